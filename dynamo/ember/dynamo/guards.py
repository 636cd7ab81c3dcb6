"""Guards: the assumptions a compiled frame makes, compiled into the C++ guard VM's program."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import torch

from . import source as S
from ._native import _C
from .config import config


@dataclasses.dataclass(frozen=True)
class Guard:
    """One check on the value of `source`: kind is ID, TYPE, EQ, LEN, TENSOR, SAME or DICT_KEYS."""

    kind: str
    source: Optional[S.Source]
    value: Any = None

    def describe(self) -> str:
        where = self.source.name() if self.source is not None else ""
        if self.kind == "ID":
            return f"{where} is {_short(self.value)}"
        if self.kind == "TYPE":
            return f"type({where}) is {self.value.__qualname__}"
        if self.kind == "EQ":
            return f"{where} == {self.value!r}"
        if self.kind == "LEN":
            return f"len({where}) == {self.value}"
        if self.kind == "TENSOR":
            t, dtype, dev, rg, sizes, strides = self.value
            return (f"{where}: {t.__name__} {dtype} {dev} sizes={list(sizes)} "
                    f"strides={list(strides)} requires_grad={rg}")  # fmt: skip
        if self.kind == "SYM_TENSOR":
            t, dtype, dev, rg, spec = self.value
            sizes = [f"slot{-1 - n}" if n < 0 else str(n) for n in spec]
            return (f"{where}: {t.__name__} {dtype} {dev} sizes=[{', '.join(sizes)}] "
                    f"row-major requires_grad={rg}")  # fmt: skip
        if self.kind == "SYM_ARRAY":
            sizes = [f"slot{-1 - n}" if n < 0 else str(n) for n in self.value[1]]
            return f"{where}: ndarray shape=({', '.join(sizes)}) C order"
        if self.kind == "EXPR":
            return f"sizes: {self.value[1]}"
        if self.kind == "PARAM":
            p, (_, dtype, dev, rg, sizes, strides) = self.value
            return (f"{where} is parameter {id(p):#x} ({dtype} {dev} sizes={list(sizes)} "
                    f"strides={list(strides)} requires_grad={rg})")  # fmt: skip
        if self.kind == "NO_HOOKS":
            return f"{where} has no hooks ({', '.join(self.value)} empty)"
        if self.kind == "SAME":
            return f"{where} is {self.value.name()}"
        if self.kind == "DICT_KEYS":
            return f"keys({where}) == {list(self.value)}"
        if self.kind == "GRAD_MODE":
            return f"torch.is_grad_enabled() == {self.value}"
        return f"{self.kind}({where}, {self.value!r})"


def _short(value) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    kind = type(value).__name__
    return f"<{kind} {name}>" if name else f"<{kind} at {id(value):#x}>"


def tensor_spec(t: torch.Tensor) -> tuple:
    """What a TENSOR guard compares: exact type, dtype, device, requires_grad, sizes, strides."""
    return (type(t), t.dtype, t.device, t.requires_grad, tuple(t.shape), tuple(t.stride()))


class GuardSet:
    """The guards of one frame conversion, in the order they were installed, deduplicated."""

    def __init__(self):
        self.guards: dict[Guard, None] = {}
        # Objects an ID guard refers to must outlive the guard (ids are compared).
        self.keepalive: list = []
        self.nslots = 0  # int slots of dynamic sizes (SYM_TENSOR fills, EXPR reads)
        self._items: Optional[list] = None  # items(), until the next guard is added

    def add_relations(self, relations, nslots: int) -> None:
        """Guards on dynamic sizes: each sympy relation over slot symbols, compiled to the
        guard VM's int-expression program."""
        from .symbolic import compile_int_program, slot_symbol

        self.nslots = nslots
        slot_of = {slot_symbol(k): k for k in range(nslots)}
        for rel in relations:
            self.add("EXPR", None, (compile_int_program(rel, slot_of), str(rel)))

    def add(self, kind: str, source: Optional[S.Source], value=None) -> None:
        if kind == "PARAM":  # value: the parameter; its metadata as a TENSOR guard's
            self.keepalive.append(value)
            key = Guard(kind, source, (_IdBox(value), tensor_spec(value)))
        elif kind in ("ID", "NOT_ID"):
            self.keepalive.append(value)
            key = Guard(kind, source, _IdBox(value))
        elif kind == "EQ":
            try:
                hash(value)
                key = Guard(kind, source, value)
            except TypeError:
                key = Guard(kind, source, _IdBox(value))
        else:
            key = Guard(kind, source, value)
        if key not in self.guards:
            self.guards[key] = None
            self._items = None

    def __len__(self):
        return len(self.guards)

    def items(self) -> list[Guard]:
        # made once per change: describe() and compile() both read them
        if self._items is None:
            self._items = [dataclasses.replace(g, value=_unbox(g.value)) for g in self.guards]
        return list(self._items)

    def describe(self) -> list[str]:
        return [g.describe() for g in self.items()]

    def compile(self) -> "_C.GuardProgram":
        """The C++ program checking every guard; cheap checks (ids, types) are ordered first."""
        instrs: list = []
        loads = S.LoadCompiler(instrs)
        order = {"ID": 0, "NOT_ID": 0, "TYPE": 1, "EQ": 2, "LEN": 2, "DICT_KEYS": 3, "SAME": 4,
                 "PARAM": 5, "NO_HOOKS": 5, "TENSOR": 6, "SYM_TENSOR": 6, "SYM_ARRAY": 6,
                 "EXPR": 8}  # fmt: skip
        for g in sorted(self.items(), key=lambda g: order.get(g.kind, 9)):
            _emit(g, instrs, loads)
        if config.guard_grad_mode:
            grad = torch.is_grad_enabled()
            instrs.append((S.G_GRAD_MODE, 0, 0, int(grad), torch.is_grad_enabled))
        # Process state a traced graph bakes in: autocast's switch per device, the dtype its
        # casts go to where it was on (a graph traced under bfloat16 autocast is not reused
        # under float16; one traced without autocast is rejected by the switch alone), and the
        # default dtype that factories without one take (torch.ones(3)).
        for enabled, dtype in _autocast_queries():
            on = enabled()
            instrs.append((S.G_GRAD_MODE, 0, 0, int(on), enabled))
            if on:
                instrs.append((S.G_CALL_IS, 0, 0, 0, (dtype, dtype())))
        default = torch.get_default_dtype
        instrs.append((S.G_CALL_IS, 0, 0, 0, (default, default())))
        return _C.GuardProgram(instrs, max(loads.nregs, 1), self.nslots)


