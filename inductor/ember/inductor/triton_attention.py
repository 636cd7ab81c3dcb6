"""Flash attention as a Triton kernel of Ember's own: the lowering of CUDA's attention externs
(`extern.sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`) where a program cannot call torch.

Traced on CUDA, `F.scaled_dot_product_attention` records one of torch's attention kernels as an
extern: calls into libtorch, which a package's C++ runtime cannot make. Where this applies
(`config.triton_flash_attention`: "auto" while compiling for a package, see
`config.packaging`), the call is instead a kernel of the program: the template
`csrc/triton_flash_attention.py` with heads, head dims (padded to powers of two), last-dim
strides, the scale and the flags as compile-time constants and batch, lengths and the other
strides as run-time arguments, launched on a grid of (row blocks x batch x key/value heads)
programs, the query heads sharing a key/value head packed into one program's rows. It is a
Triton kernel like the generated ones, so a package gets it as a cubin
(triton_aot.attach_cubins) that the C++ wrapper launches. In-process CUDA compiles keep torch's
kernels unless the switch is True (this kernel was not measured against them).

It takes what cpu_attention's kernel takes (inference, no dropout, static heads and head dims,
float32/bfloat16/float16, a float mask broadcastable to (B, H, L, S), GQA/MQA), head dims up to
256. Anything else raises NotImplementedError, which keeps the extern call (and a package then
says which extern it cannot run). On the CPU it lowers `extern.sdpa_flash_cpu` only where the
CPU graph renders Triton (`config.cpu_backend == "triton"`) and the switch is True: how the
kernel is tested in Triton's interpreter.
"""

from __future__ import annotations

import math

import sympy
import torch

from ember.ir import FloorDiv

from .codegen_common import KernelSource
from .config import config
from .cpu_attention import _ints, _run_time_checks, _strides4, unsupported
from .loop_ir import Layout, TemplateBuffer
from .lowering import View, register
from .runtime import CSRC

MAX_HEAD_DIM = 256
DECODE_ROWS = 64  # packed query rows (L * GROUP) up to which a call is decode-shaped
_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# what the kernel reads at run time, in its parameter order after the five pointers
RUNTIME = ("B", "L", "S", "QS0", "QS1", "QS2", "KS0", "KS1", "KS2", "VS0", "VS1", "VS2", "OS0",
           "OS1", "OS2", "MS0", "MS1", "MS2")  # fmt: skip


def enabled(device: str) -> bool:
    """Whether config.triton_flash_attention asks for this kernel on `device`."""
    on = config.triton_flash_attention
    on = True if on in ("1", "on", "true") else on
    if str(device).startswith("cuda"):
        return on is True or (on == "auto" and config.packaging)
    return device == "cpu" and config.cpu_backend == "triton" and on is True


def pad(n: int) -> int:
    """A head dim rounded up to a power of two, at least 16 (what tl.dot and tl.arange take)."""
    return max(16, 1 << (int(n) - 1).bit_length())


def launch_config(e_pad: int, dtype: torch.dtype, rows: int | None = None) -> dict:
    """Block sizes, warps and pipeline stages for a padded head dim and `rows` packed query rows
    (L * GROUP, None where L is dynamic). Blocks shrink as the head dim grows so that a query
    block, STAGES key/value blocks in flight and the float32 accumulator stay within shared
    memory and registers. A decode-shaped call (at most DECODE_ROWS rows) gets a block of 16,
    32 or 64 rows and longer key blocks (DECODE_N); a dynamic L gets the prefill blocks plus the
    kernel's 16- and 64-row variants, chosen at run time (DECODE)."""
    wide = dtype == torch.float32
    if e_pad <= 64:
        bm, bn, warps, stages = (64, 64, 4, 2) if wide else (128, 64, 4, 3)
        decode_n = 64 if wide else 128
    elif e_pad <= 128:
        bm, bn, warps, stages = (64, 32, 4, 2) if wide else (128, 64, 8, 3)
        decode_n = 32 if wide else 64
    else:
        bm, bn, warps, stages = (32, 32, 4, 1) if wide else (64, 64, 8, 2)
        decode_n = 32
    if rows is not None and rows <= DECODE_ROWS:
        bm = pad(rows)
        bn, warps = decode_n, 4
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, STAGES=stages,
                DECODE=rows is None, DECODE_N=decode_n)


