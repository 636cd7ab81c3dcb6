"""ember.export: capture a whole program as one graph (fullgraph semantics), ahead of time.

The root frame is translated directly by the symbolic interpreter (no frame hook, no guards): any
construct that would need a graph break raises `GraphBreakError` naming it and the user's
file:line. The captured torch-level graph takes the flat tensor arguments, then the tensors the
program reads from elsewhere (parameters, buffers, globals: the constants); it is lowered to a prim
inference graph by the registry entry "export_lowering" (ember.aot_autograd).
"""

from __future__ import annotations

import inspect
import re

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta

from . import variables as V
from .backends import resolve_entry
from .builder import Builder
from .codegen import eliminate_dead_code
from .dynamic import DerivedDim, Dim, DynamicPolicy
from .exc import GraphBreakError, RestartAnalysis, Unsupported
from .export_size_one import (Trace, check_size_one, resized, root_sizes,
                              size_one_roots)
from .exported import ExportedProgram
from .interpreter import RootTranslator
from .output import OutputGraph
from .symbolic import SymbolicFallback

# Non-tensor argument and result values an exported program can bake in and record.
_LEAF_CONSTS = (type(None), bool, int, float, str, torch.dtype, torch.device)


class _TensorLeaf:
    """Marks a tensor in the result structure: `index` is its position among graph outputs."""

    def __init__(self, index: int):
        self.index = index


def export(model, args=(), kwargs=None, dynamic_shapes=None) -> ExportedProgram:
    """Capture `model(*args, **kwargs)` as one prim inference graph with its weights.

    `dynamic_shapes` declares dynamic sizes with `ember.export.Dim`: per argument (a dict by
    parameter name, or a tuple in argument order), for a tensor a {dim: Dim} dict or a tuple with
    a Dim or None per dimension. Arguments sharing a Dim have equal sizes; `2 * d` is allowed.
    A program that forces a declared size to a constant raises SpecializationError. A Dim with
    min=1 is traced at sizes >= 2 and checked at 1 (export_size_one.py): its range starts at 1
    when the program is the same there, else SpecializationError names what differs."""
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(sorted((kwargs or {}).items()))  # so that a call's keyword order is free
    fn, bound = _root_function(model)
    export_dims = _declared_dims(fn, bound, args, kwargs, dynamic_shapes)
    ones = size_one_roots(export_dims)
    model = getattr(model, "_orig_mod", model)
    fqns = _fqns(model)

    def trace(args, kwargs, export_dims) -> Trace:
        return _trace(fn, bound, fqns, args, kwargs, export_dims)

    if ones:  # traced at sizes >= 2 (an example at 1 is repeated to 2), then checked at 1
        at_one = {i for i, n in root_sizes(args, kwargs, export_dims).items() if n == 1}
        args, kwargs, export_dims = resized(args, kwargs, export_dims, dict.fromkeys(at_one, 2))
    main = trace(args, kwargs, export_dims)
    symbols = main.gm.meta.get("ember_symbols", ())
    if ones:
        symbols = check_size_one(main, trace, args, kwargs, export_dims, ones)
        main.prim_gm.meta["ember_symbols"] = symbols
    return ExportedProgram(main.prim_gm, main.consts, *main.extra, symbols)


def _trace(fn, bound, fqns: dict, args: tuple, kwargs: dict, export_dims) -> Trace:
    """Capture `fn(*bound, *args, **kwargs)` and lower it to prims."""
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    in_leaves = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            in_leaves.append(None)
        elif isinstance(leaf, _LEAF_CONSTS):
            in_leaves.append(("const", leaf))
        else:
            kind = type(leaf).__name__
            raise TypeError(f"ember.export: argument leaf {i} is a {kind}; arguments are "
                            "tensors, containers of them, and plain constants")  # fmt: skip
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    frame_args = _frame_locals(fn, (*bound, *args), kwargs)
    gm, constants, out_spec, out_leaves, env = _capture(fn, frame_args, tensors, fqns,
                                                        export_dims)  # fmt: skip
    lower = resolve_entry("export_lowering")
    if gm.meta.get("ember_symbols") and not getattr(lower, "ember_supports_dynamic", False):
        raise NotImplementedError("ember.export: the lowering (ember.aot_autograd) does not "
                                  "take dynamic sizes yet; export without dynamic_shapes")
    names = _input_names(fn, bound, args, kwargs)
    prim_gm, consts = lower(gm, tensors, {k: v for k, (v, _) in constants.items()}, names)
    fqns = {new: fqn for new, (_, fqn) in zip(consts, constants.values())}
    return Trace(gm, prim_gm, consts, env, (fqns, in_spec, in_leaves, out_spec, out_leaves))


