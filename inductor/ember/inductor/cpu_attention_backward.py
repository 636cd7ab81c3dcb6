"""Flash attention's backward on the CPU as a generated C++ kernel: the lowering of
`extern.sdpa_flash_cpu_backward`.

A training graph traced on the CPU saves the forward's output and log-sum-exp and calls torch's
flash backward (`extern.sdpa_flash_cpu_backward`), a call into libtorch. Where cpu_attention's
forward kernel applies (`config.cpu_flash_attention`, no dropout, static heads and head dims,
float32/bfloat16/float16, a floating mask broadcastable to (B, H, L, S), GQA/MQA), the call is
instead the template `csrc/cpu_flash_attention_backward.h`: it recomputes the probabilities a
block at a time from q, k and the log-sum-exp and writes dq, dk and dv into one buffer of the
inputs' dtype (dq, then dk, then dv, each as the extern's strides lay it out), which the
gradients read as views. Anything else raises NotImplementedError, which keeps the extern call.
"""

from __future__ import annotations

import math

import sympy
import torch

from .codegen_common import KernelSource, buffer_ptr_type, code_text
from .cpu_attention import (
    _flash_dims,
    _numel,
    _run_time_checks,
    _strides4,
    dtype_args,
    mask_size_pairs,
    param_struct,
    size_reads,
    why_not,
)
from .lowering import View, register
from .loop_ir import Layout, TemplateBuffer
from .runtime import CSRC

BLOCK_Q, BLOCK_K = 64, 64  # a block pair's scores, probabilities and their gradients: 16 KiB each

# what the kernel reads at run time (ember::flash::BwdDims, in order)
RUNTIME = ("B", "L", "S", *(f"{t}S{i}" for t in ("Q", "K", "V", "O", "G", "M", "L", "DQ", "DK",
                                                  "DV") for i in range(3)))  # fmt: skip


def render_source(kernel: str, params: dict, dims: dict, dtype, mask_dtype,
                  offsets: tuple) -> tuple[str, list]:  # fmt: skip
    """(the kernel's C++ source, the size symbols it takes after its buffers): both templates,
    the struct of `params`, and the entry, which computes the run-time `dims` and where dk and
    dv start in the gradients' buffer (`offsets`, element counts)."""
    forward = (CSRC / "cpu_flash_attention.h").read_text()
    template = (CSRC / "cpu_flash_attention_backward.h").read_text()
    struct, struct_lines = param_struct(params, f"backward{dtype}{mask_dtype}")
    t, bf, mt, mbf = dtype_args(dtype, mask_dtype)
    n_buffers = 8 if mask_dtype is not None else 7  # six inputs, the mask, the gradients
    values = [code_text(sympy.sympify(dims[n])) for n in RUNTIME]
    offs = [code_text(sympy.sympify(o)) for o in offsets]
    syms, reads = size_reads(values + offs, n_buffers)
    mask_arg = "nullptr" if mask_dtype is None else f"static_cast<const {mt}*>(args[6])"
    grads = f"static_cast<{t}*>(args[{n_buffers - 1}])"
    ins = ", ".join(f"static_cast<const {t}*>(args[{i}])" for i in range(5))
    source = "\n".join([
        '#include "ember_cpu.h"', forward.rstrip("\n"), template.rstrip("\n"), "", *struct_lines,
        f"EMBER_EXPORT void {kernel}(void** args) {{", *reads,
        "  const ember::flash::BwdDims dims{" + ", ".join(values) + "};",
        f"  {t}* grads = {grads};",
        f"  ember::flash::attention_backward<{struct}, {t}, {bf}, {mt}, {mbf}>(dims,",
        f"      {ins},",
        f"      static_cast<const float*>(args[5]), {mask_arg},",
        f"      grads, grads + {offs[0]}, grads + {offs[1]});",
        "}", "",
    ])  # fmt: skip
    return source, syms


