"""The output graph of one frame conversion: fx nodes, graph inputs, guards and side effects."""

from __future__ import annotations

import contextlib
import re
import weakref
from typing import Optional

import sympy
import torch
import torch.fx as fx

from ember.ir import NODE_META_KEY, TensorMeta, contiguous_strides
from ember.ir.example import metadata_only, metadata_only_tree

from . import shapes
from . import variables as V
from .distributed import is_dtensor
from .exc import GenericFallback, Unsupported
from .guards import GuardSet, tensor_spec
from .source import AttrSource, ItemSource, Source
from .symbolic import SYM_SIZES, ShapeEnv, SymIntVT, SymSliceVT

_BY_RULE = object()  # OutputGraph.call: the result's symbolic sizes come from the op's rule

# Python scalars that may appear as graph constants.
_GRAPH_CONSTS = (int, float, bool, str, type(None), complex, torch.dtype, torch.device,
                 torch.layout, torch.memory_format, slice, type(Ellipsis), torch.Size)  # fmt: skip


# The autocast cache switch the user's code sees while a frame is traced, or None when tracing
# leaves the real switch alone (see uncached_examples).
_USER_CACHE: list = [None]


@contextlib.contextmanager
def uncached_examples():
    """Trace with autocast's cache off. Tracing runs ops on private copies of the parameters
    (`_example_clone`); under an autocast block the user holds open, autocast would keep each
    copy's cast, and so the copy, until the block ends: about twice the weights' memory for as
    long as the block runs the compiled model. The traced code still sees (and records) the
    switch as it set it."""
    saved = _USER_CACHE[0], torch.is_autocast_cache_enabled()
    _USER_CACHE[0] = saved[1]
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        _USER_CACHE[0] = saved[0]
        torch.set_autocast_cache_enabled(saved[1])


def _example_clone(t: torch.Tensor) -> torch.Tensor:
    """A private copy to run ops on while tracing, so tracing never mutates the user's tensors."""
    with torch.no_grad():
        spread = [d for d, (n, st) in enumerate(zip(t.shape, t.stride())) if st == 0 and n > 1]
        if spread:  # an expanded tensor (one element for many places): copy a slice, expand it
            one = tuple(slice(0, 1) if d in spread else slice(None) for d in range(t.dim()))
            ex = _example_clone(t[one].detach()).expand(t.shape)
        else:
            ex = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            ex.copy_(t)
    return ex.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else ex


