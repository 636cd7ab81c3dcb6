"""Which torch callables go in the graph, fold to constants, or force a graph break."""

from __future__ import annotations

import operator
import types

import torch

from . import variables as V
from .exc import AttrMissing, Unsupported
from .symbolic import SizeVT, SymbolicFallback, SymIntVT

# Tensor methods whose result depends only on metadata (guarded by the tensor guard): constants.
CONST_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
                 "element_size", "is_floating_point", "is_complex", "get_device", "is_signed",
                 "storage_offset", "has_names", "is_inference"}  # fmt: skip
CONST_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_sparse",
               "is_quantized", "is_meta", "layout", "is_leaf", "is_nested", "itemsize", "nbytes",
               "is_mps", "is_cpu", "is_xpu"}  # fmt: skip
GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
# Methods that read tensor data into Python, have effects outside the graph, or whose output
# shape depends on data (a constant-folded shape would be wrong for other data).
BREAK_METHODS = {"item", "tolist", "numpy", "backward", "data_ptr", "register_hook", "__bool__",
                 "__int__", "__float__", "__index__", "nonzero", "unique", "masked_select",
                 "argwhere", "bincount", "unique_consecutive", "retain_grad", "storage",
                 "untyped_storage", "record_stream", "__repr__", "__str__", "__format__",
                 "pin_memory", "share_memory_", "cpu_", "__reduce_ex__", "__deepcopy__",
                 "set_", "resize_", "__len__", "__iter__", "__array__"}  # fmt: skip

_T = torch
# torch functions with effects outside the graph, or data-dependent output shapes.
BREAK_FNS = {_T.manual_seed, _T.seed, _T.save, _T.load, _T.set_default_dtype, _T.set_printoptions,
             _T.nonzero, _T.unique, _T.masked_select, _T.argwhere, _T.bincount,
             _T.unique_consecutive, _T.autograd.grad, _T.autograd.backward,
             _T.set_default_device, _T.use_deterministic_algorithms,
             _T.set_num_threads}  # fmt: skip
# torch functions answering from metadata or global state: folded to constants.
CONST_FNS = {_T.is_tensor, _T.is_floating_point, _T.is_complex, _T.numel, _T.is_grad_enabled,
             _T.get_default_dtype, _T.promote_types, _T.broadcast_shapes, _T.is_storage,
             _T.is_autocast_enabled, _T.typename, _T.is_inference_mode_enabled,
             _T.result_type, _T.can_cast,
             _T._C._get_tracing_state, _T.jit.is_scripting, _T.jit.is_tracing,
             _T._C._has_torch_function, _T._C._has_torch_function_unary,
             _T._C._has_torch_function_variadic, _T.overrides.has_torch_function,
             _T.overrides.has_torch_function_unary, _T.overrides.has_torch_function_variadic,
             _T.get_num_threads, _T.cuda.is_available}  # fmt: skip
_CONST_FN_IDS = {id(f) for f in CONST_FNS}
_BREAK_FN_IDS = {id(f) for f in BREAK_FNS}

_PY_TORCH_PREFIXES = ("torch.nn.functional", "torch.functional", "torch.nn.init", "torch.fft",
                      "torch.linalg", "torch.special", "torch.random", "torch._tensor",
                      "torch.nn.modules.utils")  # fmt: skip
_INLINE_PREFIXES = ("torch.nn.modules", "torch.utils", "torch.autograd", "torch.optim",
                    "torch.distributed", "torch.fx", "torch.jit")  # fmt: skip


# "Am I being compiled?" queries that libraries (HuggingFace among them) ask to take their
# compile-friendly paths. Recognised by function name in any torch module (torch has several
# spellings of them); ember.dynamo never imports torch's compiler.
_COMPILING_QUERIES = {"is_compiling": True, "is_dynamo_compiling": True, "is_exporting": False}


def compiling_query(fn):
    """True/False when `fn` asks whether code is being compiled; None for any other function."""
    module = getattr(fn, "__module__", None) or ""
    if module != "torch" and not module.startswith("torch."):
        return None
    return _COMPILING_QUERIES.get(getattr(fn, "__name__", None))


def is_const_fn(fn) -> bool:
    return id(fn) in _CONST_FN_IDS


def is_break_fn(fn) -> bool:
    return id(fn) in _BREAK_FN_IDS


def is_graph_fn(fn) -> bool:
    """A torch callable recorded as one call_function node (rather than inlined)."""
    if is_break_fn(fn) or is_const_fn(fn):
        return False
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        mod = getattr(fn, "__module__", None) or ""
        if mod.startswith("torch"):
            return True
        self_obj = getattr(fn, "__self__", None)
        return isinstance(self_obj, types.ModuleType) and self_obj.__name__.startswith("torch")
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    if isinstance(fn, types.FunctionType):
        mod = fn.__module__ or ""
        if mod.startswith(_INLINE_PREFIXES):
            return False
        if mod == "torch" or mod.startswith(_PY_TORCH_PREFIXES):
            return "<locals>" not in fn.__qualname__
        return False
    mod = type(fn).__module__ or ""
    # torch._ops.OpOverloadPacket / OpOverload (torch.ops.aten.*) and similar callables.
    return mod.startswith("torch._ops")


def check_args_not_data_dependent(name, args) -> None:
    for a in args:
        if isinstance(a, V.TensorVT) and a.example.dtype == torch.bool and name == "getitem":
            raise Unsupported("indexing with a boolean mask (output shape depends on data)")


# Metadata that depends on sizes: symbolic for a tensor with dynamic sizes (SIZE_READS), or not
# expressible yet (the frame is traced again with static sizes).
SIZE_READS = {"size", "numel", "nelement"}
SIZE_DEPENDENT = {"stride", "is_contiguous", "storage_offset"}


