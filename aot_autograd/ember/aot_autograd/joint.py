"""Tracing a program (and its backward) into one functional prim graph, plus the runtime plan.

The program runs once on copies of the caller's tensors (values without data that report the
inputs' devices, where meta_trace.py allows) under three layers, outermost first:
`ember.primtorch.trace.Tracer` (records every dispatched ATen op, decomposed into prims, and
functionalises the in-place ops that reach it), our `_Observer` (notes which inputs get new values
and which storages views share), and `torch.func.functionalize` (turns in-place ops into
functional ones, replaying views, and writes mutated inputs back with one `copy_` each at the
end). Autograd sits above all of them, so the backward it runs for `torch.autograd.grad` is
recorded the same way, into the same graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections import Counter
from typing import Callable, Optional

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode

from ember.ir import TensorMeta, contiguous_strides
from ember.ir.example import metadata_only
from ember.primtorch.prims.core import lent_to_autograd_workers
from ember.primtorch.symbolic import SymbolicTensor, symbolic_tensor, to_expr
from ember.primtorch.symbolic_composites import SymbolicComposites

from .partition import MUTATED_INPUTS_META
from .runtime import AliasSpec, OutputSpec, RuntimePlan
from .tracer_bridge import SEED_PREFIX, new_tracer, untraced
from .user_ops import UserOpFunctionalizer

aten = torch.ops.aten

# Non-tensor outputs baked into the plan: they cannot depend on tensor data.
_CONST_TYPES = (type(None), bool, int, str, torch.dtype, torch.device, torch.Size)


@dataclasses.dataclass
class Traced:
    """A traced signature: the joint (or inference) graph and how to run it."""

    gm: fx.GraphModule
    plan: RuntimePlan
    is_joint: bool
    example_inputs: list  # MetadataOnly tensors: the trace's copies of the inputs are freed


class _Observer(TorchDispatchMode):
    """Sees each top-level ATen op between functionalize and the tracer; records aliasing facts."""

    def __init__(self, inputs: list[torch.Tensor], is_traced: Callable = lambda t: True):
        super().__init__()
        self.is_traced = is_traced  # whether the tracer has a node for a tensor
        self._inputs = {id(t): i for i, t in enumerate(inputs)}
        self.new_values: dict[int, torch.Tensor] = {}  # input index -> value copied into it
        # storage pointer -> (a weak reference to) the tensor first viewed. Weak: a strong one
        # kept every viewed activation (a reshaped matmul output, a transposed head) alive to
        # the end of the trace, a third more than the forward itself holds.
        self.view_roots: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.copy_.default and id(args[0]) in self._inputs:
            self.new_values[self._inputs[id(args[0])]] = args[1]
        elif func.is_view and isinstance(args[0], torch.Tensor):
            ptr = _storage_ptr(args[0])
            root = self.view_roots.get(ptr)
            if root is None or root() is None:  # a freed storage's address may come back
                self.view_roots[ptr] = weakref.ref(args[0])
        return func(*args, **kwargs)

    def view_root(self, ptr: int) -> Optional[torch.Tensor]:
        """The tensor first viewed in the storage at `ptr`, if it is still alive."""
        root = self.view_roots.get(ptr)
        return root() if root is not None else None


def _storage_ptr(t: torch.Tensor) -> int:
    if type(t) is SymbolicTensor:
        t = t.value
    storage = t.untyped_storage()
    # Meta storages (a metadata trace's values, device_meta.py) have no data pointer: their
    # identity.
    return storage._cdata if storage.device.type == "meta" else storage.data_ptr()


def clone_input(t: torch.Tensor) -> torch.Tensor:
    """A private copy with the same sizes and strides (so the trace sees the caller's layout)."""
    with torch.no_grad():
        try:
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            c.copy_(t)
        except RuntimeError:  # overlapping layouts (expanded inputs) cannot be written to
            c = t.clone()
    return c.requires_grad_(t.requires_grad)


def trace(flat_fn: Callable, inputs: list[torch.Tensor], symbolic=None,
          clone: Callable = clone_input, *, overwritten=(), lend=False) -> Traced:  # fmt: skip
    """Trace `flat_fn(*inputs) -> flat outputs` into a joint graph, or an inference graph.

    `symbolic`: (a TensorMeta or None per input, a primtorch ShapeEnv) to trace with symbolic
    sizes: inputs with a meta become SymbolicTensors, and the graph's sizes are expressions.
    `clone`: the private copy the program runs on (meta_trace.py passes ones without data).
    `overwritten`: positions of inputs the caller writes after the call (not the program):
    partitioners save none of them, as for inputs the program mutates.
    `lend`: parameters (`lendable`) are traced as they are, not copied; a program that would
    write one raises LentInputWritten, having written nothing (trace it again without `lend`).
    """
    lent = lendable(inputs, symbolic, overwritten) if lend else set()
    copies = [t if i in lent else clone(t) for i, t in enumerate(inputs)]
    clones = copies
    needs_grad = torch.is_grad_enabled() and any(c.requires_grad for c in clones)
    tracer = new_tracer()
    for i in lent:
        tracer.lend(inputs[i])
    if symbolic is not None:
        metas, tracer.shape_env = symbolic
        clones = [symbolic_tensor(c, m, tracer.shape_env) if m is not None else c
                  for c, m in zip(clones, metas)]  # fmt: skip
    observer = _Observer(clones, tracer.is_traced)
    with tracer:
        primals = [tracer.placeholder(c, f"primals_{i + 1}") for i, c in enumerate(clones)]
        with observer, _composites(symbolic):
            outs = _run_functional(flat_fn, clones)
        mutated = _mutated_inputs(tracer, primals, observer)
        _check_mutations(mutated, clones, needs_grad)
        specs, graph_outs = _plan_outputs(outs, clones, observer)
        diff = [needs_grad and o.requires_grad for o in graph_outs]
        grad_inputs = [needs_grad and c.requires_grad for c in clones]
        values = [*graph_outs, *(clones[i] for i in mutated)]  # rebound to their new values
        is_joint = any(diff)
        if is_joint:
            with _composites(symbolic):
                values += _trace_backward(tracer, graph_outs, diff, clones, grad_inputs)
        gm = tracer.output(values)
        # Partitioners must not save these: the runtime (or the caller) overwrites them after
        # the forward.
        written = sorted({*mutated, *overwritten})
        gm.meta[MUTATED_INPUTS_META] = tuple(primals[i].name for i in written)
    constants = _check_lifted(tracer, needs_grad)
    _order_placeholders(gm)
    plan = RuntimePlan(
        outputs=specs,
        out_spec=flat_fn.out_spec,
        num_graph_outputs=len(graph_outs),
        mutated_inputs=mutated,
        differentiable=diff if is_joint else [False] * len(graph_outs),
        grad_inputs=grad_inputs if is_joint else [False] * len(clones),
        constants=constants,
        rng_devices=tracer.seed_devices,
    )
    # Compilers see the inputs' metadata only; the trace's copies of the inputs die here.
    return Traced(gm, plan, is_joint, [metadata_only(t) for t in (*copies, *constants)])


def lendable(inputs: list, symbolic, overwritten=()) -> set:
    """Positions of the inputs a trace may read without copying them: parameters (plain leaf
    tensors that require grad, static sizes) whose memory no other input shares. A copy of each
    doubled a model's weights for as long as the trace ran (a trace on real values computes a
    whole training step besides); eager autograd refuses to write such a tensor in place where
    grad is on, so a program that writes one is rare (and is traced again on copies)."""
    metas = symbolic[0] if symbolic is not None else [None] * len(inputs)
    storages = [_storage_ptr(t) if isinstance(t, torch.Tensor) else None for t in inputs]
    sharing = Counter(storages)
    return {
        i for i, (t, meta) in enumerate(zip(inputs, metas))
        if type(t) in (torch.Tensor, torch.nn.Parameter) and i not in overwritten
        and t.is_leaf and t.requires_grad and sharing[storages[i]] == 1
        and (meta is None or meta.is_static())
    }  # fmt: skip


def _composites(symbolic):
    """With symbolic sizes, the C++ composites that read sizes as ints run as Python decompositions
    (their shape arithmetic stays symbolic); a static trace keeps torch's own."""
    return SymbolicComposites() if symbolic is not None else contextlib.nullcontext()


def _check_lifted(tracer, needs_grad: bool) -> list[torch.Tensor]:
    """Tensors the program closes over (lifted to inputs): read-only and without gradients."""
    for node, tensor in tracer.lifted:
        if node in tracer.mutated_inputs:
            raise NotImplementedError(
                f"aot_autograd: the program writes a tensor of shape {tuple(tensor.shape)} that it "
                "closes over; pass that tensor as an argument"
            )
        if needs_grad and tensor.requires_grad:
            raise NotImplementedError(
                f"aot_autograd: the program closes over a tensor of shape {tuple(tensor.shape)} "
                "that requires grad (its gradient would be lost); pass it as an argument "
                "(aot_module lifts parameters)"
            )
    return [tensor for _, tensor in tracer.lifted]


def _order_placeholders(gm: fx.GraphModule) -> None:
    """Placeholders first, as primals, lifted constants, RNG seeds, tangents (the call order)."""
    rank = {"primals": 0, "lifted": 1, SEED_PREFIX: 2, "tangents": 3}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ordered = sorted(placeholders, key=lambda n: rank[_prefix(n.name, rank)])
    anchor = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for p in ordered:
        anchor.prepend(p)  # each lands just before anchor, after the ones placed before it
    gm.graph.lint()
    gm.recompile()


def _prefix(name: str, rank: dict) -> str:
    for prefix in rank:
        if name.startswith(prefix):
            return prefix
    raise RuntimeError(f"unexpected placeholder {name} in a traced graph")


def _run_functional(flat_fn: Callable, clones: list[torch.Tensor]) -> list:
    try:
        with UserOpFunctionalizer():
            return torch.func.functionalize(flat_fn)(*clones)
    except RuntimeError as e:
        if "leaf Variable that requires grad" in str(e):
            raise NotImplementedError(
                "aot_autograd: the program mutates an input that requires grad in place; "
                "mutate a detached copy, or run this program under torch.no_grad()"
            ) from e
        raise


def _mutated_inputs(tracer, primals: list[fx.Node], observer: _Observer) -> list[int]:
    """Inputs written by the program: by functionalize's final copy_, or (for ops whose schema
    hides the write, such as native_batch_norm's running statistics) inside a decomposition."""
    index = {p: i for i, p in enumerate(primals)}
    mutated = set(observer.new_values)
    for node, new_value in tracer.mutated_inputs.items():
        if node not in index:
            continue  # a constant written in place: the graph already uses the new value
        if new_value is None:
            raise NotImplementedError(
                f"aot_autograd: input {index[node]} is written through a view in a way the tracer "
                "cannot express; write the input itself"
            )
        mutated.add(index[node])
    return sorted(mutated)


def _check_mutations(mutated: list[int], clones: list[torch.Tensor], needs_grad: bool) -> None:
    for i in mutated:
        if needs_grad and clones[i].requires_grad:
            raise NotImplementedError(
                f"aot_autograd: input {i} requires grad and the program mutates it in place; "
                "mutate a detached copy, or run this program under torch.no_grad()"
            )


def _trace_backward(tracer, graph_outs, diff, clones, grad_inputs) -> list:
    """Record the gradients of the differentiable outputs, with tangents as new inputs."""
    outs = [o for o, d in zip(graph_outs, diff) if d]
    tangents = []
    for k, o in enumerate(outs):
        with untraced():
            t = _zeros_like_sizes(o, tracer.shape_env)
        tracer.placeholder(t, f"tangents_{k + 1}")
        tangents.append(t)
    wrt = [c for c, g in zip(clones, grad_inputs) if g]

    def backward(*cotangents):
        return torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)

    # Eager code calls backward() outside its autocast region, so the backward runs without
    # autocast: its ops run in the dtypes the forward saved, as in eager.
    with _autocast_off(), lent_to_autograd_workers(), UserOpFunctionalizer():
        return list(torch.func.functionalize(backward)(*tangents))


