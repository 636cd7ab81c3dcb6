"""Ahead-of-time export: one torch-level graph -> one functional prim-level inference graph.

`ember.export` (in ember.dynamo) captures a whole program and reaches this module through its
registry ("ember.aot_autograd:export_inference_graph"). The graph is traced under `no_grad`, so it
has no backward; the module's parameters and buffers arrive as trailing inputs and leave as named
placeholders, which a package later freezes into weights.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

import torch
import torch.fx as fx

from ember.primtorch.symbolic import ShapeEnv, bind_symbols

from .control_flow import has_control_flow, lower_for_export
from .dynamic import SYMBOLS_META, symbolic_metas
from .joint import trace


def export_inference_graph(
    gm: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    constants: Mapping[str, torch.Tensor],
    input_names: Optional[Sequence[str]] = None,
) -> tuple[fx.GraphModule, dict[str, torch.Tensor]]:
    """Trace `gm(*inputs, *constants.values()) -> tensors` into a prim inference graph.

    Returns the graph, whose placeholders are the inputs (named after `input_names`) then the
    constants (named after their keys, then `lifted_k` for tensors the program closes over), and
    the constant tensors by placeholder name. fx may adjust a name (`input` becomes `input_1`, a
    builtin's name cannot be shadowed): the placeholders' names are the ones that count. Every
    output is a fresh tensor: one that would alias an input, a constant or another output is
    copied, since a package returns independent buffers.
    """
    inputs, constants = list(inputs), dict(constants)
    names = list(input_names or [f"input_{i}" for i in range(len(inputs))])
    if len(names) != len(inputs):
        raise ValueError(f"{len(names)} input names for {len(inputs)} inputs")
    tensors = [*inputs, *constants.values()]
    if has_control_flow(gm):  # lowered piece by piece, subgraphs kept (control_flow.py)
        if gm.meta.get(SYMBOLS_META):
            raise NotImplementedError("ember.export: control flow with dynamic sizes; export "
                                      "it static")  # fmt: skip
        wanted = [_identifier(n) for n in [*names, *constants]]
        with torch.no_grad():
            prim_gm = lower_for_export(gm, tensors, wanted, export_inference_graph)
        final = [n.name for n in prim_gm.graph.nodes if n.op == "placeholder"]
        return prim_gm, dict(zip(final[len(inputs) :], (t.detach() for t in constants.values())))
    copy_at: set[int] = set()
    with torch.no_grad():
        symbolic = _symbolic(gm, tensors)
        traced = trace(_flat(gm, copy_at), tensors, symbolic)
        fresh = _positions_to_copy(traced.plan)
        if fresh:  # trace again, copying the outputs that alias something
            copy_at.update(fresh)
            symbolic = _symbolic(gm, tensors)
            traced = trace(_flat(gm, copy_at), tensors, symbolic)
    _check_plan(traced.plan)
    prim_gm = traced.gm
    if symbolic is not None:
        specs = tuple(gm.meta[SYMBOLS_META])
        _check_guards(symbolic[1], specs)
        prim_gm.meta[SYMBOLS_META] = specs
    lifted = [t.detach() for t in traced.plan.constants]
    wanted = [*names, *constants, *(f"lifted_{k}" for k in range(len(lifted)))]
    final = _rename_placeholders(prim_gm, [_identifier(n) for n in wanted])
    values = [*(t.detach() for t in constants.values()), *lifted]
    return prim_gm, dict(zip(final[len(inputs) :], values))


def _symbolic(gm, tensors):
    """(metas, ShapeEnv) to trace `gm` with the symbolic sizes its placeholders declare (the
    dims ember.export's Dims made dynamic), or None for a static graph."""
    specs = gm.meta.get(SYMBOLS_META) if hasattr(gm, "meta") else None
    if not specs:
        return None
    metas = symbolic_metas(gm)
    metas += [None] * (len(tensors) - len(metas))
    return metas, ShapeEnv(tuple(specs), bind_symbols(metas, tensors))


def _check_guards(env, specs) -> None:
    """An exported program runs every size in its declared ranges: a guard that lowering needed
    (a branch on a size inside an op's decomposition, say) would make it wrong for the sizes
    that fail it, so it is an error here, naming the guard."""
    names = ", ".join(f"{s.name} in [{s.lower}, {s.upper if s.upper is not None else 'inf'}]"
                      for s in specs)  # fmt: skip
    unproved = [g for g in env.guards if env.statically_known(g) is not True]
    if unproved:
        raise NotImplementedError(
            f"ember.export: lowering the program to prims assumed {unproved} about the dynamic "
            f"sizes ({names}), which their ranges do not imply; export with narrower Dims or "
            "static sizes"
        )


def _flat(gm, copy_at: set[int]):
    """`gm` as a function returning a flat list, copying the outputs at `copy_at`."""

    def flat_fn(*tensors):
        out = gm(*tensors)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.clone(memory_format=torch.contiguous_format) if i in copy_at else o
                for i, o in enumerate(out)]  # fmt: skip

    flat_fn.out_spec = None
    return flat_fn


def _positions_to_copy(plan) -> set[int]:
    """Outputs that are views of inputs or of other outputs, or repeat an earlier output."""
    seen, out = set(), set()
    for i, spec in enumerate(plan.outputs):
        if spec.kind == "alias" or (spec.kind == "graph" and spec.index in seen):
            out.add(i)
        seen.add(spec.index if spec.kind == "graph" else None)
    return out


def _check_plan(plan) -> None:
    """Exported graphs are pure functions of their inputs: no writes, no randomness."""
    if plan.mutated_inputs:
        raise NotImplementedError(
            f"ember.export: the program writes its inputs or weights in place (flat inputs "
            f"{plan.mutated_inputs}); an exported program must be functional (a BatchNorm in "
            "training mode updates its running statistics: call model.eval() first)"
        )
    if plan.rng_devices:
        raise NotImplementedError(
            "ember.export: the program draws random numbers (dropout in training mode?); "
            "call model.eval() or remove the random op"
        )
    kinds = [s.kind for s in plan.outputs]
    if any(k != "graph" for k in kinds):
        raise NotImplementedError(f"ember.export: outputs must be graph tensors, got {kinds}")


def _identifier(name: str) -> str:
    text = re.sub(r"\W", "_", str(name)) or "_"
    return f"_{text}" if text[0].isdigit() else text


def _rename_placeholders(gm: fx.GraphModule, names: list[str]) -> list[str]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        raise RuntimeError(f"the traced graph has {len(placeholders)} inputs, not {len(names)}")
    # Free every name first, so that renaming a to b and b to a cannot collide.
    for i, node in enumerate(placeholders):
        node._rename(f"__ember_tmp_{i}")
    for node, name in zip(placeholders, names):
        node._rename(name)
        node.target = node.name
    gm.graph.lint()
    gm.recompile()
    return [n.name for n in placeholders]


# ember.export hands graphs with symbolic sizes (gm.meta["ember_symbols"]) to this lowering.
export_inference_graph.ember_supports_dynamic = True
