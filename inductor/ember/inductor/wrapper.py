"""The Python wrapper: readable generated source that allocates buffers, launches kernels and calls
externs, plus the same plan as an `ember.ir.CompiledArtifact` for the C++ wrapper.

Memory planning happens here: a buffer whose last reader has run goes to a pool, and a later
allocation of the same storage size, dtype and device takes it; a pointwise kernel may write its
output over an input that dies in that kernel when both are read and written at the same index.
"""

from __future__ import annotations

import dataclasses

import sympy
import torch
from torch.utils import _pytree as pytree

from ember.ir import BufferIR, KernelIR, StepIR, SymbolSpec, TensorMeta, new_artifact
from ember.ir.codec import value_to_json
from ember.ir.symbols import expand_index, expr_to_json

from .codegen_common import PY_MINMAX, print_index
from .config import config
from .index_simplify import simplify_index
from .loop_ir import (AliasBuffer, Buffer, ComputedBuffer, ExternBuffer, IndexedWrite, InputBuffer,
                      MultiOutput, TemplateBuffer)  # fmt: skip
from .scheduler import Kernel, _step_reads
from .triton_aot import launch_args, split_size_args


@dataclasses.dataclass
class Program:
    """Everything a compiled graph is: wrapper source, kernel sources and the IR artifact."""

    source: str
    kernels: list  # KernelSource
    artifact: object
    num_outputs: int
    out_spec: str = ""  # pytree spec (treespec_dumps) of the graph's output structure


def _ints(xs) -> tuple:
    """Static sizes as ints; a symbolic one stays a sympy expression (see `_text`)."""
    return tuple(int(x) if _is_int(x) else sympy.sympify(x) for x in xs)


def _is_int(x) -> bool:
    return isinstance(x, int) or sympy.sympify(x).is_Integer


