"""Example values without data: tensors that carry a value's metadata and hold no memory.

A compiler component hands graphs on with example values (dynamo's `node.meta["example_value"]`,
the example inputs of a forward or backward compiler). Real tensors there pin memory the program
will never read: every intermediate of a captured forward, a backward's saved activations
allocated only to be looked at. `MetadataOnly` reports sizes, strides, storage offset, dtype,
device (the real one, not "meta") and requires_grad, and refuses any op with an error that says
it has no data.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map_only

from .meta import TensorMeta


class MetadataOnly(torch.Tensor):
    """A tensor of a value's metadata alone; reading its data (any op) raises."""

    @staticmethod
    def __new__(cls, sizes, strides, storage_offset, dtype, device, requires_grad):
        return torch.Tensor._make_wrapper_subclass(
            cls, sizes, strides, storage_offset=storage_offset, dtype=dtype,
            device=device, requires_grad=requires_grad,
        )  # fmt: skip

    def __repr__(self):
        return (f"MetadataOnly(size={tuple(self.shape)}, stride={self.stride()}, "
                f"dtype={self.dtype}, device={self.device})")  # fmt: skip

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Ops that read metadata only are answered; anything else would need the values.
        if func is torch.ops.aten.detach.default:
            (t,) = args
            return MetadataOnly(t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, False)
        raise RuntimeError(
            f"{func}: an example value of shape {tuple(args[0].shape) if args else ()} has no "
            "data (ember keeps only metadata of example values, so that compiling holds no "
            "activations); use its sizes, strides, dtype and device, or the real inputs of a call"
        )


def metadata_only(t):
    """`t` as a MetadataOnly tensor (anything that is not a tensor is returned as it is)."""
    if not isinstance(t, torch.Tensor) or type(t) is MetadataOnly:
        return t
    return MetadataOnly(t.shape, t.stride(), t.storage_offset(), t.dtype, t.device,
                        t.requires_grad)  # fmt: skip


def metadata_only_tree(value):
    """Every tensor of a pytree (tuples, lists, dicts) as MetadataOnly."""
    return tree_map_only(torch.Tensor, metadata_only, value)


def example_of(meta: TensorMeta, hint=int):
    """A MetadataOnly tensor of a (static, or hinted with `hint`) TensorMeta."""
    return MetadataOnly([hint(s) for s in meta.sizes], [hint(s) for s in meta.strides],
                        hint(meta.storage_offset), meta.dtype, meta.device,
                        meta.requires_grad)  # fmt: skip
