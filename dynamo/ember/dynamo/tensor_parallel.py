"""Tensor parallel modules under ember.compile: a call to an nn.Linear or nn.Embedding that
`parallelize_module` gave a ColwiseParallel or RowwiseParallel style is captured as the local
computation on the parameters' shards plus explicit collective nodes, with no DTensor in the graph.

DTensor decides placements at run time, op by op; for these styles they are known when the call
is traced (the style's layouts, the parameters' placements, a 1-D mesh), so the capture writes
down what DTensor would run in eager and nothing else:
- colwise Linear (weight and bias Shard(0), input Replicate, output Shard(-1) as a local
  tensor): `linear(x, w_local, b_local)`; the input's gradient is partial on each rank and
  DTensor's `from_local` backward all-reduces it (`grad_all_reduce`: identity forward).
- rowwise Linear (weight Shard(1), bias Replicate, input Shard(-1), output Replicate):
  `all_reduce(linear(x, w_local)) + b`; DTensor adds b / world_size before the all-reduce, the
  same sum; the bias added after it keeps b's gradient the full one, as DTensor's is, and lets
  the add fuse with what follows. The all-reduce's backward is the identity (a replicated
  gradient), as DTensor's redistribute backward is.
- colwise Embedding (weight Shard(1)): the local lookup, output Shard(-1).
- rowwise Embedding (weight Shard(0), output Replicate): rows outside this rank's shard are
  looked up as row 0 and masked to zero, then all-reduced (DTensor's MaskPartial).
Any other layout (sequence parallel's Shard inputs, Shard outputs through reduce-scatter,
`use_local_output=False`, a mesh of more than one dimension) breaks the graph naming it.

Parameters enter the graph as `param.to_local()` (source LocalShardSource): its backward wraps
the local gradient as a DTensor of the parameter's placements, so `param.grad` is what eager TP
produces. The collectives are torch.library operators (collectives.py: `ember_dist::all_reduce`,
`ember_dist::grad_all_reduce`) that call torch.distributed on the group named in the graph;
backends keep them opaque and their wrappers run them. No collective runs while the frame is
traced (an all-reduce's example value is the local value, its metadata exact), nor while
aot_autograd and inductor compile it (they trace with the operators' fake kernels: one
all-reduce per forward and one per backward, counted): compiling never waits on a rank.
"""

from __future__ import annotations

import sys
from typing import Optional

import torch

from . import variables as V
from .exc import Unsupported
from .source import AttrSource, ItemSource, LocalShardSource, module_param_source

_STYLE_MODULE = "torch.distributed.tensor.parallel.style"


# -- recognising a parallelized module --------------------------------------------------------


class Style:
    """What parallelize_module set on one module: colwise or rowwise, its layouts, the mesh."""

    def __init__(self, kind, input_layouts, desired_input_layouts, output_layouts,
                 use_local_output, mesh):  # fmt: skip
        self.kind = kind
        self.input_layouts = tuple(input_layouts)
        self.desired_input_layouts = tuple(desired_input_layouts)
        self.output_layouts = tuple(output_layouts)
        self.use_local_output = use_local_output
        self.mesh = mesh


def _closure_value(fn, name):
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or fn.__closure__ is None:
        return None
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


def _other_style(style_mod, module) -> Optional[str]:
    """The name of a tensor parallel style whose hooks `module` carries (SequenceParallel,
    PrepareModuleInput, ...; a style's hooks close over the mesh), else None."""
    for hook in (*module._forward_pre_hooks.values(), *module._forward_hooks.values()):
        if _closure_value(hook, "device_mesh") is None:
            continue
        owner = _closure_value(hook, "self")
        if isinstance(owner, style_mod.ParallelStyle):
            return type(owner).__name__
        for name in ("input_fn", "output_fn"):
            fn = getattr(_closure_value(hook, name), "func", None)
            if fn is not None:
                return getattr(fn, "__qualname__", "a distribute_module hook").split(".")[0]
    return None