class OutputGraph:
    """Collects the fx graph, its inputs (by source), guards and side effects of one frame."""

    def __init__(self, code, where_fn, policy=None, exporting=False):
        self.exporting = exporting  # ember.export: a program run without Python or ranks
        self.graph = fx.Graph()
        # Inputs go to the frame's graph even while a control-flow body is traced into its own
        # `graph`; `root_module` holds the subgraphs (control_flow.py swaps both for a body).
        self.root_graph = self.graph
        self.root_module = torch.nn.Module()
        # Each node's value while the program still holds it (nodes keep metadata only): read by
        # control flow, which runs a body on the values its lifted inputs have
        self._values = weakref.WeakValueDictionary()
        self.code = code
        self.where = where_fn  # () -> "file:line" of the instruction being traced
        self.guards = GuardSet()
        self.inputs: list[tuple[Source, torch.Tensor, V.TensorVT]] = []
        self._input_by_id: dict[int, V.TensorVT] = {}
        self._input_by_source: dict[Source, V.TensorVT] = {}
        self.side_effects: list[tuple] = []
        self.autocast_cache = _USER_CACHE[0]  # the switch as traced code has set it
        self.mutated: dict[int, V.VT] = {}  # pre-existing lists/dicts changed while tracing
        self.pending_attrs: dict[tuple, V.VT] = {}  # (id(obj), name) -> value set while tracing
        self.root_globals: dict = {}
        self.names: set[str] = set()
        self._last_placeholder = None  # the placeholder _insert_placeholder added last
        self.op_count = 0
        # Bytes of the example values the capture computed (see convert.release_capture).
        self.example_bytes = 0
        # Dynamic sizes: the policy choosing them, and the symbols and guards (None: all static).
        self.policy = policy
        # Traced for any instance of the modules it reads (convert.CodeState.generic): module
        # types and parameter metadata are guarded, not identities.
        self.generic_modules = False
        # Whether the guards pin every graph input's sizes, strides, dtype, device and
        # requires_grad (GUARDED_INPUTS_META_KEY: the runtime then keys calls by mode alone).
        self.inputs_pinned = True
        self._module_tensors: list = []  # generic: (vt, version) of each module tensor read
        self.shape_env = None
        if policy is not None:
            this = weakref.ref(self)  # (a strong one: output -> shape_env -> output, a cycle)
            self.shape_env = ShapeEnv(self.graph, lambda: this().where() if this() else "?",
                                      exporting)  # fmt: skip

    # -- inputs -------------------------------------------------------------------------------
    def add_input(self, value: torch.Tensor, source: Source, guarded=True,
                  dims=None) -> V.TensorVT:  # fmt: skip
        """The TensorVT for a real tensor read from `source` (one placeholder per tensor object).
        `guarded=False`: the caller guards what the tensor is made from (a NumPy array), and
        `dims` ({dim: DimRange}) are its dynamic sizes (their slots: `vt.size_spec`)."""
        if source in self._input_by_source:
            return self._input_by_source[source]
        if is_dtensor(value):  # its __torch_function__ is torch's disabled one: not "plain"
            raise Unsupported(f"a DTensor ({source.name()}, placements "
                              f"{tuple(value.placements)}) as a graph input: DTensor programs "
                              "are captured only through parallelize_module's "
                              "ColwiseParallel/RowwiseParallel on nn.Linear and nn.Embedding")
        if not _plain_tensor_type(type(value)):
            raise Unsupported(f"tensor subclass {type(value).__name__} as a graph input")
        if not guarded:
            dims = dims or {}
            self.inputs_pinned = False  # the caller's guards may leave its strides free
        elif isinstance(value, torch.nn.Parameter) and source.is_module_param():
            # A module's parameter: its identity (replacing a parameter recompiles) and its
            # metadata, which `.data =` changes in place. Traced for any instance: the metadata
            # alone.
            if self.generic_modules:
                self.guards.add("TENSOR", source, tensor_spec(value))
            else:
                self.guards.add("PARAM", source, value)
            dims = {}
        else:
            dims = self.policy.dims(value, source) if self.policy is not None else {}
            if not dims:
                self.guards.add("TENSOR", source, tensor_spec(value))
        prev = self._input_by_id.get(id(value))
        if prev is not None:
            self.guards.add("SAME", source, prev.source)
            self._input_by_source[source] = prev
            return prev
        name = self._placeholder_name(source)
        node = self._insert_placeholder(name)
        example = _example_clone(value)
        self.example_bytes += example.numel() * example.element_size()
        node.meta["example_value"] = metadata_only(example)
        self._values[node] = example
        node.meta[NODE_META_KEY] = TensorMeta.from_tensor(value)
        if isinstance(value, torch.nn.Parameter):  # which parameter (distributed.py's buckets)
            node.meta["ember_param_id"] = id(value)  # read at compile time only
        vt = V.TensorVT(node, example, source, type(value))
        vt.real = value  # identity only (set membership, `is`), never read for values
        # a parameter of a module traced for any instance: its identity is this instance's
        vt.generic = self.generic_modules and source.is_module_param()
        if self.generic_modules and _module_tensor(source):
            self._module_tensors.append((vt, example._version))
        if dims:
            self._symbolic_input(vt, value, source, dims, guarded)
        self.inputs.append((source, value, vt))
        self._input_by_id[id(value)] = vt
        self._input_by_source[source] = vt
        return vt

    def _symbolic_input(self, vt, value, source, dims, guarded=True) -> None:
        """Give a graph input symbolic sizes; its guard checks the static sizes, reads the
        dynamic ones into the guard VM's int slots, and checks row-major strides (unguarded:
        the caller's guard does, from `vt.size_spec`)."""
        env = self.shape_env
        sizes, spec = [], []
        for d, n in enumerate(value.shape):
            if d in dims:
                spec.append(-1 - len(env.slots))
                sizes.append(env.input_size(source, d, n, dims[d]))
            else:
                spec.append(n)
                sizes.append(n)
        vt.size_spec = tuple(spec)
        if guarded:
            self.guards.add("SYM_TENSOR", source, (type(value), value.dtype, value.device,
                                                   value.requires_grad, tuple(spec)))  # fmt: skip
        vt.sym = tuple(sympy.sympify(s) for s in sizes)
        vt.node.meta[NODE_META_KEY] = TensorMeta(value.dtype, vt.sym, contiguous_strides(vt.sym),
                                                 0, str(value.device), value.requires_grad)

    def _insert_placeholder(self, name):
        # Placeholders are added here only, so the one added last is the last one: scanning the
        # graph for each input was quadratic in a model's parameters.
        last = self._last_placeholder
        if last is not None and last._erased:
            placeholders = [n for n in self.root_graph.nodes if n.op == "placeholder"]
            last = placeholders[-1] if placeholders else None
        if last is not None:
            with self.root_graph.inserting_after(last):
                node = self.root_graph.placeholder(name)
        else:
            with self.root_graph.inserting_before(next(iter(self.root_graph.nodes), None)):
                node = self.root_graph.placeholder(name)
        self._last_placeholder = node
        return node

    def _placeholder_name(self, source: Source) -> str:
        base = re.sub(r"\W+", "_", source.name()).strip("_").lower() or "input"
        base = base[:60]
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def check_generic_writes(self) -> None:
        """A frame traced for any instance that writes a module's tensor in place (BatchNorm's
        running statistics) falls back: two layers' tensors the trace read apart may be one in
        another layer (a module shared), and writing one then reads as writing both."""
        for vt, version in self._module_tensors:
            if vt.example._version != version:
                raise GenericFallback(f"{vt.source.name()} written in place")

    # -- ops ----------------------------------------------------------------------------------
    def call(self, kind: str, target, args: tuple, kwargs: dict, sym=_BY_RULE) -> V.VT:
        """Add a torch-level call to the graph, running it on example values to learn its result.
        `sym`: the result's symbolic sizes when the caller knows them (as `shapes.infer` gives
        them); by default they come from the op's rule."""
        node_args = _map(args, _to_node)
        node_kwargs = _map(kwargs, _to_node)
        ex_args = _map(args, _to_example)
        ex_kwargs = _map(kwargs, _to_example)
        try:
            if kind == "call_method":
                result = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
            elif self.autocast_cache is not None and target is torch.is_autocast_cache_enabled:
                result = self.autocast_cache
            elif self.autocast_cache is not None and target is torch.set_autocast_cache_enabled:
                self.autocast_cache, result = bool([*ex_args, *ex_kwargs.values()][0]), None
            else:
                result = target(*ex_args, **ex_kwargs)
        except Exception as e:  # the user's code would raise the same in eager: run it eagerly
            name = getattr(target, "__name__", target)
            raise Unsupported(f"{name} raised {type(e).__name__} on example inputs: {e}") from e
        scalar = isinstance(result, (bool, int, float, str, torch.dtype, torch.device))
        if scalar and not has_tensor((args, kwargs)):
            for vt in _sym_ints((args, kwargs)):  # the answer holds for this value only
                vt.env.specialize(vt)
            return V.ConstVT(result)  # a query of global state or metadata, not of tensor data
        node = self.graph.create_node(kind, target, tuple(node_args), dict(node_kwargs))
        node.meta["ember_where"] = self.where()
        self.op_count += 1
        if sym is _BY_RULE:
            symbolic = shapes.is_symbolic(V.ListVT([*args, *kwargs.values()]))
            sym = None
            if self.shape_env is not None and symbolic:
                sym = shapes.infer(self.shape_env, kind, target, args, kwargs, result)
        return self.wrap_result(node, result, sym)

    def cut_example_history(self) -> None:
        """Detach every example value the capture still holds from the autograd graph it ran
        (ops run with grad on to learn which results require grad; that graph saved the
        forward's activations, as eager's does). Held, they stayed alive through the backend's
        compile, where the backend's own trace computes a step besides: a GPT-2-style model's
        first training step grew the process by 3442 MiB against eager's 1926 (CPU, float32),
        2312 with them cut. A view cannot be detached in place and keeps its part of the graph.
        Nodes keep their own metadata (requires_grad included); nothing runs on these values
        after the capture."""
        for value in list(self._values.values()):
            tensor = isinstance(value, torch.Tensor)
            if tensor and value.grad_fn is not None and not value._is_view():
                value.detach_()

    def value_of(self, node: fx.Node):
        """The value `node` has in this trace, while the program still holds it; else the
        metadata-only example on the node."""
        value = self._values.get(node)
        return value if value is not None else node.meta.get("example_value")

    def wrap_result(self, node: fx.Node, result, sym=None) -> V.VT:
        """The VT of an op's result; `sym`: its symbolic sizes (shapes.infer), None if static."""
        # Nodes keep the metadata of their values, never the values: the interpreter's variables
        # hold each value only while the program can still read it, as eager does, where
        # holding them on nodes kept the whole forward alive until the backend returned.
        if isinstance(result, torch.Tensor):
            self.example_bytes += result.numel() * result.element_size()
            node.meta["example_value"] = metadata_only(result)
            self._values[node] = result
            node.meta[NODE_META_KEY] = TensorMeta.from_tensor(result)
            vt = V.TensorVT(node, result)
            vt.sym = sym
            if isinstance(sym, tuple):  # export's size-1 check reads them (export_size_one.py)
                node.meta[SYM_SIZES] = sym
            return vt
        if isinstance(result, (tuple, list)) and all(
            isinstance(r, (torch.Tensor, *_GRAPH_CONSTS)) for r in result
        ):
            node.meta["example_value"] = metadata_only_tree(result)
            items = []
            for i, r in enumerate(result):
                if isinstance(r, torch.Tensor):
                    item = self.graph.call_function(_getitem, (node, i))
                    items.append(self.wrap_result(item, r, sym[i] if sym else None))
                else:
                    items.append(V.ConstVT(r))
            if isinstance(result, list):
                return V.ListVT(items)
            fields = getattr(type(result), "_fields", None) or _structseq_fields(result)
            if fields:
                return V.NamedTupleVT(type(result), items, fields)
            return V.TupleVT(items)
        if result is None:
            return V.ConstVT(None)
        if isinstance(result, (bool, int, float)) and not isinstance(result, torch.SymInt):
            raise Unsupported(f"{node.target} returns a Python {type(result).__name__} "
                              "that depends on tensor data")  # fmt: skip
        raise Unsupported(f"{node.target} returned a {type(result).__name__}, not a tensor")

    def record_side_effect(self, *effect) -> None:
        self.side_effects.append(effect)

    def drop_restored_attributes(self) -> None:
        """Forget attribute writes whose net effect is nothing: the last value written is the
        constant the attribute holds now (a flag set and then reset, as transformers' context
        variables do around a forward), guarding that it still holds it on later calls."""
        from .source import AttrSource

        last: dict = {}
        for effect in self.side_effects:
            if effect[0] == "setattr":
                obj, name, value = effect[1:]
                last[(id(_identity_of(obj)), name)] = (obj, name, value)
        restored = set()
        for key, (obj, name, value) in last.items():
            real = _identity_of(obj)
            if (isinstance(value, V.ConstVT) and getattr(obj, "source", None) is not None
                    and hasattr(real, name) and type(getattr(real, name)) is type(value.value)
                    and type(value.value) in (bool, int, str, type(None))
                    and getattr(real, name) == value.value):  # fmt: skip
                self.guards.add("EQ", AttrSource(obj.source, name), value.value)
                restored.add(key)
        self.side_effects = [e for e in self.side_effects if not (
            e[0] == "setattr" and (id(_identity_of(e[1])), e[2]) in restored)]  # fmt: skip


