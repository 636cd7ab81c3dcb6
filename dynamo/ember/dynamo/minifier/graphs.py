"""Sub-graphs of a failing fx graph: input specs, random inputs, and graphs rebuilt from a kept
set of nodes (the nodes cut away become new inputs of the same metadata)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.fx as fx

from ember.ir import NODE_META_KEY, TensorMeta

# Python values a cut-away node may be replaced by as a literal argument (sizes, dtypes, ...).
_LITERALS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
             torch.layout)  # fmt: skip
_COMPUTE = ("call_function", "call_method", "call_module", "get_attr")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What a random input must look like: layout, dtype, device, requires_grad and the range
    of the values it stood for (random values are drawn in it, so `log`/`sqrt` stay defined)."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: str = "cpu"
    requires_grad: bool = False
    range: Optional[tuple] = None
    offset: int = 0

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        """The spec of a real tensor."""
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), t.requires_grad,
                   _value_range(t), t.storage_offset())  # fmt: skip

    def source(self) -> str:
        """The spec as Python source (what a repro file holds)."""
        extra = "" if not self.offset else f", offset={self.offset}"
        return (f"TensorSpec({self.shape!r}, {self.stride!r}, {self.dtype}, {self.device!r}, "
                f"requires_grad={self.requires_grad}, range={self.range!r}{extra})")  # fmt: skip


def _value_range(t: torch.Tensor) -> Optional[tuple]:
    if t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
        return None
    with torch.no_grad():
        values = t.detach()
        if values.is_floating_point():
            values = values[torch.isfinite(values)].double()
            if values.numel() == 0:
                return None
            return float(f"{values.min().item():.4g}"), float(f"{values.max().item():.4g}")
        return int(values.min().item()), int(values.max().item())


def spec_of(value):
    """A TensorSpec for a tensor; a plain Python value (a size) is its own spec."""
    return TensorSpec.of(value) if isinstance(value, torch.Tensor) else value


def make_inputs(specs, seed: int = 0) -> list:
    """Random inputs matching `specs` (TensorSpecs or plain values), the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return [_random_tensor(s, gen) if isinstance(s, TensorSpec) else s for s in specs]


def _random_tensor(spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    span = spec.offset
    if all(n > 0 for n in spec.shape):
        span += 1 + sum((n - 1) * st for n, st in zip(spec.shape, spec.stride))
    dtype, (low, high) = spec.dtype, spec.range or (None, None)
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (span,), generator=gen).bool()
    elif dtype.is_complex:
        flat = torch.randn(span, generator=gen, dtype=dtype)
    elif dtype.is_floating_point and low is None:
        flat = torch.randn(span, generator=gen, dtype=torch.float64).to(dtype)
    elif dtype.is_floating_point:
        flat = low + (high - low) * torch.rand(span, generator=gen, dtype=torch.float64)
        flat = flat.to(dtype)
    else:
        low, high = (0, 1) if low is None else (low, min(high, 2**63 - 2))
        flat = torch.randint(low, high + 1, (span,), generator=gen, dtype=torch.int64).to(dtype)
    t = flat.to(spec.device).as_strided(spec.shape, spec.stride, spec.offset)
    return t.requires_grad_(spec.requires_grad)


def clone_input(value):
    """A private copy of an input with its strides (expanded and overlapping ones too) and
    requires_grad, so a run that mutates it leaves the original alone."""
    if not isinstance(value, torch.Tensor):
        return value
    with torch.no_grad():
        t = value.detach()
        if t.numel() == 0:
            return t.clone().requires_grad_(value.requires_grad)
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        flat = t.as_strided((span,), (1,), t.storage_offset()).clone()
        copy = flat.as_strided(t.shape, t.stride())
    return copy.requires_grad_(value.requires_grad)


def annotate(gm: fx.GraphModule, inputs) -> None:
    """Give every node the metadata dynamo's graphs carry (`example_value`, a TensorMeta), by
    running the graph on copies of `inputs`."""
    for node, value in run_recording(gm, inputs).items():
        _set_meta(node, value)


def _set_meta(node: fx.Node, value) -> None:
    node.meta["example_value"] = value
    if isinstance(value, torch.Tensor):
        node.meta[NODE_META_KEY] = TensorMeta.from_tensor(value)


def run_recording(gm: fx.GraphModule, inputs) -> dict:
    """Run `gm` on copies of `inputs` as fx's interpreter does; every node's value, detached."""
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if n.op != "output":
                values[n] = _detached(value)
            return value

    Recorder(gm).run(*[clone_input(x) for x in inputs])
    return values


