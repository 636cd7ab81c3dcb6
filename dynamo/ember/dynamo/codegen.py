"""The transformed function: calls the compiled graph, replays side effects, rebuilds the result.

It is generated as Python source (then compiled once): `___transformed(___fn, *frame_args)` reads
the graph inputs from its arguments, globals and attributes, calls the graph, replays attribute,
list and dict mutations, and either returns the rebuilt value or (after a graph break) runs the
breaking instruction and calls the resume function with the live locals and stack.
"""

from __future__ import annotations

import collections
import math
import types
from typing import Optional

import torch
import torch.fx as fx

from . import variables as V
from .bytecode import RESUME_ORIGIN, make_resume_code
from .exc import Unsupported
from .source import ConstantSource, ItemSource, Source, literal_key
from .symbolic import SizeVT, SymIntVT, SymSliceVT, python_text

_SIMPLE = (int, str, bool, type(None), bytes)


def _new_object(cls, attrs, slots=None):
    """An object made (or copied) while tracing: a bare instance, its instance dict and slots,
    written without running the class's __getattribute__/__setattr__ (as copy.py's
    `_reconstruct` does)."""
    obj = object.__new__(cls)
    if attrs:
        object.__getattribute__(obj, "__dict__").update(attrs)
    for name, value in (slots or {}).items():
        object.__setattr__(obj, name, value)
    return obj