def grid(batch, kv_heads: int, rows, block_m: int) -> tuple:
    """The launch grid: row blocks x (batch, key/value head), sizes possibly symbolic."""
    bm = sympy.Integer(block_m)
    return (FloorDiv(sympy.sympify(rows) + bm - 1, bm) * batch * kv_heads,)


def render_source(kernel: str) -> str:
    """The template with its kernel named `kernel`."""
    return (CSRC / "triton_flash_attention.py").read_text().replace("KERNEL_NAME", kernel)


def kernel_config(params: dict, dtype: torch.dtype, rows: int | None = None) -> dict:
    """Every compile-time constant of one kernel: `params` (heads, dims, strides, flags) plus
    the dtype's precision flags and the launch configuration for `rows` packed query rows
    (L * GROUP; None where L is dynamic)."""
    return {**params, "IEEE": dtype == torch.float32, "UPCAST": False,
            **launch_config(max(params["E_PAD"], params["EV_PAD"]), dtype, rows)}  # fmt: skip


def lower(L, op: str, query, key, value, mask, is_causal: bool, scale, dropout_p=0.0,
          single_output: bool = False):  # fmt: skip
    """The Triton flash kernel's buffer for one attention call (see the module doc), as the op's
    result: the output alone (`single_output`) or its first element, the others unread."""
    if not enabled(L.device):
        raise NotImplementedError("Triton flash attention: config.triton_flash_attention is off "
                                  "for this graph (see ember.inductor.config)")  # fmt: skip
    why = unsupported(L, query, key, value, dropout_p, mask, scale, MAX_HEAD_DIM, single_output)
    if why is not None:
        raise NotImplementedError(f"Triton flash attention: {why}")
    q, k, v = (L.realize_as_buffer(t) for t in (query, key, value))
    mask = None if mask is None else L.realize_as_buffer(mask)
    b, h, length, e = q.layout.sizes
    hkv, source, ev = k.layout.sizes[1], k.layout.sizes[2], v.layout.sizes[3]
    meta = L.meta() if single_output else L.meta()[0]
    name = L.new_name()
    layout = Layout(meta.dtype, L.device, meta.sizes, meta.strides)
    strides = dict(Q=_strides4(q), K=_strides4(k), V=_strides4(v), O=list(meta.strides),
                   M=[0] * 4 if mask is None else _strides4(mask, (b, h, length, source)))
    last = _ints([st[3] for st in strides.values()])
    if last is None:
        raise NotImplementedError("Triton flash attention: a symbolic last-dim stride")
    params = dict(H=int(h), GROUP=int(h) // int(hkv), E=int(e), EV=int(ev), E_PAD=pad(e),
                  EV_PAD=pad(ev), **{f"{t}S3": n for t, n in zip(strides, last)},
                  HAS_MASK=mask is not None, CAUSAL=bool(is_causal),
                  SCALE=float(scale) if scale is not None else 1.0 / math.sqrt(int(e)))
    rows = sympy.sympify(length) * params["GROUP"]  # packed query rows (see the template)
    cfg = kernel_config(params, q.dtype, int(rows) if rows.is_Integer else None)
    dims = dict(B=b, L=length, S=source,
                **{f"{t}S{i}": st[i] for t, st in strides.items() for i in range(3)})
    runtime = [sympy.sympify(dims[n]) for n in RUNTIME]
    launch = grid(b, int(hkv), rows, cfg["BLOCK_M"])
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    pairs = [(b, k.layout.sizes[0]), (b, v.layout.sizes[0]), (source, v.layout.sizes[2])]
    if mask is not None:
        lead = [1] * (4 - len(mask.layout.sizes)) + list(mask.layout.sizes)
        pairs += [(n, w) for n, w in zip(lead, (b, h, length, source)) if n != 1]

    def render(kernel: str) -> KernelSource:
        # without a mask the query's pointer stands in for it (never read: HAS_MASK is off)
        ptrs = (q, k, v, mask if mask is not None else q)
        names = (*(x.name for x in ptrs), name)
        types = tuple(f"*{_TYPES[x.dtype]}" for x in ptrs) + (f"*{_TYPES[meta.dtype]}",)
        return KernelSource(kernel, "triton", render_source(kernel),
                            (*names, *(str(x) for x in runtime)), (*types, *("i64",) * 18),
                            grid=launch,
                            meta=(("handwritten", "flash_attention"), ("configs", (cfg,))),
                            num_warps=cfg["num_warps"])  # fmt: skip

    def fn(*tensors):  # the reference (the loop-IR interpreter runs it)
        return torch.nn.functional.scaled_dot_product_attention(
            *tensors[:3], attn_mask=tensors[3] if len(tensors) > 3 else None,
            is_causal=bool(is_causal), scale=scale, enable_gqa=int(h) != int(hkv))

    buf = TemplateBuffer(name, layout, op=op, fn=fn, args=inputs,
                         kernel=f"flash_attention_{name}", render=render,
                         checks=_run_time_checks(pairs))  # fmt: skip
    L.buffers.append(buf)
    return View.of(buf)


