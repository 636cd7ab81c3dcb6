"""The torch-level compile cache: what `compile_fx` built for a graph, by the graph it received.

The graph-level cache (cache.py) is keyed by prim graphs, so a hit there still pays for tracing
through autograd, decomposing and lowering. This cache sits in front of all of that: it is
aot_autograd's `RuntimeCache` for one graph, keyed by

- the fx graph as text (ops by their importable names, arguments, node order);
- per flat input: sizes, strides, dtype, device, requires_grad (parameters are inputs, so their
  values are not part of the key: they are read at every call), the input structure, the grad,
  inference and autocast modes and torch's default dtype;
- compile_fx's options, the inductor, partitioner and primtorch configuration, torch's SDPA
  backend switches (they decide which attention kernel is traced), the sources of every
  component that shapes the result (ir, primtorch, aot_autograd, inductor) and torch's version.

An entry holds the runtime plan and the forward (and backward) programs; a hit rebuilds them
without tracing. A graph or input that cannot be keyed faithfully (a call_module, a closure or
lambda target, a tensor constant, a tensor subclass, an unhashable argument) is `Uncacheable`
and compiles the normal way; so does a program that closes over tensors.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ember.ir import RECOMPUTE_META_KEY, WRITTEN_AFTER_CALL_META_KEY

from . import cache, metrics
from .config import config, fingerprint
from .runtime import cache_dir

log = logging.getLogger("ember.inductor")

# Call targets are keyed by module and qualified name, which names one object only in these.
_TRUSTED_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_SCALARS = (type(None), bool, int, float, str)
_TORCH_ENUMS = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def _tracing_choices() -> str:
    """What the tracer reads besides the graph and inputs, read now: primtorch's config (say
    cudnn_attention) and torch's SDPA backend switches (which attention kernel is recorded)."""
    from ember.primtorch.config import config as primtorch_config

    cuda = torch.backends.cuda
    switches = (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
                cuda.cudnn_sdp_enabled())  # fmt: skip
    return f"{primtorch_config!r} sdp={switches}"


class Uncacheable(Exception):
    """This graph or call cannot be keyed faithfully: compile without the torch-level cache."""


@functools.cache
def _target_text(target) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        # aten's meaning is torch's (versioned); another library's op may be redefined
        if str(target).split(".")[0] != "aten":
            raise Uncacheable(f"operator {target} outside aten")
        return f"op:{target}"
    module = getattr(target, "__module__", None)
    if not module or module.split(".")[0] not in _TRUSTED_MODULES:
        raise Uncacheable(f"call target {target!r} is not from a trusted module")
    # A Python function by its qualified name; a builtin (torch.conv2d's qualname is
    # torch._VariableFunctionsClass.conv2d) by the name its module exports it under.
    try:
        owner = importlib.import_module(module)
    except ImportError:
        raise Uncacheable(f"call target {target!r} names a module that does not import") from None
    for name in (getattr(target, "__qualname__", None), getattr(target, "__name__", None)):
        obj = owner
        for part in (name or "<none>").split("."):
            obj = getattr(obj, part, None)
        if obj is target:
            return f"{module}.{name}"
    # a local function, a lambda, a bound method, a shadowed name
    raise Uncacheable(f"call target {target!r} is not importable by its name")


def _arg_text(a) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if type(a) in _SCALARS:
        return repr(a)
    if isinstance(a, _TORCH_ENUMS):
        return f"{type(a).__name__}({a})"
    if isinstance(a, (tuple, list)):
        return f"{type(a).__name__}({', '.join(map(_arg_text, a))})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{_arg_text(k)}: {_arg_text(v)}" for k, v in a.items()) + "}"
    if isinstance(a, slice):
        return f"slice({_arg_text(a.start)}, {_arg_text(a.stop)}, {_arg_text(a.step)})"
    if a is Ellipsis:
        return "..."
    raise Uncacheable(f"graph argument of type {type(a).__name__}")


def _runs_its_graph(gm) -> bool:
    """Is `gm.forward` the code fx generated from gm.graph (no subclass or patched forward)?"""
    if not isinstance(gm, fx.GraphModule) or "forward" in gm.__dict__:
        return False
    mro = type(gm).__mro__
    # fx.GraphModule(...) instantiates a private per-instance subclass that holds the code.
    own = mro[: mro.index(fx.GraphModule)]
    return all(c.__module__ == fx.GraphModule.__module__ for c in own) and (
        type(gm.graph._codegen) is fx.graph.CodeGen
    )


def fx_graph_text(gm: fx.GraphModule) -> str:
    """The graph as text that determines what tracing it computes; Uncacheable if none does."""
    if not _runs_its_graph(gm):
        raise Uncacheable(f"a {type(gm).__name__} whose forward may not be its graph's code")
    if gm._forward_hooks or gm._forward_pre_hooks or any(True for _ in gm.children()):
        raise Uncacheable("a graph module with hooks or submodules")
    state = {*dict(gm.named_parameters()), *dict(gm.named_buffers())}
    lines = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            try:
                target = _target_text(n.target)
            except TypeError:  # an unhashable callable
                raise Uncacheable(f"call target {n.target!r}") from None
        elif n.op in ("placeholder", "output", "call_method"):
            target = str(n.target)
        elif n.op == "get_attr" and n.target in state:  # lifted: read at every call
            target = str(n.target)
        else:
            raise Uncacheable(f"{n.op} node {n.name} ({n.target})")
        args = ", ".join([_arg_text(a) for a in n.args] +
                         [f"{k}={_arg_text(v)}" for k, v in n.kwargs.items()])  # fmt: skip
        # a checkpointed op is partitioned differently (recomputed, not saved)
        recompute = " recompute" if n.meta.get(RECOMPUTE_META_KEY) else ""
        # an input the caller writes after the call is never saved for the backward
        written = " written_after_call" if n.meta.get(WRITTEN_AFTER_CALL_META_KEY) else ""
        lines.append(f"%{n.name} = {n.op}[{target}]({args}){recompute}{written}")
    return "\n".join(lines)


