"""User operators in the C++ wrapper: an `extern.custom_op` step calls the op's C++ kernel.

`ember.register_cpp_kernel` (ember.ir.native_kernels) gives a torch.library operator a C++ kernel
on the runtime's tensor view. Its source is compiled into the model library with the wrapper (the
same compiler driver), and the step becomes a call `fn(&args)` with an `EmberKernelArgs`: the
op's tensor arguments as DLTensors, its outputs preallocated from the plan (their layouts are the
fake kernel's), its scalars as ints and floats. An argument the op mutates is copied first into
the step's buffer for its new value (the graph is functional: the op's new value is an output of
the step), and the kernel writes that copy in place. Ops without a C++ kernel, and C++ kernels on
CUDA artifacts, are refused with the op's name. Also here: the `copy_in` pairs of a kernel step
(a user Triton kernel's private copies, see ember.inductor.user_triton).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.ir import CompiledArtifact
from ember.ir.native_kernels import TRITON_KERNEL_OP, CppKernel, cpp_kernel

from .errors import UnsupportedArtifactError

if TYPE_CHECKING:
    from .codegen import WrapperCodegen

def copy_pairs(step) -> list:
    """A kernel step's `copy_in` pairs [dst, src]: storage filled from src before the launch (a
    user Triton kernel writes private copies of its tensors; see ember.inductor.user_triton)."""
    pairs = step.kwargs.get("copy_in", ()) if isinstance(step.kwargs, dict) else ()
    return [(str(dst), str(src)) for dst, src in pairs]


def dense(layout) -> bool:
    """Static sizes and strides that cover exactly numel elements (any order of dimensions)."""
    if not layout.is_static():
        return False
    dims = sorted((int(st), int(sz)) for sz, st in zip(layout.sizes, layout.strides) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def custom_op_name(step) -> str:
    args = step.args if isinstance(step.args, (list, tuple)) else [step.args]
    return args[0] if args and isinstance(args[0], str) else "?"


def used_kernels(artifact: CompiledArtifact) -> list[CppKernel]:
    """The registered C++ kernels an artifact's custom_op steps call, one per function name."""
    found: dict[str, CppKernel] = {}
    for step in artifact.steps:
        if step.kind != "extern" or step.target != "extern.custom_op":
            continue
        kernel = cpp_kernel(custom_op_name(step))
        if kernel is None:
            continue
        other = found.get(kernel.function)
        if other is not None and other.source != kernel.source:
            raise UnsupportedArtifactError(
                f"the C++ kernels of {other.op} and {kernel.op} are both named "
                f"{kernel.function!r}; give them different function names")  # fmt: skip
        found[kernel.function] = kernel
    return list(found.values())


def declarations(artifact: CompiledArtifact) -> list[str]:
    return [f'extern "C" int32_t {k.function}(const EmberKernelArgs*);  // custom op {k.op}'
            for k in used_kernels(artifact)]  # fmt: skip


def missing_kernel_message(op: str, args) -> str:
    if op == TRITON_KERNEL_OP:
        inner = args[1] if len(args) > 1 else None
        name = str(inner[0] if isinstance(inner, (list, tuple)) and inner else "?").split(":")[0]
        return (f"the user Triton kernel {name} (launched from compiled code) runs in a CUDA "
                "artifact only, compiled ahead of time to a cubin (ember.inductor.triton_aot."
                "attach_cubins does it for packages and cpp_wrapper=True); on the CPU Triton runs "
                "only in its interpreter, which needs Python: run this program with the Python "
                "wrapper (ember.compile without cpp_wrapper)")  # fmt: skip
    return (f"the custom operator {op} (torch.library) has no C++ kernel: the C++ wrapper and "
            "standalone packages cannot call it; give it one with ember.register_cpp_kernel("
            f"{op.rsplit('.', 1)[0]!r}, source, function) or run this program with the Python "
            "wrapper (ember.compile without cpp_wrapper)")  # fmt: skip


def _float(value) -> str:
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(v)