@register("extern.sdpa_flash")
def sdpa_flash(L, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
               scale=None):  # fmt: skip
    """CUDA's flash kernel: (out, logsumexp, 7 more), only `out` read."""
    if return_debug_mask:
        raise NotImplementedError("Triton flash attention: the debug mask is asked for")
    length, source = sympy.sympify(query.sizes[2]), sympy.sympify(key.sizes[2])
    if is_causal and sympy.expand(length - source) != 0:
        # this ATen op's causal mask is aligned bottom-right when the lengths differ (torch's
        # CausalBias calls it so); F.scaled_dot_product_attention never sends it such a call
        raise NotImplementedError("Triton flash attention: extern.sdpa_flash's bottom-right "
                                  "causal mask (query and key lengths differ)")  # fmt: skip
    out = lower(L, "extern.sdpa_flash", query, key, value, None, is_causal, scale, dropout_p)
    return (out, *(None,) * 8)


@register("extern.sdpa_efficient")
def sdpa_efficient(L, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                   is_causal=False, *, scale=None):  # fmt: skip
    """The memory-efficient kernel: (out, logsumexp, seed, offset), only `out` read."""
    out = lower(L, "extern.sdpa_efficient", query, key, value, attn_bias, is_causal, scale,
                dropout_p)  # fmt: skip
    return (out, None, None, None)


@register("extern.sdpa_cudnn")
def sdpa_cudnn(L, query, key, value, attn_bias=None, is_causal=False, *, scale=None):
    """cuDNN's attention (inference): the output alone, in the layout its meta declares."""
    return lower(L, "extern.sdpa_cudnn", query, key, value, attn_bias, is_causal, scale,
                 single_output=True)  # fmt: skip


def run(q, k, v, mask=None, causal: bool = False, scale=None, dynamic: bool = False):
    """The template on tensors, outside any graph: a (B, H, L, E) output like
    F.scaled_dot_product_attention's (GQA implied by the heads). `dynamic`: the kernel built for
    a length known only at run time. For tests and bench/flash_decode_probe.py."""
    from .runtime import triton_template

    b, h, length, e = q.shape
    ev = v.shape[3]
    out = q.new_empty(b, h, length, ev)
    m_strides = [0] * 4
    if mask is not None:
        lead = 4 - mask.dim()
        m_strides[lead:] = [st if n != 1 else 0 for n, st in zip(mask.shape, mask.stride())]
    params = dict(H=h, GROUP=h // k.shape[1], E=e, EV=ev, E_PAD=pad(e), EV_PAD=pad(ev),
                  QS3=q.stride(3), KS3=k.stride(3), VS3=v.stride(3), OS3=out.stride(3),
                  MS3=m_strides[3], HAS_MASK=mask is not None, CAUSAL=bool(causal),
                  SCALE=float(scale) if scale is not None else 1.0 / math.sqrt(e))  # fmt: skip
    rows = length * params["GROUP"]
    cfg = kernel_config(params, q.dtype, None if dynamic else rows)
    launcher = triton_template("flash_run", render_source("flash_run"), cfg)
    strides = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
               *m_strides[:3]]  # fmt: skip
    blocks = int(grid(b, h // params["GROUP"], rows, cfg["BLOCK_M"])[0])
    launcher[(blocks,)](q, k, v, q if mask is None else mask, out, b, length, k.shape[2],
                        *strides)  # fmt: skip
    return out
