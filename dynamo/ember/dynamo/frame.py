"""Setting up frames for the interpreter: the root frame's arguments and cells, and inlining."""

from __future__ import annotations

import builtins as _builtins
import inspect

from . import variables as V
from .exc import Unsupported
from .source import CellSource, ConstantSource, FnSource, GlobalSource, ItemSource, LocalSource

_BUILTINS = _builtins.__dict__


class RealCellVT(V.VT):
    """A closure cell of a real function: reads wrap its contents, writes become side effects."""

    def __init__(self, cell, source):
        self.cell = cell
        self.source = source
        self.value = None
        self.loaded = False

    def load(self, tx):
        if not self.loaded:
            try:
                contents = self.cell.cell_contents
            except ValueError:
                raise Unsupported("free variable referenced before assignment") from None
            self.value = tx.builder.wrap(contents, self.source)
            self.loaded = True
        return self.value

    def store(self, tx, value):
        if self.source is None:
            raise Unsupported("assignment to a closure variable of an unknown function")
        tx.output.record_side_effect("cell", self.source, value)
        self.value = value
        self.loaded = True


def global_loader(tx_root, f_globals: dict):
    """name -> VT for LOAD_GLOBAL in code whose globals are `f_globals`."""
    root_globals = tx_root.f_globals

    def load(name):
        pending = tx_root.pending_globals if f_globals is root_globals else {}
        if name in pending:
            return pending[name]
        if f_globals is root_globals:
            source = GlobalSource(name)
        elif name in f_globals:
            source = ItemSource(ConstantSource(f_globals, "globals"), name)
        else:
            source = ItemSource(ConstantSource(_BUILTINS, "builtins"), name)
        if name in f_globals:
            value = f_globals[name]
        elif name in _BUILTINS:
            value = _BUILTINS[name]
        else:
            raise Unsupported(f"name {name!r} is not defined")
        return tx_root.builder.wrap(value, source)

    return load


def root_frame_state(tx, code, fn, f_globals, args):
    """Locals, cells and the global loader of the frame being compiled."""
    nargs = len(args)
    f_locals = {}
    for i, name in enumerate(code.co_varnames[:nargs]):
        f_locals[name] = tx.builder.wrap(args[i], LocalSource(name, i))
    cells = {}
    for name in code.co_cellvars:
        if name in code.co_varnames[:nargs]:
            continue  # MAKE_CELL moves the argument into its cell
    closure = fn.__closure__ or ()
    for i, name in enumerate(code.co_freevars):
        cells[name] = RealCellVT(closure[i], CellSource(FnSource(), i))
    return f_locals, cells, global_loader(tx, f_globals)


def bind_args(fn_like, args: list, kwargs: dict) -> dict:
    """Bind symbolic arguments to a function's parameters (defaults come back as real values)."""
    try:
        bound = inspect.signature(fn_like).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"calling {getattr(fn_like, '__name__', fn_like)}: {e}") from None
    bound.apply_defaults()
    return bound.arguments