def _input_text(a) -> str:
    if type(a) in (torch.Tensor, torch.nn.Parameter):
        if a.layout != torch.strided or a.is_nested:
            raise Uncacheable(f"a {a.layout} tensor input")
        return f"T{tuple(a.shape)}{a.stride()}{a.dtype},{a.device},{a.requires_grad}"
    if isinstance(a, torch.Tensor):
        raise Uncacheable(f"a {type(a).__name__} input (tensor subclass)")
    return _arg_text(a)


@functools.cache
def source_fingerprint() -> str:
    """A hash of every source file of the components that shape a compiled program."""
    import ember.aot_autograd
    import ember.inductor
    import ember.ir
    import ember.primtorch

    h = hashlib.sha256(torch.__version__.encode())
    for package in (ember.ir, ember.primtorch, ember.aot_autograd, ember.inductor):
        root = Path(package.__file__).parent
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".h", ".cpp")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class FxGraphCache:
    """aot_autograd's RuntimeCache for one graph `compile_fx` received (see the module doc).

    `compiler` wraps a prim-graph compiler so each compiled callable is paired with its Program;
    `rebuild(program)` turns a stored Program back into such a callable.
    """

    def __init__(self, gm: fx.GraphModule, options: str, rebuild: Callable):
        from ember.aot_autograd.partition import config as partition_config

        self.graph_text = fx_graph_text(gm)
        self.context = "\n".join([options, fingerprint(), repr(partition_config),
                                  source_fingerprint()])  # fmt: skip
        self.rebuild = rebuild
        # what a hit does with the programs it rebuilt (compile_fx: their CUDA graphs)
        self.on_load: Callable = lambda plan, compiled: None
        # Of the compile under way: its key (None: not cacheable) and the (compiled callable,
        # CompiledGraph) pairs made so far.
        self._key: Optional[str] = None
        self._programs: list = []

    def compiler(self, compile_graph: Callable, finish: Callable) -> Callable:
        """`(gm, inputs) -> finish(compile_graph(gm, inputs))`, remembering the CompiledGraph."""

        def compile_and_record(gm, example_inputs):
            graph = compile_graph(gm, example_inputs)
            result = finish(graph)
            self._programs.append((result, graph))
            return result

        return compile_and_record

    def key(self, flat: list, in_spec) -> str:
        """The key of tracing and compiling this graph for these flat inputs, now."""
        from ember.aot_autograd.signature import mode_state

        text = "\n".join([
            self.graph_text, pytree.treespec_dumps(in_spec), "|".join(map(_input_text, flat)),
            repr(mode_state()), str(torch.get_default_dtype()), self.context, _tracing_choices(),
        ])  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return cache_dir() / "fx" / f"{key}.json"

    def load(self, flat: list, in_spec):
        """(plan, compiled callables) stored for these inputs, or None (compile normally)."""
        from ember.aot_autograd import plan_from_json

        self._key, self._programs = None, []
        if not (config.cache and config.fx_cache):
            return None
        try:
            key = self.key(flat, in_spec)
        except Exception as e:  # noqa: BLE001  (Uncacheable, a custom pytree node, ...)
            log.debug("ember.inductor: no torch-level cache for this call: %s", e)
            return None
        self._key = key
        path = self._path(key)
        try:
            payload = cache.read_entry(path, key)
            plan = plan_from_json(payload["plan"])
            compiled = [self.rebuild(cache.program_from_json(p)) for p in payload["programs"]]
        except FileNotFoundError:
            metrics.fx_cache_misses += 1
            return None
        except Exception as e:  # noqa: BLE001  (whatever is wrong with an entry, recompile)
            log.warning("ember.inductor: ignoring a bad torch-level cache entry %s (%s: %s)",
                        path.name, type(e).__name__, e)  # fmt: skip
            metrics.fx_cache_misses += 1
            return None
        metrics.fx_cache_hits += 1
        self.on_load(plan, compiled)
        return plan, compiled

    def store(self, flat: list, in_spec, plan, compiled: list) -> None:
        """Write the plan and programs just compiled for these inputs (keyed by the load that
        preceded the compile), when they are plain data."""
        from ember.aot_autograd import NotSerializable, plan_to_json

        key, recorded = self._key, self._programs
        self._key, self._programs = None, []
        if key is None or not (config.cache and config.fx_cache):
            return  # the load that preceded this compile could not key it
        graphs = [next((g for r, g in recorded if r is c), None) for c in compiled]
        if any(g is None or g.constants for g in graphs):
            return  # compiled elsewhere, or the program holds tensors: not plain data
        try:
            payload = {"plan": plan_to_json(plan),
                       "programs": [cache.program_to_json(g.program) for g in graphs]}  # fmt: skip
        except NotSerializable as e:
            log.debug("ember.inductor: not caching this program at torch level: %s", e)
            return
        cache.write_entry(self._path(key), key, payload)


def runtime_cache_for(gm, options: str, rebuild: Callable) -> Optional[FxGraphCache]:
    """The torch-level cache of `gm`, or None when the graph cannot be keyed."""
    if not (config.cache and config.fx_cache) or gm.meta.get("ember_symbols"):
        return None  # off, or dynamic sizes (their programs are not stored yet)
    try:
        return FxGraphCache(gm, options, rebuild)
    except Exception as e:  # noqa: BLE001  (Uncacheable, or a graph we failed to read)
        log.info("ember.inductor: compiling without the torch-level cache: %s", e)
        return None
