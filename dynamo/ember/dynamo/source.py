"""Sources: where a value the frame reads comes from (argument, global, attribute, item, cell).

A source prints as a Python expression valid inside the transformed function (whose parameters are
`___fn` and the frame's arguments) and compiles to the guard VM's load instructions.
"""

from __future__ import annotations

import dataclasses
import keyword
import re


def sanitize(name: str) -> str:
    """A parameter name for a frame local (comprehension arguments are named `.0`)."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    return "___v_" + re.sub(r"\W", "_", name)


class Source:
    """Base of all sources; subclasses are frozen dataclasses (hashable, comparable)."""

    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        return self.expr()

    def expr_on(self, base: str):
        """The expression reading this source from `base`, its base's value (named by a
        temporary); None for a source with no base or read otherwise."""
        return None

    def is_module_param(self) -> bool:
        return False

    def __getstate__(self):
        # a hash remembered by _hash_once is only valid in this process (str hashes are salted)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    """A frame argument: `index` is its slot in the frame's fast locals."""

    local: str
    index: int

    def expr(self):
        return sanitize(self.local)

    def name(self):
        return f"L[{self.local!r}]"


@dataclasses.dataclass(frozen=True)
class FnSource(Source):
    """The function object whose frame is running (its closure holds free variables)."""

    def expr(self):
        return "___fn"


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    """A name read from the frame's globals (or builtins)."""

    global_name: str

    def expr(self):
        return self.global_name

    def name(self):
        return f"G[{self.global_name!r}]"


def _hash_once(self) -> int:
    """A chained source's hash, computed once: sources are dict keys (inputs by source, guard
    registers) and a module attribute's source is a chain as deep as the module tree, which the
    dataclass hash walked on every lookup."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash((type(self).__name__, *(getattr(self, f.name) for f in dataclasses.fields(self))))
        object.__setattr__(self, "_hash", h)
    return h


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str
    __hash__ = _hash_once

    def expr(self):
        return self.expr_on(self.base.expr())

    def expr_on(self, base: str):
        if self.attr.isidentifier() and not keyword.iskeyword(self.attr):
            return f"{base}.{self.attr}"
        return f"getattr({base}, {self.attr!r})"

    def name(self):
        return f"{self.base.name()}.{self.attr}"


@dataclasses.dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # an int or str constant
    __hash__ = _hash_once

    def is_module_param(self):
        return isinstance(self.base, AttrSource) and self.base.attr == "_parameters"

    def expr(self):
        return self.expr_on(self.base.expr())

    def expr_on(self, base: str):
        return f"{base}[{key_text(self.key)}]"

    def name(self):
        return f"{self.base.name()}[{self.key!r}]"


def literal_key(key) -> bool:
    """A dict key written as a Python literal; other keys (a class keying a dispatch table) are
    named `___c_<id>` and passed to the transformed code (codegen.CodeGen.source)."""
    if type(key) is tuple:
        return all(literal_key(k) for k in key)
    return type(key) in (int, str, bool, bytes, type(None)) or (
        type(key) is float and key == key and abs(key) != float("inf")
    )


def key_text(key) -> str:
    return repr(key) if literal_key(key) else f"___c_{id(key)}"


@dataclasses.dataclass(frozen=True)
class CellSource(Source):
    """`base.__closure__[index].cell_contents` for a function `base`."""

    base: Source
    index: int
    __hash__ = _hash_once

    def expr(self):
        return f"{self.base.expr()}.__closure__[{self.index}].cell_contents"

    def name(self):
        return f"{self.base.name()}.__closure__[{self.index}]"


@dataclasses.dataclass(frozen=True)
class LocalShardSource(Source):
    """`base.to_local()`: the local shard of the DTensor parameter at `base`, read through
    DTensor's differentiable to_local (its gradient becomes the parameter's DTensor gradient).
    Never guarded: a PARAM guard on `base` pins the parameter, and with it the shard."""

    base: Source
    __hash__ = _hash_once

    def expr(self):
        return f"{self.base.expr()}.to_local()"

    def name(self):
        return f"{self.base.name()}.to_local()"


class ConstantSource(Source):
    """An object known when the frame was converted (a module's globals dict, a class attribute):
    the guard VM holds it directly and the transformed code reads it from its closure."""

    def __init__(self, obj, label: str = ""):
        self.obj = obj
        self.label = label or type(obj).__name__

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, ConstantSource) and other.obj is self.obj

    def expr(self):
        return f"___c_{id(self.obj)}"

    def name(self):
        return f"<{self.label}>"


def module_param_source(module_source: Source, kind: str, key: str) -> Source:
    """`module._parameters[key]` (or _buffers/_modules): skips nn.Module.__getattr__ when read."""
    return ItemSource(AttrSource(module_source, kind), key)


# Guard VM opcodes (csrc/eval_frame.cc: enum GuardOp).
G_ARG, G_GLOBAL, G_ATTR, G_ITEM, G_CELL, G_CONST = 0, 1, 2, 3, 4, 5
G_ID, G_TYPE, G_EQ, G_LEN, G_TENSOR, G_SAME, G_DICT_KEYS, G_GRAD_MODE, G_NOT_ID, G_PARAM = (
    10, 11, 12, 13, 14, 15, 16, 17, 18, 19
)
G_NO_HOOKS, G_SYM_TENSOR, G_INT_EXPR, G_CALL_IS, G_SYM_ARRAY = 20, 21, 22, 23, 24  # fmt: skip


class LoadCompiler:
    """Assigns a register to each source and emits the loads that fill it, sharing prefixes."""

    def __init__(self, instrs: list):
        self.instrs = instrs
        self.regs: dict[Source, int] = {}
        self.nregs = 0

    def reg(self, source: Source) -> int:
        if source in self.regs:
            return self.regs[source]
        if isinstance(source, LocalSource):
            ins = (G_ARG, None, 0, source.index + 1, None)
        elif isinstance(source, FnSource):
            ins = (G_ARG, None, 0, 0, None)
        elif isinstance(source, GlobalSource):
            ins = (G_GLOBAL, None, 0, 0, source.global_name)
        elif isinstance(source, AttrSource):
            ins = (G_ATTR, None, self.reg(source.base), 0, source.attr)
        elif isinstance(source, ItemSource):
            ins = (G_ITEM, None, self.reg(source.base), 0, source.key)
        elif isinstance(source, ConstantSource):
            ins = (G_CONST, None, 0, 0, source.obj)
        elif isinstance(source, CellSource):
            ins = (G_CELL, None, self.reg(source.base), source.index, None)
        else:
            raise TypeError(f"cannot guard on source {source!r}")
        r = self.nregs
        self.nregs += 1
        op, _, src, idx, obj = ins
        self.instrs.append((op, r, src, idx, obj))
        self.regs[source] = r
        return r
