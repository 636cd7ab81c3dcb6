"""ExportedProgram: what `ember.export` returns, and its on-disk form.

An exported program is one prim-level inference graph (placeholders: the user's tensor inputs,
then the constants: parameters and buffers), the constant tensors, and how the user's arguments
and results map onto the graph's flat inputs and outputs. It serialises in the IR schema:

    PATH/
      program.json    format and versions, the graph as `ember.ir.GraphIR` (control-flow
                      subgraphs included, as GraphIR.subgraphs), input/output and
                      constant names with their `TensorMeta` (sizes may be expressions over the
                      dynamic-size symbols, listed as `SymbolSpec`s under "symbols"), the
                      argument/result structures (pytree specs), and where each constant lies
                      in constants.bin
      constants.bin   each constant's bytes, dense row-major, little-endian, 64-byte aligned

`ember.cpp_wrapper.package(exported, path)` compiles it into a package without Python; the
attributes it reads are `graph_module`, `inputs`, `constants` and `example_inputs()`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ember.ir import (IR_VERSION, NODE_META_KEY, GraphIR, SymbolSpec, TensorMeta, from_json,
                      graph_from_ir, graph_to_ir, to_json)  # fmt: skip
from ember.ir.codec import value_from_json, value_to_json

from .backends import resolve_entry

FORMAT = "ember-exported-program"
FORMAT_VERSION = 1
ALIGN = 64


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A named graph input, output or constant, and what it is (dtype, sizes, strides, device)."""

    name: str
    meta: TensorMeta