def parallel_style(module) -> Optional[Style]:
    """The ColwiseParallel/RowwiseParallel style `parallelize_module` applied to `module` (read
    from the hooks `distribute_module` registered), or None; Unsupported for another tensor
    parallel style (its hooks would meet DTensors the capture does not trace)."""
    style_mod = sys.modules.get(_STYLE_MODULE)
    if style_mod is None or not (module._forward_pre_hooks or module._forward_hooks):
        return None
    if len(module._forward_pre_hooks) != 1 or len(module._forward_hooks) != 1:
        return _refuse_other(style_mod, module)
    (pre,) = module._forward_pre_hooks.values()
    (post,) = module._forward_hooks.values()
    input_fn, output_fn = _closure_value(pre, "input_fn"), _closure_value(post, "output_fn")
    mesh = _closure_value(pre, "device_mesh")
    for kind, cls in (("colwise", style_mod.ColwiseParallel),
                      ("rowwise", style_mod.RowwiseParallel)):  # fmt: skip
        if (getattr(input_fn, "func", None) is cls._prepare_input_fn
                and getattr(output_fn, "func", None) is cls._prepare_output_fn):  # fmt: skip
            (layouts, desired), (out_layouts, local) = input_fn.args, output_fn.args
            return Style(kind, layouts, desired, out_layouts, local, mesh)
    return _refuse_other(style_mod, module)


def _refuse_other(style_mod, module) -> None:
    other = _other_style(style_mod, module)
    if other is not None:
        raise Unsupported(f"{type(module).__name__} parallelized with {other} (tensor "
                          "parallel): only ColwiseParallel/RowwiseParallel on nn.Linear and "
                          "nn.Embedding are captured; this call runs eagerly")  # fmt: skip
    return None


# -- capture ----------------------------------------------------------------------------------


def _placement_text(placements) -> str:
    return "(" + ", ".join(repr(p) for p in placements) + ")"


def _shard(dim):
    from torch.distributed.tensor import Shard

    return (Shard(dim),)


def _replicate():
    from torch.distributed.tensor import Replicate

    return (Replicate(),)


def _expected(style: Style, module) -> dict:
    """parameter name -> the placements the style gives it, and the layouts captured here."""
    linear = isinstance(module, torch.nn.Linear)
    if style.kind == "colwise":
        params = {"weight": _shard(0), "bias": _shard(0)} if linear else {"weight": _shard(1)}
        return {"params": params, "input": _replicate(), "output": _shard(-1)}
    params = {"weight": _shard(1), "bias": _replicate()} if linear else {"weight": _shard(0)}
    return {"params": params, "input": _shard(-1) if linear else _replicate(),
            "output": _replicate()}  # fmt: skip


def _check(style: Style, module) -> dict:
    name = f"{style.kind} {type(module).__name__}"
    if type(module).forward not in (torch.nn.Linear.forward, torch.nn.Embedding.forward):
        raise Unsupported(f"tensor parallel {name}: only nn.Linear and nn.Embedding's own "
                          "forward are captured")  # fmt: skip
    if style.mesh is None or style.mesh.ndim != 1:
        raise Unsupported(f"tensor parallel {name} on a mesh of more than one dimension")
    want = _expected(style, module)
    if style.input_layouts != want["input"] or style.desired_input_layouts != want["input"]:
        raise Unsupported(f"tensor parallel {name} with input layouts "
                          f"{_placement_text(style.input_layouts)}: a redistribution of the "
                          f"input (sequence parallel); only {_placement_text(want['input'])} "
                          "inputs are captured")  # fmt: skip
    if style.output_layouts != want["output"] or not style.use_local_output:
        raise Unsupported(f"tensor parallel {name} with output layouts "
                          f"{_placement_text(style.output_layouts)}"
                          f"{'' if style.use_local_output else ' as a DTensor'}: only "
                          f"{_placement_text(want['output'])} local outputs are captured")
    for pname, placements in want["params"].items():
        p = module._parameters.get(pname)
        if p is None:
            continue
        if tuple(getattr(p, "placements", ())) != placements or p.device_mesh != style.mesh:
            raise Unsupported(f"tensor parallel {name}: parameter {pname} is not a DTensor "
                              f"placed {_placement_text(placements)} on the style's mesh")
    if isinstance(module, torch.nn.Embedding):
        if module.max_norm is not None or module.sparse:
            raise Unsupported(f"tensor parallel {name} with max_norm or sparse gradients")
        if style.kind == "rowwise" and module.padding_idx is not None:
            raise Unsupported(f"tensor parallel {name} with padding_idx")
    return want


def _local_param(tx, vt: V.ModuleVT, pname: str) -> Optional[V.TensorVT]:
    """The graph input for the local shard of the module's DTensor parameter `pname`."""
    p = vt.module._parameters.get(pname)
    src = module_param_source(vt.source, "_parameters", pname)
    if p is None:
        tx.output.guards.add("EQ", src, None)  # a bias registered later recompiles
        return None
    tx.output.guards.add("PARAM", src, p)
    return tx.output.add_input(p.to_local(), LocalShardSource(src), guarded=False)


