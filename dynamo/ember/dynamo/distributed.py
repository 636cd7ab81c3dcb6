"""Distributed data parallel under ember.compile: DDP's forward stays eager around the captured
inner module, whose graph is split at gradient-bucket boundaries so all-reduces overlap backward.

DistributedDataParallel.forward talks to the reducer (prepare_for_forward/backward, bucket
rebuilds, the join context, `no_sync`): that is Python state outside any graph, so it runs as
it is, and what Ember captures is the wrapped module's forward, called inside DDP's
`_inside_ddp_forward` (which publishes the DDP module as `_get_active_ddp_module()`).

When a graph is compiled while a DDP module is active and grad is on, the graph is cut into
pieces that each hold about `bucket_bytes_cap` bytes of parameters (walking from the output,
as DDP fills its buckets: parameters in reverse order of use; the first piece from the end is
capped at DDP's first-bucket size). Each piece is compiled by the backend on its own, so with
aot_autograd each is a separate autograd Function: the backward of the last piece produces its
parameters' gradients, DDP's hooks on those parameters start their all-reduce, and the earlier
pieces' backward runs meanwhile. One bucket: the graph goes to the backend whole.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch
import torch.fx as fx

from ember.ir import FULLGRAPH_META_KEY

_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's default for DDP's first bucket


def _ddp_class():
    """DistributedDataParallel if the program has imported it (never imported here)."""
    mod = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(mod, "DistributedDataParallel", None) if mod is not None else None


def is_ddp(module) -> bool:
    cls = _ddp_class()
    return cls is not None and isinstance(module, cls)


def _fsdp_class():
    """FSDP2's FSDPModule (the class fully_shard mixes in) if the program has imported it."""
    mod = sys.modules.get("torch.distributed.fsdp")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def is_dtensor(value) -> bool:
    """Whether `value` is a DTensor (the class is never imported here)."""
    mod = sys.modules.get("torch.distributed.tensor._api")
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    return cls is not None and isinstance(value, cls)


def eager_call_reason(module) -> Optional[str]:
    """Why a call to `module` from captured code must run eagerly (a graph break), or None.

    DDP's forward and FSDP2's forward hooks run collectives (all-gather, reducer bookkeeping)
    that no graph holds; the forward they wrap is captured as its own frame."""
    name = type(module).__name__
    if is_ddp(module):
        return (f"a call to DistributedDataParallel: its forward talks to the reducer and runs "
                f"eagerly; the wrapped {type(module.module).__name__}.forward is captured as its "
                f"own frame")  # fmt: skip
    fsdp = _fsdp_class()
    if fsdp is not None and isinstance(module, fsdp):
        return (f"a call to the fully_shard (FSDP2) module {name}: its hooks all-gather and "
                f"free parameters and run eagerly; {name}.forward is captured as its own frame")
    return None


def captured_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward frame ember.compile captures: for DDP (nested too) the module
    it wraps, since DDP's own forward runs eagerly; otherwise `module` itself."""
    while is_ddp(module):
        module = module.module
    return module


def active_ddp():
    """The DDP module whose forward is running (DDP sets it around the wrapped module's call)."""
    cls = _ddp_class()
    if cls is None or not hasattr(cls, "_get_active_ddp_module"):
        return None
    return cls._get_active_ddp_module()


def compile_for_ddp(compile_graph: Callable, gm: fx.GraphModule, example_inputs: list):
    """`compile_graph(gm, example_inputs)`, or, inside a DDP forward with grad on, one call per
    gradient bucket's piece of `gm` and a function that runs the compiled pieces in order."""
    ddp = active_ddp()
    if ddp is None or not torch.is_grad_enabled() or gm.meta.get("ember_symbols"):
        return compile_graph(gm, example_inputs)
    part = bucket_partition(gm, ddp)
    gm.meta["ember_ddp_pieces"] = len(set(part.values()))  # for explain() and benchmarks
    if gm.meta["ember_ddp_pieces"] <= 1:
        return compile_graph(gm, example_inputs)
    return _compile_pieces(compile_graph, gm, example_inputs, part)


def _reduced_params(ddp) -> dict:
    """id -> parameter, for the parameters whose gradients DDP all-reduces."""
    params = getattr(ddp, "_module_parameters", None)
    if params is None:
        params = list(ddp.module.parameters())
    return {id(p): p for p in params if p.requires_grad}


