"""Public entry points: aot_function, aot_module, aot_module_simplified and the aot_eager backend."""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from typing import Callable, Optional, Protocol

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from ember.ir import (FULLGRAPH_META_KEY, INPUT_UPDATES_META_KEY, NODE_META_KEY,
                      RECOMPUTE_META_KEY, WRITTEN_AFTER_CALL_META_KEY, TensorMeta, progress)
from ember.ir.example import example_of
from ember.ir.locks import COMPILE_LOCK

from .control_flow import compile_with_control_flow, has_control_flow
from .dynamic import SYMBOLS_META, dynamic_module_call, runnable_graph
from .meta_trace import trace_program as trace  # on values without data where it can
from .module_call import GUARDED_INPUTS_META, module_caller
from .partition import min_cut_partition
from .plan_codec import build_runtime
from .runtime import RuntimePlan, check_mutated_aliasing
from .signature import input_signature, tensor_key
from .tracer_bridge import recompute_region

# A compiler turns a graph and example inputs into a callable taking the same inputs.
Compiler = Callable[[fx.GraphModule, list], Callable]


class RuntimeCache(Protocol):
    """A compiler's store of traced-and-compiled programs by their flat inputs (a disk cache,
    say): a hit skips tracing, partitioning and compiling. The compiled list is the inference
    graph's callable, or the forward's and the backward's. `store` follows the `load` that
    missed, for the same inputs, once they are compiled."""

    def load(self, flat: list, in_spec) -> Optional[tuple[RuntimePlan, list[Callable]]]: ...

    def store(self, flat: list, in_spec, plan: RuntimePlan, compiled: list[Callable]) -> None: ...


def run_as_fx(gm: fx.GraphModule, example_inputs: list) -> Callable:
    """The identity compiler: the graph module itself runs the prims' reference implementations
    (with nodes computing its symbolic sizes from the inputs' sizes, when it has any)."""
    return runnable_graph(gm)


def example_inputs_from_meta(gm: fx.GraphModule, shape_env=None) -> list:
    """Tensors of the placeholders' TensorMeta, for compilers to inspect; symbolic sizes take
    their hints in `shape_env`. They hold no data (ember.ir.example.MetadataOnly): real ones
    allocated a backward's whole saved set and tangents (on a GPU, device memory) just to be
    looked at."""
    out = []
    for n in gm.graph.find_nodes(op="placeholder"):
        meta = n.meta.get(NODE_META_KEY)
        if not isinstance(meta, TensorMeta):
            out.append(None)
            continue
        if shape_env is not None:
            meta = shape_env.hint_meta(meta)
        out.append(example_of(meta))
    return out