def _detached(value):
    if isinstance(value, torch.Tensor):
        # a leaf of the same layout: what an input standing for this value will look like
        return clone_input(value).requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value) if type(value) in (tuple, list) else value
    return value


def _is_literal(value) -> bool:
    if isinstance(value, (tuple, list, torch.Size)):
        return all(_is_literal(v) for v in value)
    return isinstance(value, _LITERALS)


def copy_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a graph module to hand a backend, which may rewrite it in place (node
    metadata is shared with the original's)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    return copy


def count_ops(gm: fx.GraphModule) -> int:
    """Calls in a graph (call_function, call_method, call_module nodes)."""
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


class SubGraphs:
    """Builds the graph of any subset of a graph's nodes. A kept node's argument computed by a
    node that is not kept becomes a new input (named as that node, holding its value) when it is
    a tensor, a literal when it is a plain value, and is kept otherwise (a tuple from `split`)."""

    def __init__(self, gm: fx.GraphModule, inputs, random_inputs: bool = False):
        self.gm = gm
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(self.placeholders) != len(inputs):
            raise ValueError(f"the graph has {len(self.placeholders)} inputs, "
                             f"{len(inputs)} example inputs were given")  # fmt: skip
        self.body = [n for n in gm.graph.nodes if n.op in _COMPUTE]
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.values = run_recording(gm, inputs)
        for p, x in zip(self.placeholders, inputs):
            self.values[p] = x
        self.random_inputs = random_inputs
        self.specs = {n: spec_of(v) for n, v in self.values.items()}

    def closure(self, kept) -> frozenset:
        """`kept` with the nodes whose values cannot become inputs or literals."""
        kept = set(kept)
        for node in reversed(self.body):
            if node in kept:
                for arg in node.all_input_nodes:
                    if arg.op != "placeholder" and arg not in kept and not self._cuttable(arg):
                        kept.add(arg)
        return frozenset(kept)

    def _cuttable(self, node) -> bool:
        value = self.values.get(node)
        return isinstance(value, torch.Tensor) or _is_literal(value)

    def outputs(self, kept) -> list:
        """The kept nodes no kept node reads, that hold tensors (or tuples of them)."""
        used = {a for n in kept for a in n.all_input_nodes}
        return [n for n in self.body
                if n in kept and n not in used and _outputtable(self.values[n])]  # fmt: skip

    def build(self, kept) -> Optional[tuple]:
        """(GraphModule, inputs, the original nodes the inputs stand for) computing the nodes of
        `kept`, or None when nothing is left."""
        needed = set(self.closure(kept))
        while True:  # drop leaves that are no outputs (a size nothing reads any more)
            outputs = self.outputs(needed)
            used = {a for n in needed for a in n.all_input_nodes}
            dead = {n for n in needed if n not in used and n not in outputs}
            if not dead:
                break
            needed -= dead
        if not outputs:
            return None
        graph, env, inputs = fx.Graph(), {}, []
        cut = {a for n in needed for a in n.all_input_nodes if a not in needed}
        for node in sorted(cut, key=self.order.__getitem__):
            value = self.values[node]
            if node.op != "placeholder" and not isinstance(value, torch.Tensor):
                env[node] = value  # a literal argument
                continue
            p = graph.placeholder(node.name)
            p.meta = dict(node.meta)
            if node.op != "placeholder":
                p.meta = {k: v for k, v in node.meta.items() if k != "ember_where"}
                p.meta["ember_cut_from"] = node.format_node()
            _set_meta(p, value)
            env[node] = p
            inputs.append(node)
        for node in self.body:
            if node in needed:
                env[node] = copy = graph.node_copy(node, lambda a: env[a])
                _set_meta(copy, self.values[node])  # concrete, where the graph's was symbolic
        graph.output(tuple(env[n] for n in outputs))
        gm = fx.GraphModule(self.gm, graph)
        return gm, self.inputs_for(inputs), inputs

    def inputs_for(self, nodes) -> list:
        """Values for the inputs standing for `nodes`: random ones drawn from their specs, or
        private copies of the values they had."""
        if self.random_inputs:
            return make_inputs([self.specs[n] for n in nodes])
        return [clone_input(self.values[n]) for n in nodes]


def _outputtable(value) -> bool:
    if isinstance(value, (tuple, list)):
        return len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)
