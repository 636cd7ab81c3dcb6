"""Flash attention on the CPU as a generated C++ kernel: the lowering of `extern.sdpa_flash_cpu`.

Traced on the CPU, `F.scaled_dot_product_attention` records `extern.sdpa_flash_cpu` (torch's
flash kernel: a call into libtorch, which a package cannot make). Where it applies
(`config.cpu_flash_attention`), the call is instead a kernel of the program: the template
`csrc/cpu_flash_attention.h` with heads, head dims, block sizes, last-dim strides and options as
compile-time constants and batch, lengths and the other strides read at run time (so dynamic
sizes work; equalities between them that eager's kernel checks, the wrapper checks), built
like the other C++ kernels (ember.ir.toolchain, the run-time ISA's vector width, OpenMP) and
carried in the artifact, so the C++ wrapper and packages run it without torch. It works on blocks
of query rows against blocks of keys with an online softmax, parallel over batch x heads x query
blocks, and never stores the (L, S) scores.

In a training graph the log-sum-exp, which the backward reads, is read too: the kernel then
writes the output and it into one float32 buffer (the output first, as its strides lay it out;
a half-precision output is rounded from there by a kernel of its own), and the backward
(cpu_attention_backward.py) is Ember's kernel as well.

It applies to calls without dropout, with static heads and head dims, float32/bfloat16/float16
tensors and a floating mask (torch turns a boolean one into an additive one before this call)
broadcastable to (B, H, L, S), and K/V with as many heads as the query or a divisor of them
(GQA/MQA). Anything else raises NotImplementedError, which keeps today's extern call.
"""

from __future__ import annotations

import hashlib
import math
import operator

import sympy
import torch

from ember.ir import toolchain

from .codegen_common import KernelSource, buffer_ptr_type, code_text, size_symbols_in
from .config import HARDWARE_16BIT, config
from .lowering import Lazy, View, register
from .loop_ir import Layout, TemplateBuffer, ops
from .runtime import CSRC

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CTYPE = {torch.float32: "float", torch.bfloat16: "uint16_t", torch.float16: "uint16_t"}
MAX_HEAD_DIM = 512  # bounds each thread's scratch (a block of queries, keys and values in fp32)
BLOCK_K = 64  # keys per block: a multiple of every ISA's vector width (16 at most)


def enabled(device: str, dtype=None) -> bool:
    """Whether config.cpu_flash_attention asks for the generated kernel on `device` (for
    `dtype`: "auto" leaves 16-bit floats to torch's kernels where the CPU multiplies them in
    hardware, except in a package, which cannot call torch)."""
    on = config.cpu_flash_attention
    if on is False or on in ("0", "off", "false"):
        return False
    if device != "cpu" or config.cpu_backend != "cpp":
        return False
    if on == "auto" and not config.packaging and dtype in HARDWARE_16BIT:
        return not (HARDWARE_16BIT[dtype] & toolchain.cpu_flags())
    return True


def _ints(xs):
    """`xs` as ints, or None when one is symbolic."""
    out = []
    for x in xs:
        x = sympy.sympify(x)
        if not x.is_Integer:
            return None
        out.append(int(x))
    return out


def _same(L, a, b) -> bool:
    """Whether sizes `a` and `b` agree in the example (dynamic ones: checked at run time)."""
    return _hint(L, a) == _hint(L, b)


def _run_time_checks(pairs) -> tuple:
    """Eq(a, b) for each pair of sizes that are not the same expression (two symbols that the
    example gave one value: eager's kernel rejects them unequal, the wrapper checks them)."""
    out = []
    for a, b in pairs:
        a, b = sympy.sympify(a), sympy.sympify(b)
        if sympy.expand(a - b) != 0:
            out.append(sympy.Eq(a, b))
    return tuple(out)


def why_not(L, q, k, v, dropout_p, mask, scale, **kw) -> str | None:
    """Why the generated kernels (this forward, cpu_attention_backward's) do not take this call,
    or None when they do; `kw` as `unsupported` takes them."""
    if not enabled(L.device, q.dtype):
        return ("config.cpu_flash_attention is off, the graph is not a C++ CPU graph, or torch's "
                f"kernel multiplies {q.dtype} in this CPU's hardware")
    return unsupported(L, q, k, v, dropout_p, mask, scale, MAX_HEAD_DIM, **kw)


def lse_read(L) -> bool:
    """Whether the node being lowered has its log-sum-exp (output 1) read: a training graph."""
    users = list(L.current.users) if L.current is not None else []
    return any(u.target is not operator.getitem or u.args[1] != 0 for u in users)