def _zeros_like_sizes(o: torch.Tensor, env) -> torch.Tensor:
    """A contiguous zero tangent for `o` (a SymbolicTensor with o's sizes when o has symbolic ones)."""
    # new_zeros: a tangent of a value without data (device_meta.py) holds none either
    if type(o) is not SymbolicTensor:
        return o.new_zeros(o.shape)
    sizes = [to_expr(s) for s in o.shape]
    value = o.value.new_zeros(o.value.shape)
    return symbolic_tensor(value, TensorMeta(o.dtype, sizes, contiguous_strides(sizes),
                                             device=str(o.device)), env)  # fmt: skip


class _autocast_off:
    def __enter__(self):
        self._ctxs = [torch.autocast(d, enabled=False) for d in ("cpu", "cuda")]
        for c in self._ctxs:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self._ctxs):
            c.__exit__(*exc)


# --- outputs: which come from the graph, which are views rebuilt after the call -----------------
def _plan_outputs(outs, clones, observer: _Observer):
    """(an OutputSpec per user output, the tensors the graph must return)."""
    bases = _alias_bases(outs, clones, observer)
    specs, graph_outs, graph_index = [], [], {}
    for o in outs:
        if not isinstance(o, torch.Tensor):
            if not isinstance(o, _CONST_TYPES):
                raise NotImplementedError(
                    f"aot_autograd: the program returns a {type(o).__name__}, which may depend on "
                    "tensor data; return a tensor instead"
                )
            specs.append(OutputSpec("const", value=o))
            continue
        base = bases.get(_storage_ptr(o))
        if base is None:
            graph_index[id(o)] = len(graph_outs)
            specs.append(OutputSpec("graph", index=len(graph_outs)))
            graph_outs.append(o)
            continue
        kind, ref = base
        if type(o) is SymbolicTensor:
            raise NotImplementedError(
                "aot_autograd: with symbolic sizes, an output may not alias an input or another "
                "output; return a copy (.clone())"
            )
        if kind == "output" and id(ref) not in graph_index:
            graph_index[id(ref)] = len(graph_outs)
            graph_outs.append(ref)
        index = ref if kind == "input" else graph_index[id(ref)]
        anchor = clones[ref] if kind == "input" else ref
        if kind == "output" and o is ref:
            specs.append(OutputSpec("graph", index=index))
            continue
        alias = AliasSpec(
            of_input=kind == "input",
            index=index,
            sizes=tuple(o.shape),
            strides=tuple(o.stride()),
            offset=o.storage_offset() - anchor.storage_offset(),
            requires_grad=o.requires_grad,
        )
        specs.append(OutputSpec("alias", alias=alias))
    return specs, graph_outs


