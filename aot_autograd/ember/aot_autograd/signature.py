"""The cache key of a traced program: what about the inputs and the ambient modes a trace assumed."""

from __future__ import annotations

from typing import Hashable

import torch

_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple:
    """Per device type: (enabled, dtype); plus whether autocast's cast cache is on."""
    state = []
    for device in _AUTOCAST_DEVICES:
        enabled = torch.is_autocast_enabled(device)
        state.append((device, enabled, torch.get_autocast_dtype(device) if enabled else None))
    return tuple(state)


def mode_state() -> tuple:
    """Grad mode, inference mode and autocast: a trace is valid only under the same ones."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast_state())


def _tensor_key(t: torch.Tensor) -> tuple:
    # Sizes and strides go in as given: ints now, SymInt-backed expressions once shapes are dynamic.
    return (
        "T",
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
        str(t.device),
        t.requires_grad,
    )


def _const_key(x) -> Hashable:
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"aot_autograd cannot key a compiled program on a {type(x).__name__} argument; pass "
            f"tensors, numbers, strings, dtypes or containers of them"
        ) from None
    return ("C", type(x), x)


def storage_groups(tensors: list[torch.Tensor]) -> tuple:
    """For each tensor, the index of the first input sharing its storage (aliasing inputs)."""
    first: dict[int, int] = {}
    groups = []
    for i, t in enumerate(tensors):
        ptr = _storage_ptr(t)
        groups.append(first.setdefault(ptr, i) if ptr else i)
    return tuple(groups)


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # tensors without storage (meta) alias nothing
        return 0


def input_signature(flat_args: list) -> tuple:
    """The cache key of one call: every flat argument, input aliasing, and the mode state."""
    tensors = [a for a in flat_args if isinstance(a, torch.Tensor)]
    parts = tuple(
        _tensor_key(a) if isinstance(a, torch.Tensor) else _const_key(a) for a in flat_args
    )
    return parts, storage_groups(tensors), mode_state()
