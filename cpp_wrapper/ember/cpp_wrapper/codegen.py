"""C++ wrapper generation: a CompiledArtifact (IR v1) becomes the source of a model library.

The generated `run` function validates the inputs (dtype, rank, sizes, strides), binds dynamic
sizes from input shapes, checks symbol ranges and guards, then performs the plan's steps in order:
allocations from the runtime's pool, CPU kernel calls through function pointers resolved once at
load, Triton launches and extern ops through the runtime, frees, and finally hands the outputs to
the runtime. Everything about the model (inputs, outputs, constants, kernels) is described by a
static ModelDesc that the runtime reads (csrc/detail/model_abi.h).
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

import sympy
import torch

from ember.ir import CompiledArtifact, KernelIR, contiguous_strides

from .cexpr import CExprPrinter, int_literal
from .codegen_values import (
    READ_IR_VERSIONS,
    Buf,
    KernelBuild,
    Layout,
    buffer_ref,
    c_param_type,
    c_string,
    decode_value,
    dlpack_dtype,
    itemsize,
    packed_entry,
    parse_expr,
    step_refs,
)
from .custom_kernels import copy_pairs, declarations, dense, emit_custom_op
from .errors import UnsupportedArtifactError
from .extern_ops import OP_COPY, OP_INDEX_COPY, bind_extern


class WrapperCodegen:
    """Generates the model library's C++ source from one artifact."""

    def __init__(
        self,
        artifact: CompiledArtifact,
        *,
        artifact_hash: str,
        isa: str,
        kernels: Mapping[str, KernelBuild] = None,
    ):
        if artifact.ir_version not in READ_IR_VERSIONS:
            raise UnsupportedArtifactError(
                f"artifact of IR version {artifact.ir_version}; "
                f"ember.cpp_wrapper reads {READ_IR_VERSIONS}"
            )
        self.a = artifact
        self.hash = artifact_hash
        self.isa = isa
        self.builds = dict(kernels or {})
        self.device = torch.device(artifact.device)
        if self.device.type not in ("cpu", "cuda"):
            raise UnsupportedArtifactError(f"artifact for device {artifact.device}")
        self.cuda = self.device.type == "cuda"
        self.kernel_index = {k.name: i for i, k in enumerate(artifact.kernels)}
        self.constants = [b for b in artifact.buffers if b.kind == "constant"]
        self.bufs: dict[str, Buf] = {}
        for i, b in enumerate(artifact.buffers):
            if b.kind not in ("input", "constant", "intermediate", "output"):
                raise UnsupportedArtifactError(f"buffer {b.name} has unknown kind {b.kind!r}")
            self.bufs[b.name] = Buf(b.name, b.kind, f"B{i}", b.name, Layout.of(b.meta))
        self.sym_vars = {
            s.name: f"s_{re.sub(r'[^0-9A-Za-z_]', '_', s.name)}" for s in artifact.symbols
        }
        self.cexpr = CExprPrinter(self.sym_vars)
        self.body: list[str] = []
        self.output_roots: set[str] = set()

    # ---- entry point ------------------------------------------------------------------------

    def generate(self) -> str:
        self.check_kernels()
        self.bind_inputs()
        self.bind_constants()
        self.output_roots = self.plan_output_roots()
        last_use = self.plan_last_uses()
        for i, step in enumerate(self.a.steps):
            self.step(step)
            for root in sorted(r for r, j in last_use.items() if j == i):
                self.release(root)
        self.emit_outputs()
        return (
            "\n".join(
                [
                    *self.prologue(),
                    *self.descriptors_before_run(),
                    *self.run_function(),
                    *self.descriptors_after_run(),
                ]
            )
            + "\n"
        )

    def emit(self, line: str) -> None:
        self.body.append("  " + line)

    def emit_check(self, call: str) -> None:
        """A host or helper call that returns a status: return it when it is not 0."""
        self.emit(f"if ((st = {call})) return st;")

    # ---- inputs, symbols, guards --------------------------------------------------------------

    def bind_inputs(self) -> None:
        bound: set[str] = set()
        deferred: list[tuple[str, str, int, sympy.Expr]] = []
        for i, name in enumerate(self.a.inputs):
            buf = self.bufs.get(name)
            if buf is None or buf.kind != "input":
                raise UnsupportedArtifactError(f"artifact input {name!r} is not an input buffer")
            code, bits = dlpack_dtype(buf.layout.dtype)
            t, q = f"in{i}", c_string(name)
            self.emit(f"const DLTensor* {t} = a->inputs[{i}];")
            ndim = len(buf.layout.sizes)
            self.emit_check(f"ember_abi::check_input(a, {t}, {q}, {code}, {bits}, {ndim})")
            for d, size in enumerate(buf.layout.sizes):
                if size.is_Symbol and size.name not in bound and size.name in self.sym_vars:
                    self.emit(f"const int64_t {self.sym_vars[size.name]} = {t}->shape[{d}];")
                    bound.add(size.name)
                else:
                    deferred.append((t, q, d, size))
        unbound = set(self.sym_vars) - bound
        if unbound:
            raise UnsupportedArtifactError(
                f"dynamic sizes {sorted(unbound)} appear in no input's shape; "
                "the wrapper cannot bind them"
            )
        for t, q, d, size in deferred:
            self.emit_check(f"ember_abi::check_size(a, {t}, {q}, {d}, {self.cexpr(size)})")
        for spec in self.a.symbols:
            upper = -1 if spec.upper is None else spec.upper
            var, name = self.sym_vars[spec.name], c_string(spec.name)
            lower, upper = int_literal(spec.lower), int_literal(upper)
            self.emit_check(f"ember_abi::check_range(a, {name}, {var}, {lower}, {upper})")
        for i, name in enumerate(self.a.inputs):
            buf = self.bufs[name]
            for d, stride in enumerate(buf.layout.strides):
                want = self.cexpr(stride)
                self.emit_check(f"ember_abi::check_stride(a, in{i}, {c_string(name)}, {d}, {want})")
        for guard in self.a.guards:
            self.emit(
                f"if (!{self.cexpr(guard)}) return h->fail(c, EMBER_ERR_GUARD, "
                f"{c_string(f'shape guard failed: {guard}')});"
            )
        # On CUDA an input's data pointer is 16-byte aligned here: the runtime runs a misaligned
        # input from an aligned copy (ember_runtime.h), so the Triton cubins may take pointers
        # into inputs as aligned (ember.inductor's triton_hints); constants' storage and pool
        # allocations are aligned too.
        for i, name in enumerate(self.a.inputs):
            buf = self.bufs[name]
            self.emit(
                f"char* {buf.var} = ember_abi::input_ptr(in{i}){self.minus_offset(buf.layout)};"
            )
            buf.materialised = True

    def bind_constants(self) -> None:
        for j, b in enumerate(self.constants):
            buf = self.bufs[b.name]
            base = f"ember_abi::input_ptr(a->constants[{j}]){self.minus_offset(buf.layout)}"
            self.emit(f"char* {buf.var} = {base};")
            buf.materialised = True

    def minus_offset(self, layout: Layout) -> str:
        if layout.offset == 0:
            return ""
        return f" - ({self.cexpr(layout.offset)}) * {itemsize(layout.dtype)}"

    def plan_roots(self) -> dict[str, str]:
        """Each buffer's storage owner, following view steps (as `view` will when emitting)."""
        roots = {}
        for step in self.a.steps:
            if step.kind == "view":
                src = buffer_ref(step.args[0])
                roots[step.outputs[0]] = roots.get(src, src)
        return roots

    def plan_output_roots(self) -> set[str]:
        roots = self.plan_roots()
        return {roots.get(name, name) for name in self.a.outputs}

    def plan_last_uses(self) -> dict[str, int]:
        """The step after which each allocated storage is dead.

        Storage is released by liveness, not at the plan's "free" steps: a plan may free a buffer
        and later reuse its storage through a view of it (ember.inductor's buffer reuse), so the
        storage lives until the last step that touches any buffer sharing it."""
        roots = self.plan_roots()
        last: dict[str, int] = {}
        for i, step in enumerate(self.a.steps):
            for name in step_refs(step):
                last[roots.get(name, name)] = i
        return {
            r: i
            for r, i in last.items()
            if r in self.bufs
            and self.bufs[r].kind in ("intermediate", "output")
            and r not in self.output_roots
        }

    # ---- steps --------------------------------------------------------------------------------

    def buf(self, name: str) -> Buf:
        if name not in self.bufs:
            raise UnsupportedArtifactError(f"a step uses the unknown buffer {name!r}")
        buf = self.bufs[name]
        if not buf.materialised:  # a plan may leave the allocation of a written buffer implicit
            self.alloc(buf)
        return buf

    def alloc(self, buf: Buf) -> None:
        if buf.kind not in ("intermediate", "output"):
            raise UnsupportedArtifactError(f"cannot allocate {buf.kind} buffer {buf.name}")
        lay = buf.layout
        if lay.is_static():
            nbytes = int_literal(lay.static_nbytes())
        else:
            nbytes = (
                f"({self.cexpr(lay.numel())} == 0 ? 0 : {self.cexpr(lay.extent())} * "
                f"{itemsize(lay.dtype)})"
            )
        self.emit(f"{buf.var} = static_cast<char*>(h->alloc(c, {nbytes}));")
        what = c_string(f"allocating {buf.name}")
        self.emit(f"if (!{buf.var}) return h->fail(c, EMBER_ERR_OUT_OF_MEMORY, {what});")
        buf.materialised = True

    def step(self, step) -> None:
        kind = step.kind
        if kind == "alloc":
            buf = self.bufs.get(step.outputs[0])
            if buf is None:
                raise UnsupportedArtifactError(f"alloc of unknown buffer {step.outputs[0]!r}")
            if not buf.materialised:
                self.alloc(buf)
        elif kind == "free":
            pass  # storage is released by liveness (see plan_last_uses)
        elif kind == "kernel":
            self.kernel_call(step)
        elif kind == "extern":
            self.extern_call(step)
        elif kind == "view":
            self.view(step)
        else:
            raise UnsupportedArtifactError(f"step kind {kind!r}")

    def release(self, root: str) -> None:
        buf = self.bufs[root]
        if buf.materialised and buf.root == root:
            self.emit(f"h->release(c, {buf.var});  // {root} is dead")

    def view(self, step) -> None:
        src = self.buf(buffer_ref(step.args[0]))
        out = self.bufs.get(step.outputs[0])
        if out is None:
            raise UnsupportedArtifactError(f"view into unknown buffer {step.outputs[0]!r}")
        if len(step.args) > 1 and step.args[1] is not None:
            sizes, strides, offset = step.args[1]
            out.layout = Layout(
                out.layout.dtype,
                tuple(map(parse_expr, sizes)),
                tuple(map(parse_expr, strides)),
                parse_expr(offset),
            )
        out.root = src.root
        self.emit(f"{out.var} = {src.var};  // {out.name}: view of {src.name}")
        out.materialised = True

    def data_ptr(self, buf: Buf) -> str:
        lay = buf.layout
        if lay.offset == 0:
            return buf.var
        return f"({buf.var} + ({self.cexpr(lay.offset)}) * {itemsize(lay.dtype)})"

    def view_struct(self, buf: Optional[Buf]) -> str:
        if buf is None:
            return "{nullptr, {2, 32, 1}, 0, {}, {}}"
        lay = buf.layout
        if len(lay.sizes) > 8:
            raise UnsupportedArtifactError(f"{buf.name} has more than 8 dimensions")
        code, bits = dlpack_dtype(lay.dtype)
        sizes = ", ".join(self.cexpr(s) for s in lay.sizes)
        strides = ", ".join(self.cexpr(s) for s in lay.strides)
        head = f"{self.data_ptr(buf)}, {{{code}, {bits}, 1}}, {len(lay.sizes)}"
        return f"{{{head}, {{{sizes}}}, {{{strides}}}}}"

    def scalar(self, value, arg_type: str) -> str:
        if arg_type in ("fp32", "fp64"):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return repr(float(value))
            if isinstance(value, dict) and "float" in value:
                return {"inf": "INFINITY", "-inf": "-INFINITY", "nan": "NAN"}[value["float"]]
        return f"static_cast<{c_param_type(arg_type)}>({self.cexpr(parse_expr(value))})"

    def kernel_call(self, step) -> None:
        if step.target not in self.kernel_index:
            raise UnsupportedArtifactError(f"a step launches the unknown kernel {step.target!r}")
        k = self.a.kernels[self.kernel_index[step.target]]
        if len(step.args) != len(k.arg_types):
            raise UnsupportedArtifactError(
                f"kernel {k.name}: {len(step.args)} arguments for {len(k.arg_types)} parameters"
            )
        for dst, src in copy_pairs(step):
            self.copy_into(self.buf(dst), self.buf(src), k.name)
        values = []
        for value, ty in zip(step.args, k.arg_types):
            ref = buffer_ref(value)
            if ty.startswith("*"):
                if ref is None:
                    raise UnsupportedArtifactError(
                        f"kernel {k.name}: pointer parameter given {value!r}"
                    )
                values.append(
                    f"reinterpret_cast<{c_param_type(ty)}>({self.data_ptr(self.buf(ref))})"
                )
            else:
                values.append(self.scalar(value, ty))
        index = self.kernel_index[k.name]
        if k.language == "cpp" and packed_entry(k):
            self.emit("{")
            slots = []
            for j, (value, ty) in enumerate(zip(values, k.arg_types)):
                if ty.startswith("*"):
                    slots.append(f"const_cast<void*>(static_cast<const void*>({value}))")
                else:  # a scalar travels as a pointer to it
                    self.emit(f"  {c_param_type(ty)} s{j} = {value};")
                    slots.append(f"&s{j}")
            self.emit(f"  void* args[] = {{{', '.join(slots) or 'nullptr'}}};")
            self.emit(
                f"  reinterpret_cast<void (*)(void**)>(a->kernels[{index}])(args);  // {k.name}"
            )
            self.emit("}")
            return
        if k.language == "cpp":
            fn_type = f"void (*)({', '.join(c_param_type(t) for t in k.arg_types)})"
            call = f"reinterpret_cast<{fn_type}>(a->kernels[{index}])"
            self.emit(f"{call}({', '.join(values)});  // {k.name}")
            return
        grid = (step.kwargs or {}).get("grid") if isinstance(step.kwargs, dict) else None
        grid = [parse_expr(g) for g in grid] if grid else list(k.grid)
        grid = [self.cexpr(g) for g in grid] + ["1"] * (3 - len(grid))
        self.emit("{")
        names = []
        for j, (value, ty) in enumerate(zip(values, k.arg_types)):
            ctype = "void*" if ty.startswith("*") else c_param_type(ty)
            self.emit(f"  {ctype} p{j} = {value};")
            names.append(f"&p{j}")
        # Triton >= 3.3 kernels take two trailing scratch pointers (global and profile scratch).
        self.emit("  void* scratch0 = nullptr;")
        self.emit("  void* scratch1 = nullptr;")
        args = ", ".join([*names, "&scratch0", "&scratch1"])
        self.emit(f"  void* args[] = {{{args}}};")
        gx, gy, gz = (f"static_cast<uint32_t>({g})" for g in grid)
        self.emit(
            f"  if ((st = h->launch(c, {index}, {gx}, {gy}, {gz}, args))) return st;  // {k.name}"
        )
        self.emit("}")

    def copy_into(self, dst: Buf, src: Buf, kernel: str) -> None:
        """dst = src (equal layouts), through the runtime's copy: strided on the CPU, a dense
        memcpy on CUDA."""
        same = dst.layout.sizes == src.layout.sizes and dst.layout.strides == src.layout.strides
        if not same or (self.cuda and not dense(dst.layout)):
            raise UnsupportedArtifactError(
                f"kernel {kernel}: the copy of {src.name} it writes needs the same dense layout "
                f"as the tensor (got sizes {dst.layout.sizes}, strides {dst.layout.strides})")
        self.emit(f"{{ const ember_abi::View cp[] = {{{self.view_struct(dst)}, "
                  f"{self.view_struct(src)}}};  // {dst.name} = {src.name}")  # fmt: skip
        copy = f"h->extern_op(c, {OP_COPY}, cp, 2, nullptr, 0, nullptr, 0)"
        self.emit(f"  if ((st = {copy})) return st; }}")

    def extern_call(self, step) -> None:
        args = step.args if isinstance(step.args, (list, tuple)) else [step.args]
        args = [decode_value(v) for v in args]
        if step.target == "extern.custom_op":  # a user operator's registered C++ kernel
            return emit_custom_op(self, step, args)
        if step.target == "prims.index_put" and (step.kwargs or {}).get("in_place"):
            return self.index_copy_in_place(step, args)
        kwargs = {k: decode_value(v) for k, v in (step.kwargs or {}).items()}
        spec, bound = bind_extern(step.target, args, kwargs, self.device.type)
        if len(step.outputs) != spec.outputs:
            raise UnsupportedArtifactError(
                f"{step.target} with {len(step.outputs)} outputs (the runtime writes "
                f"{spec.outputs})"
            )
        first = buffer_ref(bound[spec.tensors[0]])
        bound["__spatial__"] = len(self.bufs[first].layout.sizes) - 2 if first in self.bufs else 0
        views = []
        for param in spec.tensors:
            ref = buffer_ref(bound[param]) if bound[param] is not None else None
            if ref is None and not (param in spec.optional and bound[param] is None):
                raise UnsupportedArtifactError(f"{step.target}: argument {param} is not a tensor")
            views.append(self.view_struct(self.buf(ref) if ref else None))
        scratch = [self.scratch_output(step, i, first) for i, out in enumerate(step.outputs)
                   if out not in self.bufs]  # fmt: skip
        views.extend(self.view_struct(self.buf(out)) for out in step.outputs)
        ints = [int(i) for i in spec.ints(bound)]
        floats = [float(f) for f in spec.floats(bound)]
        self.emit("{")
        self.emit(f"  const ember_abi::View v[] = {{{', '.join(views)}}};")
        self.emit(f"  const int64_t ints[] = {{{', '.join(map(int_literal, ints)) or '0'}}};")
        self.emit(f"  const double floats[] = {{{', '.join(map(repr, floats)) or '0.0'}}};")
        self.emit(
            f"  if ((st = h->extern_op(c, {spec.op_id}, v, {len(views)}, ints, {len(ints)}, "
            f"floats, {len(floats)}))) return st;  // {step.target}"
        )
        for buf in scratch:
            self.emit(f"  h->release(c, {buf.var});  // {buf.name} is unused")
        self.emit("}")

    def index_copy_in_place(self, step, args) -> None:
        """A donated input's update (decode.donate_index_puts): the rows of `values` written into
        the step's output, a view of the input, at `index` along its first dimension."""
        out = step.outputs[0]
        index = args[1][0] if isinstance(args[1], (list, tuple)) and len(args[1]) == 1 else None
        if buffer_ref(args[0]) != out or buffer_ref(index) is None or buffer_ref(args[2]) is None:
            raise UnsupportedArtifactError(f"in-place prims.index_put into {out}: expected "
                                           "(out, [index], values) tensors")  # fmt: skip
        views = [self.view_struct(self.buf(buffer_ref(v))) for v in (args[0], index, args[2])]
        self.emit(f"{{ const ember_abi::View v[] = {{{', '.join(views)}}};  // {out}[index] = ...")
        call = f"h->extern_op(c, {OP_INDEX_COPY}, v, 3, nullptr, 0, nullptr, 0)"
        self.emit(f"  if ((st = {call})) return st; }}")

    def scratch_output(self, step, index: int, source: str) -> Buf:
        """Storage for an output the plan declares no buffer for (a result nobody reads: sort's
        indices under `.values`). Only (values, indices) externs have several outputs: both
        take the sizes of the other, values the input's dtype and indices int64."""
        others = [o for o in step.outputs if o in self.bufs]
        if len(step.outputs) != 2 or not others:
            raise UnsupportedArtifactError(f"{step.target} writes the unknown buffer "
                                           f"{step.outputs[index]!r}")  # fmt: skip
        dtype = self.bufs[source].layout.dtype if index == 0 else torch.int64
        sizes = self.bufs[others[0]].layout.sizes
        layout = Layout(dtype, sizes, tuple(contiguous_strides(sizes)), sympy.S.Zero)
        name = step.outputs[index]
        buf = Buf(name, "intermediate", f"U{len(self.bufs)}", name, layout)
        self.bufs[name] = buf
        self.alloc(buf)
        return buf

    def emit_outputs(self) -> None:
        for i, name in enumerate(self.a.outputs):
            if name not in self.bufs:
                raise UnsupportedArtifactError(f"artifact output {name!r} is not a buffer")
            buf = self.bufs[name]
            if not buf.materialised:
                raise UnsupportedArtifactError(
                    f"artifact output {name!r} is never written by a step"
                )
            root = self.bufs[buf.root]
            owned = root.kind in ("intermediate", "output") and root.materialised
            self.emit("{")
            self.emit(f"  const ember_abi::View v = {self.view_struct(buf)};")
            base = root.var if owned else "nullptr"
            self.emit(f"  if ((st = h->set_output(c, {i}, &v, {base}))) return st;  // {name}")
            self.emit("}")
        self.emit("return 0;")

    # ---- descriptors and file layout ---------------------------------------------------------

    def check_kernels(self) -> None:
        entries = {}
        for k in self.a.kernels:
            if k.language not in ("cpp", "triton"):
                raise UnsupportedArtifactError(f"kernel {k.name}: language {k.language!r}")
            if k.language == "triton" and not self.cuda:
                raise UnsupportedArtifactError(f"Triton kernel {k.name} in a CPU artifact")
            if k.language == "triton" and not self.builds.get(k.name, KernelBuild()).cubin:
                raise UnsupportedArtifactError(
                    f"Triton kernel {k.name} has no compiled cubin (KernelIR.binary)"
                )
            build = self.builds.get(k.name, KernelBuild())
            if k.language == "cpp" and not build.library:
                # one definition may serve kernels of equal source (model.py names them by it)
                if k.entry in entries and entries[k.entry].source != k.source:
                    raise UnsupportedArtifactError(f"kernels {entries[k.entry].name} and "
                                                   f"{k.name} share the entry {k.entry!r}")
                entries[k.entry] = k

    def prologue(self) -> list[str]:
        lines = [
            f"// Generated by ember.cpp_wrapper from artifact {self.hash} "
            f"(IR v{self.a.ir_version}).",
            "// Do not edit: regenerate from the artifact.",
            "#include <math.h>",
            "#include <stdint.h>",
            '#include "detail/model_abi.h"',
            "",
            "#ifndef EMBER_EXPORT",
            '#define EMBER_EXPORT extern "C" __attribute__((visibility("default")))',
            "#endif",
            "",
        ]
        for k in self.a.kernels:
            if k.language == "cpp" and not self.builds.get(k.name, KernelBuild()).library:
                params = (
                    "void**" if packed_entry(k) else ", ".join(c_param_type(t) for t in k.arg_types)
                )
                lines.append(f'extern "C" void {k.entry}({params});  // kernel {k.name}')
        lines += declarations(self.a)
        for k in self.a.kernels:
            symbol = self.builds.get(k.name, KernelBuild()).cubin_symbol
            if symbol:
                lines.append(f'extern "C" const unsigned char {symbol}[];  // kernel {k.name}')
        lines += ["", "namespace {", ""]
        return lines

    def tensor_desc_arrays(
        self, prefix: str, i: int, name: str, layout: Layout, storage: bool
    ) -> tuple[list[str], str]:
        shape = [int(s) if s.is_Integer else -1 for s in layout.sizes]
        strides = [int(s) if s.is_Integer else -1 for s in layout.strides]
        dims = ["nullptr" if s.is_Integer else c_string(str(s)) for s in layout.sizes]
        p = f"{prefix}{i}"
        lines = [
            f"const int64_t {p}_shape[] = {{{', '.join(map(int_literal, shape)) or '0'}}};",
            f"const int64_t {p}_strides[] = {{{', '.join(map(int_literal, strides)) or '0'}}};",
            f"const char* const {p}_dims[] = {{{', '.join(dims) or 'nullptr'}}};",
        ]
        code, bits = dlpack_dtype(layout.dtype)
        offset, nbytes = 0, -1
        if storage:
            if not all(s.is_Integer for s in (*layout.sizes, *layout.strides, layout.offset)):
                raise UnsupportedArtifactError(f"constant {name} has a symbolic shape")
            offset = int(layout.offset)
            nbytes = layout.static_nbytes()
        entry = (
            f"{{{c_string(name)}, {{{code}, {bits}, 1}}, {len(shape)}, {p}_shape, {p}_strides, "
            f"{p}_dims, {offset}, {nbytes}}}"
        )
        return lines, entry

    def descriptors_before_run(self) -> list[str]:
        lines: list[str] = []
        for k in self.a.kernels:
            build = self.builds.get(k.name, KernelBuild())
            if build.cubin and build.cubin_symbol:
                lines.append(f"const unsigned char* const {self.kernel_var(k)}_binary = "
                             f"{build.cubin_symbol};")  # fmt: skip
            elif build.cubin:
                data = ",".join(str(b) for b in build.cubin)
                lines.append(f"const unsigned char {self.kernel_var(k)}_binary[] = {{{data}}};")
        return lines

    def kernel_var(self, k: KernelIR) -> str:
        return f"kernel{self.kernel_index[k.name]}"

    def run_function(self) -> list[str]:
        return [
            "",
            "int32_t run(const ember_abi::RunArgs* a) {",
            "  const ember_abi::HostApi* h = a->host;",
            "  ember_abi::Call* c = a->call;",
            "  int32_t st = 0;",
            "  (void)h; (void)c; (void)st;",
            *(
                f"  char* {b.var} = nullptr;  // {b.name}"
                for b in self.bufs.values()
                if b.kind in ("intermediate", "output")
            ),
            *self.body,
            "}",
            "",
        ]

    def descriptors_after_run(self) -> list[str]:
        lines: list[str] = []
        groups = {"kInputs": [], "kOutputs": [], "kConstants": []}
        for i, name in enumerate(self.a.inputs):
            arr, entry = self.tensor_desc_arrays(
                "in", i, name, Layout.of(self.a.buffer(name).meta), False
            )
            lines += arr
            groups["kInputs"].append(entry)
        for i, name in enumerate(self.a.outputs):
            arr, entry = self.tensor_desc_arrays(
                "out", i, name, Layout.of(self.a.buffer(name).meta), False
            )
            lines += arr
            groups["kOutputs"].append(entry)
        for i, b in enumerate(self.constants):
            arr, entry = self.tensor_desc_arrays("const", i, b.name, Layout.of(b.meta), True)
            lines += arr
            groups["kConstants"].append(entry)
        for group, entries in groups.items():
            body = (
                ",\n    ".join(entries)
                or "{nullptr, {0, 0, 0}, 0, nullptr, nullptr, nullptr, 0, -1}"
            )
            lines.append(f"const ember_abi::TensorDesc {group}[] = {{\n    {body}}};")
        kernels = []
        for k in self.a.kernels:
            build = self.builds.get(k.name, KernelBuild())
            fn = (
                f"reinterpret_cast<void*>(&{k.entry})"
                if k.language == "cpp" and not build.library
                else "nullptr"
            )
            binary = f"{self.kernel_var(k)}_binary" if build.cubin else "nullptr"
            kernels.append(
                f"{{{c_string(k.name)}, {c_string(k.language)}, {c_string(k.entry)}, {fn}, "
                f"{c_string(build.library) if build.library else 'nullptr'}, {binary}, "
                f"{len(build.cubin)}, {k.num_warps}, {k.shared_mem}}}"
            )
        body = ",\n    ".join(kernels) or '{"", "cpp", "", nullptr, nullptr, nullptr, 0, 0, 0}'
        lines.append(f"const ember_abi::KernelDesc kKernels[] = {{\n    {body}}};")
        device = 2 if self.cuda else 1
        counts = [len(self.a.inputs), len(self.a.outputs), len(self.constants), len(self.a.kernels)]
        lines += [
            "",
            "const ember_abi::ModelDesc kDesc = {",
            "    EMBER_MODEL_ABI_VERSION, sizeof(ember_abi::ModelDesc),",
            f"    {self.a.ir_version}, {device}, {c_string(self.hash)}, {c_string(self.isa)},",
            f"    {', '.join(map(str, counts))},",
            "    kInputs, kOutputs, kConstants, kKernels, run};",
            "",
            "}  // namespace",
            "",
            "EMBER_EXPORT const ember_abi::ModelDesc* ember_model_describe_v1() { return &kDesc; }",
        ]
        return lines


def generate_wrapper(
    artifact: CompiledArtifact,
    *,
    artifact_hash: str = "",
    isa: str = "generic",
    kernels: Mapping[str, KernelBuild] = None,
) -> str:
    """The C++ source of the model library for `artifact` (see module docstring)."""
    return WrapperCodegen(
        artifact, artifact_hash=artifact_hash, isa=isa, kernels=kernels
    ).generate()