def emit_custom_op(g: "WrapperCodegen", step, args: list) -> None:
    """Emit the call of a custom op's C++ kernel for `step` (args decoded, buffers as Refs)."""
    from .codegen_values import buffer_ref, dlpack_dtype, parse_expr

    op = args[0] if args else "?"
    kernel = cpp_kernel(op)
    if kernel is None:
        raise UnsupportedArtifactError(missing_kernel_message(op, args))
    if g.cuda:
        raise UnsupportedArtifactError(
            f"the custom operator {op} has a C++ kernel for the CPU ({kernel.function}); a CUDA "
            "artifact cannot call it: run this program with the Python wrapper")  # fmt: skip
    values = list(args[1]) if len(args) > 1 else []
    mutated = [int(i) for i in (args[2] if len(args) > 2 else [])]
    if len(values) != len(kernel.kinds) or tuple(mutated) != kernel.mutated:
        raise UnsupportedArtifactError(
            f"the custom operator {op} was registered with another schema than the graph's "
            f"({len(kernel.kinds)} arguments, mutating {list(kernel.mutated)}; the graph passes "
            f"{len(values)}, mutating {mutated})")  # fmt: skip
    n_out = len(step.outputs) - len(mutated)
    if n_out != kernel.num_outputs:
        raise UnsupportedArtifactError(f"custom operator {op}: {n_out} outputs in the plan, the "
                                       f"schema returns {kernel.num_outputs}")  # fmt: skip
    g.emit("{")
    tensors: list[str] = []  # DLTensor initialisers
    setup: list[str] = []

    def dl_tensor(buf) -> str:
        j = len(setup)
        lay = buf.layout
        sizes = ", ".join(g.cexpr(s) for s in lay.sizes) or "0"
        strides = ", ".join(g.cexpr(s) for s in lay.strides) or "0"
        setup.append(f"  int64_t sh{j}[] = {{{sizes}}};")
        setup.append(f"  int64_t st{j}[] = {{{strides}}};")
        code, bits = dlpack_dtype(lay.dtype)
        return (f"{{const_cast<void*>(static_cast<const void*>({g.data_ptr(buf)})), {{kDLCPU, 0}}, "
                f"{len(lay.sizes)}, {{{code}, {bits}, 1}}, sh{j}, st{j}, 0}}")  # fmt: skip

    new_value = {i: g.buf(step.outputs[n_out + j]) for j, i in enumerate(mutated)}
    for i, dst in new_value.items():  # the op writes a private copy: its new value's buffer
        g.copy_into(dst, g.buf(buffer_ref(values[i])), f"custom operator {op}")
    ints: list[str] = []
    floats: list[str] = []
    for i, (kind, value) in enumerate(zip(kernel.kinds, values)):
        if kind in ("tensor", "tensor?"):
            ref = buffer_ref(value) if value is not None else None
            if ref is None and kind == "tensor":
                raise UnsupportedArtifactError(f"custom operator {op}: argument {i} is not a "
                                               "tensor buffer")  # fmt: skip
            if ref is None:
                tensors.append("{nullptr, {kDLCPU, 0}, 0, {2, 32, 1}, nullptr, nullptr, 0}")
            else:
                tensors.append(dl_tensor(new_value.get(i) or g.buf(ref)))
        elif kind in ("int?", "float?"):
            ints.append("1" if value is not None else "0")
            if kind == "int?":
                ints.append("0" if value is None else g.cexpr(parse_expr(value)))
            else:
                floats.append("0.0" if value is None else _float(value))
        elif kind == "int":
            ints.append(g.cexpr(parse_expr(value)))
        elif kind == "float":
            floats.append(_float(value))
        elif kind == "int[]":
            ints.extend(g.cexpr(parse_expr(v)) for v in value)
    outputs = [dl_tensor(g.buf(name)) for name in step.outputs[:n_out]]
    for line in setup:
        g.emit(line)
    g.emit(f"  const DLTensor ins[] = {{{', '.join(tensors) or '{}'}}};")
    g.emit(f"  const DLTensor outs[] = {{{', '.join(outputs) or '{}'}}};")
    g.emit(f"  const int64_t ints[] = {{{', '.join(f'(int64_t)({v})' for v in ints) or '0'}}};")
    g.emit(f"  const double floats[] = {{{', '.join(floats) or '0.0'}}};")
    counts = f"{len(tensors)}, {len(outputs)}, outs, ints, floats, {len(ints)}, {len(floats)}"
    g.emit(f"  const EmberKernelArgs ka = {{ins, {counts}, nullptr}};")
    message = f"custom operator {op}: its C++ kernel {kernel.function} returned a non-zero status"
    g.emit(f"  if ({kernel.function}(&ka) != 0) return h->fail(c, EMBER_ERR_RUNTIME, "
           f"{_c_string(message)});")  # fmt: skip
    g.emit("}")


def _c_string(text: str) -> str:
    from .codegen_values import c_string

    return c_string(text)
