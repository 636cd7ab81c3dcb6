"""TensorMeta: what a value is (dtype, sizes, strides, device), with sizes as sympy expressions."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import sympy
import torch

from .symbols import as_expr

# The `node.meta` key under which every value of a graph that crosses a component boundary carries
# its TensorMeta (a tuple of them for a node with several tensor outputs, None for a non-tensor).
NODE_META_KEY = "ember_meta"
# The `node.meta` key (value True) of a torch-level node whose value the backward should compute
# again rather than keep from the forward (ops inside torch.utils.checkpoint); partitioners of
# the joint graph carry it to the nodes the op decomposes into.
RECOMPUTE_META_KEY = "ember_recompute"
# The `node.meta` key (value True) of a placeholder whose caller's tensor is written after the
# graph returns (a frame input a custom autograd.Function marked dirty, dynamo writes it back):
# partitioners must not save it for the backward, as they save no input the graph mutates.
WRITTEN_AFTER_CALL_META_KEY = "ember_written_after_call"
# The `gm.meta` key of an inference graph whose inputs the caller's runtime overwrites with some
# of its outputs after the call: {output position: input position}. A compiler may compute such
# an output in the input's own memory (the runtime's copy is then skipped), where nothing else
# reads the input's old value.
INPUT_UPDATES_META_KEY = "ember_input_updates"
# The `gm.meta` key (value True) of a graph whose caller's guards pin every tensor input (the
# graph's own parameters and buffers too) to the sizes, strides, dtype, device and
# requires_grad of the call it was traced on: the runtime need not key each call by them.
GUARDED_INPUTS_META_KEY = "ember_guarded_inputs"
# The `gm.meta` key dynamo sets on each graph it hands a backend: the `fullgraph` it captured
# under. False: what a compile made later (at the graph's first call) cannot compile runs the
# graph eagerly, as at capture; True, or no key (a graph from another caller): it raises.
FULLGRAPH_META_KEY = "ember_fullgraph"

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.bool,
        torch.uint64, torch.uint32, torch.uint16, torch.uint8,
        torch.complex64, torch.complex128,
        torch.float8_e4m3fn, torch.float8_e5m2,
    )
}  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    """The schema's name of a torch dtype ("float32")."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"dtype {dtype} is not in the Ember IR schema")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of `dtype_name`."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} in serialised IR") from None


def contiguous_strides(sizes) -> tuple[sympy.Expr, ...]:
    """Row-major strides for `sizes`, as torch computes them (a size-0 dimension counts as 1)."""
    return _contiguous_strides(tuple(as_expr(s) for s in sizes))


# Asked for the same sizes over and over by lowering (each view, each new buffer); sympy's Max
# and products make each answer cost far more than looking it up.
@functools.lru_cache(maxsize=1 << 14)
def _contiguous_strides(sizes: tuple) -> tuple[sympy.Expr, ...]:
    strides, running = [], sympy.S.One
    for size in reversed(sizes):
        strides.append(running)
        running = running * sympy.Max(as_expr(size), 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=256)
def _device_name(device) -> str:
    """str(torch.device(device)), remembered: every TensorMeta normalises its device, and a
    trace makes thousands of them on one or two devices."""
    return str(torch.device(device))


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """Dtype, sizes, strides, storage offset, device and requires_grad of one tensor value."""

    dtype: torch.dtype
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    storage_offset: sympy.Expr = sympy.S.Zero
    device: str = "cpu"
    requires_grad: bool = False

    def __post_init__(self):
        # Accept ints (and SymInts of ours) anywhere a size goes; store sympy expressions only.
        object.__setattr__(self, "sizes", tuple(as_expr(s) for s in self.sizes))
        object.__setattr__(self, "strides", tuple(as_expr(s) for s in self.strides))
        object.__setattr__(self, "storage_offset", as_expr(self.storage_offset))
        object.__setattr__(self, "device", _device_name(self.device))
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"TensorMeta has {len(self.sizes)} sizes but {len(self.strides)} strides")

    def __repr__(self) -> str:
        # The dataclass's own form, remembered by value: graph cache keys print every node's
        # meta (~27 us each through sympy's printer; a training graph has thousands, most alike).
        return _meta_repr(self)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(
            dtype=t.dtype,
            sizes=tuple(t.shape),
            strides=tuple(t.stride()),
            storage_offset=t.storage_offset(),
            device=str(t.device),
            requires_grad=t.requires_grad,
        )

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.sizes) if self.sizes else sympy.S.One

    def is_static(self) -> bool:
        return all(e.is_Integer for e in (*self.sizes, *self.strides, self.storage_offset))

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.sizes)
        return all(
            size == 1 or stride == want
            for size, stride, want in zip(self.sizes, self.strides, expected)
        )

    def nbytes(self) -> sympy.Expr:
        """Bytes this value occupies if stored densely (what saving it for backward costs)."""
        return self.numel() * _itemsize(self.dtype)

    def describe(self) -> str:
        sizes = ", ".join(str(s) for s in self.sizes)
        return f"{dtype_name(self.dtype)}[{sizes}]@{self.device}"


@functools.lru_cache(maxsize=1 << 14)
def _meta_repr(meta: TensorMeta) -> str:
    fields = ", ".join(f"{f.name}={getattr(meta, f.name)!r}" for f in dataclasses.fields(meta))
    return f"{type(meta).__qualname__}({fields})"


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def meta_of(node) -> Optional[TensorMeta]:
    """The TensorMeta an fx node carries under NODE_META_KEY (None when it has none)."""
    return node.meta.get(NODE_META_KEY)