@contextlib.contextmanager
def _heap_frozen():
    """The objects that exist before a compile are left out of the garbage collector's passes
    while it runs (gc.freeze), and given back after. A compile allocates millions of objects, so
    the collector makes full passes during it, each over the whole heap (torch, the model, every
    module): ~0.4 s of a 12-layer GPT-2's 2.9 s compile on the CPU. Nothing is lost: garbage among
    the frozen objects is collected after the compile. A process that froze its heap itself (a
    pre-forking server) is left as it is."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class AOTFunction:
    """The callable `aot_function` returns: traces once per input signature, then runs compiled."""

    def __init__(self, fn, fw_compiler, bw_compiler, partition_fn, inference_compiler,
                 runtime_cache: Optional[RuntimeCache] = None):  # fmt: skip
        self.fn = fn
        self.runtime_cache = runtime_cache
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler or fw_compiler
        self.inference_compiler = inference_compiler or fw_compiler
        self.partition_fn = partition_fn
        self.cache: dict = {}  # (in_spec, input_signature) -> runtime
        self.last_graphs: dict[str, fx.GraphModule] = {}  # for debugging and tests
        self.compile_seconds = 0.0
        # Calls with positional tensors only: tensor_key(args) -> runtime.call (no pytree).
        self._flat_calls: dict = {}
        # (TensorMeta or None per flat input, ShapeEnv) while a dynamic-shape trace is made.
        self.symbolic = None
        functools.update_wrapper(self, fn, updated=())

    @property
    def trace_count(self) -> int:
        return len(self.cache)

    def __call__(self, *args, **kwargs):
        key = None if kwargs else tensor_key(args)
        call = self._flat_calls.get(key)
        if call is not None:
            return call(args)
        flat, in_spec = pytree.tree_flatten((args, kwargs))
        runtime = self.runtime_for(flat, in_spec)
        if key is not None:  # args were flat tensors: the same flat list, the same spec
            self._flat_calls[key] = runtime.call
        return runtime.call(tuple(a for a in flat if isinstance(a, torch.Tensor)))

    def runtime_for(self, flat: list, in_spec):
        """The runtime for these flattened arguments, tracing and compiling on a miss."""
        key = (in_spec, input_signature(flat))
        runtime = self.cache.get(key)
        if runtime is None:
            # The first call compiles, outside dynamo's capture: under the process's compile lock,
            # as dynamo's capture is (ember.ir.locks). A thread that waited looks again: another
            # thread may have compiled this signature meanwhile.
            with COMPILE_LOCK:
                runtime = self.cache.get(key)
                if runtime is None:
                    start = time.perf_counter()
                    with progress.stage("aot_autograd"), _heap_frozen():
                        runtime = self.cache[key] = self._compile(flat, in_spec)
                    self.compile_seconds += time.perf_counter() - start
        return runtime

    def eager_runtime_for(self, flat: list, in_spec, error: NotImplementedError):
        """A runtime running the program as written, for these arguments' signature, whose
        compile raised `error` (a construct the tracer or a compiler does not cover): what
        dynamo's graphs fall back to, as a capture the backend refuses does, with a warning."""
        first = str(error).splitlines()[0] if str(error) else ""
        warnings.warn(f"ember.compile: a graph runs eagerly: the compile at its first call "
                      f"raised {type(error).__name__}: {first}")  # fmt: skip
        with COMPILE_LOCK:
            runtime = self.cache[(in_spec, input_signature(flat))] = _EagerRuntime(
                self.fn, flat, in_spec)  # fmt: skip
        return runtime

    def _compile(self, flat: list, in_spec):
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        cache = self.runtime_cache if self.symbolic is None else None  # static programs only
        hit = cache.load(flat, in_spec) if cache is not None else None
        if hit is not None:
            plan, compiled = hit
            check_mutated_aliasing(plan, tensors)
            self.last_graphs = {}
            return build_runtime(plan, compiled)
        program = getattr(self.fn, "program", self.fn)
        with progress.stage("trace"):
            traced = trace(_flat_program(self.fn, flat, in_spec), tensors, self.symbolic,
                           overwritten=_written_after_call(program, flat))
        check_mutated_aliasing(traced.plan, tensors)
        example = list(traced.example_inputs)
        example += [torch.zeros((), dtype=torch.int64, device=d) for d in traced.plan.rng_devices]
        if not traced.is_joint:
            plan = traced.plan  # the inputs the runtime overwrites with the last outputs
            traced.gm.meta[INPUT_UPDATES_META_KEY] = {
                plan.num_graph_outputs + k: i for k, i in enumerate(plan.mutated_inputs)}
            self.last_graphs = {"inference": traced.gm}
            with progress.stage("inference graph compile"):
                compiled = [self.inference_compiler(traced.gm, example)]
        else:
            with progress.stage("partition"):
                fw_gm, bw_gm = self.partition_fn(traced.gm,
                                                 num_fwd_outputs=traced.plan.num_fw_outputs)
            self.last_graphs = {"joint": traced.gm, "forward": fw_gm, "backward": bw_gm}
            for part, gm in (("forward", fw_gm), ("backward", bw_gm)):
                gm.meta["ember_training"] = part  # a compiler may lay training graphs out apart
            # the forward's outputs past these are what it saves for the backward
            fw_gm.meta["ember_num_fw_outputs"] = traced.plan.num_fw_outputs
            with progress.stage("forward graph compile"):
                forward = self.fw_compiler(fw_gm, example)
            env = self.symbolic[1] if self.symbolic is not None else None
            with progress.stage("backward graph compile"):
                backward = self.bw_compiler(bw_gm, example_inputs_from_meta(bw_gm, env))
            compiled = [forward, backward]
        if cache is not None:
            self.runtime_cache.store(flat, in_spec, traced.plan, compiled)
        return build_runtime(traced.plan, compiled)


