"""The pipeline: prim graph -> loop IR -> fused kernels -> C++/Triton source -> callable.

`compile_fx` is a backend with the torch compiler's backend contract (aot_autograd with
`compile_prims` as forward and backward compiler); `compile_prims` is the inductor proper, one
flat list of stages.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import re

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, progress
from ember.ir.graph import lazy_graph_module
from ember.ir.locks import COMPILE_LOCK

from . import (
    attention_rewrite,
    cache,
    cpu_attention,  # noqa: F401  (registers the generated CPU flash attention's lowering)
    cpu_attention_backward,  # noqa: F401  (and its backward's)
    fx_cache,
    gemm_template,
    lowering_matmul,  # noqa: F401  (registers the matrix products' lowerings)
    lowering_random,  # noqa: F401  (registers the random prims' lowerings)
    lowering_views,  # noqa: F401  (registers the view, reduction and extern lowerings)
    metrics,
    runtime,
    triton_attention,  # noqa: F401  (registers Ember's Triton flash attention's lowerings)
)
from .codegen_cpp import CppRenderer
from .codegen_triton import TritonRenderer, grid_of, launch_configs
from .config import config, on_for
from .cudagraphs import (MIN_GRAPHED_STEPS, GraphedCall, GraphsBySize, SharedPool,
                         host_work_reason, varying_inputs)  # fmt: skip
from .device_constants import fold_device_constants
from .loop_ir import TemplateBuffer, verify
from .lowering import lower_graph
from .scheduler import Kernel, schedule
from .split_reduction import split_reductions
from .input_updates import mark_in_place_updates
from .triton_aot import attach_cubins
from .wrapper import Program, generate

log = logging.getLogger("ember.inductor")


# Where `options={"cpp_wrapper": True}` finds the C++ wrapper's loader. inductor may not import
# cpp_wrapper (ARCHITECTURE.md), so the runtime is resolved by name when that option is asked for.
CPP_WRAPPER_LOADER = "ember.cpp_wrapper:load_artifact"
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MODES_TEXT = """What each mode does in Ember (the names torch's compiler uses):
- None / "default": static-size inference and training graphs on CUDA replay from CUDA graphs
  (config.cudagraphs and config.cudagraphs_training "auto"); Triton block sizes are autotuned
  among a few candidates on the first call and remembered on disk.
- "reduce-overhead": the same as the default: Ember's default already replays CUDA graphs, which
  is what this mode turns on in torch.
- "max-autotune": as the default, and on CUDA each matmul with static sizes (mm, addmm, bmm,
  baddbmm: Linear layers too) is a generated Triton GEMM template with its pointwise readers
  (bias, activation, residual add, cast) fused into its store, if timing it against the library
  call (in a subprocess, on the real shapes; remembered on disk) says it is faster.
  Convolutions stay library calls.
- "max-autotune-no-cudagraphs": as "max-autotune", never replayed from CUDA graphs."""


def compile_fx(gm: fx.GraphModule, example_inputs, *, mode=None, options=None):
    """A backend with the torch compiler's backend contract: aot_autograd, with inductor
    compiling forward and backward. options: {"cpp_wrapper": True} runs the C++ wrapper; mode:
    one of MODES (MODES_TEXT says what each does).

    What it compiles is remembered on disk by `gm` and the inputs of each call (fx_cache.py), so
    a later compile of the same graph skips tracing and lowering."""
    from ember.aot_autograd import aot_module_simplified

    options = dict(options or {})
    cpp_wrapper = bool(options.pop("cpp_wrapper", False))
    if options:
        raise TypeError(f"ember.inductor.compile_fx: unknown options {sorted(options)}")
    if mode not in MODES:
        raise ValueError(f"ember.inductor.compile_fx: unknown mode {mode!r}; one of {MODES}")
    # finish: a compiled graph -> what runs it; rebuild: a cached Program -> the same
    finish, rebuild = (_load_cpp_wrapper, _program_cpp_wrapper) if cpp_wrapper else (
        _as_is, _program_python)  # fmt: skip
    if config.attention_rewrite and isinstance(gm, fx.GraphModule):
        attention_rewrite.rewrite(gm)
    options_text = f"mode={mode} cpp_wrapper={cpp_wrapper}"
    templates = mode in ("max-autotune", "max-autotune-no-cudagraphs")
    if templates and torch.cuda.is_available():  # the chosen tiles suit the GPU timed on
        options_text += f" gpu={torch.cuda.get_device_name()}"
    runtime_cache = fx_cache.runtime_cache_for(gm, options_text, rebuild)
    prims_compiler = compile_prims
    if templates:
        prims_compiler = _with_max_autotune(compile_prims)
    if runtime_cache is not None:
        compile_graph = runtime_cache.compiler(prims_compiler, finish)
    else:
        compile_graph = lambda gm, inputs: finish(prims_compiler(gm, inputs))  # noqa: E731

    graphs = mode != "max-autotune-no-cudagraphs"  # see MODES_TEXT

    shared = SharedPool()  # the memory pool and lock of this graph's forward and backward

    def replay(compiled, part=None, num_fw_outputs=0):
        use_cudagraphs = getattr(compiled, "use_cudagraphs", None)
        if not graphs or use_cudagraphs is None:
            return
        if not part:
            use_cudagraphs()  # an inference graph
        elif on_for(config.cudagraphs_training, "cuda"):  # use_cudagraphs checks the device
            # the forward's own outputs are copied; what it saves and every gradient is not
            use_cudagraphs(shared=shared, alias_from=num_fw_outputs if part == "forward" else 0)

    def compiler(gm, inputs):
        compiled = compile_graph(gm, inputs)
        replay(compiled, gm.meta.get("ember_training"), gm.meta.get("ember_num_fw_outputs", 0))
        return compiled

    def cached(plan, compiled):  # the same programs, read from the torch-level cache
        if len(compiled) == 1:
            replay(compiled[0])
        else:
            replay(compiled[0], "forward", plan.num_fw_outputs)
            replay(compiled[1], "backward")

    if runtime_cache is not None:
        runtime_cache.on_load = cached

    return aot_module_simplified(gm, list(example_inputs), fw_compiler=compiler,
                                 bw_compiler=compiler, runtime_cache=runtime_cache)  # fmt: skip


# Takes graphs with symbolic sizes (gm.meta["ember_symbols"]): one program for every size in
# range; where a graph's symbols are beyond it, it raises and dynamo retraces with static sizes.
compile_fx.ember_supports_dynamic = True


def _with_max_autotune(compile):
    """`compile` with config.max_autotune_gemm and autotune_wide on while it runs (under the
    compile lock, so a default-mode compile on another thread never sees them; the backward
    compiles later, through this same function)."""

    def compile_max_autotune(gm, inputs):
        with COMPILE_LOCK:
            saved = config.max_autotune_gemm, config.autotune_wide
            config.max_autotune_gemm = config.autotune_wide = True
            try:
                return compile(gm, inputs)
            finally:
                config.max_autotune_gemm, config.autotune_wide = saved

    return compile_max_autotune


def _as_is(compiled: CompiledGraph) -> CompiledGraph:
    return compiled


def _program_python(program: Program) -> CompiledGraph:
    return CompiledGraph(program, {})


def _program_cpp_wrapper(program: Program):
    return _load_artifact(program, {})


def _load_cpp_wrapper(compiled: CompiledGraph):
    """The compiled graph's artifact run through the C++ wrapper instead of Python."""
    return _load_artifact(compiled.program, compiled.constants)


def _load_artifact(program: Program, constants: dict):
    artifact = program.artifact
    if artifact.device.startswith("cuda") or any(k.language == "triton" for k in artifact.kernels):
        # the C++ wrapper launches cubins (Ember's kernels and the user's Triton launches)
        artifact = attach_cubins(program)
    module_name, attr = CPP_WRAPPER_LOADER.split(":")
    try:
        load_artifact = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise RuntimeError(
            "options={'cpp_wrapper': True} needs ember.cpp_wrapper: pip install ./cpp_wrapper"
        ) from e
    return load_artifact(artifact, constants)


def compile_prims(gm: fx.GraphModule, example_inputs) -> CompiledGraph:
    """Compile one prim-level graph into a callable taking the graph's inputs positionally.
    A graph with control-flow nodes (an exported program with torch.cond, say) is compiled in
    pieces, each branch its own program, run in order by aot_autograd's control-flow runner."""
    from ember.aot_autograd.control_flow import compile_with_control_flow, has_control_flow

    if has_control_flow(gm):
        return compile_with_control_flow(gm, compile_prims)
    # One compile at a time in the process (ember.ir.locks): lowering and code generation read
    # the config and write the counters in `metrics`. Already held when aot_autograd compiles.
    with COMPILE_LOCK:
        return _compile_prims(gm, example_inputs)


def _compile_prims(gm: fx.GraphModule, example_inputs) -> CompiledGraph:
    key = cache.graph_key(gm, example_inputs)
    program, constants = cache.load(key), {}
    if program is None:
        gm = fold_device_constants(gm)  # 0. scalars made on the CPU from constants: constants
        gm = _small_matmuls_as_reductions(gm)  # matrix-vector products: generated kernels
        gm = merge_common_subexpressions(gm)  # each layer's copy of a mask's bias, computed once
        gm = accumulate_into_addend(gm)  # a tied embedding's two gradients: one buffer fewer
        if config.inplace_input_updates:  # a KV cache's rows written where the cache is
            mark_in_place_updates(gm)
        with progress.stage("lowering"):
            lowered = lower_graph(gm, example_inputs)  # 1. prims -> loop-IR buffers
            # reductions of few long rows: partial reductions over chunks, then their reduction
            lowered.buffers = split_reductions(lowered.buffers, lowered.device)
        verify([b for b in lowered.inputs if b is not None] + lowered.buffers,
               lowered.size_symbols)  # 2. loop-IR checks  # fmt: skip
        out_names = [o.name for o in lowered.outputs if hasattr(o, "name")]
        with progress.stage("scheduling"):
            steps = schedule(lowered.buffers, out_names)  # 3. dead code, fusion, phases, locals
        buffers = {b.name: b for b in [*lowered.inputs, *lowered.buffers] if b is not None}
        if gemm_template.enabled(lowered.device):  # 3b. max-autotune: matmul templates, timed
            with progress.stage("matmul autotuning"):
                steps = gemm_template.choose_templates(steps, buffers, out_names, lowered.device)
        hints = {s: example_inputs[i].shape[d] for s, (i, d) in lowered.size_symbols.items()}
        with progress.stage("code generation"):
            kernels = render_kernels(steps, buffers, lowered.device, hints)  # 4. kernel source
            program = generate(lowered, steps, kernels)  # 5. wrapper + artifact, memory plan
        constants = lowered.constants
        # Tensors held by the graph are not part of the cache entry.
        if not constants:
            cache.store(key, program)
    return CompiledGraph(program, constants)  # 6. build kernels, load the wrapper


_SMALL_MM = ("extern.mm", "extern.addmm")


def _small_matmuls_as_reductions(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite products of one or two rows (a Linear at batch 1), and thin ones (K and N a few
    elements: a Linear mixing attention heads), into reductions that fuse with their neighbours
    (primtorch's decomp/small_mm.py); on CUDA, where a library GEMM's launches dominate such a
    product and its tensor cores idle on a thin one, or wherever config.small_mm_as_reduction
    says so. On every device, a product of up to MAX_DEQUANTIZED_ROWS rows whose weight is
    dequantized in the graph (ember.quantize_weights) becomes one too: its kernel reads the
    int8/int4 bytes and never writes the float weight."""
    from ember.ir import target_name
    from ember.primtorch import decompose_externs
    from ember.primtorch.decomp.small_mm import MAX_DEQUANTIZED_ROWS, allow_rows, is_thin

    def static(v):
        v = sympy.sympify(v)
        return int(v) if v.is_Integer else None

    def operands(n):
        if n.op != "call_function" or target_name(n.target) not in _SMALL_MM:
            return None
        first = 1 if target_name(n.target) == "extern.addmm" else 0
        a, b = (getattr(x, "meta", {}).get(NODE_META_KEY) for x in n.args[first:first + 2])
        if a is None or b is None or len(a.sizes) != 2 or len(b.sizes) != 2:
            return None
        return a, b, n.args[first + 1]

    def candidate(n):
        ops = operands(n)
        if ops is None:
            return False
        a, b, _ = ops
        on = config.small_mm_as_reduction
        on = str(a.device).startswith("cuda") if on is None else on
        rows = static(a.sizes[0])
        return on and ((rows is not None and rows <= 2) or is_thin(*map(static, b.sizes)))

    def dequantized(n):
        ops = operands(n)
        if ops is None or config.dequantize_in_kernel is False:
            return False
        rows = static(ops[0].sizes[0])
        return rows is not None and rows <= MAX_DEQUANTIZED_ROWS and _dequantized_weight(ops[2])

    dequantizing = {n.name for n in gm.graph.nodes if dequantized(n)}
    chosen = dequantizing | {n.name for n in gm.graph.nodes if candidate(n)}
    if not chosen:
        return gm
    with allow_rows(MAX_DEQUANTIZED_ROWS if dequantizing else 2):
        return decompose_externs(gm, _SMALL_MM, only=chosen)


_NARROW_INTS = (torch.int8, torch.uint8)


def _dequantized_weight(node, limit: int = 64) -> bool:
    """Whether a float matrix is computed, by pointwise and view prims only, from a graph input
    or constant of 8-bit integers: a weight stored quantized and dequantized where it is used."""
    from ember.ir import target_name
    from ember.primtorch.prims.core import PRIMS

    meta = getattr(node, "meta", {}).get(NODE_META_KEY)
    if meta is None or not meta.dtype.is_floating_point:
        return False
    seen, stack, found = set(), [node], False
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > limit:  # a whole subgraph, not a weight's dequantization
            return False
        m = n.meta.get(NODE_META_KEY)
        if n.op in ("placeholder", "get_attr"):
            found |= m is not None and m.dtype in _NARROW_INTS
            continue
        if n.op != "call_function":
            return False
        try:
            p = PRIMS.get(target_name(n.target))
        except KeyError:
            return False
        if p is None or not p.tags & {"pointwise", "view"}:
            return False
        stack.extend(a for a in n.all_input_nodes)
    return found


# Ops whose equal calls need not give equal results (their own random draws): never merged.
_UNMERGED = re.compile(r"sdpa|dropout|rand|bernoulli|normal|multinomial|poisson|exponential")


def _zeros_accumulation(n, user) -> bool:
    """Whether `n` is `index_put(full(0), indices, values, accumulate=True)` read only by `user`."""
    from ember.ir import target_name

    if not (isinstance(n, fx.Node) and n.op == "call_function"
            and target_name(n.target) == "prims.index_put" and list(n.users) == [user]):
        return False  # fmt: skip
    base, accumulate = n.args[0], n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate")
    return (accumulate is True and isinstance(base, fx.Node) and base.op == "call_function"
            and target_name(base.target) == "prims.full" and base.args[1] == 0)  # fmt: skip


def accumulate_into_addend(gm: fx.GraphModule) -> fx.GraphModule:
    """`add(x, index_put(zeros, idx, v, accumulate=True))` -> `index_put(x, idx, v, True)`, where
    `x` has the sum's layout; `gm` itself when nothing matches. A weight used by an embedding
    and a matmul (GPT-2's tied lm_head) gets the sum of two gradients, and index_put (no
    lowering) runs its reference, which copies its first argument: the zeros, their copy and
    the matmul's gradient were alive at once (three vocabulary-sized float32 buffers at the
    backward's peak, where PyTorch's own compiler holds two)."""
    from ember.ir import target_name

    matches = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or target_name(n.target) != "prims.add" or len(n.args) != 2:
            continue
        for mine, other in ((n.args[1], n.args[0]), (n.args[0], n.args[1])):
            if not (_zeros_accumulation(mine, n) and isinstance(other, fx.Node)):
                continue
            out, x = n.meta.get(NODE_META_KEY), other.meta.get(NODE_META_KEY)
            if (out is not None and x is not None and out.dtype == x.dtype
                    and tuple(out.sizes) == tuple(x.sizes)
                    and tuple(out.strides) == tuple(x.strides)):  # fmt: skip
                matches[n] = (mine, other)
                break
    if not matches:
        return gm
    graph, env = fx.Graph(), {}
    for n in gm.graph.nodes:
        if n in matches:
            put, x = matches[n]
            _, indices, values = put.args[:3]
            env[n] = graph.call_function(
                put.target, (env[x], fx.node.map_arg(indices, env.__getitem__), env[values], True)
            )
            env[n].meta = dict(n.meta)
            continue
        if any(put is n for put, _ in matches.values()):
            continue  # read only by the add it is folded into
        env[n] = graph.node_copy(n, env.__getitem__)
    graph.eliminate_dead_code()
    folded = lazy_graph_module(gm, graph)  # lowered, never run as Python (and `gm` unchanged)
    folded.meta.update(gm.meta)
    return folded


def merge_common_subexpressions(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` with each call that repeats an earlier one (same op, same arguments) replaced by the
    earlier one's result; `gm` itself when none does. Prim graphs are functional, so equal calls
    give equal values: an attention mask's additive bias, built again in every layer, becomes one
    buffer instead of one per layer. Random prims take their seed and offset as arguments, so
    they merge only when they draw the same numbers; ops with draws of their own never merge."""
    from ember.ir import target_name

    graph, env, first = fx.Graph(), {}, {}
    for n in gm.graph.nodes:
        key = None
        if n.op == "call_function" and not _UNMERGED.search(target_name(n.target)):
            try:
                key = (n.target, _frozen((n.args, n.kwargs), env))
                hash(key)
            except TypeError:
                key = None  # an argument that cannot be compared (a nan, an object)
        if key is not None and key in first:
            env[n] = first[key]
            continue
        env[n] = graph.node_copy(n, env.__getitem__)
        if key is not None:
            first[key] = env[n]
    if len(graph.nodes) == len(gm.graph.nodes):
        return gm
    merged = lazy_graph_module(gm, graph)  # lowered, never run as Python
    merged.meta.update(gm.meta)
    return merged


def _frozen(value, env):
    """A hashable form of a node's arguments, with nodes as their copies in the new graph."""
    if isinstance(value, fx.Node):
        return ("node", env[value])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v, env) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v, env)) for k, v in sorted(value.items())))
    if isinstance(value, slice):
        return ("slice", _frozen((value.start, value.stop, value.step), env))
    if isinstance(value, float):
        if value != value:
            raise TypeError("nan")
        return (float, value, str(value))  # 0.0 and -0.0 stay apart
    return (type(value), value)  # 1, 1.0 and True stay apart