def unsupported(L, q, k, v, dropout_p, mask, scale, max_head_dim: int,
                single_output: bool = False, lse_ok: bool = False) -> str | None:  # fmt: skip
    """Why a flash kernel of Ember's (this one, or triton_attention's) cannot run this call, or
    None: dropout, a read log-sum-exp (unless `lse_ok`; `single_output`: the op returns only
    the output), dtypes, sizes and masks it does not take."""
    if dropout_p != 0.0:
        return "dropout"
    if not single_output and not lse_ok and lse_read(L):
        return "the log-sum-exp is read (a training graph's backward)"
    if q.dtype not in _DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtype {q.dtype}"
    if len(q.sizes) != 4 or len(k.sizes) != 4 or len(v.sizes) != 4:
        return "q, k and v are not 4-d"
    # batch and sequence lengths may be dynamic; heads and head dims are compile-time constants
    heads = _ints([q.sizes[1], k.sizes[1], v.sizes[1], q.sizes[3], k.sizes[3], v.sizes[3]])
    if heads is None:
        return "symbolic heads or head dims"
    h, hk, hv, e, ek, ev = heads
    same = _same(L, q.sizes[0], k.sizes[0]) and _same(L, k.sizes[0], v.sizes[0])
    if not (same and _same(L, k.sizes[2], v.sizes[2]) and hk == hv and e == ek) or h % hk:
        return "q, k and v sizes the kernel does not take"
    if max(e, ev) > max_head_dim:
        return f"head dim above {max_head_dim}"
    if scale is not None and not math.isfinite(scale):
        return f"scale {scale}"
    if mask is not None:
        if mask.dtype not in _DTYPES or len(mask.sizes) > 4:
            return f"a {mask.dtype} mask of {len(mask.sizes)} dims"
        lead = [1] * (4 - len(mask.sizes)) + list(mask.sizes)
        want = (q.sizes[0], h, q.sizes[2], k.sizes[2])
        if any(n != 1 and not _same(L, n, w) for n, w in zip(lead, want)):
            return "a mask that does not broadcast to (B, H, L, S)"
    return None


def _strides4(buf, broadcast_to=None) -> list:
    """`buf`'s strides as 4 (a broadcast dim, size 1 against another size, gets 0)."""
    sizes, strides = list(buf.layout.sizes), list(buf.layout.strides)
    pad = 4 - len(sizes)
    sizes, strides = [1] * pad + sizes, [0] * pad + strides
    if broadcast_to is None:
        return strides
    return [0 if n == 1 and w != 1 else st for n, w, st in zip(sizes, broadcast_to, strides)]