def bind_code(code, args: list, kwargs: dict, defaults, kwdefaults, name: str) -> dict:
    """Bind arguments to a code object's parameters, as CPython's frame setup does.

    `defaults`/`kwdefaults` hold VTs or real values; missing parameters take them."""
    names = code.co_varnames
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    pos_names, kw_names = names[:npos], names[npos : npos + nkw]
    i = npos + nkw
    varargs = names[i] if code.co_flags & inspect.CO_VARARGS else None
    varkw = names[i + (varargs is not None)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    out = dict(zip(pos_names, args))
    extra = list(args[npos:])
    if extra and varargs is None:
        raise Unsupported(f"{name}() takes {npos} positional arguments but {len(args)} were given")
    kw = dict(kwargs)
    for n in pos_names[code.co_posonlyargcount :] + kw_names:
        if n in kw:
            if n in out:
                raise Unsupported(f"{name}() got multiple values for argument {n!r}")
            out[n] = kw.pop(n)
    if kw and varkw is None:
        raise Unsupported(f"{name}() got unexpected keyword arguments {sorted(kw)}")
    defaults = tuple(defaults or ())
    first_default = npos - len(defaults)
    for j, n in enumerate(pos_names):
        if n not in out:
            if j < first_default:
                raise Unsupported(f"{name}() missing argument {n!r}")
            out[n] = _Default(defaults[j - first_default])
    for n in kw_names:
        if n not in out:
            if not kwdefaults or n not in kwdefaults:
                raise Unsupported(f"{name}() missing keyword argument {n!r}")
            out[n] = _Default(kwdefaults[n])
    if varargs is not None:
        out[varargs] = V.TupleVT(extra)
    if varkw is not None:
        out[varkw] = V.DictVT(kw)
    return out


def inline_call(tx, fn_vt, args: list, kwargs: dict) -> V.VT:
    """Run a Python function's code in a child translator and return its symbolic result."""
    from .interpreter import Translator

    if isinstance(fn_vt, V.FunctionVT):
        fn = fn_vt.fn
        code, f_globals = fn.__code__, fn.__globals__
        closure_cells = {}
        for i, name in enumerate(code.co_freevars):
            src = CellSource(fn_vt.source, i) if fn_vt.source is not None else None
            if src is None:
                src = AttrSourceCell(fn.__closure__[i])
            closure_cells[name] = RealCellVT(fn.__closure__[i], src)
        defaults, kwdefaults = fn.__defaults__, fn.__kwdefaults__
    else:  # NestedFunctionVT
        fn = None
        code, f_globals = fn_vt.code, fn_vt.globals
        closure_cells = dict(zip(code.co_freevars, fn_vt.closure or ()))
        defaults, kwdefaults = fn_vt.defaults, fn_vt.kwdefaults
    if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"call to coroutine function {code.co_name}")
    bound = bind_code(code, args, kwargs, defaults, kwdefaults, code.co_name)
    f_locals = {}
    for name, value in bound.items():
        f_locals[name] = _as_vt(tx, value, fn, name, getattr(fn_vt, "source", None))
    child = Translator(tx.root, code, f_locals, closure_cells, global_loader(tx.root, f_globals),
                       parent=tx)  # fmt: skip
    child.f_globals = f_globals
    if code.co_flags & inspect.CO_GENERATOR:
        # Run a generator to completion and iterate over what it yielded: exact when the
        # consumer exhausts it and the generator's work has no effects outside the graph.
        child.yielded = []
        child.run()
        return V.IteratorVT(child.yielded)
    return child.run()


def AttrSourceCell(cell):
    """Source of a real cell's contents when the function itself has no source."""
    from .source import AttrSource

    return AttrSource(ConstantSource(cell, "cell"), "cell_contents")


class _Default:
    """Marks a parameter filled from the function's defaults (a VT or a real value)."""

    def __init__(self, vt):
        self.vt = vt


def _as_vt(tx, value, fn, name, fn_source):
    if isinstance(value, V.VT):
        return value
    if isinstance(value, _Default):
        value = value.vt
        if isinstance(value, V.VT):
            return value
    if fn is None:
        raise Unsupported("a default value of a nested function that is not symbolic")
    # A default value of a real function: constants need no guard (the function is guarded).
    from .builder import is_const_value

    if is_const_value(value):
        return V.ConstVT(value)
    return tx.builder.wrap(value, _default_source(fn, name, fn_source))


def _default_source(fn, name, fn_source):
    if fn_source is None:
        fn_source = ConstantSource(fn, "function")
    from .source import AttrSource

    code = fn.__code__
    pos = code.co_varnames[: code.co_argcount]
    if name in pos and fn.__defaults__:
        first_default = len(pos) - len(fn.__defaults__)
        return ItemSource(AttrSource(fn_source, "__defaults__"), pos.index(name) - first_default)
    return ItemSource(AttrSource(fn_source, "__kwdefaults__"), name)