def render_kernels(steps, buffers: dict, device: str, hints=None) -> dict:
    """One KernelSource per scheduled Kernel, by the renderer the device calls for; `hints` give
    dynamic sizes' example values (Triton block sizes are chosen for them)."""
    use_triton = device.startswith("cuda") or config.cpu_backend == "triton"
    out = {}
    for s in steps:
        if isinstance(s, TemplateBuffer):  # a hand-written kernel renders itself
            out[s.kernel] = s.render(s.kernel)
            continue
        if isinstance(s, gemm_template.GemmKernel):  # rendered and chosen when it was planned
            out[s.name] = s.source
            continue
        if not isinstance(s, Kernel):
            continue
        if use_triton:
            renderer = TritonRenderer(s, buffers, s.name)
            renderer.hints = hints or {}
            src = renderer.render()
            configs = launch_configs(src)
            src = dataclasses.replace(src, grid=grid_of(src, configs[0]), num_warps=configs[0]["num_warps"],
                                      meta=src.meta + (("configs", tuple(configs)),))  # fmt: skip
        else:
            src = CppRenderer(s, buffers, s.name).render()
        out[s.name] = src
    return out


class CompiledGraph:
    """The callable a compiled graph is: `graph(*inputs) -> outputs` through the wrapper's call()."""

    def __init__(self, program: Program, constants: dict):
        self.program = program
        self.artifact = program.artifact
        self.constants = constants
        if config.output_code:
            print(program.source)
        namespace: dict = dict(constants)  # get_attr tensors, by their buffer names
        code = cache.wrapper_code(program.source)
        # Every kernel of the program builds at once, in the background until the first call.
        with runtime.collect_builds() as builds:
            exec(code, namespace)
            for k in program.kernels:
                if k.language == "triton":
                    runtime.precompile_triton(k.name, namespace[k.name], k.arg_types)
        if not config.packaging:  # a package compiles its kernels itself: none built here
            builds.start()  # (unless this program is called, which builds them first)
        self._builds, self._run = builds, namespace.pop("call")  # (else call <-> its globals: a cycle)
        self._graphed = None
        self._call = self._first_call if builds.pending() else self._run
        self._spec = pytree.treespec_loads(program.out_spec) if program.out_spec else None
        leaves = tuple(range(program.num_outputs))
        # A flat tuple or list of outputs needs no unflattening on each call; a flat sequence of
        # another type (fx's immutable_list, say) is only rebuilt as its type.
        self._flat = self._spec is None or self._spec in (
            pytree.tree_structure(leaves), pytree.tree_structure(list(leaves))
        )
        spec, self._sequence = self._spec, None
        if not self._flat and spec.num_nodes == spec.num_leaves + 1:  # one container of leaves
            kind = spec.type
            if issubclass(kind, (list, tuple)) and not hasattr(kind, "_fields"):  # no namedtuple
                self._sequence = kind
        metrics.generated_kernel_count += len(program.kernels)

    def _first_call(self, args):
        self._builds.finish()
        self._call = self._graphed or self._run
        return self._call(args)

    def use_cudagraphs(self, shared=None, alias_from=None) -> None:
        """Replay this program from a CUDA graph (cudagraphs.py) when config.cudagraphs allows
        and it runs on CUDA (with symbolic sizes: a graph per set of sizes). A training graph
        (`alias_from`: outputs from there on are returned over the graph's memory, `shared`:
        the pool its forward and backward share) has static sizes only."""
        mode = config.cudagraphs
        if mode is False or mode in ("0", "off", "false") or self._graphed is not None:
            return
        art = self.artifact
        if not str(art.device).startswith("cuda"):
            return
        reason = host_work_reason(art)
        if reason is not None:  # a replay would not run it
            metrics.cudagraph_skips.append(f"host work: {reason}"[:300])
            return
        if sum(s.kind in ("kernel", "extern") for s in art.steps) < MIN_GRAPHED_STEPS:
            return  # a replay, the input copies and the output copies cost more than they save
        if art.symbols:
            if alias_from is not None:
                return  # a graph per size would keep each size's activations and gradients
            self._graphed = GraphsBySize(self._run, varying_inputs(art))
        elif alias_from is not None:
            if shared.pool is None:
                shared.pool = torch.cuda.graph_pool_handle()
            self._graphed = GraphedCall(self._run, shared, alias_from)
        else:
            self._graphed = GraphedCall(self._run)
        if self._call is self._run:
            self._call = self._graphed

    @property
    def source(self) -> str:
        return self.program.source

    def __call__(self, *args):
        return self._structure(self._call(list(args)))

    def call_boxed(self, args: list):
        """Like __call__, but takes the caller's list and empties it, so that the wrapper holds
        the only references to the inputs and frees each one after its last use."""
        return self._structure(self._call(args))

    def _structure(self, out):
        if self._flat:
            return out
        if self._sequence is not None:
            return self._sequence(out)
        return pytree.tree_unflatten(out, self._spec)


def example_metas(gm):
    return [n.meta.get(NODE_META_KEY) for n in gm.graph.nodes if n.op == "placeholder"]


__all__ = ["CompiledGraph", "compile_fx", "compile_prims", "render_kernels", "torch"]