def _declared_dims(fn, bound, args, kwargs, dynamic_shapes):
    """{id(tensor): {dim: Dim}} from `dynamic_shapes` (None when not given)."""
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, dict):
        named = inspect.signature(fn).bind(*bound, *args, **kwargs).arguments
        unknown = set(dynamic_shapes) - set(named)
        if unknown:
            raise TypeError(f"ember.export: dynamic_shapes names {sorted(unknown)}, which are "
                            f"not arguments of {fn.__qualname__}")  # fmt: skip
        pairs = [(named[k], v) for k, v in dynamic_shapes.items()]
    else:
        pairs = list(zip(args, dynamic_shapes))
    out: dict = {}
    for value, spec in pairs:
        _walk_dims(value, spec, out)
    return out


def _walk_dims(value, spec, out: dict) -> None:
    if spec is None:
        return
    if isinstance(value, torch.Tensor):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for d, x in items:
            if x is not None and not isinstance(x, (Dim, DerivedDim)):
                raise TypeError(f"ember.export: dynamic_shapes entry {x!r} is not a Dim")
        out[id(value)] = {d: x for d, x in items} if isinstance(spec, dict) else {
            d: x for d, x in enumerate(spec) if x is not None}  # fmt: skip
    elif isinstance(value, (list, tuple)):
        for v, s in zip(value, spec):
            _walk_dims(v, s, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk_dims(v, spec.get(k), out)


def _root_function(model):
    """The Python function whose frame is captured, and the arguments bound before the user's."""
    if isinstance(model, torch.nn.Module):
        if "_orig_mod" in model.__dict__:  # an ember.compile'd module: export the original
            return _root_function(model.__dict__["_orig_mod"])
        m = torch.nn.modules.module
        hooks = [model._forward_hooks, model._forward_pre_hooks,
                 m._global_forward_hooks, m._global_forward_pre_hooks]  # fmt: skip
        if any(hooks):
            raise NotImplementedError("ember.export: the module (or torch globally) has "
                                      "forward hooks, which export would skip; remove them")
        if "forward" in model.__dict__:
            fn = model.__dict__["forward"]
            return _root_function(fn)
        return type(model).forward, (model,)
    if inspect.ismethod(model):
        return model.__func__, (model.__self__,)
    if inspect.isfunction(model):
        return model, ()
    raise TypeError(f"ember.export expects an nn.Module or a Python function, got {type(model)}")


def _frame_locals(fn, args: tuple, kwargs: dict) -> list:
    """The frame's arguments as CPython binds them (defaults applied, *args and **kwargs)."""
    code = fn.__code__
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"ember.export: calling {fn.__qualname__}: {e}") from None
    bound.apply_defaults()
    nargs = code.co_argcount + code.co_kwonlyargcount
    nargs += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return [bound.arguments[name] for name in code.co_varnames[:nargs]]


def _capture(fn, frame_args: list, tensors: list, fqns: dict, export_dims=None):
    """Translate the root frame; returns (torch-level gm, constants, out_spec, out_leaves,
    the ShapeEnv)."""
    code = fn.__code__
    rng, grad = torch.random.get_rng_state(), torch.is_grad_enabled()
    policy = DynamicPolicy(None, export_dims=export_dims) if export_dims else None
    try:
        torch._C._set_grad_enabled(False)
        output = OutputGraph(code, lambda: "?", policy, exporting=True)
        output.root_globals = fn.__globals__
        tx = RootTranslator(output, Builder(output), code, fn, fn.__globals__, frame_args, None)
        output.where = tx.innermost_where
        tx.run_root()
        result = tx.result[1]
        output.drop_restored_attributes()
        _check_side_effects(output, tx.where())
        out_vts: list = []
        struct = _result_structure(result, out_vts)
    except RestartAnalysis as r:
        raise GraphBreakError(_message(r.reason, code)) from None
    except Unsupported as e:
        raise GraphBreakError(_message(e, code)) from None
    except SymbolicFallback as e:
        raise NotImplementedError(f"ember.export with dynamic sizes: {e} at "
                                  f"{tx.innermost_where()}; export it static") from None
    finally:
        torch.random.set_rng_state(rng)
        torch._C._set_grad_enabled(grad)
    flat, out_spec = pytree.tree_flatten(struct)
    out_leaves = [("tensor", x.index) if isinstance(x, _TensorLeaf) else ("const", x) for x in flat]
    output.graph.output(tuple(vt.node for vt in out_vts))
    eliminate_dead_code(output.graph)
    constants = _order_placeholders(output, tensors, fqns)
    gm = fx.GraphModule(output.root_module, output.graph)  # with control-flow subgraphs
    gm.graph.lint()
    if output.shape_env is not None and output.shape_env.symbols:
        gm.meta["ember_symbols"] = output.shape_env.specs()
    return gm, constants, out_spec, out_leaves, output.shape_env


def _message(e: Unsupported, code) -> str:
    where = e.where or f"{code.co_filename}:{code.co_firstlineno}"
    return f"ember.export (one graph, no breaks): {e.msg} at {where}"