class CodeGen:
    """Builds the source of one transformed function."""

    def __init__(self, output, arg_names: list[str]):
        self.output = output
        self.arg_names = arg_names
        self.lines: list[str] = []
        self.objs: dict[str, object] = {}
        self.temps: dict[int, str] = {}
        self.out_index: dict[fx.Node, int] = {}
        self.ntemp = 0
        self.at_break = False  # rebuilding the live values at a graph break (not a return)
        self.host_copies: dict = {}  # storage -> the NumPy value copied to the host (numpy_device)

    # -- names for objects and temporaries ----------------------------------------------------
    def obj(self, value, hint="k") -> str:
        for name, v in self.objs.items():
            if v is value:
                return name
        name = f"___{hint}{len(self.objs)}"
        self.objs[name] = value
        return name

    def temp(self, expr: str) -> str:
        name = f"___t{self.ntemp}"
        self.ntemp += 1
        self.lines.append(f"{name} = {expr}")
        return name

    def source(self, src: Source) -> str:
        text = src.expr()
        for obj in _constant_sources(src):
            self.objs[f"___c_{id(obj)}"] = obj
        return text

    def input_exprs(self, sources: list) -> list[str]:
        """The expressions of the graph's inputs, where their reads branch (a value two of them
        read further, or an input another reads further) computed once into a temporary: a
        module's parameters were each read down the whole chain
        `self._modules['blocks']._modules['3']._modules['0']._parameters['weight']`, the
        transformed function's largest cost on a cache hit (a CNN of 360 tensors: 108 -> 28 us
        a call here, in Python 3.11)."""
        children: dict = collections.defaultdict(set)
        for src in sources:
            self.source(src)  # (names the objects its expression reads)
            while src.expr_on("") is not None:
                children[src.base].add(src)
                src = src.base
        inputs, texts = set(sources), {}
        return [self._input_text(src, inputs, children, texts) for src in sources]

    def _input_text(self, src, inputs: set, children: dict, texts: dict) -> str:
        """(input_exprs) `src`'s expression on its base's; a temporary where reads branch. A
        method, not a closure over itself: that cycle held the CodeGen, and with it the
        capture, until a full collection (the compile-reset leak test grew 12%)."""
        if src not in texts:
            if src.expr_on("") is None:  # a frame argument, a global, ...: read as it is
                texts[src] = src.expr()
            else:
                texts[src] = src.expr_on(self._input_text(src.base, inputs, children, texts))
                if len(children[src]) > 1 or (src in inputs and children[src]):
                    texts[src] = self.temp(texts[src])
        return texts[src]

    # -- graph outputs ------------------------------------------------------------------------
    def collect_outputs(self, roots: list) -> list:
        """TensorVTs (produced by the graph) reachable from what the code must rebuild."""
        from .calls import ObjKey

        found: dict[fx.Node, V.TensorVT] = {}
        seen: set[int] = set()

        def visit(vt):
            if vt is None or id(vt) in seen:
                return
            seen.add(id(vt))
            if isinstance(vt, V.TensorVT):
                if vt.source is None or not (vt.node.op == "placeholder" or vt.written_back):
                    found.setdefault(vt.node, vt)
            elif isinstance(vt, V.ListVT):
                for i in vt.items:
                    visit(i)
            elif isinstance(vt, V.DictVT):
                for k, i in vt.items.items():
                    if isinstance(k, ObjKey):  # the key's object is rebuilt too
                        visit(k.vt)
                    visit(i)
            elif isinstance(vt, V.NewObjectVT):
                for i in vt.attrs.values():
                    visit(i)
            elif isinstance(vt, V.IteratorVT):
                for i in vt.items[vt.pos :]:
                    visit(i)
            elif isinstance(vt, V.BoundMethodVT):
                visit(vt.self_vt)
                visit(vt.fn)
            elif isinstance(vt, V.MethodVT):
                visit(vt.obj)
            elif isinstance(vt, V.IdVT):
                visit(vt.target)
            elif isinstance(vt, V.NdarrayVT):
                visit(vt.tensor)

        for r in roots:
            visit(r)
        del visit  # (it closes over itself: a cycle holding `found`, its variables and graph)
        for i, node in enumerate(found):
            self.out_index[node] = i
        return list(found.values())

    # -- rebuilding values --------------------------------------------------------------------
    def expr(self, vt) -> str:
        if id(vt) in self.temps:
            return self.temps[id(vt)]
        if isinstance(vt, V.TensorVT):
            if vt.written_back:  # the caller's tensor, holding the new value after the graph
                return self.source(vt.source)
            if vt.node in self.out_index:
                return f"___o[{self.out_index[vt.node]}]"
            if vt.source is not None:
                return self.source(vt.source)
            raise Unsupported("a tensor that is neither a graph output nor an input")
        if isinstance(vt, V.ConstVT):
            return self.const(vt.value)
        if isinstance(vt, SymIntVT):
            return self.sym_int(vt)
        if isinstance(vt, SymSliceVT):
            return f"slice({', '.join(self.expr(p) for p in vt.parts)})"
        if isinstance(vt, SizeVT):
            items = ", ".join(self.expr(i) for i in vt.items)
            return f"{self.obj(torch.Size, 'Size')}(({items}{',' if vt.items else ''}))"
        if vt.source is not None and not isinstance(vt, V.NewObjectVT):
            return self.source(vt.source)
        if isinstance(vt, V.NdarrayVT):  # a NumPy value the graph computed, as NumPy returns it
            from .numpy_device import host_array_text

            return self._bind(vt, host_array_text(self, vt))
        if isinstance(vt, V.NamedTupleVT):
            items = ", ".join(self.expr(i) for i in vt.items)
            maker = self.eager(vt.cls._make if hasattr(vt.cls, "_make") else vt.cls)
            return f"{maker}(({items},))"
        if isinstance(vt, V.ListVT):
            items = ", ".join(self.expr(i) for i in vt.items)
            if vt.is_tuple:
                return f"({items},)" if vt.items else "()"
            return self._bind(vt, f"[{items}]")
        if isinstance(vt, V.DictVT):
            body = ", ".join(f"{self.const(k)}: {self.expr(v)}" for k, v in vt.items.items())
            text = "{" + body + "}"
            if vt.cls is not dict:
                text = f"{self.obj(vt.cls, 'cls')}({text})"
            return self._bind(vt, text)
        if isinstance(vt, V.SetVT):
            return self._bind(vt, f"{{{', '.join(self.const(k) for k in vt.items)}}}"
                              if vt.items else "set()")  # fmt: skip
        if isinstance(vt, V.DataclassVT):
            body = ", ".join(f"{k}={self.expr(v)}" for k, v in vt.attrs.items())
            return self._bind(vt, f"{self.eager(vt.cls)}({body})")
        if isinstance(vt, V.NewObjectVT):
            from .attrs import is_slot

            slot = {k for k in vt.attrs if is_slot(getattr(vt.cls, k, None))}
            body = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in vt.attrs.items() if k not in slot)
            slots = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in vt.attrs.items() if k in slot)
            cls = self.obj(vt.cls, "cls")
            args = f"{cls}, {{{body}}}" + (f", {{{slots}}}" if slot else "")
            return self._bind(vt, f"{self.obj(_new_object, 'new')}({args})")
        if isinstance(vt, V.IdVT):
            return f"id({self.expr(vt.target)})"
        if isinstance(vt, V.IteratorVT):
            items = ", ".join(self.expr(i) for i in vt.items[vt.pos :])
            return f"iter(({items}{',' if items else ''}))"
        if isinstance(vt, V.BoundMethodVT):
            mt = self.obj(types.MethodType, "method")
            return f"{mt}({self.expr(vt.fn)}, {self.expr(vt.self_vt)})"
        if isinstance(vt, V.MethodVT):
            return f"{self.expr(vt.obj)}.{vt.name}"
        if isinstance(vt, V.NestedFunctionVT) and not vt.closure and not vt.kwdefaults:
            defaults = ", ".join(self.expr(d) for d in vt.defaults or ())
            mk = self.obj(types.FunctionType, "function")
            return (f"{mk}({self.obj(vt.code, 'code')}, {self.obj(vt.globals, 'globals')}, "
                    f"{vt.name!r}, ({defaults}{',' if defaults else ''}))")  # fmt: skip
        for attr in ("module", "fn", "cls", "obj"):
            if hasattr(vt, attr) and not isinstance(vt, V.NestedFunctionVT):
                return self.obj(getattr(vt, attr))
        raise Unsupported(f"cannot rebuild a {type(vt).__name__} after the graph")

    def sym_int(self, vt: SymIntVT) -> str:
        """An int computed from sizes, recomputed in Python from the inputs' sizes."""
        env = vt.env

        def text_of(slot):
            source, dim = env.slots[int(slot.name[len("_slot") :])]
            return f"{self.source(source)}.size({dim})"

        return python_text(vt.expr.xreplace(env.value_of), text_of)

    def eager(self, fn) -> str:
        """A name for `fn` wrapped to run with the frame hook off (user constructors rebuilding
        an output would otherwise be captured as frames of their own)."""
        from ._native import _C

        return self.obj(_C.CompiledFunction(fn, None), "eager")

    def iter_items(self, vt: V.IteratorVT) -> str:
        """The remaining items of an iterator, as a tuple (the resume prologue re-iterates it)."""
        items = ", ".join(self.expr(i) for i in vt.items[vt.pos :])
        return f"({items}{',' if items else ''})"

    def _bind(self, vt, text: str) -> str:
        name = self.temp(text)
        self.temps[id(vt)] = name
        return name

    def const(self, value) -> str:
        from .calls import ObjKey

        if isinstance(value, ObjKey):
            return self.expr(value.vt)
        if type(value) in _SIMPLE:
            return repr(value)
        if type(value) is float and math.isfinite(value):
            return repr(value)
        if type(value) is tuple and all(type(x) in _SIMPLE for x in value):
            return repr(value)
        return self.obj(value)

    # -- side effects -------------------------------------------------------------------------
    def side_effects(self) -> None:
        out = self.output
        for kind, *rest in out.side_effects:
            if kind == "setattr":
                obj, name, value = rest
                self.lines.append(f"setattr({self.expr(obj)}, {name!r}, {self.expr(value)})")
            elif kind == "global":
                name, value = rest
                g = self.obj(out.root_globals, "globals")
                self.lines.append(f"{g}[{name!r}] = {self.expr(value)}")
            elif kind == "call":
                fn, args, kwargs = rest
                parts = [self.expr(a) for a in args]
                parts += [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
                self.lines.append(f"{self.expr(fn)}({', '.join(parts)})")
            elif kind == "cell":
                src, value = rest
                self.lines.append(f"{self.source(src)} = {self.expr(value)}")
        for vt in out.mutated.values():
            target = self.source(vt.source)
            if isinstance(vt, V.ListVT):
                items = ", ".join(self.expr(i) for i in vt.items)
                self.lines.append(f"{target}[:] = [{items}]")
            elif isinstance(vt, V.DictVT):
                body = ", ".join(f"{self.const(k)}: {self.expr(v)}" for k, v in vt.items.items())
                t = self.temp("{" + body + "}")
                self.lines.append(f"{target}.clear(); {target}.update({t})")

    # -- assembly -----------------------------------------------------------------------------
    def build(self, name: str, f_globals: dict, body: list[str]) -> types.FunctionType:
        params = ", ".join(["___fn", *self.arg_names])
        free = list(self.objs)
        src = [f"def ___make({', '.join(free)}):", f"    def {name}({params}):"]
        src += [f"        {line}" for line in self.lines + body]
        src += [f"    return {name}"]
        text = "\n".join(src)
        namespace: dict = {}
        exec(compile(text, f"<ember transformed {name}>", "exec"), namespace)
        inner = namespace["___make"](*[self.objs[n] for n in free])
        fn = types.FunctionType(inner.__code__, f_globals, name, None, inner.__closure__)
        fn.__ember_source__ = text
        return fn


def _constant_sources(src) -> list:
    """The objects a source's expression names as `___c_<id>`: constant sources and dict keys
    that are not literals."""
    out = []
    while src is not None:
        if isinstance(src, ConstantSource):
            out.append(src.obj)
        elif isinstance(src, ItemSource) and not literal_key(src.key):
            out.append(src.key)
        out.extend(getattr(src, "closure_objects", ()))  # functions a source calls (from_numpy)
        src = getattr(src, "base", None)
    return out


def resume_call(cg: CodeGen, tx, offset: int, stack: list, extra: Optional[str] = None) -> str:
    """Source text calling the resume function at `offset` with the live locals and `stack`."""
    code = tx.code
    origin = RESUME_ORIGIN.get(code)
    orig = origin[0] if origin else code
    kinds = tuple("null" if v is V.NULL else "iter" if isinstance(v, V.IteratorVT) else "val"
                  for v in stack) + (("val",) if extra is not None else ())  # fmt: skip
    cellvars = orig.co_cellvars
    values = dict(tx.locals)
    for name in cellvars:  # cell contents travel as plain values; the resume code re-cells them
        values.pop(name, None)
        cell = tx.cells.get(name)
        if isinstance(cell, V.CellVT) and cell.value is not None:
            values[name] = cell.value
    unbound = tuple(n for n in orig.co_varnames if n not in values)
    own_cells = [c for c in cellvars if c not in orig.co_varnames]
    cells = tuple(c in values for c in own_cells)
    for v in stack:
        if isinstance(v, (V.ContextExitVT, V.GradModeVT)):
            raise Unsupported("graph break inside a with-block")
    try:
        rcode = make_resume_code(code, offset, kinds, unbound, cells)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    args = [cg.expr(values[n]) if n in values else "None" for n in orig.co_varnames]
    args += ["None" if v is V.NULL else cg.iter_items(v) if isinstance(v, V.IteratorVT)
             else cg.expr(v) for v in stack]  # fmt: skip
    if extra is not None:
        args.append(extra)
    args += [cg.expr(values[c]) if c in values else "None" for c in own_cells]
    if code.co_freevars:
        mk = cg.obj(types.FunctionType, "function")
        g = cg.obj(tx.f_globals, "globals")
        fn_expr = f"{mk}({cg.obj(rcode, 'code')}, {g}, {rcode.co_name!r}, None, ___fn.__closure__)"
    else:
        fn_expr = cg.obj(types.FunctionType(rcode, tx.f_globals, rcode.co_name), "resume")
    return f"{fn_expr}({', '.join(args)})"


# The calls torch.autocast's __enter__/__exit__ make (inlined from a `with torch.autocast(...)`
# block): recorded in the graph where they happen, so ops between them run with that autocast
# state whenever the graph runs (and when a backend traces it).
AUTOCAST_STATE_FNS = {torch.set_autocast_enabled, torch.set_autocast_dtype,
                      torch.autocast_increment_nesting, torch.autocast_decrement_nesting,
                      torch.set_autocast_cache_enabled, torch.clear_autocast_cache}  # fmt: skip


def _is_impure(node: fx.Node) -> bool:
    """In-place ops and global-state switches must stay even when nothing reads their result."""
    if node.op == "placeholder" or node.op == "output":
        return True
    if node.target is torch._C._set_grad_enabled or node.target in AUTOCAST_STATE_FNS:
        return True
    if _writes_arguments(node.target):  # an operator whose schema writes an argument
        return True
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name in ("setitem", "__setitem__") or (
        "out" in node.kwargs
    )


def _writes_arguments(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, o)._schema.is_mutable for o in target.overloads())
    return False


def eliminate_dead_code(graph: fx.Graph) -> None:
    for node in reversed(list(graph.nodes)):
        if not node.users and not _is_impure(node):
            graph.erase_node(node)


def graph_module(output, outputs: list) -> fx.GraphModule:
    """Finish the fx graph: its output is the tuple of graph-produced tensors the code needs."""
    output.graph.output(tuple(vt.node for vt in outputs))
    eliminate_dead_code(output.graph)
    if output.shape_env is not None and output.shape_env.replacements:
        output.shape_env.pin_placeholders(output.graph)
        for sub in output.root_module.modules():  # control-flow bodies take symbolic sizes too
            if isinstance(sub, fx.GraphModule):
                output.shape_env.pin_placeholders(sub.graph)
    gm = fx.GraphModule(output.root_module, output.graph)  # with control-flow subgraphs
    gm.graph.lint()
    return gm
