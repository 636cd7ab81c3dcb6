"""Composite ops decomposed in Python while tracing with symbolic sizes.

torch's C++ composites (CompositeImplicitAutograd kernels such as `linear`) run above the dispatch
key where the tracer sees ops. A few of them read a tensor's sizes as plain ints (`sizes()`, not
`sym_sizes()`), so the symbolic sizes of a SymbolicTensor come back as their hints and the shape
arithmetic that follows (a view to the flattened size, say) is baked for this example's sizes.
While a symbolic trace runs, `SymbolicComposites` (a TorchFunctionMode) answers those functions
with Python decompositions whose shape arithmetic is done on SymInts, so it stays symbolic; the
ATen ops they call reach the tracer as usual. A rule returns NotImplemented for the cases the C++
composite handles symbolically itself.
"""

from __future__ import annotations

import math
import operator
from functools import reduce

import torch
from torch.overrides import TorchFunctionMode

from .attention import autocast_input, efficient_bias, recorded, torch_choice


def _linear(input, weight, bias=None):
    """linear on an input of 3 or more dims: torch flattens it to 2-d for one mm (addmm with a
    bias) and views the result back, reading the sizes as ints (on CUDA its checks call numel(),
    which a tensor with symbolic sizes refuses); here the flattened size is a SymInt."""
    if not isinstance(input, torch.Tensor) or input.dim() < 3:
        return NotImplemented
    sizes = input.shape
    if not input.is_contiguous():
        out = torch.matmul(input, weight.t())  # torch's own path for this layout
        return out if bias is None else out + bias
    flat = input.reshape(reduce(operator.mul, sizes[:-1], 1), sizes[-1])
    out = torch.mm(flat, weight.t()) if bias is None else torch.addmm(bias, flat, weight.t())
    return out.view(*sizes[:-1], out.shape[-1])


def _dropout(input, p=0.5, training=True, inplace=False):
    """dropout: torch's composite asks `numel()`, which a tensor with symbolic sizes refuses; this
    is what it computes on CPU (a Bernoulli mask scaled by 1 / (1 - p))."""
    if not isinstance(input, torch.Tensor) or inplace or not 0 <= p <= 1:
        return NotImplemented
    if not training or p == 0:
        return input
    if p == 1:
        return input * torch.zeros_like(input)
    noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
    return input * noise


def _symbolic(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and not all(isinstance(n, int) for n in t.shape)
               for t in tensors)  # fmt: skip


def _batched_matmul(a, b):
    """a @ b for operands of 3 or more dims, as one bmm over the broadcast batch: torch's C++
    matmul (some versions) computes the expanded batch from `sizes()`, baking in the hints."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
    flat = reduce(operator.mul, batch, 1)
    a3 = a.expand(*batch, n, k).reshape(flat, n, k)
    b3 = b.expand(*batch, k, m).reshape(flat, k, m)
    return torch.bmm(a3, b3).view(*batch, n, m)


def _matmul(input, other):
    """matmul of two batched (3+ dims) operands with symbolic sizes (see _batched_matmul)."""
    if not (isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor)):
        return NotImplemented
    if input.dim() < 3 or other.dim() < 3 or not _symbolic(input, other):
        return NotImplemented
    return _batched_matmul(input, other)


def requires_grad(t: torch.Tensor) -> bool:
    """Whether `t` requires grad, looking through functionalize's wrapper."""
    return recorded(t).requires_grad


def _cuda_kernel(backend, query, key, value, attn_mask, is_causal, scale):
    """The flash or memory-efficient CUDA kernel called directly, as torch's C++ attention would
    call it, so that the tracer never hands a SymbolicTensor to that C++ (whose checks read plain
    sizes, on CUDA only); `backend` MATH (inference only) asks for the memory-efficient kernel in
    its place. NotImplemented where torch's preparation of the inputs is not mirrored here."""
    from torch.nn.attention import SDPBackend

    dims = [int(n) for n in (query.shape[-1], key.shape[-1], value.shape[-1])]  # specialised
    if dims[0] != dims[1] or dims[0] % 8 or dims[2] % 8:
        return NotImplemented  # torch pads the head dim to a multiple of 8 first
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return NotImplemented
    if backend == SDPBackend.FLASH_ATTENTION and attn_mask is None:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal, False, scale=scale
        )[0]
    if backend not in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        return NotImplemented
    bias = None
    if attn_mask is not None:
        # (the lowering then lays the bias out in aligned rows too: ARG_STRIDES)
        bias = efficient_bias(attn_mask, query, query.dtype)
        if bias is None:
            return NotImplemented
    if torch.is_grad_enabled() and any(requires_grad(t) for t in (query, key, value)):
        # its backward, traced with symbolic sizes, failed the log-sum-exp alignment check on an
        # H100: training takes the math path
        return NotImplemented
    try:
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, False, 0.0, is_causal, scale=scale
        )[0]
    except RuntimeError:
        if backend == SDPBackend.MATH:
            return NotImplemented  # the kernel refused what torch would not give it either
        raise