def sym_sizes(t: V.TensorVT, what: str):
    """The symbolic sizes of `t` (None when static); unknown ones make the frame static."""
    from .shapes import UNKNOWN

    if t.sym is UNKNOWN:
        raise SymbolicFallback(f"{what} of a tensor whose dynamic sizes are not known "
                               f"(made by {t.node.target})")  # fmt: skip
    return t.sym


def size_read(tx, t: V.TensorVT, name: str, args) -> V.VT:
    """x.size(), x.size(d), x.shape, x.numel() of a tensor with dynamic sizes."""
    from .calls import const_of

    sizes = sym_sizes(t, f"Tensor.{name}")
    env = tx.output.shape_env
    if name in ("numel", "nelement"):
        numel = sympy_prod(sizes)
        return env.int_vt(numel, lambda: tx.output.graph.call_method("numel", (t.node,)))
    if args:
        d = const_of(args[0], "dimension")
        d = d + len(sizes) if d < 0 else d
        return env.size_vt(t.node, d, sizes[d])
    return SizeVT([env.size_vt(t.node, d, e) for d, e in enumerate(sizes)])


def sympy_prod(exprs):
    import sympy

    return sympy.Mul(*exprs) if exprs else sympy.S.One


def tensor_getattr(tx, t: V.TensorVT, name: str) -> V.VT:
    """`t.name` for a symbolic tensor."""
    if t.sym is not None and name in ("shape", "nbytes"):
        if name == "nbytes":
            raise SymbolicFallback("Tensor.nbytes of a tensor with dynamic sizes")
        return size_read(tx, t, "size", [])
    if name in CONST_ATTRS:
        return V.ConstVT(getattr(t.example, name))
    if name in GRAPH_ATTRS:
        return tx.output.call("call_function", getattr, (t, V.ConstVT(name)), {})
    if name == "data":
        return tx.output.call("call_method", "detach", (t,), {})
    if name == "__class__":
        return V.ClassVT(t.ptype)
    if name in ("grad", "grad_fn", "_version", "_base"):
        raise Unsupported(f"reading tensor.{name}")
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        raise AttrMissing(f"tensor has no attribute {name!r}")
    if callable(attr) or isinstance(attr, (types.MethodDescriptorType,)):
        return V.MethodVT(t, name)
    raise Unsupported(f"tensor attribute {name!r}")


def tensor_method(tx, t: V.TensorVT, name: str, args, kwargs) -> V.VT:
    """Call `t.name(*args, **kwargs)`."""
    from .calls import const_of

    if name == "numpy":  # an ndarray sharing the tensor's memory (numpy_values.py)
        from .numpy_values import tensor_numpy

        return tensor_numpy(tx, t, args, kwargs)
    if name in BREAK_METHODS:
        raise Unsupported(f"Tensor.{name}() (reads tensor data or has effects outside the graph)")
    if t.sym is not None and name in SIZE_READS:
        return size_read(tx, t, name, args or list(kwargs.values()))
    if t.sym is not None and name in SIZE_DEPENDENT:
        raise SymbolicFallback(f"Tensor.{name}() of a tensor with dynamic sizes")
    if name in CONST_METHODS:
        cargs = [const_of(a, f"argument of Tensor.{name}") for a in args]
        ckw = {k: const_of(v, f"argument of Tensor.{name}") for k, v in kwargs.items()}
        return V.ConstVT(getattr(t.example, name)(*cargs, **ckw))
    if name == "type" and not args and not kwargs:
        return V.ConstVT(t.example.type())
    if name in ("__getitem__",):
        return tx.output.call("call_function", operator.getitem, (t, *args), {})
    if name == "__setitem__":
        return tx.output.call("call_function", operator.setitem, (t, *args), {})
    if name == "repeat_interleave" and args and isinstance(args[0], V.TensorVT):
        raise Unsupported("repeat_interleave with tensor repeats (output shape depends on data)")
    return tx.output.call("call_method", name, (t, *args), kwargs)


def torch_call(tx, fn, args, kwargs) -> V.VT:
    """Call a torch function: fold, break, or add a node."""
    from .calls import const_of

    name = getattr(fn, "__name__", repr(fn))
    if fn is torch.from_numpy:
        from .numpy_values import from_numpy

        return from_numpy(tx, args, kwargs)
    if is_break_fn(fn):
        raise Unsupported(f"torch.{name}() (effects outside the graph or data-dependent output)")
    if fn is torch.numel and args and isinstance(args[0], V.TensorVT) and args[0].sym is not None:
        return size_read(tx, args[0], "numel", [])
    if is_const_fn(fn):
        cargs = [_const_or_example(a) for a in args]
        ckw = {k: _const_or_example(v) for k, v in kwargs.items()}
        return V.ConstVT(fn(*cargs, **ckw))
    if fn is torch._C._set_grad_enabled:
        from .calls import set_grad_mode

        set_grad_mode(tx, bool(const_of(args[0], "grad mode")))
        return V.ConstVT(None)
    if fn in (torch.where,) and len(args) == 1:
        raise Unsupported("torch.where(condition) (output shape depends on data)")
    return tx.output.call("call_function", fn, tuple(args), kwargs)


def _const_or_example(v):
    if isinstance(v, V.TensorVT):  # CONST_FNS read dtypes; torch.numel is handled above
        return v.example
    if isinstance(v, SymIntVT):
        return v.env.specialize(v)
    if isinstance(v, V.ConstVT):
        return v.value
    if isinstance(v, V.ListVT):
        items = [_const_or_example(i) for i in v.items]
        return tuple(items) if v.is_tuple else items
    raise Unsupported(f"{type(v).__name__} argument to a metadata function")
