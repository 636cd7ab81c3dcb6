"""The tracer: run a function on real tensors under a TorchDispatchMode and record prims.

Every ATen op that reaches the mode is decomposed as it runs (through `DECOMPOSITIONS`, re-entering
the mode so that ATen ops inside a decomposition are decomposed in turn), recorded as an extern op,
or recorded as itself when kept. An op in `no_extern` (its extern has no kernel on the target) is
decomposed through `decomp.EXTERN_DECOMPOSITIONS` instead of being recorded as an extern. Prims called by decompositions (or by the traced function) record
an fx node whose `NODE_META_KEY` is the TensorMeta from the prim's meta rule. Values are real
tensors throughout, so the traced program computes as eager does while it is recorded.

Unknown tensors (made outside the trace and never declared with `placeholder`) become constants
(`get_attr` nodes holding the tensor) by default; `unknown_tensors="placeholder"` lifts them to
extra trailing placeholders (see `Tracer.lifted`), "error" refuses them.

Mutation is functionalised simply: an in-place or out= op on a traced value records its functional
variant and rebinds the value to the result. Writing a tensor that other live tensors alias marks
those aliases stale (using one later is an error: replaying views is aot_autograd's job), and a
write to an input or constant is reported to `on_input_mutation`; an output that shares storage
with an input is reported to `on_output_alias`.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from typing import Callable, Iterable, Optional

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ember.ir import NODE_META_KEY, TensorMeta
from ember.ir.graph import lazy_graph_module
from ember.ir.locks import COMPILE_LOCK
from ember.ir.symbols import as_expr

from . import utils
from .attention import (
    AttentionChoice,
    constant_cpu_mask_kind,
    constant_mask_kind,
    cpu_flash_arguments,
    cudnn_inference_arguments,
    without_unread_rng_state,
)
from .errors import DataDependentError, LentInputWritten, NotDecomposableError, TraceError
from .fresh_constants import LIFT_FRESH, fresh_constant
from .prims import core
from .prims.custom import is_custom_op, record_custom_op
from .prims.extern import ATEN_TO_EXTERN, rng_state_of
from .symbolic import SymbolicTensor, symbolic_tensor, to_expr
from .trace_checks import check_decomposition, check_prim_output
from .trace_mutation import functional_variant, mutated_arguments

aten = torch.ops.aten


# Size queries that reach the mode, answered from a SymbolicTensor's symbolic metadata.
_SIZE_QUERIES = {
    aten.size.default: lambda t: tuple(t.shape), aten.size.int: lambda t, d: t.shape[d],
    aten.sym_size.int: lambda t, d: t.shape[d], aten.stride.default: lambda t: tuple(t.stride()),
    aten.stride.int: lambda t, d: t.stride()[d], aten.sym_numel.default: lambda t: t.numel(),
}  # fmt: skip

# Ops whose non-tensor result comes from metadata only, so recording nothing is exact.
_METADATA_OPS = {
    aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
    aten.sym_storage_offset.default, aten.is_same_size.default,
}  # fmt: skip


class _Entry:
    __slots__ = ("ref", "node", "storage")

    def __init__(self, ref, node, storage):
        self.ref, self.node, self.storage = ref, node, storage


class Tracer(TorchDispatchMode):
    """Records what a function does on real tensors as an fx graph of prims (and extern ops)."""

    def __init__(
        self,
        *,
        decompose: bool = True,
        keep: Iterable = (),
        allow_extern: bool = True,
        no_extern: Iterable = (),
        decompositions: Optional[dict] = None,
        unknown_tensors: str = "constant",
        allow_data_dependent: bool = False,
        check: Optional[bool] = None,
        strict_strides: bool = False,
    ):
        super().__init__()
        if unknown_tensors not in ("constant", "placeholder", "error"):
            raise ValueError("unknown_tensors must be constant, placeholder or error")
        self.decompose = decompose
        self.keep = _overloads(keep)
        self.allow_extern = allow_extern
        self.no_extern = _overloads(no_extern)
        self._decompositions = decompositions
        self.unknown_tensors = unknown_tensors
        self.allow_data_dependent = allow_data_dependent
        from .config import config

        self.check = config.check if check is None else check
        self.strict_strides = strict_strides
        self.graph = fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.lifted: list[tuple[fx.Node, torch.Tensor]] = []
        self.inputs: dict[fx.Node, torch.Tensor] = {}  # placeholders and constants
        self.mutated_inputs: dict[fx.Node, Optional[fx.Node]] = {}
        self.output_aliases: dict[int, fx.Node] = {}
        self.stride_mismatches: list[str] = []
        self._entries: dict[int, _Entry] = {}
        self._storage_ids: dict[int, set[int]] = {}
        self._stale: set[int] = set()
        self._suspended = 0
        # Storages (`_storage_key`) of the tensors the caller lent (`lend`)
        self._lent: set = set()
        # Set (a symbolic.ShapeEnv) when inputs are SymbolicTensors: sizes are then symbolic.
        self.shape_env = None

    # --- public API -------------------------------------------------------------------------------

    @property
    def decompositions(self) -> dict:
        if self._decompositions is None:
            from .decomp import DECOMPOSITIONS

            self._decompositions = DECOMPOSITIONS
        return self._decompositions

    @property
    def recording(self) -> bool:
        """False while a reference implementation runs (its ops are not part of the program)."""
        return self._suspended == 0

    def placeholder(self, tensor: torch.Tensor, name: str) -> fx.Node:
        """Declare `tensor` an input of the graph called `name`."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"placeholder {name!r} must be a tensor, got {type(tensor).__name__}")
        if self.is_traced(tensor):
            # The same tensor passed twice: a second (unused) input; the first one is its value.
            node = self.graph.placeholder(name)
            node.meta[NODE_META_KEY] = TensorMeta.from_tensor(tensor)
            self.inputs[node] = tensor
            return node
        return self._new_input(lambda: self.graph.placeholder(name), tensor)

    def lend(self, tensor: torch.Tensor) -> None:
        """Trace `tensor` (the caller's own, not a copy) read-only: an op that would write its
        storage raises LentInputWritten before anything is written."""
        self._lent.add(_storage_key(tensor))

    def node_of(self, tensor: torch.Tensor) -> fx.Node:
        """The node whose value `tensor` is (an unknown tensor is lifted per `unknown_tensors`)."""
        key = id(tensor)
        entry = self._entries.get(key)
        if entry is not None and entry.ref() is tensor:
            if key in self._stale:
                raise TraceError(
                    f"a tensor of shape {tuple(tensor.shape)} (node {entry.node.name}) is used "
                    "after it was written through an alias (a view of it, or its base, was "
                    "mutated in place). The tracer functionalises only direct in-place ops; trace "
                    "through ember.aot_autograd (or torch.func.functionalize) for programs that "
                    "mutate views."
                )
            return entry.node
        return self._lift(tensor)

    def is_traced(self, tensor: torch.Tensor) -> bool:
        entry = self._entries.get(id(tensor))
        return entry is not None and entry.ref() is tensor

    def output(self, values, dce: bool = True) -> fx.GraphModule:
        """Finish the graph with `values` (any pytree of tensors and constants) as its output;
        nodes the output does not need are removed unless dce=False."""
        flat, spec = pytree.tree_flatten(values)
        out = []
        for i, v in enumerate(flat):
            if isinstance(v, torch.Tensor):
                node = self.node_of(v)
                out.append(node)
                self._note_output_alias(i, v)
            else:
                out.append(v)
        self._note_stale_inputs()
        self.graph.output(pytree.tree_unflatten(out, spec))
        if dce:
            self.graph.eliminate_dead_code()
        used = {n.target for n in self.graph.nodes if n.op == "get_attr"}
        constants = {k: v for k, v in self.constants.items() if k in used}
        gm = lazy_graph_module(constants, self.graph)  # code written if it is ever run
        gm.graph.lint()
        return gm

    # Hooks for consumers (aot_autograd) that handle mutation and aliasing completely.
    def on_input_mutation(self, input_node: fx.Node, new_value: Optional[fx.Node]) -> None:
        """`input_node` (placeholder or constant) was written; new_value None: through an alias."""
        self.mutated_inputs[input_node] = new_value

    def on_output_alias(self, index: int, input_node: fx.Node) -> None:
        """Flat output `index` shares storage with the input `input_node`."""
        self.output_aliases[index] = input_node

    # --- entering and leaving ---------------------------------------------------------------------

    def __enter__(self):
        # Traces run one at a time in the process (ember.ir.locks): the switch below is
        # process-wide, and two traces overlapping on two threads restored it out of order (the
        # second found the first's "off" and put it back last). Held until __exit__; re-entrant
        # for a trace started inside another, and for aot_autograd and dynamo, which hold it.
        COMPILE_LOCK.acquire()
        try:
            return self._enter()
        except BaseException:
            COMPILE_LOCK.release()
            raise

    def _enter(self):
        core.push_recorder(self)
        # scaled_dot_product_attention picks its CUDA kernel at dispatch. Torch's own cuDNN call
        # has no extern of ours (it returns what a training graph would need, laid out as the
        # cuDNN version decides), so torch's dispatch may not pick it while tracing: the flash
        # or memory-efficient kernel, both externs, is chosen instead ...
        self._cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(False)
        # ... except where AttentionChoice records an inference call as extern.sdpa_cudnn because
        # torch, with cuDNN as the user had it, would run it there; and a call with a mask goes
        # to the memory-efficient kernel, not the math path.
        self._attention = AttentionChoice(cudnn_enabled=self._cudnn_sdp, tracer=self)
        self._attention.__enter__()
        # With symbolic sizes, shape checks (utils.known) see the ranges and guards of this trace.
        self._assuming = (utils.assuming(self.shape_env) if self.shape_env is not None
                          else contextlib.nullcontext())  # fmt: skip
        self._assuming.__enter__()
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            try:
                self._assuming.__exit__(None, None, None)
                self._attention.__exit__(None, None, None)
                torch.backends.cuda.enable_cudnn_sdp(self._cudnn_sdp)
                core.pop_recorder(self)
            finally:
                COMPILE_LOCK.release()

    @contextlib.contextmanager
    def _reentered(self):
        # Inside __torch_dispatch__ the mode is off; a decomposition's ATen ops must come back here.
        TorchDispatchMode.__enter__(self)
        try:
            yield
        finally:
            TorchDispatchMode.__exit__(self, None, None, None)

    @contextlib.contextmanager
    def _suspend(self):
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    # --- dispatch ---------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._suspended:
            return func(*args, **kwargs)
        return self.dispatch(func, args, kwargs)

    def dispatch(self, func, args, kwargs):
        """Record one ATen call (mode off); returns its real result."""
        if self.shape_env is not None and func in _SIZE_QUERIES:
            return _SIZE_QUERIES[func](*args, **kwargs)  # the symbolic sizes, not the hints
        if is_custom_op(func) and func not in self.keep and func not in self.decompositions:
            return self._record_custom_op(func, args, kwargs)
        self._check_data_dependence(func)
        if func in LIFT_FRESH and (made := fresh_constant(self, args[0])) is not None:
            return made  # torch.tensor(number): a constant of the graph, not an input
        if func._schema.is_mutable:
            return self._functionalize(func, args, kwargs)
        if not self.decompose or func in self.keep:
            return self._record_aten(func, args, kwargs)
        if rng_state_of(func) is not None:
            args = without_unread_rng_state(func, args, self._empty_rng_state)
        if func is aten._scaled_dot_product_efficient_attention.default and self.allow_extern:
            flash = self._flash_for_constant_mask(args, kwargs)
            if flash is not None:
                return flash
        if func is aten._scaled_dot_product_flash_attention_for_cpu.default and self.allow_extern:
            bound = cpu_flash_arguments(args, kwargs)
            kind = constant_cpu_mask_kind(self, bound)
            if kind is not None:  # the mask is a constant that allows all, or the causal one
                q, k, v = bound["query"], bound["key"], bound["value"]
                return self.dispatch(func, (q, k, v, 0.0, kind == "causal"),
                                     {"scale": bound.get("scale")})
        if func is aten._scaled_dot_product_cudnn_attention.default and self.allow_extern:
            res = self._cudnn_for_inference(args, kwargs)
            if res is not None:
                return res
        if self.allow_extern and func in ATEN_TO_EXTERN and func not in self.no_extern:
            p, adapt = ATEN_TO_EXTERN[func]
            if adapt is not None:
                args, kwargs = adapt(args, kwargs)
            return self.record_prim(p, args, kwargs)
        decomposition = self.decompositions.get(func)
        if decomposition is None and func in self.no_extern:
            from .decomp import EXTERN_DECOMPOSITIONS

            decomposition = EXTERN_DECOMPOSITIONS.get(func)
        if decomposition is None and torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        ):
            decomposition = func.decompose
        if decomposition is None:
            hint = " (an extern op, but allow_extern=False)" if func in ATEN_TO_EXTERN else ""
            raise NotDecomposableError(
                f"{func} has no decomposition to prims{hint}: register one with "
                "ember.primtorch.decomp.register_decomposition, or pass it in keep="
            )
        return self._decompose(func, decomposition, args, kwargs)

    def _empty_rng_state(self, device):
        """A recorded empty int64 scalar on `device` (attention.without_unread_rng_state)."""
        with self._reentered():
            return torch.empty((), dtype=torch.int64, device=device)

    def _flash_for_constant_mask(self, args, kwargs):
        """The flash kernel for a memory-efficient attention whose bias is a constant of the
        program that adds nothing or masks causally (see attention.constant_mask_kind)."""
        kind = constant_mask_kind(self, args, kwargs)
        if kind is None:
            return None
        q, k, v = args[:3]
        try:
            with self._reentered():
                res = aten._scaled_dot_product_flash_attention(
                    q, k, v, 0.0, kind == "causal", False, scale=kwargs.get("scale")
                )
        except RuntimeError:
            return None  # the flash kernel refused these arguments
        return res[0], res[1], res[6], res[7]  # as the efficient op: out, lse, seed, offset

    def _cudnn_for_inference(self, args, kwargs):
        """extern.sdpa_cudnn for cuDNN attention's inference form (attention.cudnn_attention
        calls it), with the ATen op's nine results around its output; the other eight are
        unrecorded placeholders that nothing reads. None for any other form of the call."""
        bound = cudnn_inference_arguments(args, kwargs)
        if bound is None:
            return None
        from .prims.extern import sdpa_cudnn

        out = self.record_prim(sdpa_cudnn, *bound)
        q, k = args[0], args[1]
        with self._suspend():
            nothing = torch.empty(0, device=q.device)
            seed = torch.empty((), dtype=torch.int64, device=q.device)
        return (out, nothing, None, None, q.shape[2], k.shape[2], seed, seed.clone(),
                nothing.clone())  # fmt: skip

    def _check_data_dependence(self, func):
        if func is aten._local_scalar_dense.default:
            raise DataDependentError(
                "the traced program reads a tensor's value as a Python number (.item(), int(t), "
                "float(t), bool(t) or a tensor in an if): the graph would bake in this example's "
                "value. Keep the value a tensor (torch.where instead of if)."
            )
        if func in _METADATA_OPS:
            return
        returns = func._schema.returns
        if returns and not any("Tensor" in str(r.type) for r in returns):
            raise DataDependentError(
                f"{func} returns a Python value computed from tensor data; the graph cannot "
                "record it"
            )
        if not self.allow_data_dependent and func in ATEN_TO_EXTERN:
            p, _ = ATEN_TO_EXTERN[func]
            if "data_dependent" in p.tags:
                raise DataDependentError(
                    f"{func} has an output size that depends on the data; the graph would bake in "
                    "this example's size (Tracer(allow_data_dependent=True) records it with an "
                    "unbacked size symbol for consumers that handle those)"
                )

    def _decompose(self, func, decomposition, args, kwargs):
        with self._reentered():
            out = decomposition(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and not self.is_traced(t):
                raise TraceError(f"the decomposition of {func} returned a tensor it did not trace")
        if self.check and not func._schema.is_mutable and self.shape_env is None:
            with self._suspend():
                msg = check_decomposition(func, args, kwargs, out, self.strict_strides)
            if msg:
                self.stride_mismatches.append(msg)
        return out

    def _record_custom_op(self, func, args, kwargs):
        """A user-defined operator as one extern.custom_op node (see prims/custom.py); the tensors
        it writes take their new values as for an in-place ATen op."""
        outs, written, new_values = record_custom_op(self.record_prim, func, args, kwargs,
                                                     self.node_of)  # fmt: skip
        self._check_not_lent(func, written)
        with self._suspend(), torch.no_grad():
            for t, value in zip(written, new_values):
                t.copy_(value)
        for t, value in zip(written, new_values):
            self._rebind(t, value)
        return outs

    def _record_aten(self, func, args, kwargs):
        if self.shape_env is not None:
            raise NotImplementedError(f"{func} is kept as an ATen op, which symbolic sizes do not support")
        node_args, node_kwargs = self._to_nodes((args, kwargs))
        with self._suspend():
            out = func(*args, **kwargs)
        node = self.graph.call_function(func, tuple(node_args), dict(node_kwargs))
        meta = pytree.tree_map(
            lambda t: TensorMeta.from_tensor(t) if isinstance(t, torch.Tensor) else None, out
        )
        return self._bind(node, out, meta)

    def record_prim(self, prim, args, kwargs):
        """Run `prim` on real values and record it (called by Prim.__call__ while tracing)."""
        args, kwargs = prim.canonical_args(args, kwargs)
        if self.shape_env is not None:
            return self._record_symbolic(prim, args, kwargs)
        args, kwargs = _tmap(_plain, (args, kwargs))
        node_args, node_kwargs = self._to_nodes((args, kwargs))
        meta_args, meta_kwargs = _tmap(
            lambda n: n.meta[NODE_META_KEY] if isinstance(n, fx.Node) else n,
            (node_args, node_kwargs),
        )
        with self._suspend():
            out = prim.ref(*args, **kwargs)
            if isinstance(out, torch.Tensor) and any(out is a for a in _leaves((args, kwargs))):
                out = out.view(out.shape)  # a result is a new value, even when it equals an input
        meta = prim._meta(*meta_args, **meta_kwargs)
        if "view" not in prim.tags:
            _check_fresh(prim, args, kwargs, out)
        if self.check:
            check_prim_output(prim, meta, out)
        node = self.graph.call_function(prim, tuple(node_args), dict(node_kwargs))
        return self._bind(node, out, meta)

    def _record_symbolic(self, prim, args, kwargs):
        """record_prim with symbolic sizes: the node gets sympy size arguments and the meta rule's
        symbolic TensorMeta; the reference runs on the values at the hints."""
        env = self.shape_env
        args, kwargs = _tmap(_symbolic_plain, (args, kwargs))
        node_args, node_kwargs = self._to_nodes((args, kwargs))
        meta_args, meta_kwargs = _tmap(
            lambda n: n.meta[NODE_META_KEY] if isinstance(n, fx.Node) else n,
            (node_args, node_kwargs),
        )
        real_args, real_kwargs = _tmap(lambda x: _hint_value(env, x), (args, kwargs))
        with self._suspend():
            out = prim.ref(*real_args, **real_kwargs)
            if isinstance(out, torch.Tensor) and any(
                out is a for a in _leaves((real_args, real_kwargs))
            ):
                out = out.view(out.shape)
        meta = prim._meta(*meta_args, **meta_kwargs)
        if "view" not in prim.tags:
            _check_fresh(prim, real_args, real_kwargs, out)
        if self.check:
            hint_meta = _tmap(lambda m: env.hint_meta(m) if isinstance(m, TensorMeta) else m, meta)
            check_prim_output(prim, hint_meta, out)
        node = self.graph.call_function(prim, tuple(node_args), dict(node_kwargs))
        if isinstance(out, torch.Tensor):
            out = symbolic_tensor(out, meta, env)
        elif isinstance(out, (tuple, list)):
            metas = meta if isinstance(meta, (tuple, list)) else (None,) * len(out)
            out = type(out)(
                symbolic_tensor(t, m, env) if isinstance(m, TensorMeta) else t
                for t, m in zip(out, metas)
            )
        return self._bind(node, out, meta)

    # --- values and nodes -------------------------------------------------------------------------

    def _to_nodes(self, tree):
        return _tmap(lambda x: self.node_of(x) if isinstance(x, torch.Tensor) else x, tree)

    def _bind(self, node: fx.Node, out, meta):
        """Map the real output(s) of `node` to it (tuple outputs through getitem nodes)."""
        if isinstance(out, torch.Tensor):
            node.meta[NODE_META_KEY] = meta
            self._track(out, node)
            return out
        if isinstance(out, (tuple, list)):
            metas = tuple(meta) if isinstance(meta, (tuple, list)) else (None,) * len(out)
            node.meta[NODE_META_KEY] = metas
            for i, (t, m) in enumerate(zip(out, metas)):
                if isinstance(t, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta[NODE_META_KEY] = m
                    self._track(t, item)
            return out
        node.meta[NODE_META_KEY] = None
        return out

    def _track(self, tensor: torch.Tensor, node: fx.Node) -> None:
        key, storage = id(tensor), _storage_key(tensor)
        entry = self._entries.get(key)
        if entry is not None and entry.ref() is tensor:
            entry.node = node
            if entry.storage != storage:  # out= may have resized the tensor into new storage
                self._storage_ids[entry.storage].discard(key)
                entry.storage = storage
        else:
            ref = weakref.ref(tensor, lambda _, key=key: self._forget(key))
            self._entries[key] = _Entry(ref, node, storage)
        self._storage_ids.setdefault(storage, set()).add(key)
        self._stale.discard(key)

    def _forget(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        self._stale.discard(key)
        if entry is not None:
            ids = self._storage_ids.get(entry.storage)
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self._storage_ids[entry.storage]

    def _new_input(self, make_node: Callable[[], fx.Node], tensor: torch.Tensor) -> fx.Node:
        if self.is_traced(tensor):
            return self._entries[id(tensor)].node
        node = make_node()
        node.meta[NODE_META_KEY] = TensorMeta.from_tensor(tensor)
        self.inputs[node] = tensor
        self._track(tensor, node)
        return node

    def _lift(self, tensor: torch.Tensor) -> fx.Node:
        if self.unknown_tensors == "error":
            raise TraceError(
                f"a tensor of shape {tuple(tensor.shape)} made outside the trace was used; declare "
                "it with Tracer.placeholder (or allow unknown_tensors='constant')"
            )
        if self.unknown_tensors == "placeholder":
            name = f"lifted_{len(self.lifted)}"
            last = [n for n in self.graph.nodes if n.op == "placeholder"]

            def make():
                ctx = (
                    self.graph.inserting_after(last[-1]) if last else self.graph.inserting_before()
                )
                with ctx:
                    return self.graph.placeholder(name)

            node = self._new_input(make, tensor)
            self.lifted.append((node, tensor))
            return node
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = tensor

        def make_attr():
            with self.graph.inserting_before(_first_non_input(self.graph)):
                return self.graph.get_attr(name)

        return self._new_input(make_attr, tensor)

    # --- mutation ---------------------------------------------------------------------------------

    def _functionalize(self, func, args, kwargs):
        if func.overloadpacket.__name__ in _STORAGE_CHANGING:
            raise NotDecomposableError(f"{func} changes a tensor's storage; it cannot be traced")
        if torch.Tag.inplace_view in func.tags:
            return self._inplace_view(func, args, kwargs)
        functional, kind = functional_variant(func)
        if functional is None and func in self.decompositions and self.decompose:
            # A decomposition written for the mutating op itself (its in-place ATen calls come back
            # here and are functionalised one by one).
            return self._decompose(func, self.decompositions[func], args, kwargs)
        if functional is None:
            raise NotDecomposableError(
                f"{func} mutates its arguments and has no functional variant to record"
            )
        written = mutated_arguments(func, args, kwargs)
        self._check_not_lent(func, written)
        for t in written:
            self.node_of(t)  # stale or unknown tensors are dealt with before anything runs
        f_args, f_kwargs = args, kwargs
        if kind == "out":
            names = {a.name for a in func._schema.arguments if _is_written(a)}
            f_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        result = self.dispatch(functional, f_args, f_kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if kind == "functional":
            n_out = len(results) - len(written)
            new_values, returned = results[n_out:], results[:n_out]
        else:
            new_values, returned = results, None
        for t, value in zip(written, new_values):
            if kind != "functional" and not torch.can_cast(value.dtype, t.dtype):
                raise RuntimeError(
                    f"{func}: result type {value.dtype} can't be cast to the desired output type "
                    f"{t.dtype}"
                )
        # The real tensors take the recorded values (not a second eager run, which would draw
        # other random numbers for uniform_ and friends).
        with self._suspend(), torch.no_grad():
            for t, value in zip(written, new_values):
                if t.shape != value.shape:
                    t.resize_(value.shape)
                t.copy_(value)
        for t, value in zip(written, new_values):
            self._rebind(t, value)
        if returned is not None:
            return tuple(returned) if len(returned) != 1 else returned[0]
        return written[0] if len(written) == 1 else tuple(written)

    def _check_not_lent(self, func, written) -> None:
        if not self._lent:
            return
        for t in written:
            if isinstance(t, torch.Tensor) and _storage_key(t) in self._lent:
                raise LentInputWritten(f"{func} writes a tensor the tracer was lent, not given")

    def _inplace_view(self, func, args, kwargs):
        """`as_strided_`, `transpose_`, `squeeze_`...: only the tensor's metadata changes. Record
        the out-of-place view, give the real tensor its new metadata, and let the tensor name the
        view's node from now on (no data is written: a copy would overlap its own source)."""
        tensor = args[0]
        if any(t is tensor for t in self.inputs.values()):
            raise NotDecomposableError(f"{func} changes the metadata of an input; it cannot be traced")
        packet = getattr(torch.ops.aten, func.overloadpacket.__name__.rstrip("_"))
        names = [a.name for a in func._schema.arguments]
        view_op = next(o for o in (getattr(packet, n) for n in packet.overloads())
                       if [a.name for a in o._schema.arguments] == names)  # fmt: skip
        value = self.dispatch(view_op, args, kwargs)
        with self._suspend(), torch.no_grad():
            func(*args, **kwargs)
        self._track(tensor, self.node_of(value))
        return tensor

    def _rebind(self, tensor: torch.Tensor, value: torch.Tensor) -> None:
        from .prims import elementwise, movement

        if value.dtype != tensor.dtype:
            value = self.record_prim(elementwise.convert_element_type, (value, tensor.dtype), {})
        meta = self.node_of(value).meta[NODE_META_KEY]
        if tuple(value.shape) != tuple(tensor.shape):
            raise TraceError(f"in-place result shape {tuple(value.shape)} != {tuple(tensor.shape)}")
        if _significant_strides(meta.sizes, meta.strides) != _significant_strides(
            tensor.shape, tensor.stride()
        ):
            value = self.record_prim(movement.copy_strided, (value, tensor.stride()), {})
        node = self.node_of(value)
        for other in self._storage_ids.get(_storage_key(tensor), ()):
            if other != id(tensor):
                self._stale.add(other)
        self._track(tensor, node)
        for inp, t in self.inputs.items():
            if t is tensor:
                self.on_input_mutation(inp, node)

    def _note_stale_inputs(self):
        for inp, t in self.inputs.items():
            if id(t) in self._stale and inp not in self.mutated_inputs:
                self.on_input_mutation(inp, None)

    def _note_output_alias(self, index: int, tensor: torch.Tensor) -> None:
        key = _storage_key(tensor)
        for inp, t in self.inputs.items():
            if _storage_key(t) == key and tensor.numel() and t.numel():
                self.on_output_alias(index, inp)
                return


_STORAGE_CHANGING = {"set_", "resize_", "resize_as_", "_resize_output_"}


def _storage_key(t: torch.Tensor) -> int:
    if type(t) is SymbolicTensor:
        t = t.value
    return t.untyped_storage()._cdata


def _is_written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _first_non_input(graph: fx.Graph) -> fx.Node:
    for n in graph.nodes:
        if n.op not in ("placeholder", "get_attr"):
            return n
    return graph._root


def _overloads(ops) -> set:
    out = set()
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            out.update(getattr(op, name) for name in op.overloads())
        else:
            out.add(op)
    return out


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    else:
        yield x


def _tmap(fn, x):
    # pytree.tree_map for the shapes call arguments take (lists, tuples, dicts), several times
    # faster; it runs a few times per recorded op.
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_tmap(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _tmap(fn, v) for k, v in x.items()}
    return fn(x)


def _plain(x):
    # Recorded arguments hold Python ints for static sizes, never sympy Integers.
    if isinstance(x, sympy.Basic) and x.is_Integer:
        return int(x)
    return x


def _symbolic_plain(x):
    # A SymInt of ours is recorded as its sympy expression (an int when constant).
    if isinstance(x, torch.SymInt):
        return to_expr(x)
    return _plain(x)


def _hint_value(env, x):
    if type(x) is SymbolicTensor:
        return x.value
    if isinstance(x, sympy.Basic):
        return env.hint(x)
    return x


def _significant_strides(sizes, strides):
    # Dims of size 0 or 1 have no meaningful stride; symbolic sizes are at least 2.
    return tuple(
        as_expr(st) for s, st in zip(sizes, strides) if not (as_expr(s).is_number and int(s) <= 1)
    )


def _check_fresh(prim, args, kwargs, out) -> None:
    keys = {
        _storage_key(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
    }
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.numel() and _storage_key(t) in keys:
            raise TraceError(f"{prim} is not a view prim but its reference returned an alias")


def trace_to_prims(fn: Callable, *example_args, keep=(), **options) -> fx.GraphModule:
    """Trace `fn(*example_args)` into a graph of prims and extern ops over its flat tensors."""
    flat, in_spec = pytree.tree_flatten(example_args)
    tracer = Tracer(keep=keep, **options)
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            tracer.placeholder(x, f"arg{i}")
    with tracer:
        out = fn(*pytree.tree_unflatten(flat, in_spec))
    gm = tracer.output(out)
    if tracer.mutated_inputs:
        names = ", ".join(n.name for n in tracer.mutated_inputs)
        raise TraceError(
            f"{getattr(fn, '__name__', fn)} mutates {names}; trace_to_prims returns a functional "
            "graph and cannot express that. Use ember.aot_autograd (which returns the new values), "
            "or Tracer directly and read Tracer.mutated_inputs."
        )
    gm.meta["in_spec"] = in_spec
    return gm