def _proven_mask_kind(mask, query, key):
    """mask_proof's verdict on a mask of the program the active tracer records (None outside)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .mask_proof import proven_mask_kind
    from .trace import Tracer

    tracer = next((m for m in reversed(_get_current_dispatch_mode_stack())
                   if isinstance(m, Tracer)), None)  # fmt: skip
    if tracer is None or tracer.shape_env is None or not isinstance(mask, torch.Tensor):
        return None
    return proven_mask_kind(tracer, recorded(mask), query, key)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):  # fmt: skip
    """scaled_dot_product_attention with symbolic sizes. Where torch would take its math path,
    whose C++ matmuls bake the hints in (see _batched_matmul), the same math runs on SymInts; on
    CUDA the flash and memory-efficient kernels (externs) are called directly (_cuda_kernel)."""
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        return NotImplemented
    if attn_mask is not None and dropout_p == 0.0 and not is_causal:
        kind = _proven_mask_kind(attn_mask, query, key)
        if kind is not None:  # the mask is a function of the sizes: none at all, or causal
            causal = kind == "causal"
            out = _sdpa(query, key, value, None, 0.0, causal, scale, enable_gqa)
            if out is NotImplemented:  # torch's kernel takes it as it is
                out = torch.nn.functional.scaled_dot_product_attention(
                    query, key, value, None, 0.0, causal, scale=scale, enable_gqa=enable_gqa)
            return out
    if enable_gqa:  # transformers asks for it whenever no mask is given, groups or not
        if query.device.type != "cuda":
            return NotImplemented  # (torch's CPU kernels take symbolic sizes)
        heads, groups = int(query.shape[1]), int(key.shape[1])  # head counts are specialised
        if heads % groups:
            return NotImplemented
        group = heads // groups
        if group > 1:
            key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
            tensors = (query, key, value)
        enable_gqa = False
    if dropout_p != 0.0 or not _symbolic(*tensors, attn_mask):
        return NotImplemented
    device = query.device.type
    if scale is None and not isinstance(query.shape[-1], int):
        if device != "cuda":
            return NotImplemented  # the default scale reads the head size
        scale = 1.0 / math.sqrt(int(query.shape[-1]))  # the head size is specialised (a guard)
    backend = torch_choice(query, key, value, attn_mask, dropout_p, is_causal, scale,
                           enable_gqa)  # fmt: skip
    if torch.is_autocast_enabled(device):  # what the autocast of sdpa does to its inputs
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (autocast_input(t, dtype) for t in tensors)
    math_path = backend == torch.nn.attention.SDPBackend.MATH
    if device == "cuda" and (not math_path or not torch.is_grad_enabled()):
        # in inference the memory-efficient kernel also takes what torch would run on its math
        # path (as attention.efficient_attention does for static sizes)
        with torch.autocast(device, enabled=False):
            out = _cuda_kernel(backend, query, key, value, attn_mask, is_causal, scale)
        if out is not NotImplemented:
            return out
    if not math_path and device != "cuda":
        return NotImplemented  # the CPU flash kernel: torch's C++ handles symbolic sizes
    # the math path (on CUDA also for what no kernel above took: torch's C++ attention there
    # reads plain sizes)
    out_dtype = query.dtype
    # torch's math path on CUDA computes reduced-precision attention in float32
    compute = torch.float32 if device == "cuda" and out_dtype in (torch.float16,
                                                                  torch.bfloat16) else out_dtype
    with torch.autocast(device, enabled=False):
        q, k, v = (t.to(compute) for t in (query, key, value))
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        root = math.sqrt(scale)
        scores = _batched_matmul(q * root, k.transpose(-2, -1) * root)
        if is_causal:
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(keep.logical_not(), float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
            else:
                scores = scores + attn_mask.to(compute)
        weights = torch.ops.aten._safe_softmax(scores, -1)
        return _batched_matmul(weights, v).to(out_dtype)


_RULES = {
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.nn.functional.scaled_dot_product_attention: _sdpa,
    torch._C._nn.scaled_dot_product_attention: _sdpa,
    torch._C._nn.linear: _linear,
    torch.nn.functional.linear: _linear,
    torch.nn.functional.dropout: _dropout,
    torch.dropout: lambda input, p, train: _dropout(input, p, train),
}


class SymbolicComposites(TorchFunctionMode):
    """While active, the composites in `_RULES` run as Python decompositions (see the module)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = _RULES.get(func)
        if rule is not None:
            out = rule(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


__all__ = ["SymbolicComposites"]