def bucket_partition(gm: fx.GraphModule, ddp) -> dict:
    """node -> piece index (0 first in forward order) for every computing node of `gm`."""
    cap = int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))
    first_cap = min(cap, _DEFAULT_FIRST_BUCKET_BYTES)
    reduced = _reduced_params(ddp)
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    seen: set = set()
    back_index, size, has_params = 0, 0, False
    backwards = {}
    for node in reversed(nodes):
        if has_params and size >= (first_cap if back_index == 0 else cap):
            back_index, size, has_params = back_index + 1, 0, False
        for arg in node.all_input_nodes:
            pid = arg.meta.get("ember_param_id") if arg.op == "placeholder" else None
            param = reduced.get(pid)
            if param is None or pid in seen:
                continue
            seen.add(pid)
            size += param.numel() * param.element_size()
            has_params = True
        backwards[node] = back_index
    if not has_params and back_index > 0:  # nodes before the first parameter join the next piece
        last = back_index
        backwards = {n: (last - 1 if b == last else b) for n, b in backwards.items()}
        back_index -= 1
    return {n: back_index - b for n, b in backwards.items()}


class _Piece:
    """One compiled piece: the nodes of the whole graph it reads and the ones it produces."""

    def __init__(self, gm, inputs, outputs):
        self.gm = gm
        self.inputs = inputs
        self.outputs = outputs
        self.fn = None


def split_graph(gm: fx.GraphModule, part: dict) -> list:
    """Cut `gm` into graph modules, one per piece index, in order; each takes the values it
    reads from the graph's inputs or earlier pieces and returns, as a tuple, the values that
    later pieces or the graph's output read."""
    order = sorted(set(part.values()))
    result_users: set = set()
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    fx.map_arg(out_node.args, lambda n: result_users.add(n))
    pieces = []
    for k in order:
        nodes = [n for n in gm.graph.nodes if part.get(n) == k]
        graph = fx.Graph()
        env: dict = {}
        inputs = []
        for node in nodes:
            for arg in node.all_input_nodes:
                if part.get(arg) != k and arg not in env:
                    ph = graph.placeholder(arg.name)
                    ph.meta = dict(arg.meta)
                    env[arg] = ph
                    inputs.append(arg)
        for node in nodes:
            env[node] = graph.node_copy(node, lambda n: env[n])
        outputs = [n for n in nodes
                   if n in result_users or any(part.get(u, -1) > k for u in n.users)]  # fmt: skip
        graph.output(tuple(env[n] for n in outputs))
        module = fx.GraphModule(gm, graph)
        if FULLGRAPH_META_KEY in gm.meta:  # (the capture's fullgraph, for each piece's compile)
            module.meta[FULLGRAPH_META_KEY] = gm.meta[FULLGRAPH_META_KEY]
        pieces.append(_Piece(module, inputs, outputs))
    return pieces


def _example(t):
    """A tensor handed from one piece to the next, as the next piece's example input."""
    if isinstance(t, torch.Tensor):
        return t.detach().requires_grad_(t.requires_grad)
    return t


def _compile_pieces(compiler, gm, example_inputs, part):
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    pieces = split_graph(gm, part)
    examples = dict(zip(placeholders, example_inputs))
    for piece in pieces:
        args = [examples[n] for n in piece.inputs]
        with torch.enable_grad():  # the next pieces see which of their inputs need gradients
            outs = piece.gm(*args)
        piece.fn = compiler(piece.gm, args)
        if piece.fn is None:
            return None
        for node, value in zip(piece.outputs, outs):
            examples[node] = _example(value)
    del examples
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    result = out_node.args[0]
    index = {n: i for i, n in enumerate(placeholders)}
    # After each piece, the values no later piece reads (the result's are kept): autograd holds
    # what the backward needs, the rest need not live until the last piece returns.
    kept: set = set()
    fx.map_arg(result, kept.add)
    last_read = {n: k for k, p in enumerate(pieces) for n in p.inputs}
    done_after = [[n for n, k in last_read.items() if k == i and n not in kept]
                  for i in range(len(pieces))]  # fmt: skip

    def run_buckets(*args):
        values = {n: args[i] for n, i in index.items()}
        for p, done in zip(pieces, done_after):
            outs = p.fn(*[values[n] for n in p.inputs])
            values.update(zip(p.outputs, outs))
            for n in done:
                del values[n]
        return fx.map_arg(result, lambda n: values[n])

    run_buckets.ember_pieces = [p.gm for p in pieces]
    return run_buckets