class _EagerRuntime:
    """`call(tensors)`: the program run as written, its other arguments those of the signature."""

    def __init__(self, fn: Callable, flat: list, in_spec):
        self._run = _with_tensors(fn, flat, in_spec)

    def call(self, tensors):
        return self._run(*tensors)


def _written_after_call(program, flat: list) -> tuple:
    """Positions among the flat tensor arguments of the graph inputs the caller overwrites after
    the call (placeholders tagged WRITTEN_AFTER_CALL_META_KEY). The graph's arguments are the
    last flat leaves (after its parameters and buffers)."""
    graph = getattr(program, "graph", None)
    if not isinstance(graph, fx.Graph):
        return ()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not any(n.meta.get(WRITTEN_AFTER_CALL_META_KEY) for n in placeholders):
        return ()
    start = len(flat) - len(placeholders)
    tensor_index = {}
    for pos, a in enumerate(flat):
        if isinstance(a, torch.Tensor):
            tensor_index[pos] = len(tensor_index)
    return tuple(tensor_index[start + j] for j, n in enumerate(placeholders)
                 if n.meta.get(WRITTEN_AFTER_CALL_META_KEY) and start + j in tensor_index)


def _with_tensors(fn: Callable, flat: list, in_spec) -> Callable:
    """`(*tensors) -> fn(*args, **kwargs)`: the call `flat` (tree_flatten of (args, kwargs)) made
    with these tensors in its tensors' places; the template keeps its other leaves only."""
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    template = [None if isinstance(a, torch.Tensor) else a for a in flat]

    def call(*tensors):
        args = list(template)
        for pos, t in zip(positions, tensors):
            args[pos] = t
        a, kw = pytree.tree_unflatten(args, in_spec)
        return fn(*a, **kw)

    return call


def _flat_program(fn: Callable, flat: list, in_spec):
    """fn as a function of the flat tensor arguments alone (the rest are baked constants)."""
    run = _with_tensors(fn, flat, in_spec)

    def flat_fn(*tensors):
        flat_out, flat_fn.out_spec = pytree.tree_flatten(run(*tensors))
        return flat_out

    flat_fn.out_spec = None
    return flat_fn


def aot_function(
    fn: Callable,
    fw_compiler: Compiler,
    bw_compiler: Optional[Compiler] = None,
    partition_fn=min_cut_partition,
    inference_compiler: Optional[Compiler] = None,
    runtime_cache: Optional[RuntimeCache] = None,
) -> AOTFunction:
    """Trace `fn` ahead of time (forward and backward as prim graphs) and run it compiled."""
    return AOTFunction(
        fn, fw_compiler, bw_compiler, partition_fn, inference_compiler, runtime_cache
    )


class AOTModule(nn.Module):
    """`module` with its forward traced and compiled; parameters and buffers stay the module's."""

    def __init__(self, module: nn.Module, compiled: AOTFunction):
        super().__init__()
        self.orig_module = module
        self._compiled = compiled
        self._run = module_caller(module, compiled)

    def forward(self, *args, **kwargs):
        return self._run(*args, **kwargs)


def _functional(module: nn.Module) -> Callable:
    """`module` as a function of (params, buffers, *args); `.program` is the module (its graph
    tags the inputs the caller overwrites after the call)."""
    if _has_recompute_regions(module):
        runner = _RegionRunner(module)

        def call_regions(params, buffers, *args, **kwargs):
            state = {f"gm.{k}": v for k, v in {**params, **buffers}.items()}
            return torch.func.functional_call(runner, state, args, kwargs)

        call_regions.program = module
        return call_regions

    def call(params, buffers, *args, **kwargs):
        return torch.func.functional_call(module, {**params, **buffers}, args, kwargs)

    call.program = module
    return call


