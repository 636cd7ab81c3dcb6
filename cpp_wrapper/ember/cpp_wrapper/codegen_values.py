"""What the C++ wrapper generator reads from an artifact: dtype codes, kernel parameter types,
integer expressions, buffer references, and the layouts and buffers it plans with.

Apart from the generator (codegen.py, which emits the source), so that packaging, decode steps
and custom kernels read an artifact the way the generator does without importing it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import sympy
import torch

from ember.ir import KernelIR, TensorMeta
from ember.ir.codec import value_from_json
from ember.ir.symbols import expr_from_json

from .custom_kernels import copy_pairs
from .errors import UnsupportedArtifactError

READ_IR_VERSIONS = (1,)

# torch dtype -> DLPack (code, bits).
DLPACK_DTYPES = {
    torch.float32: (2, 32),
    torch.float64: (2, 64),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.int64: (0, 64),
    torch.int32: (0, 32),
    torch.int16: (0, 16),
    torch.int8: (0, 8),
    torch.uint8: (1, 8),
    torch.uint16: (1, 16),
    torch.uint32: (1, 32),
    torch.uint64: (1, 64),
    torch.bool: (6, 8),
    torch.complex64: (5, 64),
    torch.complex128: (5, 128),
    torch.float8_e4m3fn: (10, 8),
    torch.float8_e5m2: (12, 8),
}

# Kernel parameter types ("*fp32", "i64", ...) as C++ types.
_SCALAR_C = {
    "fp32": "float",
    "fp64": "double",
    "fp16": "uint16_t",
    "bf16": "uint16_t",
    "i1": "bool",
    "i8": "int8_t",
    "i16": "int16_t",
    "i32": "int32_t",
    "i64": "int64_t",
    "u8": "uint8_t",
    "u16": "uint16_t",
    "u32": "uint32_t",
    "u64": "uint64_t",
}


def c_param_type(arg_type: str) -> str:
    if arg_type.startswith("*"):
        return _SCALAR_C.get(arg_type[1:].lstrip("k"), "void") + "*"
    if arg_type not in _SCALAR_C:
        raise UnsupportedArtifactError(f"kernel parameter type {arg_type!r}")
    return _SCALAR_C[arg_type]


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def dlpack_dtype(dtype: torch.dtype) -> tuple[int, int]:
    if dtype not in DLPACK_DTYPES:
        raise UnsupportedArtifactError(f"dtype {dtype} has no DLPack code the runtime reads")
    return DLPACK_DTYPES[dtype]


def parse_expr(value) -> sympy.Expr:
    """An integer expression in any JSON form a step may carry.

    That is an int, {"expr": e}, {"sym": s} or [head, ...] (ember.ir's expression JSON)."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, dict) and "expr" in value:
        return expr_from_json(value["expr"])
    if isinstance(value, (dict, list)):
        return expr_from_json(value)
    raise UnsupportedArtifactError(f"expected an integer expression, found {value!r}")


@dataclasses.dataclass(frozen=True)
class Ref:
    """A decoded {"node": name} argument: a reference to a buffer."""

    name: str


def buffer_ref(value) -> Optional[str]:
    """The buffer a step argument names, or None for a non-buffer argument."""
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"node"}:
        return value["node"]
    return None


def decode_value(value):
    """A step argument in ember.ir's JSON form as a Python value, with buffers as `Ref`s."""
    return value_from_json(value, Ref)


def step_refs(step) -> set[str]:
    """Every buffer a step reads or writes."""
    names = set(step.outputs)

    def walk(v):
        if isinstance(v, dict):
            if set(v) == {"node"}:
                names.add(v["node"])
            else:
                for x in v.values():
                    walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    if step.kind == "kernel":
        names.update(n for n in map(buffer_ref, step.args) if n)
        names.update(n for pair in copy_pairs(step) for n in pair)
    elif step.kind == "view":
        names.add(buffer_ref(step.args[0]))
    elif step.kind == "extern":
        walk(step.args)
        walk(step.kwargs)
    return names


def packed_entry(kernel: KernelIR) -> bool:
    """Does a C++ kernel take its arguments packed, as `void entry(void** args)`?

    Both conventions exist: an entry with one typed parameter per arg_types item, and the packed
    form that ember.inductor emits (each args[i] points at a tensor's data, or at a scalar)."""
    pattern = rf"\b{re.escape(kernel.entry)}\s*\(\s*void\s*\*\s*\*\s*\w*\s*\)"
    return re.search(pattern, kernel.source) is not None


def c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclasses.dataclass
class Layout:
    dtype: torch.dtype
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr

    @classmethod
    def of(cls, meta: TensorMeta) -> "Layout":
        return cls(meta.dtype, meta.sizes, meta.strides, meta.storage_offset)

    def is_static(self) -> bool:
        return all(e.is_Integer for e in (*self.sizes, *self.strides, self.offset))

    def extent(self) -> sympy.Expr:
        """Elements of storage this layout reaches from storage offset 0 (when it has elements)."""
        return (
            self.offset
            + 1
            + sum(((s - 1) * st for s, st in zip(self.sizes, self.strides)), sympy.S.Zero)
        )

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.sizes) if self.sizes else sympy.S.One

    def static_nbytes(self) -> int:
        return 0 if int(self.numel()) == 0 else int(self.extent()) * itemsize(self.dtype)


@dataclasses.dataclass
class Buf:
    name: str
    kind: str  # input, constant, intermediate, output
    var: str  # the C variable holding its storage base (char*)
    root: str  # the buffer that owns the storage (itself unless a view)
    layout: Layout
    materialised: bool = False


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """How the library reaches a kernel: its entry compiled in, a prebuilt .so, or a cubin."""

    library: str = ""  # path of a prebuilt shared object ("" when compiled into the library)
    cubin: bytes = b""
    # the cubin as `extern "C" const unsigned char SYMBOL[]` of another unit (library_build's
    # data_unit), not an array in the wrapper: "" embeds it in the wrapper
    cubin_symbol: str = ""
