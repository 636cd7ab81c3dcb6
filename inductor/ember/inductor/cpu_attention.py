"""Flash attention on the CPU as a generated C++ kernel: the lowering of `extern.sdpa_flash_cpu`.

Traced on the CPU, `F.scaled_dot_product_attention` records `extern.sdpa_flash_cpu` (torch's
flash kernel: a call into libtorch, which a package cannot make). Where it applies
(`config.cpu_flash_attention`), the call is instead a kernel of the program: the template
`csrc/cpu_flash_attention.h` with every size, stride and option as a compile-time constant, built
like the other C++ kernels (ember.ir.toolchain, the run-time ISA's vector width, OpenMP) and
carried in the artifact, so the C++ wrapper and packages run it without torch. It works on blocks
of query rows against blocks of keys with an online softmax, parallel over batch x heads x query
blocks, and never stores the (L, S) scores.

It applies to inference calls (the log-sum-exp, which a backward reads, is unused) without
dropout, with static sizes, float32/bfloat16/float16 tensors and a floating mask (torch turns a
boolean one into an additive one before this call) broadcastable to (B, H, L, S), and K/V with as
many heads as the query or a divisor of them (GQA/MQA). Anything else raises NotImplementedError,
which keeps today's extern call.
"""

from __future__ import annotations

import hashlib
import math
import operator

import sympy
import torch

from .codegen_common import KernelSource, buffer_ptr_type
from .config import config
from .lowering import View, register
from .loop_ir import Layout, TemplateBuffer
from .runtime import CSRC

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CTYPE = {torch.float32: "float", torch.bfloat16: "uint16_t", torch.float16: "uint16_t"}
MAX_HEAD_DIM = 512  # bounds each thread's scratch (a block of queries, keys and values in fp32)
BLOCK_K = 64  # keys per block: a multiple of every ISA's vector width (16 at most)


def enabled(device: str) -> bool:
    """Whether config.cpu_flash_attention asks for the generated kernel on `device`."""
    on = config.cpu_flash_attention
    if on is False or on in ("0", "off", "false"):
        return False
    return device == "cpu" and config.cpu_backend == "cpp"


def _ints(xs):
    out = []
    for x in xs:
        x = sympy.sympify(x)
        if not x.is_Integer:
            return None
        out.append(int(x))
    return out


def _why_not(L, q, k, v, dropout_p, mask) -> str | None:
    """Why the kernel does not take this call, or None when it does."""
    if not enabled(L.device):
        return "config.cpu_flash_attention is off, or the graph is not a C++ CPU graph"
    if dropout_p != 0.0:
        return "dropout"
    users = list(L.current.users) if L.current is not None else []
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return "the log-sum-exp is read (a training graph's backward)"
    tensors = [q, k, v] + ([] if mask is None else [mask])
    if any(_ints(t.sizes) is None for t in tensors):
        return "symbolic sizes"
    if q.dtype not in _DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtype {q.dtype}"
    if len(q.sizes) != 4 or len(k.sizes) != 4 or len(v.sizes) != 4:
        return "q, k and v are not 4-d"
    (b, h, _, e), (bk, hk, s, ek), (bv, hv, sv, ev) = (_ints(t.sizes) for t in (q, k, v))
    if not (b == bk == bv and hk == hv and s == sv and e == ek) or hk == 0 or h % hk:
        return "q, k and v sizes the kernel does not take"
    if max(e, ev) > MAX_HEAD_DIM:
        return f"head dim above {MAX_HEAD_DIM}"
    if mask is not None:
        if mask.dtype not in _DTYPES or len(mask.sizes) > 4:
            return f"a {mask.dtype} mask of {len(mask.sizes)} dims"
        lead = [1] * (4 - len(mask.sizes)) + _ints(mask.sizes)
        want = (b, h, _ints(q.sizes)[2], s)
        if any(n not in (1, w) for n, w in zip(lead, want)):
            return "a mask that does not broadcast to (B, H, L, S)"
    return None


def _strides4(buf, broadcast_to=None) -> list:
    """`buf`'s strides as 4 (a broadcast dim, size 1 against a larger size, gets 0)."""
    sizes, strides = _ints(buf.layout.sizes), _ints(buf.layout.strides)
    pad = 4 - len(sizes)
    sizes, strides = [1] * pad + sizes, [0] * pad + strides
    if broadcast_to is None:
        return strides
    return [0 if n == 1 and w != 1 else st for n, w, st in zip(sizes, broadcast_to, strides)]


