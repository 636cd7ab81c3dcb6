"""The cache key of a traced program: what about the inputs and the ambient modes a trace assumed.

Two forms of one key. `input_signature` keys any flat argument list (tensors and constants);
`tensor_key` is the hot-path form for an all-tensor argument tuple, built with C-level `map`s so a
call pays about half a microsecond per tensor (2-core dev box). Input aliasing is not part of either: a
trace runs on private clones, so it only matters for a program that mutates an input, and the
runtime of such a program checks it on every call (`runtime.check_mutated_aliasing`).
"""

from __future__ import annotations

import operator
from typing import Hashable, Optional

import torch

_AUTOCAST_DEVICES = ("cpu", "cuda")
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode = torch.is_inference_mode_enabled
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)

# Per tensor: what a trace specialises on (besides strides, read by _stride). Sizes and strides go
# in as given: ints now, SymInt-backed expressions once shapes are dynamic.
_tensor_meta = operator.attrgetter("shape", "dtype", "device", "requires_grad")
# Raises TypeError for anything that is not a torch.Tensor: tensor_key relies on it.
_stride = torch.Tensor.stride


def autocast_state() -> tuple:
    """Per device type: (enabled, dtype)."""
    state = []
    for device in _AUTOCAST_DEVICES:
        enabled = torch.is_autocast_enabled(device)
        state.append((device, enabled, torch.get_autocast_dtype(device) if enabled else None))
    return tuple(state)


def mode_state() -> tuple:
    """Grad mode, inference mode and autocast: a trace is valid only under the same ones."""
    if _any_autocast is not None and not _any_autocast():
        autocast = None  # the common case in one C call
    else:
        autocast = autocast_state()
    return (_is_grad_enabled(), _is_inference_mode(), autocast)


def tensor_key(flat: tuple) -> Optional[tuple]:
    """The key of an all-tensor argument tuple, or None if one is not a tensor.

    One flat tuple: (shape, dtype, device, requires_grad) per tensor, then each tensor's strides,
    then the three entries of `mode_state()` (so `key[-3:] == mode_state()`).
    """
    try:
        return (
            *map(_tensor_meta, flat),
            *map(_stride, flat),
            _is_grad_enabled(),
            _is_inference_mode(),
            autocast_state() if _any_autocast is None or _any_autocast() else None,
        )
    except (AttributeError, TypeError):
        return None


def split_tensor_key(key: tuple) -> tuple[tuple, tuple, tuple]:
    """(per-tensor metadata, per-tensor strides, mode state) of a `tensor_key`."""
    n = (len(key) - 3) // 2
    return key[:n], key[n : 2 * n], key[2 * n :]


def _tensor_part(t: torch.Tensor) -> tuple:
    return ("T", tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.requires_grad)


def _const_key(x) -> Hashable:
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"aot_autograd cannot key a compiled program on a {type(x).__name__} argument; pass "
            f"tensors, numbers, strings, dtypes or containers of them"
        ) from None
    return ("C", type(x), x)


def input_signature(flat_args: list) -> tuple:
    """The cache key of one call: every flat argument (tensor or constant) and the mode state."""
    parts = tuple(
        _tensor_part(a) if isinstance(a, torch.Tensor) else _const_key(a) for a in flat_args
    )
    return parts, mode_state()


def storage_ptr(t: torch.Tensor) -> int:
    """The address of t's storage (0 for tensors without one, which alias nothing)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # meta tensors
        return 0