_AUTOCAST: list = []


def _autocast_queries() -> list:
    """(is autocast on, its dtype) as zero-argument callables, per device type torch knows."""
    if not _AUTOCAST:
        for device in ("cpu", "cuda"):
            try:
                torch.is_autocast_enabled(device)
                torch.get_autocast_dtype(device)
            except (TypeError, RuntimeError):
                continue
            _AUTOCAST.append((functools.partial(torch.is_autocast_enabled, device),
                              functools.partial(torch.get_autocast_dtype, device)))
    return _AUTOCAST


class _IdBox:
    """Hashes and compares by identity (for ID guards on unhashable objects)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _IdBox) and other.obj is self.obj


def _unbox(v):
    if isinstance(v, tuple) and v and isinstance(v[0], _IdBox):
        return (v[0].obj, *v[1:])
    return v.obj if isinstance(v, _IdBox) else v


def _emit(g: Guard, instrs: list, loads: S.LoadCompiler) -> None:
    if g.kind == "EXPR":
        instrs.append((S.G_INT_EXPR, 0, 0, 0, g.value[0]))
        return
    r = loads.reg(g.source)
    if g.kind == "ID":
        instrs.append((S.G_ID, 0, r, 0, g.value))
    elif g.kind == "NOT_ID":
        instrs.append((S.G_NOT_ID, 0, r, 0, g.value))
    elif g.kind == "TYPE":
        instrs.append((S.G_TYPE, 0, r, 0, g.value))
    elif g.kind == "EQ":
        if g.value is None or isinstance(g.value, bool):
            instrs.append((S.G_ID, 0, r, 0, g.value))
        else:
            instrs.append((S.G_EQ, 0, r, 0, g.value))
    elif g.kind == "LEN":
        instrs.append((S.G_LEN, 0, r, g.value, None))
    elif g.kind == "NO_HOOKS":
        instrs.append((S.G_NO_HOOKS, 0, r, 0, tuple(g.value)))
    elif g.kind == "PARAM":
        instrs.append((S.G_PARAM, 0, r, 0, tuple(g.value)))  # (parameter, tensor_spec)
    elif g.kind == "TENSOR":
        instrs.append((S.G_TENSOR, 0, r, 0, g.value))
    elif g.kind == "SYM_TENSOR":
        instrs.append((S.G_SYM_TENSOR, 0, r, 0, g.value))
    elif g.kind == "SYM_ARRAY":  # value: (itemsize, size spec)
        instrs.append((S.G_SYM_ARRAY, 0, r, g.value[0], g.value[1]))
    elif g.kind == "SAME":
        instrs.append((S.G_SAME, 0, r, loads.reg(g.value), None))
    elif g.kind == "DICT_KEYS":
        instrs.append((S.G_DICT_KEYS, 0, r, 0, tuple(g.value)))
    else:
        raise ValueError(f"unknown guard kind {g.kind}")
