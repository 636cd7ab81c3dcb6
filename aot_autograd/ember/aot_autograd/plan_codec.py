"""A `RuntimePlan` as JSON, so a compiler's on-disk cache can rebuild a runtime without tracing.

Only plans made of plain data round-trip: a plan that closes over tensors (lifted constants),
returns a non-JSON constant, or has symbolic alias geometry raises `NotSerializable`, and the
caller then simply does not cache it.
"""

from __future__ import annotations

from typing import Callable

from torch.utils import _pytree as pytree

from .runtime import AliasSpec, InferenceRuntime, OutputSpec, RuntimePlan, TrainingRuntime

# Bumped whenever the JSON layout below or the meaning of a RuntimePlan field changes.
PLAN_FORMAT = 1
_JSON_SCALARS = (type(None), bool, int, float, str)


class NotSerializable(ValueError):
    """The plan holds something that has no faithful JSON form."""


def _ints(xs, what: str) -> list:
    if not all(type(x) is int for x in xs):
        raise NotSerializable(f"{what} is not a list of ints: {xs!r}")
    return list(xs)


def _output_to_json(spec: OutputSpec) -> dict:
    out = {"kind": spec.kind, "index": spec.index}
    if spec.kind == "const":
        if type(spec.value) not in _JSON_SCALARS:
            raise NotSerializable(f"constant output of type {type(spec.value).__name__}")
        out["value"] = spec.value
    if spec.alias is not None:
        a = spec.alias
        if type(a.offset) is not int:
            raise NotSerializable(f"alias offset {a.offset!r}")
        out["alias"] = dict(of_input=a.of_input, index=a.index, sizes=_ints(a.sizes, "sizes"),
                            strides=_ints(a.strides, "strides"), offset=a.offset,
                            requires_grad=a.requires_grad)  # fmt: skip
    return out


def _output_from_json(d: dict) -> OutputSpec:
    alias = None
    if "alias" in d:
        a = d["alias"]
        alias = AliasSpec(bool(a["of_input"]), int(a["index"]), tuple(a["sizes"]),
                          tuple(a["strides"]), int(a["offset"]),
                          bool(a["requires_grad"]))  # fmt: skip
    return OutputSpec(d["kind"], int(d["index"]), alias, d.get("value"))


def plan_to_json(plan: RuntimePlan) -> dict:
    """The plan as JSON-able data; raises NotSerializable when it cannot be stored faithfully."""
    if plan.constants:
        raise NotSerializable("the program closes over tensors (lifted constants)")
    try:
        out_spec = pytree.treespec_dumps(plan.out_spec)
    except Exception as e:  # noqa: BLE001  (a custom pytree node without a serialized form)
        raise NotSerializable(f"output structure: {e}") from None
    return {
        "format": PLAN_FORMAT,
        "outputs": [_output_to_json(s) for s in plan.outputs],
        "out_spec": out_spec,
        "num_graph_outputs": plan.num_graph_outputs,
        "mutated_inputs": _ints(plan.mutated_inputs, "mutated_inputs"),
        "differentiable": [bool(d) for d in plan.differentiable],
        "grad_inputs": [bool(g) for g in plan.grad_inputs],
        "rng_devices": [str(d) for d in plan.rng_devices],
    }


def plan_from_json(d: dict) -> RuntimePlan:
    """The inverse of `plan_to_json` (ValueError/KeyError/TypeError on malformed data)."""
    if d.get("format") != PLAN_FORMAT:
        raise ValueError(f"runtime plan format {d.get('format')!r}, expected {PLAN_FORMAT}")
    return RuntimePlan(
        outputs=[_output_from_json(o) for o in d["outputs"]],
        out_spec=pytree.treespec_loads(d["out_spec"]),
        num_graph_outputs=int(d["num_graph_outputs"]),
        mutated_inputs=[int(i) for i in d["mutated_inputs"]],
        differentiable=[bool(x) for x in d["differentiable"]],
        grad_inputs=[bool(x) for x in d["grad_inputs"]],
        rng_devices=[str(x) for x in d["rng_devices"]],
    )


def build_runtime(plan: RuntimePlan, compiled: list[Callable]):
    """The runtime of a plan: one compiled graph is an inference program, two are forward and
    backward of a training program."""
    if len(compiled) == 1:
        return InferenceRuntime(plan, compiled[0])
    if len(compiled) == 2:
        return TrainingRuntime(plan, *compiled)
    raise ValueError(f"a runtime takes 1 or 2 compiled graphs, got {len(compiled)}")

