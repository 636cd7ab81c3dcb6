"""Lossless JSON for the schema's frozen dataclasses, driven by their type annotations.

The same annotations give `describe_schema()`, the text that the golden copy pins: changing a field
of any schema class changes it, and the golden test then asks for a version bump.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from typing import Any, Union

import sympy
import torch

from .meta import dtype_from_name, dtype_name
from .symbols import expr_from_json, expr_to_json

SCHEMA_CLASSES: dict[str, type] = {}


def schema_class(cls):
    """Register a frozen dataclass as part of the IR schema."""
    SCHEMA_CLASSES[cls.__name__] = cls
    return cls


# --- free-form values (op arguments) ----------------------------------------------------------
# Node arguments are Python values of a few kinds; each non-JSON kind is a one-key object.


def value_to_json(v):
    """The JSON form of an op argument (node references are encoded by the caller's `ref`)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, sympy.Basic):
        return {"expr": expr_to_json(v)}
    if isinstance(v, (list, tuple)):
        items = [value_to_json(x) for x in v]
        return items if isinstance(v, list) else {"tuple": items}
    raise TypeError(f"ember.ir cannot serialise an argument of type {type(v).__name__}: {v!r}")


def value_from_json(d, ref=None):
    """Inverse of `value_to_json`; `ref(name)` resolves {"node": name} references."""
    if isinstance(d, list):
        return [value_from_json(x, ref) for x in d]
    if not isinstance(d, dict):
        return d
    ((kind, payload),) = d.items()
    if kind == "node":
        if ref is None:
            raise ValueError("a node reference appears where none is allowed")
        return ref(payload)
    if kind == "tuple":
        return tuple(value_from_json(x, ref) for x in payload)
    if kind == "float":
        return float(payload)
    if kind == "dtype":
        return dtype_from_name(payload)
    if kind == "device":
        return torch.device(payload)
    if kind == "memory_format":
        return getattr(torch, payload)
    if kind == "layout":
        return getattr(torch, payload)
    if kind == "expr":
        return expr_from_json(payload)
    raise ValueError(f"unknown value kind {kind!r} in serialised IR")


# --- typed dataclass fields -------------------------------------------------------------------


@functools.cache
def _encoder(tp):
    """The function encoding a value of annotation `tp`, built once per annotation: storing a
    large program encodes tens of thousands of values, and reading each one's annotation again
    (typing.get_origin, get_args) was most of the cost (GPT-2's training step: 0.4 s)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        inner = _encoder(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None else inner(v)
    if origin is tuple:
        item = _encoder(args[0])
        return lambda v: [item(x) for x in v]
    if origin is dict:
        value = _encoder(args[1])
        return lambda v: {k: value(x) for k, x in v.items()}
    if tp is sympy.Expr:
        return expr_to_json
    if tp is torch.dtype:
        return dtype_name
    if tp is Any:  # JSON form (node arguments are encoded by their owner), but for the sizes
        return _sizes_encoded  # a view or kernel step holds as expressions
    if dataclasses.is_dataclass(tp):
        return to_json
    return _identity


def _sizes_encoded(v):
    """`v` with each sympy expression in it as {"expr": ...}: a "view" or "kernel" step keeps
    its symbolic sizes as expressions in memory (StepIR), which JSON cannot hold as they are."""
    if isinstance(v, sympy.Basic):
        return {"expr": expr_to_json(v)}
    if isinstance(v, (list, tuple)):
        return [_sizes_encoded(x) for x in v]
    if isinstance(v, dict):
        return {k: _sizes_encoded(x) for k, x in v.items()}
    return v


def _identity(d):
    return d


@functools.cache
def _decoder(tp):
    """The function decoding JSON data of annotation `tp`, built once per annotation: loading a
    cached program decodes thousands of values, and dispatching on the annotation each time
    (typing.get_origin/get_args, is_dataclass) cost more than the decoding."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        inner = _decoder(next(a for a in args if a is not type(None)))
        return lambda d: None if d is None else inner(d)
    if origin is tuple:
        item = _decoder(args[0])
        return lambda d: tuple([item(x) for x in d])
    if origin is dict:
        value = _decoder(args[1])
        return lambda d: {k: value(x) for k, x in d.items()}
    if tp is sympy.Expr:
        return expr_from_json
    if tp is torch.dtype:
        return dtype_from_name
    if tp is Any:
        return _identity
    if dataclasses.is_dataclass(tp):
        return functools.partial(from_json, tp)
    if tp in (int, float, str, bool):
        def check(d, tp=tp):
            if not isinstance(d, tp) and not (tp is float and isinstance(d, int)):
                found = type(d).__name__
                raise TypeError(f"expected {tp.__name__}, found {found} in serialised IR")
            return d

        return check
    return _identity


@functools.cache
def _type_hints(cls) -> dict:
    # Resolving string annotations compiles each one; schema classes never change, so once.
    return typing.get_type_hints(cls)


# Field metadata of an additive field: left out of the JSON while it holds its default, so a
# document that does not use the addition reads in the readers that predate it.
OMIT_DEFAULT = {"omit_default": True}


def to_json(obj) -> dict:
    """A schema dataclass instance as a JSON-ready dict."""
    out = {}
    for name, encode, omit, default in _encoders_of(type(obj)):
        v = getattr(obj, name)
        if not (omit and v == default):
            out[name] = encode(v)
    return out


@functools.cache
def _encoders_of(cls) -> tuple:
    """((name, encoder, omitted at its default, default), ...) of a schema class's fields."""
    hints = _type_hints(cls)
    return tuple((f.name, _encoder(hints[f.name]), bool(f.metadata.get("omit_default")), f.default)
                 for f in dataclasses.fields(cls))  # fmt: skip


@functools.cache
def _fields_of(cls) -> tuple:
    """(field names, ((name, decoder, required), ...)) of a schema class, in field order."""
    hints = _type_hints(cls)
    fields = tuple(
        (f.name, _decoder(hints[f.name]),
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )  # fmt: skip
    return frozenset(name for name, _, _ in fields), fields


def from_json(cls, data: dict):
    """A schema dataclass instance from `to_json`'s dict; unknown or missing fields are errors."""
    names, fields = _fields_of(cls)
    if not names.issuperset(data):
        unknown = set(data) - names
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)} in serialised IR")
    kwargs = {}
    for name, decode, required in fields:
        if name in data:
            kwargs[name] = decode(data[name])
        elif required:
            raise ValueError(f"{cls.__name__}: field {name!r} missing in serialised IR")
    return cls(**kwargs)


def dumps(obj) -> str:
    return json.dumps(to_json(obj), sort_keys=True, separators=(",", ":"))


def loads(cls, text: str):
    return from_json(cls, json.loads(text))


def _type_text(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return f"Optional[{_type_text(inner[0])}]"
    if origin is tuple:
        return f"tuple[{_type_text(args[0])}, ...]"
    if origin is dict:
        return f"dict[str, {_type_text(args[1])}]"
    if tp is Any:
        return "json"
    return getattr(tp, "__name__", str(tp))


def describe_schema() -> dict:
    """Every schema class with its fields and their types: what the golden copy pins."""
    out = {}
    for name, cls in sorted(SCHEMA_CLASSES.items()):
        hints = typing.get_type_hints(cls)
        out[name] = {f.name: _type_text(hints[f.name]) for f in dataclasses.fields(cls)}
    return out