def _module_tensor(source) -> bool:
    """A module's parameter or buffer (`...._parameters['w']`, `...._buffers['b']`)."""
    return (isinstance(source, ItemSource) and isinstance(source.base, AttrSource)
            and source.base.attr in ("_parameters", "_buffers"))  # fmt: skip


def _identity_of(obj):
    """The Python object a module or object variable stands for."""
    return obj.module if isinstance(obj, V.ModuleVT) else getattr(obj, "obj", obj)


_getitem = __import__("operator").getitem
_TF = torch.Tensor.__torch_function__.__func__


def _plain_tensor_type(cls) -> bool:
    """Tensor, Parameter, Buffer and subclasses that do not override __torch_function__."""
    tf = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
    return tf is _TF or tf is torch._C._disabled_torch_function_impl


def _structseq_fields(result) -> Optional[tuple]:
    """Field names of a structseq (torch.return_types.max has .values and .indices)."""
    n = getattr(type(result), "n_sequence_fields", None)
    if n is None:
        return None
    names = getattr(type(result), "__match_args__", None)
    if names and len(names) >= n:
        return tuple(names[:n])
    return None


def has_tensor(x, test=None) -> bool:
    """Whether `x` (VTs, and lists, tuples and dicts of them) holds a TensorVT (one for which
    `test(vt)` is true, when given)."""
    if isinstance(x, V.TensorVT):
        return test is None or bool(test(x))
    if isinstance(x, (list, tuple)):
        return any(has_tensor(i, test) for i in x)
    if isinstance(x, dict):
        return any(has_tensor(i, test) for i in x.values())
    if isinstance(x, V.ListVT):
        return any(has_tensor(i, test) for i in x.items)
    if isinstance(x, V.DictVT):
        return any(has_tensor(i, test) for i in x.items.values())
    return False