def _alias_bases(outs, clones, observer: _Observer) -> dict:
    """storage pointer -> ("input", index) or ("output", base tensor) for aliased outputs.
    Storages of no bytes are left out: they all have the pointer 0 (two `torch.tensor([])` of
    a cache are not views of one another) and no write through one can reach another."""
    tensors = [o for o in outs if isinstance(o, torch.Tensor) and _has_bytes(o)]
    bases: dict[int, tuple] = {}
    for i, c in enumerate(clones):
        if _has_bytes(c):
            bases.setdefault(_storage_ptr(c), ("input", i))
    # A mutated input's new value (and views of it) alias that input after the copy-back.
    for i, value in observer.new_values.items():
        if _has_bytes(value) and _same_layout(value, clones[i]):
            bases.setdefault(_storage_ptr(value), ("input", i))
    counts: dict[int, int] = {}
    for o in tensors:
        counts[_storage_ptr(o)] = counts.get(_storage_ptr(o), 0) + 1
    for ptr, n in counts.items():
        if n > 1 and ptr not in bases:
            bases[ptr] = ("output", _group_base(ptr, tensors, observer))
    return {ptr: b for ptr, b in bases.items() if ptr in counts}


def _has_bytes(t: torch.Tensor) -> bool:
    if type(t) is SymbolicTensor:
        t = t.value
    return t.untyped_storage().nbytes() > 0


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == 0


def _covers_storage(t: torch.Tensor) -> bool:
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return (
        t.storage_offset() == 0
        and extent * t.element_size() == t.untyped_storage().nbytes()
        and t.numel() == extent
    )


def _group_base(ptr: int, tensors: list, observer: _Observer) -> torch.Tensor:
    """The tensor the graph returns for outputs sharing one storage; the others become views."""
    for o in tensors:
        if _storage_ptr(o) == ptr and _covers_storage(o):
            return o
    root = observer.view_root(ptr)
    if root is not None and _covers_storage(root):
        return root
    for o in tensors:  # a view output keeps its base alive when nothing else does
        base = o._base
        if (base is not None and _storage_ptr(base) == ptr and _covers_storage(base)
                and observer.is_traced(base)):  # fmt: skip
            return base
    raise NotImplementedError(
        "aot_autograd: outputs share a storage that no output or traced tensor covers; "
        "return the base tensor as well"
    )