def _check_side_effects(output: OutputGraph, where: str) -> None:
    """An exported graph is a pure function: Python-visible mutations cannot be replayed."""
    kinds = sorted({str(e[0]) for e in output.side_effects})
    if output.mutated:
        kinds.append("list/dict mutation")
    if kinds:
        raise Unsupported(f"the program has Python side effects ({', '.join(kinds)}), which an "
                          "exported graph cannot replay", where)  # fmt: skip


def _result_structure(vt, out_vts: list):
    """The result as Python containers with `_TensorLeaf`s where the graph's outputs go."""
    if isinstance(vt, V.TensorVT):
        out_vts.append(vt)
        return _TensorLeaf(len(out_vts) - 1)
    if isinstance(vt, V.ConstVT) and isinstance(vt.value, _LEAF_CONSTS):
        return vt.value
    if isinstance(vt, V.ListVT) and type(vt) is V.ListVT:
        items = [_result_structure(i, out_vts) for i in vt.items]
        return tuple(items) if vt.is_tuple else items
    if isinstance(vt, V.DictVT) and vt.cls is dict:
        return {k: _result_structure(i, out_vts) for k, i in vt.items.items()}
    raise Unsupported(f"the program returns a {_describe(vt)}; exported results are tensors, "
                      "tuples, lists and dicts of them, and plain constants")  # fmt: skip


def _describe(vt) -> str:
    if isinstance(vt, V.ConstVT):
        return type(vt.value).__name__
    cls = getattr(vt, "cls", None)
    return cls.__name__ if isinstance(cls, type) else type(vt).__name__


def _order_placeholders(output: OutputGraph, tensors: list, fqns: dict) -> dict:
    """Placeholders in call order: the flat tensor arguments, then the constants.

    Returns {name: (tensor, where it comes from)} for the constants: the module's qualified name
    ("conv.weight"), or the source ("G['table']") for a tensor read from elsewhere. An argument
    the program never reads still gets a placeholder: the program takes every tensor it was given.
    """
    by_id = {id(value): vt for _, value, vt in output.inputs}
    seen: dict[int, int] = {}
    ordered = []
    for i, t in enumerate(tensors):
        if id(t) in seen:
            raise NotImplementedError(f"ember.export: the same tensor is passed as arguments "
                                      f"{seen[id(t)]} and {i}; pass distinct tensors")  # fmt: skip
        seen[id(t)] = i
        vt = by_id.get(id(t))
        if vt is not None:
            ordered.append(vt.node)
            continue
        node = output._insert_placeholder(_unique(output, f"unused_input_{i}"))
        node.meta["example_value"] = t
        node.meta[NODE_META_KEY] = TensorMeta.from_tensor(t)
        ordered.append(node)
    constants = {}
    for source, value, vt in output.inputs:
        if id(value) in seen:
            continue
        fqn = fqns.get(id(value), "")
        name = _unique_key(constants, fqn or source.name())
        constants[name] = (value.detach(), fqn or source.name())
        ordered.append(vt.node)
    anchor = next(n for n in output.graph.nodes if n.op != "placeholder")
    for node in ordered:
        anchor.prepend(node)
    return constants


def _fqns(model) -> dict[int, str]:
    """id(tensor) -> its qualified name in the module ("layer1.0.conv.weight")."""
    if not isinstance(model, torch.nn.Module):
        model = getattr(model, "__self__", None)
        if not isinstance(model, torch.nn.Module):
            return {}
    out: dict[int, str] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:  # fmt: skip
        out.setdefault(id(t), name)
    return out


def _input_names(fn, bound: tuple, args: tuple, kwargs: dict) -> list[str]:
    """A name per flat tensor argument: its parameter's name, with the path inside containers."""
    params = list(inspect.signature(fn).parameters)[len(bound) :]
    names = []
    for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
        if not isinstance(leaf, torch.Tensor):
            continue
        keys = [getattr(k, "idx", getattr(k, "key", k)) for k in path]
        if keys[0] == 0:  # positional: name it after its parameter (or *args)
            idx = keys[1]
            named = idx < len(params) and not _is_var(fn, params[idx])
            base = params[idx] if named else f"arg{idx}"
        else:
            base = str(keys[1])
        names.append("_".join([base, *(str(k) for k in keys[2:])]))
    return names


def _is_var(fn, name: str) -> bool:
    kind = inspect.signature(fn).parameters[name].kind
    return kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _unique(output: OutputGraph, base: str) -> str:
    name, i = base, 1
    while name in output.names:
        name, i = f"{base}_{i}", i + 1
    output.names.add(name)
    return name


def _unique_key(d: dict, text: str) -> str:
    base = re.sub(r"\W+", "_", text).strip("_") or "constant"
    name, i = base, 1
    while name in d:
        name, i = f"{base}_{i}", i + 1
    return name


export.Dim = Dim  # `ember.export.Dim(name, min=..., max=...)`
