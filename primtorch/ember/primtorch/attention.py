"""Which kernel a traced `scaled_dot_product_attention` with a mask runs on CUDA.

`F.scaled_dot_product_attention` picks its kernel at dispatch, inside the ATen op, so the tracer
records whatever that choice decomposes to. With an attention mask torch may pick cuDNN (which the
tracer turns off: it has no extern of ours) or the math path, and the math path materializes the
(L, S) scores of every head in float32: two float32 batched matmuls and a softmax over
B*H*L*S elements where one fused kernel would do. While tracing, `AttentionChoice` sends such
inference calls to the memory-efficient kernel (`_scaled_dot_product_efficient_attention`, an
extern) whenever it takes them, and leaves every other call to torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AttentionChoice(TorchFunctionMode):
    """A torch-function mode, active while tracing, for masked CUDA attention (see module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = efficient_attention(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _static(t) -> bool:
    return isinstance(t, torch.Tensor) and all(type(s) is int for s in t.shape)


def autocast_input(t, dtype):
    """`t` as autocast hands it to attention: floating tensors in `dtype` (None: as they are)."""
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def efficient_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                        scale=None, enable_gqa=False):  # fmt: skip
    """The memory-efficient kernel's output for a masked CUDA attention it supports, else None
    (torch then makes its own choice)."""
    q, k, v = query, key, value
    if torch.is_grad_enabled():
        # Training is left to torch's choice: the kernel's backward, traced through functionalize,
        # failed its log-sum-exp alignment check on an H100 (to be looked into).
        return None
    if attn_mask is None or is_causal or enable_gqa:
        return None  # no mask: torch picks flash attention, which is an extern already
    if not all(_static(t) for t in (q, k, v, attn_mask)):
        return None  # symbolic sizes: left to torch
    if not (q.is_cuda and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        return None
    if q.is_nested or q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        return None
    amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    if amp is not None and amp not in (torch.float16, torch.bfloat16):
        return None
    if not (q.dtype in _DTYPES and q.dtype == k.dtype == v.dtype) and amp is None:
        return None
    dtype = amp or q.dtype
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % 8 or v.shape[-1] % 8:
        return None
    batch, heads, length = q.shape[:3]
    source = k.shape[2]
    if attn_mask.dim() > 4 or attn_mask.shape[-1] != source:
        return None
    try:
        torch.broadcast_shapes(attn_mask.shape, (batch, heads, length, source))
    except RuntimeError:
        return None
    q, k, v = (autocast_input(t, amp) for t in (q, k, v))
    bias = efficient_bias(attn_mask, q, dtype)
    if bias is None:
        return None
    try:
        out = aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, False, dropout_p, False, scale=scale
        )
    except RuntimeError:
        return None  # the kernel refused these arguments: torch chooses
    return out[0]


def efficient_bias(attn_mask, query, dtype):
    """`attn_mask` (bool or additive, at most 4-d) as the memory-efficient kernel's additive bias
    in `dtype`: rows padded to a multiple of 16 elements and viewed back (the kernel reads them
    so), broadcast to query's (B, H, L) where its size is 1. Sizes may be ints or SymInts (a
    mask's own length is then another symbol, equal at run time, which the kernel checks).
    None for a mask the kernel does not take."""
    if attn_mask.dim() > 4:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=dtype, device=query.device)
        bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
    elif attn_mask.is_floating_point():
        bias = attn_mask.to(dtype)
    else:
        return None
    source = bias.shape[-1]
    padded = (source + 15) // 16 * 16
    if not (isinstance(padded, int) and padded == source):
        bias = F.pad(bias, (0, padded - source))[..., :source]
    lead = [1] * (4 - bias.dim()) + list(bias.shape[:-1])
    return bias.expand(*(q if n == 1 else n for q, n in zip(query.shape[:3], lead)), source)


# --- a mask that is a constant of the program ----------------------------------------------------

_EFFICIENT_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
                   "is_causal")  # fmt: skip
_BLOCKED = -1e4  # an additive bias at or below this is a masked-out position (-inf, finfo.min)


def _depends_on_inputs(node) -> bool:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return True
        stack.extend(n.all_input_nodes)
    return False


def _constant_mask_kind(bias, length, source):
    """"none" when the bias (additive, or a boolean mask) adds nothing, "causal" when it is the
    causal mask, else None."""
    if bias.dtype == torch.bool:
        allowed, blocked = bias, ~bias
    else:
        allowed, blocked = bias == 0, bias <= _BLOCKED
    if bool(allowed.all()):
        return "none"
    if length != source or not bool((allowed | blocked).all()):
        return None
    causal = torch.ones(length, source, dtype=torch.bool, device=bias.device).tril()
    return "causal" if bool((allowed == causal).all()) else None


def _a_constant(tracer, t) -> bool:
    """Whether `t` is a value the traced program computes from no input (sizes alone)."""
    return tracer.is_traced(t) and not _depends_on_inputs(tracer.node_of(t))


_CPU_FLASH_ARGS = ("query", "key", "value", "dropout_p", "is_causal")


def cpu_flash_arguments(args, kwargs) -> dict:
    """The arguments of `_scaled_dot_product_flash_attention_for_cpu`, by name."""
    return dict(zip(_CPU_FLASH_ARGS, args), **kwargs)


def constant_cpu_mask_kind(tracer, bound: dict):
    """As `constant_mask_kind`, for the CPU flash kernel's `attn_mask` (its arguments `bound`
    by name)."""
    q, k, mask = bound["query"], bound["key"], bound.get("attn_mask")
    if mask is None or bound.get("is_causal") or bound.get("dropout_p", 0.0) != 0.0:
        return None
    if tracer.shape_env is not None or mask.dim() < 2 or not _a_constant(tracer, mask):
        return None
    return _constant_mask_kind(mask, q.shape[2], k.shape[2])


def constant_mask_kind(tracer, args, kwargs):
    """For `_scaled_dot_product_efficient_attention` in inference (called by the tracer with its
    mode off): "none" when the bias is computed from no input of the program (a mask built from
    the sizes alone, as transformers builds one when no attention mask is passed) and is all
    zeros, "causal" when such a bias is exactly the causal mask; the tracer then records the
    flash kernel (no bias, or is_causal) instead. None otherwise."""
    bound = dict(zip(_EFFICIENT_ARGS, args), **kwargs)
    q, k, v, bias = (bound.get(n) for n in ("query", "key", "value", "attn_bias"))
    if bias is None or bound.get("compute_log_sumexp") or bound.get("is_causal"):
        return None
    if bound.get("dropout_p", 0.0) != 0.0 or tracer.shape_env is not None:
        return None
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] > 256 or q.shape[-1] % 8:
        return None
    if v.shape[-1] != q.shape[-1] or not _a_constant(tracer, bias):
        return None
    return _constant_mask_kind(bias, q.shape[2], k.shape[2])