def _sym_ints(x) -> list:
    if isinstance(x, SymIntVT):
        return [x]
    if isinstance(x, SymSliceVT):
        return _sym_ints(x.parts)
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    if isinstance(x, (V.ListVT, V.DictVT)):
        items = x.items.values() if isinstance(x, V.DictVT) else x.items
    return [s for i in items for s in _sym_ints(i)]


def _map(x, fn):
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    return [fn(v) for v in x]


def _to_node(v):
    if isinstance(v, (V.TensorVT, SymIntVT)):
        return v.node
    if isinstance(v, SymSliceVT):
        return slice(*(_to_node(p) for p in v.parts))
    if isinstance(v, V.ConstVT):
        if isinstance(v.value, _GRAPH_CONSTS) or _is_const_tuple(v.value):
            return _plain_number(v.value)
    if isinstance(v, V.ListVT):
        items = [_to_node(i) for i in v.items]
        return tuple(items) if v.is_tuple else items
    if isinstance(v, V.DictVT) and v.cls is dict:
        return {k: _to_node(i) for k, i in v.items.items()}
    if isinstance(v, V.ConstVT):
        return _plain_number(v.value)
    raise Unsupported(f"a {type(v).__name__} ({_describe(v)}) cannot be an argument of a graph op")


def _plain_number(value):
    """A NumPy scalar as the Python number torch reads it as (int and float kinds as themselves,
    others through float()): fx would print `np.float64(0.5)`, a name the graph's code lacks."""
    if type(value) is tuple:
        return tuple(_plain_number(x) for x in value)
    if getattr(type(value), "__module__", None) == "numpy" and hasattr(value, "item"):
        return value.item() if value.dtype.kind in "iuf" else float(value.real)
    return value


def _to_example(v):
    if isinstance(v, V.TensorVT):
        return v.example
    if isinstance(v, SymIntVT):
        return v.hint
    if isinstance(v, SymSliceVT):
        return slice(*(_to_example(p) for p in v.parts))
    if isinstance(v, V.ConstVT):
        return v.value
    if isinstance(v, V.ListVT):
        items = [_to_example(i) for i in v.items]
        return tuple(items) if v.is_tuple else items
    if isinstance(v, V.DictVT):
        return {k: _to_example(i) for k, i in v.items.items()}
    raise Unsupported(f"a {type(v).__name__} cannot be an argument of a graph op")


def _is_const_tuple(value) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(x, _GRAPH_CONSTS) or _is_const_tuple(x) for x in value
    )


def _describe(v) -> str:
    for attr in ("module", "obj", "fn", "cls"):
        if hasattr(v, attr):
            return type(getattr(v, attr)).__name__
    return type(v).__name__