def _reference(grad_out, query, key, value, out, lse, mask=None, *, is_causal=False,
               scale=None):  # fmt: skip
    """What the kernel computes, by torch (the loop-IR interpreter runs this): dq, dk and dv,
    each at its strides, one after the other in one buffer."""
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale
    )
    buf = torch.empty(sum(g.numel() for g in grads), dtype=query.dtype)
    at = 0
    for g in grads:
        buf.as_strided(g.shape, g.stride(), at).copy_(g)
        at += g.numel()
    return buf


@register("extern.sdpa_flash_cpu_backward")
def sdpa_flash_cpu_backward(L, grad_out, query, key, value, out, logsumexp, dropout_p=0.0,
                            is_causal=False, *, attn_mask=None, scale=None):  # fmt: skip
    """The generated flash-attention backward for this call (see the module doc), or
    NotImplementedError, which keeps the extern call into torch."""
    why = why_not(L, query, key, value, dropout_p, attn_mask, scale, single_output=True)
    if why is not None:
        raise NotImplementedError(f"generated CPU flash attention backward: {why}")
    g, q, k, v, o, lse = (L.realize_as_buffer(t)
                          for t in (grad_out, query, key, value, out, logsumexp))  # fmt: skip
    b, h, length, e = q.layout.sizes
    hkv, source, ev = k.layout.sizes[1], k.layout.sizes[2], v.layout.sizes[3]
    mask = None if attn_mask is None else L.realize_as_buffer(attn_mask)
    metas = L.meta()
    strides = dict(Q=_strides4(q), K=_strides4(k), V=_strides4(v), O=_strides4(o), G=_strides4(g),
                   M=[0] * 4 if mask is None else _strides4(mask, (b, h, length, source)),
                   L=[*lse.layout.strides, 1], DQ=list(metas[0].strides),
                   DK=list(metas[1].strides), DV=list(metas[2].strides))  # fmt: skip
    last, run_time = _flash_dims(strides)
    ms3 = last.pop("MS3")
    if any(n != 1 for key_, n in last.items() if key_ != "LS3"):
        raise NotImplementedError("generated CPU flash attention backward: a last-dim stride "
                                  "other than 1")  # fmt: skip
    if not g.dtype == o.dtype == q.dtype or lse.dtype != torch.float32:
        raise NotImplementedError("generated CPU flash attention backward: output or "
                                  "log-sum-exp dtypes")  # fmt: skip
    params = dict(H=int(h), HKV=int(hkv), E=int(e), EV=int(ev), BQ=BLOCK_Q, BK=BLOCK_K, MS3=ms3,
                  CAUSAL=bool(is_causal),
                  SCALE=float(scale) if scale is not None else 1.0 / math.sqrt(int(e)))
    dims = dict(B=b, L=length, S=source, **run_time)
    counts = [_numel(m.sizes) for m in metas]
    offsets = (counts[0], counts[0] + counts[1])
    name = L.new_name()
    layout = Layout(q.layout.dtype, L.device, (offsets[1] + counts[2],), (1,))
    inputs = (g, q, k, v, o, lse) + (() if mask is None else (mask,))
    mask_dtype = None if mask is None else mask.dtype
    pairs = [(b, k.layout.sizes[0]), (b, v.layout.sizes[0]), (source, v.layout.sizes[2])]
    pairs += mask_size_pairs(mask, (b, h, length, source))

    def render(kernel: str) -> KernelSource:
        src, syms = render_source(kernel, params, dims, q.dtype, mask_dtype, offsets)
        names = tuple(x.name for x in inputs) + (name,)
        types = tuple(buffer_ptr_type(x.dtype) for x in (*inputs, q))
        return KernelSource(kernel, "cpp", src, (*names, *syms), (*types, *("i64",) * len(syms)))

    def fn(*tensors):
        return _reference(*tensors[:6], tensors[6] if len(tensors) > 6 else None,
                          is_causal=bool(is_causal), scale=scale)  # fmt: skip

    buf = TemplateBuffer(name, layout, op="extern.sdpa_flash_cpu_backward", fn=fn, args=inputs,
                         kernel=f"flash_attention_backward_{name}", render=render,
                         checks=_run_time_checks(pairs))  # fmt: skip
    L.buffers.append(buf)
    starts = (0, *offsets)
    return tuple(View(buf, m.sizes, m.strides, at) for m, at in zip(metas, starts))