class ExportedProgram:
    """One captured, functional inference graph with its weights; call it like the original."""

    def __init__(self, graph_module: fx.GraphModule, constants: dict, fqns: dict, in_spec,
                 in_leaves: list, out_spec, out_leaves: list, symbols=()):  # fmt: skip
        self.graph_module = graph_module
        # Dynamic sizes: the inputs' sizes are expressions over these symbols (ember.ir).
        self.symbols: tuple[SymbolSpec, ...] = tuple(symbols)
        self._runnable = None  # what __call__ runs (see there)
        self.constants: dict[str, torch.Tensor] = dict(constants)  # in placeholder order
        self.constant_fqns: dict[str, str] = dict(fqns)  # placeholder name -> "conv.weight"
        # Flat leaves of (args, kwargs): None for a tensor input, ("const", value) for a value
        # baked into the graph; of the result: ("tensor", output index) or ("const", value).
        self.in_spec, self.in_leaves = in_spec, list(in_leaves)
        self.out_spec, self.out_leaves = out_spec, list(out_leaves)
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        n_in = len(placeholders) - len(self.constants)
        if [p.name for p in placeholders[n_in:]] != list(self.constants):
            raise ValueError("the graph's last placeholders must be the constants, in order")
        self.inputs = tuple(TensorSpec(p.name, p.meta[NODE_META_KEY]) for p in placeholders[:n_in])
        self.constant_specs = tuple(TensorSpec(p.name, p.meta[NODE_META_KEY])
                                    for p in placeholders[n_in:])  # fmt: skip
        out_node = next(n for n in graph_module.graph.nodes if n.op == "output")
        self.outputs = tuple(TensorSpec(f"output_{i}", a.meta[NODE_META_KEY])
                             for i, a in enumerate(out_node.args[0]))  # fmt: skip

    # -- running -------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """Run the graph (prim reference implementations) on the user's arguments."""
        tensors = self.flat_inputs(args, kwargs)
        if self._runnable is None:  # a graph with sizes as expressions: a copy computing them
            self._runnable = (resolve_entry("runnable_graph")(self.graph_module)
                              if _sizes_as_expressions(self.graph_module) else self.graph_module)
        with torch.no_grad():
            outs = self._runnable(*tensors, *self.constants.values())
        return self.unflatten_outputs(list(outs))

    def flat_inputs(self, args, kwargs=None) -> list[torch.Tensor]:
        """The graph's tensor inputs from the user's arguments, checked against the export."""
        leaves, spec = pytree.tree_flatten((tuple(args), dict(sorted((kwargs or {}).items()))))
        if spec != self.in_spec:
            raise TypeError(f"ember.export: the arguments' structure {spec} differs from the "
                            f"exported one {self.in_spec}")  # fmt: skip
        tensors = []
        for i, (leaf, want) in enumerate(zip(leaves, self.in_leaves)):
            if want is None:
                tensors.append(leaf)
            elif leaf != want[1] or type(leaf) is not type(want[1]):
                raise ValueError(f"ember.export: argument leaf {i} was {want[1]!r} at export "
                                 f"time (it is baked into the graph), got {leaf!r}")  # fmt: skip
        values: dict = {}
        for spec, t in zip(self.inputs, tensors):
            _check_input(spec, t, values)
        _check_ranges(self.symbols, values)
        return tensors

    def unflatten_outputs(self, outs: list):
        """The user's result structure from the graph's flat outputs."""
        leaves = [outs[leaf[1]] if leaf[0] == "tensor" else leaf[1] for leaf in self.out_leaves]
        return pytree.tree_unflatten(leaves, self.out_spec)

    def example_inputs(self) -> list[torch.Tensor]:
        """A tensor for every placeholder: zeros for the inputs (dynamic sizes at their lower
        bounds), then the constants."""
        lows = {s.symbol: sympy.Integer(s.lower) for s in self.symbols}
        zeros = [_empty(s.meta, lows).zero_() for s in self.inputs]
        return [*zeros, *self.constants.values()]

    @property
    def graph_ir(self) -> GraphIR:
        return graph_to_ir(self.graph_module)

    def __repr__(self):
        ins = ", ".join(f"{s.name}: {s.meta.describe()}" for s in self.inputs)
        outs = ", ".join(s.meta.describe() for s in self.outputs)
        return (f"ExportedProgram(({ins}) -> ({outs}), {len(self.constants)} constants, "
                f"{sum(1 for n in self.graph_module.graph.nodes if n.op == 'call_function')} ops)")

    # -- saving --------------------------------------------------------------------------------
    def save(self, path: os.PathLike | str) -> Path:
        """Write the program as a directory (program.json + constants.bin); returns the path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        entries, offset = [], 0
        with open(path / "constants.bin", "wb") as f:
            for spec in self.constant_specs:
                data = _tensor_bytes(self.constants[spec.name])
                pad = (-offset) % ALIGN
                f.write(b"\0" * pad)
                offset += pad
                entries.append({"name": spec.name, "fqn": self.constant_fqns.get(spec.name, ""),
                                "meta": to_json(spec.meta), "offset": offset,
                                "nbytes": len(data)})  # fmt: skip
                f.write(data)
                offset += len(data)
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "ir_version": IR_VERSION,
            "graph": to_json(self.graph_ir),
            "inputs": [{"name": s.name, "meta": to_json(s.meta)} for s in self.inputs],
            "outputs": [{"name": s.name, "meta": to_json(s.meta)} for s in self.outputs],
            "symbols": [to_json(s) for s in self.symbols],
            "constants": entries,
            "constants_sha256": _sha256(path / "constants.bin"),
            "in_spec": pytree.treespec_dumps(self.in_spec),
            "in_leaves": [None if x is None else value_to_json(x[1]) for x in self.in_leaves],
            "in_leaf_is_const": [x is not None for x in self.in_leaves],
            "out_spec": pytree.treespec_dumps(self.out_spec),
            "out_leaves": [[k, value_to_json(v)] for k, v in self.out_leaves],
        }
        (path / "program.json").write_text(json.dumps(doc, indent=1) + "\n")
        return path


def load_exported(path: os.PathLike | str) -> ExportedProgram:
    """Read an ExportedProgram that `ExportedProgram.save` wrote."""
    path = Path(path)
    doc = json.loads((path / "program.json").read_text())
    if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not an exported program of format version {FORMAT_VERSION}")
    blob = (path / "constants.bin").read_bytes()
    if hashlib.sha256(blob).hexdigest() != doc["constants_sha256"]:
        raise ValueError(f"{path / 'constants.bin'} is damaged (its SHA-256 differs)")
    resolve_entry("op_vocabulary")  # graph_from_ir resolves prims by name: define them first
    gm = graph_from_ir(from_json(GraphIR, doc["graph"]))
    constants, fqns = {}, {}
    for e in doc["constants"]:
        meta = from_json(TensorMeta, e["meta"])
        data = blob[e["offset"] : e["offset"] + e["nbytes"]]
        constants[e["name"]] = _tensor_from_bytes(data, meta)
        if e["fqn"]:
            fqns[e["name"]] = e["fqn"]
    in_leaves = [("const", value_from_json(v)) if c else None
                 for v, c in zip(doc["in_leaves"], doc["in_leaf_is_const"])]  # fmt: skip
    out_leaves = [(k, value_from_json(v)) for k, v in doc["out_leaves"]]
    symbols = [from_json(SymbolSpec, s) for s in doc.get("symbols", [])]
    return ExportedProgram(gm, constants, fqns, pytree.treespec_loads(doc["in_spec"]), in_leaves,
                           pytree.treespec_loads(doc["out_spec"]), out_leaves,
                           symbols)  # fmt: skip


def _check_input(spec: TensorSpec, t: Any, values: dict) -> None:
    """Check an input against its spec; dynamic sizes bind their symbols in `values` (a size
    `k * s` binds s to size / k), and every size must agree with the symbols bound so far."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ember.export: input {spec.name} must be a tensor, got {type(t).__name__}")
    meta = spec.meta
    for size, expr in zip(t.shape, meta.sizes):
        free = expr.free_symbols
        if len(free) == 1 and (s := next(iter(free))) not in values:
            scale = expr.coeff(s) if expr != s else 1
            if expr == scale * s and size % scale == 0:
                values[s] = sympy.Integer(size // scale)
    sizes = tuple(int(e.xreplace(values)) if not e.xreplace(values).free_symbols else -1
                  for e in meta.sizes)  # fmt: skip
    if t.dtype != meta.dtype or tuple(t.shape) != sizes:
        got = TensorMeta.from_tensor(t).describe()
        raise ValueError(f"ember.export: input {spec.name} is {got}, the program was exported "
                         f"for {meta.describe()}")  # fmt: skip
    if t.device != torch.device(meta.device):
        raise ValueError(f"ember.export: input {spec.name} is on {t.device}, not {meta.device}")


def _sizes_as_expressions(gm: fx.GraphModule) -> bool:
    """Whether a node of `gm` takes a symbolic size as a sympy expression (a prim graph traced with
    dynamic sizes), which fx cannot run until the sizes are computed from the inputs'."""
    for node in gm.graph.nodes:
        for leaf in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(leaf, sympy.Basic) and leaf.free_symbols:
                return True
    return False


def _check_ranges(symbols, values: dict) -> None:
    for spec in symbols:
        value = values.get(spec.symbol)
        if value is not None and not spec.contains(int(value)):
            hi = "inf" if spec.upper is None else spec.upper
            raise ValueError(f"ember.export: dynamic size {spec.name} = {value} is outside the "
                             f"exported range [{spec.lower}, {hi}]")  # fmt: skip


def _ints(exprs, values=None) -> tuple[int, ...]:
    return tuple(int(e.xreplace(values) if values else e) for e in exprs)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _tensor_from_bytes(data: bytes, meta: TensorMeta) -> torch.Tensor:
    """A tensor laid out as `meta` says, filled from dense row-major bytes."""
    sizes = _ints(meta.sizes)
    out = _empty(meta)
    if data:
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out.copy_(raw.view(meta.dtype).reshape(sizes))
    return out


def _empty(meta: TensorMeta, values=None) -> torch.Tensor:
    return torch.empty_strided(_ints(meta.sizes, values), _ints(meta.strides, values),
                               dtype=meta.dtype, device=meta.device)  # fmt: skip


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
