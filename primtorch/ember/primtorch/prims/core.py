"""The Prim class and `prim(...)`, the one place where a primitive is registered.

A prim is a callable with a vocabulary schema, a meta rule and a reference implementation:

- called on real tensors it runs its reference implementation (torch eager);
- called while an `ember.primtorch.Tracer` is recording, it runs the reference on the real values
  and records a graph node whose TensorMeta comes from the meta rule;
- `p.meta(*args)` takes TensorMetas in tensor positions and returns the output TensorMeta(s).

Registration calls `ember.ir.define`, so graphs name the prim "prims.<name>" (or "extern.<name>").
"""

from __future__ import annotations

import ast
import contextlib
import threading
from typing import Callable, Optional

import torch
from torch.utils import _pytree as pytree

from ember.ir import ArgSpec, OpSchema, TensorMeta, define

# Every prim and extern op, by qualified name ("prims.add", "extern.mm").
PRIMS: dict[str, "Prim"] = {}

# The recorder a prim call goes to (set by ember.primtorch.trace.Tracer while it records). A stack
# so that a tracer started inside another (aot_autograd tracing a graph module) gets the calls; per
# thread, as torch's dispatch modes are: one thread tracing must not record the prim calls another
# thread makes meanwhile (a compiled graph run eagerly, another trace).
_LOCAL = threading.local()


def _recorders() -> list:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def push_recorder(recorder) -> None:
    """Route prim calls on this thread to `recorder.record_prim(prim, args, kwargs)`."""
    _recorders().append(recorder)


def pop_recorder(recorder) -> None:
    """Undo `push_recorder`."""
    stack = _recorders()
    if not stack or stack[-1] is not recorder:
        raise RuntimeError("prim recorders must be pushed and popped in LIFO order")
    stack.pop()


# Recorders lent to autograd's worker threads (see lent_to_autograd_workers).
_LENT: list = []
_LENT_LOCK = threading.Lock()


@contextlib.contextmanager
def lent_to_autograd_workers():
    """While a backward is traced on this thread, prim calls made on autograd's own worker
    threads go to this thread's recorder. Autograd runs a CUDA backward on a worker thread of its
    engine: torch's dispatch modes (the tracer) are carried there, Python's thread-locals (the
    recorder stack) are not, so without this the tracer's decompositions called prims that ran
    their references, which dispatched back to the tracer, and so on without end."""
    recorder = current_recorder()
    if recorder is None:
        yield
        return
    with _LENT_LOCK:
        _LENT.append(recorder)
    try:
        yield
    finally:
        with _LENT_LOCK:
            _LENT.remove(recorder)


def _engine_thread() -> bool:
    # Threads started outside Python's threading module (autograd's workers are C++ threads)
    # appear as dummy threads; a Python thread of the program never does.
    return isinstance(threading.current_thread(), threading._DummyThread)


def current_recorder():
    """The recorder that receives prim calls on this thread now, or None."""
    stack = getattr(_LOCAL, "stack", None)
    if not stack and _LENT and _engine_thread():
        stack = _LENT
    if stack and getattr(stack[-1], "recording", True):
        return stack[-1]
    return None


class Prim:
    """One primitive (or extern) op: schema, meta rule, reference implementation and tags."""

    def __init__(self, schema: OpSchema, meta: Callable, ref: Callable, canon=None, doc=""):
        self.schema = schema
        self.qualname = schema.name
        self.namespace, self.name = schema.name.split(".", 1)
        self.tags = frozenset(schema.tags)
        self._meta = meta
        self.ref = ref
        # Normalises arguments before they are recorded (negative dims, lists to tuples), so every
        # consumer sees one canonical spelling of each call.
        self.canon = canon
        # fx prints a call target as module_name: "prims_add", "extern_mm" in generated code.
        self.__name__ = self.name
        self.__qualname__ = self.name
        self.__module__ = self.namespace
        self.__doc__ = doc or f"{schema.signature()}"

    def __call__(self, *args, **kwargs):
        recorder = current_recorder()
        if recorder is not None:
            return recorder.record_prim(self, args, kwargs)
        if self.canon is not None:
            args, kwargs = self.canon(*args, **kwargs)
        return self.ref(*args, **kwargs)

    def meta(self, *args, **kwargs):
        """Output TensorMeta(s) for TensorMeta (or tensor) arguments; sizes may be symbolic."""
        args, kwargs = pytree.tree_map(_as_meta, (args, kwargs))
        if self.canon is not None:
            args, kwargs = self.canon(*args, **kwargs)
        return self._meta(*args, **kwargs)

    def canonical_args(self, args, kwargs):
        """The (args, kwargs) that a graph node records for this call."""
        if self.canon is None:
            return tuple(args), dict(kwargs)
        args, kwargs = self.canon(*args, **kwargs)
        return tuple(args), dict(kwargs)

    def __repr__(self):
        return self.qualname

    def __reduce__(self):
        # Pickling (fx graph modules, caches) refers to the registered prim by name.
        return (_resolve_prim, (self.qualname,))


def _resolve_prim(qualname: str) -> "Prim":
    import ember.primtorch.prims  # noqa: F401  (registers every prim)

    return PRIMS[qualname]


def _as_meta(x):
    if isinstance(x, torch.Tensor):
        return TensorMeta.from_tensor(x)
    return x


def parse_signature(name: str, signature: str) -> tuple[tuple[ArgSpec, ...], tuple[str, ...]]:
    """Parse "(Tensor a, int[] dims, *, Optional[dtype] dtype=None) -> Tensor"."""
    head, _, ret = signature.partition("->")
    head, ret = head.strip(), ret.strip()
    if not (head.startswith("(") and head.endswith(")")) or not ret:
        raise ValueError(f"prim {name}: malformed signature {signature!r}")
    args, kwarg_only = [], False
    for part in _split_top(head[1:-1]):
        if part == "*":
            kwarg_only = True
            continue
        decl, eq, default = part.partition("=")
        type_, _, arg_name = decl.strip().rpartition(" ")
        if not type_ or not arg_name:
            raise ValueError(f"prim {name}: cannot parse argument {part!r}")
        spec = ArgSpec(
            name=arg_name,
            type=type_.strip(),
            default=ast.literal_eval(default.strip()) if eq else None,
            has_default=bool(eq),
            kwarg_only=kwarg_only,
        )
        args.append(spec)
    if ret.startswith("("):
        returns = tuple(_split_top(ret[1:-1]))
    else:
        returns = (ret,)
    return tuple(args), returns


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def prim(
    name: str,
    signature: str,
    *,
    meta: Callable,
    ref: Callable,
    tags: tuple[str, ...] = (),
    canon: Optional[Callable] = None,
    namespace: str = "prims",
    doc: str = "",
) -> Prim:
    """Register a prim "<namespace>.<name>" in the Ember op vocabulary and return it."""
    args, returns = parse_signature(name, signature)
    schema = OpSchema(
        name=f"{namespace}.{name}", version=1, args=args, returns=returns, tags=tuple(tags)
    )
    p = Prim(schema, meta, ref, canon=canon, doc=doc)
    if schema.name in PRIMS:
        raise ValueError(f"{schema.name} is registered twice")
    PRIMS[schema.name] = p
    define(schema, p)
    return p


def is_prim(target) -> bool:
    """True for a prim of the "prims" namespace (not an extern op)."""
    return isinstance(target, Prim) and target.namespace == "prims"


def is_extern(target) -> bool:
    """True for an extern op: one a backend calls (a library kernel) rather than generates."""
    return isinstance(target, Prim) and target.namespace == "extern"