def _text(value) -> str:
    """Python source for sizes: ints as before, symbolic sizes as expressions over s0, s1, ..."""
    if isinstance(value, tuple):
        inner = ", ".join(_text(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, sympy.Basic) and not value.is_Integer:
        return print_index(value, floordiv="//", minmax=PY_MINMAX)
    return str(int(value))


def _meta(lay) -> TensorMeta:
    return TensorMeta(lay.dtype, lay.sizes, lay.strides, lay.offset, lay.device)


# externs whose result is a new tensor (never a view of an argument): a kernel may store over it
FRESH_EXTERNS = ("extern.mm", "extern.addmm", "extern.bmm", "extern.baddbmm", "extern.convolution")


class WrapperBuilder:
    """Walks the schedule once, writing wrapper lines and artifact steps side by side."""

    def __init__(self, lowered, steps, kernel_sources: dict):
        self.lowered, self.steps, self.ks = lowered, steps, kernel_sources
        self.lines: list[str] = []
        self.art_steps: list[StepIR] = []
        self.art_buffers: dict[str, BufferIR] = {}
        self.pool: dict[tuple, list[str]] = {}
        self.pool_until: dict[str, int] = {}  # pooled buffer -> the last step that may claim it
        self.storage: dict[str, str] = {}  # buffer -> the Python variable holding its memory
        self.outputs = [o.name if isinstance(o, Buffer) else None for o in lowered.outputs]
        self.buffers = {b.name: b for b in lowered.buffers}
        for b in lowered.inputs:
            if b is not None:
                self.buffers[b.name] = b

    def _last_uses(self) -> dict:
        last = {}
        for i, s in enumerate(self.steps):
            for name in _step_reads(s):
                b = self.buffers.get(name)
                last[name] = i
                # A view keeps its base alive; a MultiOutput holds its element itself, so the
                # extern's result tuple dies once its elements are picked.
                while isinstance(b, AliasBuffer):
                    b = b.source
                    last[b.name] = i
        return last

    def _key(self, b: Buffer):
        lay = b.layout
        size = lay.storage_size()
        return (lay.dtype, lay.device, int(size) if _is_int(size) else expand_index(size))

    def _alloc(self, b: Buffer, inplace_of=None):
        lay = b.layout
        sizes, strides = _ints(lay.sizes), _ints(lay.strides)
        donor, pooled = inplace_of, False
        if donor is None and config.reuse_buffers and self.pool.get(self._key(b)):
            donor, pooled = self.pool[self._key(b)].pop(), True
            self.pool_until.pop(donor)
        if donor is not None:
            # (an IndexedWrite's view of the input it writes rows of: that input's memory)
            why = f"rows of {donor}" if isinstance(b, IndexedWrite) else f"reuses {donor}"
            was = self.buffers[donor].layout if donor in self.buffers else None
            if was is not None and (was.sizes, was.strides) == (lay.sizes, lay.strides) and \
                    lay.offset == 0:  # the donor's tensor as it is: no view made at each call
                self.lines.append(f"{b.name} = {donor}  # {why}")
            else:
                self.lines.append(f"{b.name} = reinterpret({donor}, {_text(sizes)}, "
                                  f"{_text(strides)}, {_text(lay.offset)})  # {why}")
            if pooled:  # the new name holds the memory now; the old one would pin it forever
                self.lines.append(f"del {donor}")
            self.art_steps.append(
                StepIR(
                    "view",
                    "",
                    [donor, [list(sizes), list(strides), _ints([lay.offset])[0]]],
                    {},
                    (b.name,),
                )
            )
        else:
            self.lines.append(
                f"{b.name} = empty_strided({_text(sizes)}, {_text(strides)}, {lay.dtype}, '{lay.device}')"
            )
            self.art_steps.append(StepIR("alloc", "", [], {}, (b.name,)))
        self.art_buffers[b.name] = BufferIR(
            b.name, "output" if b.name in self.outputs else "intermediate", _meta(lay)
        )

    def _inplace_donor(self, k: Kernel, b: ComputedBuffer, i: int, last: dict):
        """A buffer that dies in kernel `k`, read only where `b` is stored: `b` may overwrite it.

        Either an input of a pointwise kernel, or (softmax's exp, say) an earlier per-element member
        of the same reduction kernel. Either way every member that reads it must be emitted no
        later than `b`: a member after `b` in the loop body would load the element `b` has just
        stored over it (a kernel computing `mm(d) * 2` and `d + 1` could give `d + 1` the product).
        """
        if not config.inplace_buffers:
            return None
        reads, emitted_at = {}, {}
        for loop, post in k.phases:  # the order the kernel's body computes and stores them
            for m in loop + post:
                emitted_at[m.node.name] = len(emitted_at)
        xs, rs = k.vars()
        ranges = dict(zip([*xs, *rs], [*k.xsizes, *k.rsizes]))

        def element(index):  # a view's div/mod of a variable by its own range is affine here
            return expand_index(simplify_index(index, ranges))

        for m in k.members:
            for name, index in k.record(m).loads:
                reads.setdefault(name, []).append((element(index), m.node.name))
        want = element(k.stores[b.name])
        for name, uses in reads.items():
            src = self.buffers.get(name)
            if name in getattr(k, "operands", {}):
                continue  # a matmul template's operand: other tiles still read it
            if not (self._may_donate(src, b) and last.get(name) == i and name not in self.outputs
                    and not self._aliased(name)  # an output's view of it outlives the kernel
                    and name not in self.donated
                    and all(idx == want for idx, _ in uses)
                    and all(emitted_at[r] <= emitted_at[b.name] for _, r in uses)):  # fmt: skip
                continue
            if name == b.name:
                continue
            if name in k.names:
                ok = (k.rsizes and k.names.index(name) < k.names.index(b.name)
                      and k.roles[name] == k.roles[b.name] == "xr" and name not in k.local)  # fmt: skip
            else:
                ok = not k.rsizes
            if ok:
                self.donated.add(name)
                return name
        return None

    def _may_donate(self, src, b: ComputedBuffer) -> bool:
        """Whether `src`'s memory may hold `b`: a kernel's buffer, or a matmul's or convolution's
        fresh result (an mm's (256, 1000) that its bias add stores as (4, 64, 1000)), of `b`'s
        dtype, device, storage size and offset (the caller checks that each element is read
        where it is stored)."""
        if isinstance(src, IndexedWrite) or not (isinstance(src, ComputedBuffer)
                or (type(src) is ExternBuffer and src.op in FRESH_EXTERNS)):  # fmt: skip
            return False  # (an IndexedWrite's memory is a graph input's)
        return src.layout == b.layout or (
            self._key(src) == self._key(b) and src.layout.offset == b.layout.offset)

    def build(self) -> Program:
        last, self.donated = self._last_uses(), set()
        inputs = [b for b in self.lowered.inputs]
        names = [b.name if b is not None else f"sym{i}" for i, b in enumerate(inputs)]
        for b in inputs:
            if b is not None:
                self.art_buffers[b.name] = BufferIR(b.name, "input", _meta(b.layout))
        head = ", ".join(names) + ("," if len(names) == 1 else "")
        # The caller hands over its list: clearing it lets each input die at its last use below
        # (a backward's saved activations, say), as in eager.
        self.lines += [f"{head} = args" if names else "", "args.clear()"]
        for s, (i, d) in sorted(self.lowered.size_symbols.items(), key=lambda kv: kv[0].name):
            self.lines.append(f"{s.name} = {names[i]}.shape[{d}]")
        for b in inputs:  # kernels index inputs with the traced strides: copy any that differ
            if b is not None and b.layout.sizes and any(s != 1 for s in b.layout.sizes):
                lay = b.layout
                self.lines.append(
                    f"{b.name} = restride({b.name}, {_text(_ints(lay.sizes))}, {_text(_ints(lay.strides))})"
                )
        self.alloc_steps = self._alloc_steps()
        # A base read through a view dies at its view's last reader, a step that need not name
        # it (an extern's result tuple, read through the MultiOutputs that pick its elements).
        dies_at: dict[int, set] = {}
        for name, i in last.items():
            dies_at.setdefault(i, set()).add(name)
        for i, s in enumerate(self.steps):
            self._expire_pool(i)
            self._step(s, i, last)
            for name in sorted(dies_at.get(i, set()) | _produces_names(s)):
                if last.get(name, i) <= i and name not in self.outputs:
                    self._free(name, i)
        outs = ", ".join(o or "None" for o in self.outputs) + (
            "," if len(self.outputs) == 1 else ""
        )
        self.lines.append(f"return ({outs})")
        return self._finish()

    def _alloc_steps(self) -> dict:
        """key -> the step indices that allocate a buffer of that key, in order."""
        at: dict = {}
        for i, s in enumerate(self.steps):
            if isinstance(s, Kernel):
                for b in _allocated(s):
                    at.setdefault(self._key(b), []).append(i)
            elif isinstance(s, TemplateBuffer):
                at.setdefault(self._key(s), []).append(i)
        return at

    def _wanted_soon(self, key, i: int) -> bool:
        """Whether a dead buffer of `key` is claimed by an allocation within the next few steps
        (more of them than the pool already holds): only then is keeping it alive worth it."""
        dtype, _, numel = key
        if not _is_int(numel) or int(numel) * dtype.itemsize > config.reuse_max_bytes:
            return False  # a large buffer goes back to the allocator, which reuses it at once
        window = config.reuse_window
        soon = sum(1 for j in self.alloc_steps.get(key, ()) if i < j <= i + window)
        return soon > len(self.pool.get(key, ()))

    def _free(self, name, i: int):
        """`name` is dead after step i: pool its memory for an allocation soon, or drop it now.

        Dropping (`del`) returns the memory to the allocator at once, so the wrapper's peak is
        the live set's, not the sum of every intermediate."""
        b = self.buffers.get(name)
        ir = self.art_buffers.get(name)
        if ir is None:
            if isinstance(b, ExternBuffer) and b.outputs:
                # The tuple an extern returned (a convolution backward's grad_input and
                # grad_weight): held, it would keep every element alive to the graph's end.
                self.lines.append(f"del {name}")
            return
        if ir.kind == "input":
            self.lines.append(f"del {name}")
            return
        if (
            isinstance(b, (ComputedBuffer, ExternBuffer))
            and not isinstance(b, AliasBuffer)
            and not (isinstance(b, ExternBuffer) and b.kwargs.get("in_place"))  # a graph input's
            and not isinstance(b, IndexedWrite)  # (memory, the caller's)
            and name not in self.donated
            and not self._aliased(name)
        ):
            self.art_steps.append(StepIR("free", "", [name], {}, ()))
            if config.reuse_buffers and self._wanted_soon(self._key(b), i):
                self.pool.setdefault(self._key(b), []).append(name)
                self.pool_until[name] = i + config.reuse_window
                return
        self.lines.append(f"del {name}")

    def _expire_pool(self, i: int) -> None:
        """Drop pooled buffers that no allocation claimed within the window (an allocation
        counted on may have been served in place instead): pooled for good, they would stay
        alive to the end of the graph."""
        for name in sorted(n for n, until in self.pool_until.items() if until < i):
            del self.pool_until[name]
            self.pool[self._key(self.buffers[name])].remove(name)
            self.lines.append(f"del {name}")

    def _aliased(self, name):
        """Whether a graph output is a view of `name` (directly or through other views)."""
        if not hasattr(self, "_output_bases"):
            self._output_bases = set()
            for b in self.buffers.values():
                if b.name not in self.outputs:
                    continue
                while isinstance(b, (AliasBuffer, MultiOutput)):
                    b = b.source
                    self._output_bases.add(b.name)
        return name in self._output_bases

    def _step(self, s, i, last):
        if isinstance(s, Kernel):
            src = self.ks[s.name]
            for b in _allocated(s):
                if isinstance(b, IndexedWrite):  # the input's own memory: a view of it
                    donor = b.target.name
                elif isinstance(b, ExternBuffer):
                    donor = None
                else:
                    donor = self._inplace_donor(s, b, i, last)
                self._alloc(b, donor)
            self.lines.append(f"{s.name}({', '.join(src.args)})")
            if src.language == "triton":
                args = launch_args(src, list(src.args))
            else:  # the buffers, then the size symbols (expressions, not buffer names)
                buffers, syms = split_size_args(src, list(src.args))
                args = [*buffers, *syms]
            self.art_steps.append(StepIR("kernel", s.name, args, {}, ()))
        elif isinstance(s, AliasBuffer):
            lay = s.layout
            self.lines.append(f"{s.name} = reinterpret({s.source.name}, {_text(_ints(lay.sizes))}, "
                              f"{_text(_ints(lay.strides))}, {_text(lay.offset)})")  # fmt: skip
            self.art_steps.append(
                StepIR(
                    "view",
                    "",
                    [
                        s.source.name,
                        [list(_ints(lay.sizes)), list(_ints(lay.strides)), _ints([lay.offset])[0]],
                    ],
                    {},
                    (s.name,),
                )
            )
            self.art_buffers[s.name] = BufferIR(
                s.name, "output" if s.name in self.outputs else "intermediate", _meta(lay)
            )
        elif isinstance(s, MultiOutput):
            lay = s.layout
            self.lines.append(
                f"{s.name} = restride({s.source.name}[{s.index}], {_text(_ints(lay.sizes))}, "
                f"{_text(_ints(lay.strides))})"
            )
            self.art_buffers[s.name] = BufferIR(
                s.name, "output" if s.name in self.outputs else "intermediate", _meta(lay)
            )
        elif isinstance(s, TemplateBuffer):
            src = self.ks[s.kernel]
            for rel in s.checks:  # sizes the kernel assumes equal (eager's kernel checks them)
                lhs, rhs = _text(rel.lhs), _text(rel.rhs)
                self.lines.append(f"if {lhs} != {rhs}: raise RuntimeError('{s.op}: sizes {lhs} "
                                  f"and {rhs} must be equal, got %d and %d' % ({lhs}, {rhs}))")
                self.guards.append(rel)
            self._alloc(s)
            if src.language == "triton":
                self._template_launch(s.kernel, src)
                return
            self.lines.append(f"{s.kernel}({', '.join(src.args)})")
            buffers, syms = split_size_args(src, list(src.args))
            self.art_steps.append(StepIR("kernel", s.kernel, [*buffers, *syms], {}, ()))
        elif isinstance(s, ExternBuffer):
            self._extern(s)

    def _template_launch(self, kernel: str, src):
        """A Triton template's launch: its buffers, then scalars that are size expressions (as
        text in the KernelSource, which the compile cache stores as JSON), over `src.grid`."""
        n_ptr = sum(1 for t in src.arg_types if t.startswith("*"))
        buffers, scalars = list(src.args[:n_ptr]), [sympy.sympify(a) for a in src.args[n_ptr:]]
        grid = ", ".join(_text(g) for g in src.grid)
        args = ", ".join([*buffers, *(_text(e) for e in scalars)])
        self.lines.append(f"{kernel}[({grid},)]({args})")
        values = [int(e) if e.is_Integer else {"expr": expr_to_json(e)} for e in scalars]
        self.art_steps.append(StepIR("kernel", kernel, [*buffers, *values], {}, ()))

    def _extern(self, s: ExternBuffer):
        fn = s.op.replace(".", "_")
        self.externs[fn] = s.op
        args = ", ".join(_py_arg(a) for a in s.args)
        kwargs = "".join(f", {k}={_py_arg(v)}" for k, v in s.kwargs.items())
        lay = s.layout
        call = f"{fn}({args}{kwargs})"
        if not s.outputs:
            call = f"restride({call}, {_text(_ints(lay.sizes))}, {_text(_ints(lay.strides))})"
        self.lines.append(f"{s.name} = {call}")
        args = [_json_arg(a) for a in s.args]
        if s.kwargs.get("in_place"):  # input_updates.py: the result is a view of the target,
            # written in place (the convention ember.cpp_wrapper's decode donation also uses)
            self.art_steps.append(StepIR("view", "", [s.args[0].name, [
                list(_ints(lay.sizes)), list(_ints(lay.strides)), _ints([lay.offset])[0]]], {},
                (s.name,)))  # fmt: skip
            args[0] = {"node": s.name}
        self.art_steps.append(StepIR("extern", s.op, args,
                                     {k: _json_arg(v) for k, v in s.kwargs.items()},
                                     (s.name,) if not s.outputs else s.outputs))  # fmt: skip
        if not s.outputs:
            self.art_buffers[s.name] = BufferIR(
                s.name, "output" if s.name in self.outputs else "intermediate", _meta(lay)
            )

    def _finish(self) -> Program:
        ks = list(self.ks.values())
        out = ["# ember.inductor generated wrapper", "import torch",
               "from ember.inductor.runtime import empty_strided, reinterpret, restride, extern, "
               "cpp_kernel, triton_kernel, triton_template",
               ""]  # fmt: skip
        for fn, op in sorted(self.externs.items()):
            out.append(f"{fn} = extern({op!r})")
        for k in ks:
            out += ["", *_kernel_loader(k)]
        out += ["", "", "def call(args):", *("    " + line for line in self.lines if line)]
        kernels = [KernelIR(k.name, k.language, _standalone(k), k.name, k.arg_types,
                            grid=k.grid, num_warps=k.num_warps) for k in ks]  # fmt: skip
        device = self.lowered.device
        symbols = tuple(SymbolSpec(s.name) for s in sorted(self.lowered.size_symbols, key=str))
        art = new_artifact(
            device=device, symbols=symbols, guards=tuple(self.guards),
            buffers=tuple(self.art_buffers.values()), kernels=tuple(kernels),
            steps=tuple(self.art_steps),
            inputs=tuple(b.name for b in self.lowered.inputs if b is not None),
            outputs=tuple(o for o in self.outputs if o is not None),
        )  # fmt: skip
        spec = getattr(self.lowered, "out_spec", None)
        return Program(
            "\n".join(out) + "\n",
            ks,
            art,
            len(self.outputs),
            pytree.treespec_dumps(spec) if spec is not None else "",
        )


def _standalone(k) -> str:
    """A C++ kernel's source with ember_cpu.h inlined, so an artifact builds without ember."""
    if k.language != "cpp":
        return k.source
    from .runtime import CSRC

    header = (CSRC / "ember_cpu.h").read_text()
    return k.source.replace('#include "ember_cpu.h"', header.rstrip("\n"), 1)


def _kernel_loader(k) -> list[str]:
    if k.language == "triton" and dict(k.meta).get("handwritten"):
        cfg = dict(dict(k.meta)["configs"][0])
        return [f"{k.name} = triton_template({k.name!r}, r'''", k.source.rstrip("\n"),
                f"''', {cfg!r})"]  # fmt: skip
    if k.language == "cpp":
        nsyms = k.arg_types.count("i64")  # trailing size arguments (dynamic shapes)
        return [
            f"{k.name} = cpp_kernel({k.name!r}, r'''",
            k.source.rstrip("\n"),
            f"''', {len(k.args)}{f', sizes={nsyms}' if nsyms else ''})",
        ]
    meta = dict(k.meta)
    numel = ""
    if "numel" in meta:  # dynamic sizes: (xnumel, rnumel) computed from them at each call
        syms = [a for a, t in zip(k.args, k.arg_types) if t == "i64"]
        xn, rn = meta["numel"]
        numel = f", numel=lambda {', '.join(syms)}: ({xn}, {rn if meta['reduction'] else None})"
    return [f"{k.name} = triton_kernel({k.name!r}, r'''", k.source.rstrip("\n"),
            f"''', {list(meta['configs'])!r}, {meta['xnumel']}, {meta['rnumel'] if meta['reduction'] or meta.get('tiled') else None}{numel})"]  # fmt: skip


def _allocated(k: Kernel) -> list:
    """The buffers a kernel writes to memory: a template's stored product, then its members."""
    product = getattr(k, "product", None)
    return ([product] if product is not None else []) + [
        m.node for m in k.members if m.node.name not in k.local
    ]


def _produces_names(s) -> set:
    if isinstance(s, Kernel):
        return s.produced()
    if isinstance(s, ExternBuffer):
        return {s.name, *s.outputs}
    return {s.name}


def _py_arg(a) -> str:
    if isinstance(a, Buffer):
        return a.name
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_py_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
        return f"float({str(a)!r})"
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, (torch.dtype, torch.memory_format, torch.layout)):
        return str(a)
    if isinstance(a, sympy.Basic):
        return _text(a)
    return repr(a)


def _json_arg(a):
    if isinstance(a, Buffer):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        items = [_json_arg(x) for x in a]
        return items if isinstance(a, list) else {"tuple": items}
    return value_to_json(a)


def generate(lowered, steps, kernel_sources: dict) -> Program:
    """Wrapper source and artifact for a scheduled program."""
    builder = WrapperBuilder(lowered, steps, kernel_sources)
    builder.externs, builder.guards = {}, []
    return builder.build()


__all__ = ["InputBuffer", "Program", "generate"]