def _has_recompute_regions(module: nn.Module) -> bool:
    graph = getattr(module, "graph", None)
    return isinstance(graph, fx.Graph) and any(
        n.meta.get(RECOMPUTE_META_KEY) for n in graph.nodes
    )


class _RegionInterpreter(fx.Interpreter):
    """Runs a frontend's graph node by node, each node tagged `RECOMPUTE_META_KEY` (an op inside
    torch.utils.checkpoint) inside a recompute region, so the tracer tags what it records."""

    def run_node(self, n: fx.Node):
        if not n.meta.get(RECOMPUTE_META_KEY):
            return super().run_node(n)
        with recompute_region(True):
            return super().run_node(n)


class _RegionRunner(nn.Module):
    """`gm` run by _RegionInterpreter (its parameters as `gm.<name>`, for functional_call)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__()
        self.gm = gm

    def forward(self, *args):
        return _RegionInterpreter(self.gm).run(*args)


def aot_module(
    module: nn.Module,
    fw_compiler: Compiler,
    bw_compiler=None,
    partition_fn=min_cut_partition,
    inference_compiler=None,
) -> AOTModule:
    """An nn.Module running `module` through aot_function, parameters and buffers lifted."""
    compiled = aot_function(
        _functional(module), fw_compiler, bw_compiler, partition_fn, inference_compiler
    )
    return AOTModule(module, compiled)


def aot_module_simplified(
    gm: nn.Module,
    example_inputs: list,
    fw_compiler: Compiler,
    bw_compiler=None,
    partition_fn=min_cut_partition,
    inference_compiler=None,
    guarded: Optional[bool] = None,
    runtime_cache: Optional[RuntimeCache] = None,
) -> Callable:
    """A compiler-backend body (the dynamo contract): `(*flat_inputs) -> what gm returns`.

    `guarded=True` promises that every call's tensors (gm's own parameters and buffers too) have
    the sizes, strides, dtypes, devices and requires_grad of the first call, as a frontend's
    guards ensure; calls then skip re-keying. None reads `gm.meta[GUARDED_INPUTS_META]`.
    `runtime_cache` (see RuntimeCache) lets a compiler reuse what it compiled for gm before.
    A graph with control-flow nodes is compiled in pieces (control_flow.py). Where dynamo
    captured gm with fullgraph=False (`gm.meta[FULLGRAPH_META_KEY]` is False), a signature whose
    compile (made at its first call) raises NotImplementedError, and a call whose mutated
    argument shares storage with another, run gm eagerly with a warning; else they raise.
    """
    fullgraph = getattr(gm, "meta", {}).get(FULLGRAPH_META_KEY)  # (None: not from dynamo)
    if has_control_flow(gm):
        def compile_piece(piece, inputs):  # each piece and subgraph: its own fw/bw, same compilers
            if fullgraph is not None:
                piece.meta[FULLGRAPH_META_KEY] = fullgraph
            return aot_module_simplified(piece, inputs, fw_compiler, bw_compiler, partition_fn,
                                         inference_compiler, guarded=False)  # fmt: skip

        return compile_with_control_flow(gm, compile_piece)
    compiled = aot_function(
        _functional(gm), fw_compiler, bw_compiler, partition_fn, inference_compiler, runtime_cache
    )
    if getattr(gm, "meta", {}).get(SYMBOLS_META):
        return dynamic_module_call(gm, example_inputs, compiled)
    if guarded is None:
        guarded = bool(getattr(gm, "meta", {}).get(GUARDED_INPUTS_META, False))
    return module_caller(gm, compiled, guarded=guarded, eager_fallback=fullgraph is False)


def aot_eager(gm: nn.Module, example_inputs: list, **kwargs) -> Callable:
    """Backend: aot_module_simplified with every graph run as fx (prim reference kernels)."""
    kwargs.setdefault("fw_compiler", run_as_fx)
    return aot_module_simplified(gm, example_inputs, **kwargs)


# Takes graphs with symbolic sizes (gm.meta["ember_symbols"]); dynamo retraces static if it fails.
aot_eager.ember_supports_dynamic = True

BACKENDS = {"aot_eager": aot_eager}