def block_sizes(batch_heads: int, length: int, source: int) -> tuple[int, int]:
    """(query rows, keys) per block. Each query block copies every key block it reads (keys
    transposed, values, in float32), so longer blocks copy less: the longest of 256, 128, 64
    rows that still leaves 64 work items (batch x heads x query blocks) for the threads, else 32;
    never more than the (rounded) sequence."""
    bq = next((n for n in (256, 128, 64) if batch_heads * -(-length // n) >= 64), 32)
    bq = min(bq, -(-length // 8) * 8)
    bk = min(BLOCK_K, -(-source // 16) * 16)
    return max(bq, 8), max(bk, 16)


def _float_literal(x: float) -> str:
    return f"{float(x)!r}f" if math.isfinite(x) else "0.0f"


def render_source(kernel: str, params: dict, dtype, mask_dtype) -> str:
    """The kernel's C++ source: the template, one parameter struct and the packed entry."""
    template = (CSRC / "cpu_flash_attention.h").read_text()
    fields = []
    for key, value in params.items():
        if isinstance(value, bool):
            fields.append(f"static constexpr bool {key} = {'true' if value else 'false'};")
        elif isinstance(value, float):
            fields.append(f"static constexpr float {key} = {_float_literal(value)};")
        elif isinstance(value, (list, tuple)):
            fields += [f"static constexpr int64_t {key}{i} = {int(x)};"
                       for i, x in enumerate(value)]  # fmt: skip
        else:
            fields.append(f"static constexpr int64_t {key} = {int(value)};")
    body = "\n".join(fields)
    tag = hashlib.sha256(f"{body}{dtype}{mask_dtype}".encode()).hexdigest()[:16]
    struct = f"FlashParams_{tag}"
    t, bf = _CTYPE[dtype], "true" if dtype == torch.bfloat16 else "false"
    mt = "void" if mask_dtype is None else _CTYPE[mask_dtype]
    mbf = "true" if mask_dtype == torch.bfloat16 else "false"
    mask_arg = "nullptr" if mask_dtype is None else f"static_cast<const {mt}*>(args[3])"
    out_index = 3 if mask_dtype is None else 4
    return "\n".join([
        '#include "ember_cpu.h"', template.rstrip("\n"), "",
        f"#ifndef EMBER_{struct}", f"#define EMBER_{struct}",
        f"struct {struct} {{", *("  " + f for f in fields), "};", "#endif", "",
        f"EMBER_EXPORT void {kernel}(void** args) {{",
        f"  ember::flash::attention<{struct}, {t}, {bf}, {mt}, {mbf}>(",
        f"      static_cast<const {t}*>(args[0]), static_cast<const {t}*>(args[1]),",
        f"      static_cast<const {t}*>(args[2]), {mask_arg},",
        f"      static_cast<{t}*>(args[{out_index}]));",
        "}", "",
    ])  # fmt: skip


def _reference(query, key, value, mask=None, *, is_causal=False, scale=None):
    """What the kernel computes, by torch (the loop-IR interpreter runs this)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=mask, scale=scale
    )[0]


@register("extern.sdpa_flash_cpu")
def sdpa_flash_cpu(L, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                   scale=None):  # fmt: skip
    """The generated flash-attention kernel for this call (see the module doc), or
    NotImplementedError, which keeps the extern call into torch."""
    why = _why_not(L, query, key, value, dropout_p, attn_mask)
    if why is not None:
        raise NotImplementedError(f"generated CPU flash attention: {why}")
    q, k, v = (L.realize_as_buffer(t) for t in (query, key, value))
    b, h, length, e = _ints(q.layout.sizes)
    hkv, source, ev = _ints(k.layout.sizes)[1], _ints(k.layout.sizes)[2], _ints(v.layout.sizes)[3]
    mask = None if attn_mask is None else L.realize_as_buffer(attn_mask)
    out_meta = L.meta()[0]
    name = L.new_name()
    layout = Layout(out_meta.dtype, L.device, out_meta.sizes, out_meta.strides)
    bq, bk = block_sizes(b * h, length, source)
    params = dict(B=b, H=h, HKV=hkv, L=length, S=source, E=e, EV=ev, BQ=bq, BK=bk,
                  QS=_strides4(q), KS=_strides4(k), VS=_strides4(v), OS=_ints(out_meta.strides),
                  MS=(0, 0, 0, 0) if mask is None else _strides4(mask, (b, h, length, source)),
                  CAUSAL=bool(is_causal),
                  SCALE=float(scale) if scale is not None else 1.0 / math.sqrt(e))  # fmt: skip
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    mask_dtype = None if mask is None else mask.dtype

    def render(kernel: str) -> KernelSource:
        src = render_source(kernel, params, q.dtype, mask_dtype)
        names = tuple(x.name for x in inputs) + (name,)
        types = tuple(buffer_ptr_type(x.dtype) for x in inputs) + (buffer_ptr_type(q.dtype),)
        return KernelSource(kernel, "cpp", src, names, types)

    def fn(*tensors):
        return _reference(*tensors[:3], tensors[3] if len(tensors) > 3 else None,
                          is_causal=bool(is_causal), scale=scale)  # fmt: skip

    buf = TemplateBuffer(name, layout, op="extern.sdpa_flash_cpu", fn=fn, args=inputs,
                         kernel=f"flash_attention_{name}", render=render)  # fmt: skip
    L.buffers.append(buf)
    return View.of(buf), None
