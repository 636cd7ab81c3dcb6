"""Native kernels for opaque operators: what runtimes without Python call for a user's op.

A user operator (torch.library) stays one opaque node, `extern.custom_op`; a user Triton launch is
the operator `ember::triton_kernel`. The Python wrapper calls them through torch. The C++ wrapper
and standalone packages link neither libtorch nor libpython, so they need something native:

- `register_cpp_kernel(op, source, function)`: the user gives the operator a C++ kernel written
  against the runtime's tensor view (`EmberKernelArgs` of ember_runtime.h: DLPack tensors, the
  op's scalars as ints and floats). ember.cpp_wrapper compiles the source into the model library
  and calls the function with the op's tensors and outputs preallocated from its fake kernel.
- `register_triton_launch(key, launch)`: ember.dynamo records each captured user Triton launch
  (the kernel's Python function, its arguments, autotuning configs and grids), so that
  ember.inductor can compile it ahead of time into a cubin for a CUDA artifact.

Both tables live here, the one module every component may import; they are per process (a
program packaged elsewhere must register its kernels there too).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any, Callable, Optional

import torch

_LOCK = threading.Lock()
_CPP: dict[str, "CppKernel"] = {}
_TRITON: dict[str, "TritonLaunch"] = {}

# How each schema argument type reaches a C++ kernel (see EmberKernelArgs).
_KINDS = {
    "Tensor": "tensor", "Optional[Tensor]": "tensor?", "int": "int", "SymInt": "int",
    "bool": "int", "float": "float", "List[int]": "int[]", "List[SymInt]": "int[]",
    "Optional[int]": "int?", "Optional[float]": "float?",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CppKernel:
    """A user operator's C++ kernel: `function` in `source`, for the op named `op`.

    `kinds` says how each schema argument is passed, in schema order: "tensor" (an input
    DLTensor), "tensor?" (a DLTensor with data NULL when None), "int"/"float" (one entry of
    ints/floats; a bool is an int), "int[]" (its items appended to ints), "int?"/"float?" (a
    presence flag in ints, then the value or 0)."""

    op: str
    source: str
    function: str
    kinds: tuple[str, ...]
    mutated: tuple[int, ...]
    num_outputs: int


def _overload(op):
    """The OpOverload `op` names: a string "ns::name" / "ns::name.overload", an overload, a packet
    or a torch.library.custom_op object."""
    if hasattr(op, "_opoverload"):  # torch.library.custom_op's CustomOpDef
        op = op._opoverload
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if isinstance(op, torch._ops.OpOverload):
        return op
    if not isinstance(op, str) or "::" not in op:
        raise TypeError(f"register_cpp_kernel: {op!r} is not an operator (pass 'ns::name', "
                        "'ns::name.overload' or the op itself)")  # fmt: skip
    ns, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    except (AttributeError, RuntimeError):
        raise ValueError(f"register_cpp_kernel: operator {op} is not defined in this process; "
                         "define it (torch.library) before registering its kernel") from None


def qualified(func) -> str:
    """"ns::name.overload", as extern.custom_op records an operator."""
    return f"{func._schema.name}.{func._overloadname}"


def register_cpp_kernel(op, source: str, function: str) -> CppKernel:
    """Give the user operator `op` a C++ kernel for the C++ wrapper and packages (CPU).

    `source` is C++ that includes "ember_runtime.h" and defines
    `extern "C" int32_t function(const EmberKernelArgs* args)`, returning 0 on success. The
    kernel reads the op's tensor arguments from args->inputs (schema order; an argument the op
    mutates is a private copy the kernel writes in place, as the torch kernel writes its input)
    and writes args->outputs, preallocated with the sizes, strides and dtypes the op's fake kernel
    gives. Scalar arguments arrive in args->ints / args->floats in schema order. Returns the
    registration; registering again replaces it."""
    func = _overload(op)
    if not re.fullmatch(r"[A-Za-z_]\w*", function or ""):
        raise ValueError(f"register_cpp_kernel: function {function!r} is not a C identifier")
    if not isinstance(source, str) or function not in source:
        raise ValueError(f"register_cpp_kernel: the source does not define {function!r}")
    kinds, mutated = [], []
    for i, arg in enumerate(func._schema.arguments):
        kind = _KINDS.get(str(arg.type))
        if kind is None:
            raise NotImplementedError(
                f"register_cpp_kernel: {qualified(func)} takes {arg.name}: {arg.type}; a C++ "
                f"kernel takes tensors, ints, floats, bools and int lists only")  # fmt: skip
        if arg.alias_info is not None and arg.alias_info.is_write:
            if kind != "tensor":
                raise NotImplementedError(f"register_cpp_kernel: {qualified(func)} writes "
                                          f"{arg.name}, which is not a Tensor")  # fmt: skip
            mutated.append(i)
        kinds.append(kind)
    for ret in func._schema.returns:
        if str(ret.type) != "Tensor":
            raise NotImplementedError(f"register_cpp_kernel: {qualified(func)} returns "
                                      f"{ret.type}; a C++ kernel returns tensors only")  # fmt: skip
    kernel = CppKernel(qualified(func), source, function, tuple(kinds), tuple(mutated),
                       len(func._schema.returns))  # fmt: skip
    with _LOCK:
        _CPP[kernel.op] = kernel
    return kernel


def cpp_kernel(op: str) -> Optional[CppKernel]:
    """The C++ kernel registered for the operator named "ns::name.overload", or None."""
    with _LOCK:
        return _CPP.get(op)


def unregister_cpp_kernel(op) -> None:
    """Forget the C++ kernel of `op` (tests; a program that replaces its ops)."""
    with _LOCK:
        _CPP.pop(qualified(_overload(op)), None)


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """One launch configuration of a user Triton kernel: constexpr values it sets, and its grid."""

    kwargs: dict
    num_warps: int
    num_stages: int
    grid: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TritonLaunch:
    """A captured `kernel[grid](*args, **kwargs)` (see ember.dynamo.user_kernels).

    `fn` is the Python function under `@triton.jit`; `arguments` lists (parameter name, value)
    for each argument the launch passed, a value being `TENSOR(i)` for the i-th tensor of the
    `ember::triton_kernel` node; `configs` has one entry per autotuning config (one for a plain
    kernel) and `chosen()` the index of the one to compile ahead of time (autotuning's pick when
    it ran in this process, else the first)."""

    name: str
    fn: Callable
    arguments: tuple[tuple[str, Any], ...]
    configs: tuple[TritonConfig, ...]
    chosen: Callable[[], int] = lambda: 0


@dataclasses.dataclass(frozen=True)
class TENSOR:
    """The tensor argument at `index` of an `ember::triton_kernel` node."""

    index: int


def register_triton_launch(key: str, launch: TritonLaunch) -> None:
    with _LOCK:
        _TRITON.setdefault(key, launch)


def triton_launch(key: str) -> Optional[TritonLaunch]:
    """The launch an `ember::triton_kernel` node's key names; None if traced in another process."""
    with _LOCK:
        return _TRITON.get(key)


TRITON_KERNEL_OP = "ember::triton_kernel.default"

__all__ = ["CppKernel", "TENSOR", "TRITON_KERNEL_OP", "TritonConfig", "TritonLaunch", "cpp_kernel",
           "qualified", "register_cpp_kernel", "register_triton_launch", "triton_launch",
           "unregister_cpp_kernel"]  # fmt: skip
