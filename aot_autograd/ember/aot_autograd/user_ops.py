"""User operators that write their arguments, under torch.func.functionalize.

torch's functionalization refuses an operator outside ATen whose schema writes an argument
(`torch.library.custom_op(..., mutates_args=("out",))`): it has no functional variant. While
aot_autograd traces, a torch-function mode sees each such operator before it is dispatched and
gives it a Functionalize kernel (once per operator, kept for the process): the kernel runs the
operator below functionalization on private copies of the written arguments (the tracer records
that as one functional `extern.custom_op`) and makes the copies the arguments' new values, so
views of them and the copy back into a mutated input are replayed as for an in-place ATen op.
Eager calls of the operator never reach that kernel (no tensor carries the Functionalize key).
Mutating operators defined with `torch.library.custom_op` are all prepared when tracing starts
(their backward formulas run where torch-function modes are off); those defined with the
`Library` API are prepared when the forward calls them.
"""

from __future__ import annotations

import threading

import torch
from torch.overrides import TorchFunctionMode

from ember.primtorch.prims.custom import is_custom_op, qualified_name

_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize
_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> the Library holding our kernels
_DONE: set[str] = set()
_LOCK = threading.Lock()


def _written_names(op) -> set[str]:
    return {a.name for a in op._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write}  # fmt: skip


def _unwrap(t):
    if isinstance(t, torch.Tensor) and torch._is_functional_tensor(t):
        torch._sync(t)
        return torch._from_functional_tensor(t)
    if isinstance(t, (list, tuple)):
        return type(t)(_unwrap(x) for x in t)
    return t


def _wrap(t):
    if isinstance(t, torch.Tensor):
        return torch._to_functional_tensor(t)
    if isinstance(t, (list, tuple)):
        return type(t)(_wrap(x) for x in t)
    return t


def _functionalize_kernel(op):
    written = _written_names(op)
    names = [a.name for a in op._schema.arguments]

    def kernel(*args, **kwargs):
        raw_args = [_unwrap(a) for a in args]
        raw_kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        updates = []  # (functional tensor, private copy the operator writes)
        for i, name in enumerate(names):
            where, key = (raw_args, i) if i < len(args) else (raw_kwargs, name)
            if name in written and (key in where if where is raw_kwargs else True):
                if isinstance(where[key], torch.Tensor):
                    where[key] = where[key].clone()
                    updates.append((args[i] if where is raw_args else kwargs[name], where[key]))
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_FUNCTIONALIZE)):
            out = op(*raw_args, **raw_kwargs)
        for functional, value in updates:
            torch._functionalize_replace(functional, value)
            torch._functionalize_commit_update(functional)
        return _wrap(out)

    return kernel


def ensure_functionalizable(op) -> None:
    """Give the mutating user operator `op` a Functionalize kernel, unless it has one."""
    name = qualified_name(op)
    if name in _DONE:
        return
    with _LOCK:
        if name in _DONE:
            return
        schema_name = op._schema.name
        if not torch._C._dispatch_has_kernel_for_dispatch_key(schema_name, "Functionalize"):
            ns, _, op_name = schema_name.partition("::")
            lib = _LIBRARIES.get(ns)
            if lib is None:
                lib = _LIBRARIES[ns] = torch.library.Library(ns, "IMPL")
            overload = op._overloadname
            lib.impl(op_name if overload == "default" else f"{op_name}.{overload}",
                     _functionalize_kernel(op), "Functionalize")  # fmt: skip
        _DONE.add(name)


class UserOpFunctionalizer(TorchFunctionMode):
    """Active while aot_autograd traces: prepares each mutating user operator it sees, and on
    entry every mutating `torch.library.custom_op` defined so far (a backward formula runs
    where torch-function modes are off, so its calls are never seen)."""

    def __enter__(self):
        _prepare_custom_op_definitions()
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        op = func
        if type(func).__name__ == "CustomOpDef":
            op = getattr(func, "_opoverload", func)
        if isinstance(op, torch._ops.OpOverloadPacket):
            for o in op.overloads():
                _prepare(getattr(op, o))
        else:
            _prepare(op)
        return func(*args, **(kwargs or {}))


_SCANNED = [0]  # how many custom_op definitions were prepared


def _prepare_custom_op_definitions() -> None:
    try:
        from torch._library.custom_ops import OPDEFS  # where custom_op keeps its definitions
    except ImportError:  # pragma: no cover (older torch)
        return
    if len(OPDEFS) == _SCANNED[0]:
        return
    for opdef in list(OPDEFS.values()):
        op = getattr(opdef, "_opoverload", None)
        if op is not None:
            _prepare(op)
    _SCANNED[0] = len(OPDEFS)


def _prepare(op) -> None:
    if is_custom_op(op) and op._schema.is_mutable:
        ensure_functionalizable(op)