def _collective(tx, op, x: V.TensorVT, group_name: str) -> V.TensorVT:
    """A collective node on `x`; its example value is the local one (nothing is sent while
    tracing), which has the result's sizes, strides and dtype."""
    out = tx.output
    node = out.graph.create_node("call_function", op, (x.node, group_name), {})
    node.meta["ember_where"] = out.where()
    out.op_count += 1
    with torch.no_grad():
        example = x.example.contiguous().clone()
    if torch.is_grad_enabled() and x.example.requires_grad:
        example.requires_grad_(True)
    result = out.wrap_result(node, example)
    result.sym = getattr(x, "sym", None)
    return result


def _guard_hooks(tx, vt) -> None:
    m = vt.module
    tx.output.guards.add("NO_HOOKS", vt.source, ("_backward_hooks", "_backward_pre_hooks"))
    for kind in ("_forward_pre_hooks", "_forward_hooks"):
        table = getattr(m, kind)
        src = AttrSource(vt.source, kind)
        tx.output.guards.add("DICT_KEYS", src, tuple(table))
        for k, hook in table.items():
            tx.output.guards.add("ID", ItemSource(src, k), hook)


def call_parallel_module(tx, vt: V.ModuleVT, style: Style, args, kwargs) -> V.VT:
    """Capture `module(x)` for a module parallelize_module gave `style` (see the file's top)."""
    m = vt.module
    _check(style, m)
    if kwargs or len(args) != 1 or not isinstance(args[0], V.TensorVT):
        raise Unsupported(f"tensor parallel {type(m).__name__} called with other than one "
                          "tensor argument")  # fmt: skip
    if vt.source is None:
        raise Unsupported("a tensor parallel module reached without a source")
    if tx.output.exporting:
        raise Unsupported(f"tensor parallel {type(m).__name__} in ember.export: an exported "
                          "program runs without ranks to talk to; export the module before "
                          "parallelize_module")  # fmt: skip
    _guard_hooks(tx, vt)
    from . import collectives  # noqa: F401  (defines the torch.ops.ember_dist operators)

    group = style.mesh.get_group(0).group_name
    x = args[0]
    F = torch.nn.functional
    call = tx.output.call
    weight = _local_param(tx, vt, "weight")
    if isinstance(m, torch.nn.Linear):
        bias = _local_param(tx, vt, "bias")
        if style.kind == "colwise":
            if torch.is_grad_enabled() and x.example.requires_grad:
                x = _collective(tx, torch.ops.ember_dist.grad_all_reduce.default, x, group)
            return call("call_function", F.linear, (x, weight) if bias is None else
                        (x, weight, bias), {})  # fmt: skip
        y = _collective(tx, torch.ops.ember_dist.all_reduce.default,
                        call("call_function", F.linear, (x, weight), {}), group)  # fmt: skip
        if bias is None:
            return y
        if bias.example.dtype != y.example.dtype:  # under autocast, as F.linear casts it
            bias = call("call_method", "to", (bias, V.ConstVT(y.example.dtype)), {})
        return call("call_function", torch.add, (y, bias), {})
    if style.kind == "colwise":
        return call("call_function", F.embedding, (x, weight, V.ConstVT(m.padding_idx)), {})
    return _rowwise_embedding(tx, m, style, x, weight, group)


def _rowwise_embedding(tx, m, style, x, weight, group):
    """Rows [start, start + local rows) live on this rank: other ids read row 0, masked out."""
    call = tx.output.call
    rows = m.weight.shape[0]
    size, rank = style.mesh.size(), style.mesh.get_local_rank(0)
    chunk = -(-rows // size)  # torch.chunk's split, as DTensor's Shard(0)
    start = min(rank * chunk, rows)
    stop = min(start + chunk, rows)
    outside = call("call_function", torch.logical_or,
                   (call("call_function", torch.lt, (x, V.ConstVT(start)), {}),
                    call("call_function", torch.ge, (x, V.ConstVT(stop)), {})), {})  # fmt: skip
    local_ids = call("call_method", "masked_fill",
                     (call("call_function", torch.sub, (x, V.ConstVT(start)), {}), outside,
                      V.ConstVT(0)), {})  # fmt: skip
    found = call("call_function", torch.nn.functional.embedding, (local_ids, weight), {})
    mask = call("call_method", "unsqueeze", (outside, V.ConstVT(-1)), {})
    masked = call("call_method", "masked_fill", (found, mask, V.ConstVT(0.0)), {})
    return _collective(tx, torch.ops.ember_dist.all_reduce.default, masked, group)