def block_sizes(batch_heads: int, length: int, source: int) -> tuple[int, int]:
    """(query rows, keys) per block. Each query block copies every key block it reads (keys and
    values, in float32), so longer blocks copy less: the longest of 256, 128, 64
    rows that still leaves 64 work items (batch x heads x query blocks) for the threads, else 32;
    never more than the (rounded) sequence. Dynamic sizes are chosen for by their examples."""
    bq = next((n for n in (256, 128, 64) if batch_heads * -(-length // n) >= 64), 32)
    bq = min(bq, -(-length // 8) * 8)
    bk = min(BLOCK_K, -(-source // 16) * 16)
    return max(bq, 8), max(bk, 16)


def _float_literal(x: float) -> str:
    return f"{float(x)!r}f"


# what the kernel reads at run time (sizes that may be dynamic and the strides built from them)
RUNTIME = ("B", "L", "S", "QS0", "QS1", "QS2", "KS0", "KS1", "KS2", "VS0", "VS1", "VS2", "OS0",
           "OS1", "OS2", "MS0", "MS1", "MS2", "LS0", "LS1", "LS2")  # fmt: skip


def param_struct(params: dict, salt: str) -> tuple[str, list]:
    """(the name of a struct of the compile-time `params`, its lines): a name of its own per
    value set, so several kernels' structs can share one translation unit."""
    fields = []
    for key, value in params.items():
        if isinstance(value, bool):
            fields.append(f"static constexpr bool {key} = {'true' if value else 'false'};")
        elif isinstance(value, float):
            fields.append(f"static constexpr float {key} = {_float_literal(value)};")
        else:
            fields.append(f"static constexpr int64_t {key} = {int(value)};")
    tag = hashlib.sha256(("\n".join(fields) + salt).encode()).hexdigest()[:16]
    struct = f"FlashParams_{tag}"
    lines = [f"#ifndef EMBER_{struct}", f"#define EMBER_{struct}", f"struct {struct} {{",
             *("  " + f for f in fields), "};", "#endif", ""]  # fmt: skip
    return struct, lines


def size_reads(values: list, n_buffers: int) -> tuple[list, list]:
    """(the size symbols that `values`' code uses, the entry's lines reading them from the
    arguments after the kernel's `n_buffers` buffers)."""
    syms = size_symbols_in(values)
    reads = [f"  const int64_t {s} = *static_cast<const int64_t*>(args[{n_buffers + j}]);"
             for j, s in enumerate(syms)]  # fmt: skip
    return syms, reads


def dtype_args(dtype, mask_dtype) -> tuple[str, str, str, str]:
    """The C++ template arguments T, BF16, MT, MBF16 for these tensor and mask dtypes."""
    t, bf = _CTYPE[dtype], "true" if dtype == torch.bfloat16 else "false"
    mt = "void" if mask_dtype is None else _CTYPE[mask_dtype]
    return t, bf, mt, "true" if mask_dtype == torch.bfloat16 else "false"


def render_source(kernel: str, params: dict, dims: dict, n_buffers: int, dtype, mask_dtype,
                  n_out=None) -> tuple[str, list]:  # fmt: skip
    """(the kernel's C++ source, the size symbols it takes after its buffers): the template,
    one struct of the compile-time `params`, and the packed entry, which computes the run-time
    `dims` (sympy expressions over the program's size symbols). `n_out`: for a training graph,
    the output's element count, after which the float32 output buffer holds the log-sum-exp."""
    template = (CSRC / "cpu_flash_attention.h").read_text()
    struct, struct_lines = param_struct(params, f"{dtype}{mask_dtype}")
    t, bf, mt, mbf = dtype_args(dtype, mask_dtype)
    mask_arg = "nullptr" if mask_dtype is None else f"static_cast<const {mt}*>(args[3])"
    values = [code_text(sympy.sympify(dims[n])) for n in RUNTIME]
    n_out_text = None if n_out is None else code_text(sympy.sympify(n_out))
    syms, reads = size_reads(values + ([n_out_text] if n_out_text else []), n_buffers)
    ot = t if n_out is None else "float"
    out = f"static_cast<{ot}*>(args[{n_buffers - 1}])"
    lse = "nullptr"
    if n_out is not None:
        lse = f"static_cast<float*>(args[{n_buffers - 1}]) + {n_out_text}"
    source = "\n".join([
        '#include "ember_cpu.h"', template.rstrip("\n"), "", *struct_lines,
        f"EMBER_EXPORT void {kernel}(void** args) {{", *reads,
        "  const ember::flash::Dims dims{" + ", ".join(values) + "};",
        f"  ember::flash::attention<{struct}, {t}, {bf}, {mt}, {mbf}, {ot}>(dims,",
        f"      static_cast<const {t}*>(args[0]), static_cast<const {t}*>(args[1]),",
        f"      static_cast<const {t}*>(args[2]), {mask_arg},",
        f"      {out}, {lse});",
        "}", "",
    ])  # fmt: skip
    return source, syms


def _hint(L, x) -> int:
    """A size's value in the example inputs (itself when static)."""
    x = sympy.sympify(x)
    if x.is_Integer:
        return int(x)
    subs = {s: L.example_inputs[i].shape[d] for s, (i, d) in L.size_symbols.items()}
    return int(x.subs(subs))


def _reference(query, key, value, mask=None, *, is_causal=False, scale=None, train=False):
    """What the kernel computes, by torch (the loop-IR interpreter runs this). `train`: a
    training graph's float32 buffer, the output (at its strides) and after it the log-sum-exp."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=mask, scale=scale
    )
    if not train:
        return out
    buf = torch.empty(out.numel() + lse.numel(), dtype=torch.float32)
    buf.as_strided(out.shape, out.stride()).copy_(out)
    buf.as_strided(lse.shape, lse.stride(), out.numel()).copy_(lse)
    return buf


def _numel(sizes):
    return sympy.Mul(*[sympy.sympify(n) for n in sizes])


def _flash_dims(strides: dict) -> tuple[dict, dict]:
    """(compile-time last-dim strides by name, run-time strides of dims 0-2 by name) of the
    tensors' 4-d `strides` by letter; NotImplementedError for a symbolic last-dim stride."""
    last = _ints([st[3] for st in strides.values()])
    if last is None:
        raise NotImplementedError("generated CPU flash attention: a symbolic last-dim stride")
    return ({f"{t}S3": n for t, n in zip(strides, last)},
            {f"{t}S{i}": st[i] for t, st in strides.items() for i in range(3)})  # fmt: skip


def mask_size_pairs(mask, want) -> list:
    """(mask size, size it stands for) for each mask dim that is not broadcast."""
    if mask is None:
        return []
    lead = [1] * (4 - len(mask.layout.sizes)) + list(mask.layout.sizes)
    return [(n, w) for n, w in zip(lead, want) if n != 1]


@register("extern.sdpa_flash_cpu")
def sdpa_flash_cpu(L, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                   scale=None):  # fmt: skip
    """The generated flash-attention kernel for this call (see the module doc), or
    NotImplementedError, which keeps the extern call into torch."""
    if config.cpu_backend == "triton":  # the Triton renderer's own (its tests' CPU graphs)
        from . import triton_attention

        out = triton_attention.lower(L, "extern.sdpa_flash_cpu", query, key, value, attn_mask,
                                     bool(is_causal), scale, dropout_p)  # fmt: skip
        return out, None
    why = why_not(L, query, key, value, dropout_p, attn_mask, scale, lse_ok=True)
    if why is not None:
        raise NotImplementedError(f"generated CPU flash attention: {why}")
    q, k, v = (L.realize_as_buffer(t) for t in (query, key, value))
    b, h, length, e = q.layout.sizes
    hkv, source, ev = k.layout.sizes[1], k.layout.sizes[2], v.layout.sizes[3]
    mask = None if attn_mask is None else L.realize_as_buffer(attn_mask)
    out_meta, lse_meta = L.meta()
    train = lse_read(L)
    n_out = _numel(out_meta.sizes)
    name = L.new_name()
    if train:  # the output (float32), then the log-sum-exp
        layout = Layout(torch.float32, L.device, (n_out + _numel(lse_meta.sizes),), (1,))
    else:
        layout = Layout(out_meta.dtype, L.device, out_meta.sizes, out_meta.strides)
    bq, bk = block_sizes(_hint(L, b) * int(h), _hint(L, length), _hint(L, source))
    strides = dict(Q=_strides4(q), K=_strides4(k), V=_strides4(v), O=list(out_meta.strides),
                   M=[0] * 4 if mask is None else _strides4(mask, (b, h, length, source)),
                   L=[*lse_meta.strides, 1] if train else [0] * 4)  # fmt: skip
    last, run_time = _flash_dims(strides)
    last.pop("LS3")
    params = dict(H=int(h), HKV=int(hkv), E=int(e), EV=int(ev), BQ=bq, BK=bk, **last,
                  CAUSAL=bool(is_causal),
                  SCALE=float(scale) if scale is not None else 1.0 / math.sqrt(int(e)))
    dims = dict(B=b, L=length, S=source, **run_time)
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    mask_dtype = None if mask is None else mask.dtype
    pairs = [(b, k.layout.sizes[0]), (b, v.layout.sizes[0]), (source, v.layout.sizes[2])]
    pairs += mask_size_pairs(mask, (b, h, length, source))

    def render(kernel: str) -> KernelSource:
        src, syms = render_source(kernel, params, dims, len(inputs) + 1, q.dtype, mask_dtype,
                                  n_out if train else None)  # fmt: skip
        names = tuple(x.name for x in inputs) + (name,)
        types = tuple(buffer_ptr_type(x.dtype) for x in inputs) + (buffer_ptr_type(layout.dtype),)
        return KernelSource(kernel, "cpp", src, (*names, *syms), (*types, *("i64",) * len(syms)))

    def fn(*tensors):
        return _reference(*tensors[:3], tensors[3] if len(tensors) > 3 else None,
                          is_causal=bool(is_causal), scale=scale, train=train)  # fmt: skip

    buf = TemplateBuffer(name, layout, op="extern.sdpa_flash_cpu", fn=fn, args=inputs,
                         kernel=f"flash_attention_{name}", render=render,
                         checks=_run_time_checks(pairs))  # fmt: skip
    L.buffers.append(buf)
    if not train:
        return View.of(buf), None
    out = View(buf, out_meta.sizes, out_meta.strides)
    if out_meta.dtype != torch.float32:  # rounded by a pointwise kernel of its own
        f32 = out
        out = Lazy(f32.sizes, out_meta.dtype, L.device,
                   lambda idx: ops.to_dtype(f32.load(idx), out_meta.dtype))  # fmt: skip
    return out, View(buf, lse_meta.sizes, lse_meta.strides, n_out)
