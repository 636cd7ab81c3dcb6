"""The op vocabulary: the name, version, signature and tags of every op a graph may call.

primtorch defines the prims (and the extern ops) here, one `define` call each; the vocabulary is the
frozen contract between components, pinned by the golden opset file beside this module. A graph
names its call targets by qualified name ("prims.add", "extern.mm"), resolved through this table.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from pathlib import Path
from typing import Any, Callable

from .codec import schema_class, to_json

OPSET_VERSION = 1
GOLDEN_OPSET = Path(__file__).with_name("golden") / f"opset_v{OPSET_VERSION}.json"

# Targets every graph may use besides vocabulary ops.
_BUILTIN_TARGETS: dict[str, Callable] = {"getitem": operator.getitem}


@schema_class
@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One argument of an op: its name, type ("Tensor", "Tensor[]", "int", "int[]", "float",
    "bool", "dtype", "device", "Scalar", "str", "Optional[...]", "Graph": a subgraph named by a
    get_attr node), and default if it has one
    (in the JSON form of `codec.value_to_json`)."""

    name: str
    type: str
    default: Any = None
    has_default: bool = False
    kwarg_only: bool = False


@schema_class
@dataclasses.dataclass(frozen=True)
class OpSchema:
    """An op of the vocabulary: qualified name, version, arguments, return types and tags."""

    name: str
    version: int
    args: tuple[ArgSpec, ...]
    returns: tuple[str, ...]
    tags: tuple[str, ...]

    @property
    def namespace(self) -> str:
        return self.name.split(".", 1)[0]

    def signature(self) -> str:
        parts = []
        for a in self.args:
            text = f"{a.type} {a.name}" + (f"={a.default!r}" if a.has_default else "")
            parts.append(("*, " if a.kwarg_only else "") + text)
        return f"{self.name}({', '.join(parts)}) -> ({', '.join(self.returns)})"


_VOCAB: dict[str, OpSchema] = {}
_IMPLS: dict[str, Callable] = {}
_NAMES: dict[int, str] = {}


def define(schema: OpSchema, impl: Callable) -> Callable:
    """Add an op to the vocabulary with the callable that graphs use as its call target."""
    if schema.name in _VOCAB and _VOCAB[schema.name] != schema:
        raise ValueError(f"op {schema.name} is already defined with another schema")
    _VOCAB[schema.name] = schema
    _IMPLS[schema.name] = impl
    _NAMES[id(impl)] = schema.name
    return impl


def lookup(name: str) -> OpSchema:
    """The schema of a vocabulary op."""
    try:
        return _VOCAB[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the Ember op vocabulary (is ember.primtorch imported?)") from None


def vocabulary() -> dict[str, OpSchema]:
    """Every op defined so far, by qualified name."""
    return dict(_VOCAB)


def target_name(target) -> str:
    """The qualified name under which a graph's call target is serialised."""
    name = _NAMES.get(id(target))
    if name is not None:
        return name
    for key, fn in _BUILTIN_TARGETS.items():
        if target is fn:
            return key
    raise KeyError(f"call target {target!r} is not in the Ember op vocabulary")


def resolve(name: str) -> Callable:
    """The callable for a qualified op name (inverse of `target_name`)."""
    if name in _BUILTIN_TARGETS:
        return _BUILTIN_TARGETS[name]
    if name not in _IMPLS:
        lookup(name)
    return _IMPLS[name]


def opset_snapshot() -> dict:
    """The vocabulary as the golden opset file stores it."""
    return {
        "opset_version": OPSET_VERSION,
        "ops": {name: to_json(s) for name, s in sorted(_VOCAB.items())},
    }


def golden_opset() -> dict:
    """The frozen opset checked in beside this module."""
    return json.loads(GOLDEN_OPSET.read_text())
