"""Converting a frame: translate, compile the graph with the backend, build guards and code.

`make_callback` returns the function the C++ hook calls on a cache miss. It answers None to run
the frame eagerly (the hook then marks the code "skip"), or (guard program, transformed function)
for a new cache entry; a transformed function of None runs the original code under those guards.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import logging
import os
import sys
import sysconfig
import warnings
import weakref
from pathlib import Path
from typing import Callable, Optional

import torch

from ember.ir import FULLGRAPH_META_KEY, GUARDED_INPUTS_META_KEY, progress

from . import variables as V
from ._native import _C
from .builder import Builder
from .codegen import CodeGen, graph_module, resume_call
from .config import config
from .distributed import compile_for_ddp
from .dynamic import DynamicPolicy
from .exc import GenericFallback, GraphBreakError, RestartAnalysis, Unsupported
from .interpreter import RootTranslator
from .minifier.hook import call_backend
from .output import OutputGraph, uncached_examples
from .source import sanitize
from .symbolic import SymbolicFallback

log = logging.getLogger("ember.dynamo")


@dataclasses.dataclass
class GraphRecord:
    """One compiled graph, for explain() and tests."""

    gm: torch.fx.GraphModule
    code_name: str
    where: str
    op_count: int
    guards: list


@dataclasses.dataclass
class BreakRecord:
    reason: str
    where: str


@dataclasses.dataclass
class Stats:
    """What conversions did since the last reset (graphs, breaks, failures, recompiles)."""

    graphs: list = dataclasses.field(default_factory=list)
    breaks: list = dataclasses.field(default_factory=list)
    failures: list = dataclasses.field(default_factory=list)
    frames_converted: int = 0


stats = Stats()
_warned: set = set()


class CodeState:
    """What conversions learned about one code object. `graphs` / `graphless`: its cache entries
    that hold a graph (config.cache_size_limit counts these) and those that hold none (an entry
    that only calls eagerly and breaks, as a loop's resume function does between two calls of a
    module that runs eagerly: config.graphless_entry_limit). `modules`: argument position ->
    (type, id) of the first nn.Module passed there. `generic`: the code was called with another
    instance of a module type already compiled for it (the layers of a stack, each its own
    frame): its frames are traced for any instance (module types and parameter shapes guarded,
    not identities), so one entry serves every layer. `refused`: a generic trace read instance
    state no guard covers (GenericFallback), so the code is traced per instance from then on."""

    __slots__ = ("graphs", "graphless", "modules", "generic", "refused")

    def __init__(self):
        self.graphs = 0
        self.graphless = 0
        self.modules: dict = {}
        self.generic = False
        self.refused = False

    def limit_reached(self):
        """The name of the limit its entries reached, or None."""
        if self.graphs >= config.cache_size_limit:
            return "cache_size_limit"
        if self.graphless >= config.graphless_entry_limit:
            return "graphless_entry_limit"
        return None

    def note_arguments(self, code, args) -> None:
        if self.refused:
            return
        for i, a in enumerate(args[: code.co_argcount]):
            if isinstance(a, torch.nn.Module):
                first = self.modules.setdefault(i, (type(a), id(a)))
                if first[0] is type(a) and first[1] != id(a):
                    self.generic = True


# code -> CodeState: every live code object the hook has state for (reset() clears them)
_touched_codes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Code objects compiled even though they live in a skipped file: the function or the forward
# method that the user passed to ember.compile (nn.Linear itself, say).
force_codes: dict = {}
# Codes whose dynamic trace hit something not expressible symbolically: traced static from then on.
static_codes: "weakref.WeakSet" = weakref.WeakSet()


def _skip_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get("stdlib"), paths.get("platstdlib")}
    dirs.add(str(Path(torch.__file__).parent))
    dirs.add(str(Path(__file__).parent))
    for mod in ("numpy", "sympy", "_pytest", "pluggy", "typing_extensions", "triton"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            dirs.add(str(Path(m.__file__).parent))
    return tuple(sorted(d + os.sep for d in dirs if d))


_SKIP_DIRS: Optional[tuple] = None


def should_skip(code) -> bool:
    """Library code (stdlib, torch, ember itself) runs eagerly; user code is captured."""
    global _SKIP_DIRS
    if _SKIP_DIRS is None:
        _SKIP_DIRS = _skip_dirs()
    if code in force_codes:
        return False
    if not code.co_flags & 0x02:  # CO_NEWLOCALS: class bodies and module code are not traced
        return True
    name = code.co_filename
    if name.startswith("<ember transformed"):
        return True
    if code.co_name in ("<module>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"):
        return True  # comprehension frames reached eagerly take a live iterator: run them as is
    if name.startswith("<frozen") or name == "<string>":  # <string>: dataclass-generated code
        return True
    if "site-packages" in name and "ember" not in name:
        return not any(lib in name for lib in ("transformers", "timm", "torchvision/models"))
    for d in _SKIP_DIRS:
        if name.startswith(d):
            # a test under a library's folder is user code; the folders above it are not looked
            # at (Bazel's runfiles of a //tests target hold ember itself under bin/tests/)
            return "tests" not in Path(name[len(d):]).parts
    return False


def warn_once(key, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, stacklevel=3)


def supports_dynamic(backend) -> bool:
    """Whether a compiler function takes graphs with symbolic sizes (`ember_supports_dynamic`)."""
    while isinstance(backend, functools.partial):
        backend = backend.func
    return getattr(backend, "ember_supports_dynamic", False) is True


def make_callback(backend: Callable, fullgraph: bool, backend_name: str = "",
                  dynamic=None) -> Callable:  # fmt: skip
    """The per-compile callback the C++ hook calls on a cache miss; `dynamic` is the mode of
    ember.compile (True, None: marked and automatic, False), used if the backend supports it."""
    dynamic = dynamic if supports_dynamic(backend) else False

    def callback(code, fn, f_globals, f_builtins, args):
        state = _touched_codes.get(code)
        if state is None:
            state = _touched_codes[code] = CodeState()
        if should_skip(code):
            return None
        over = state.limit_reached()
        if over is not None:
            warn_once(("limit", code), f"ember.compile: {code.co_name} ({code.co_filename}:"
                      f"{code.co_firstlineno}) was recompiled {state.graphs + state.graphless} "
                      f"times ({over}); it runs eagerly from now on")  # fmt: skip
            return None
        state.note_arguments(code, args)
        return convert_frame(code, fn, f_globals, args, backend, fullgraph, dynamic)

    callback.backend = backend
    callback.fullgraph = fullgraph
    callback.backend_name = backend_name
    return callback


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_nesting() -> int:
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


def autocast_state() -> tuple:
    """Everything an inlined `with torch.autocast(...)` changes while a frame is traced (its
    switches run on the example values too, so each op sees the dtype it will have)."""
    per_device = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                       for d in _AUTOCAST_DEVICES)  # fmt: skip
    return per_device, torch.is_autocast_cache_enabled(), _autocast_nesting()


def restore_autocast_state(state: tuple) -> None:
    """Undo what a trace that stopped inside an autocast block left switched."""
    per_device, cache, nesting = state
    for device, enabled, dtype in per_device:
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache)
    level = _autocast_nesting()
    while level > nesting:
        level = torch.autocast_decrement_nesting()
    while level < nesting:
        level = torch.autocast_increment_nesting()


def convert_frame(code, fn, f_globals, args, backend, fullgraph, dynamic=False):
    stats.frames_converted += 1
    rng = torch.random.get_rng_state()
    grad = torch.is_grad_enabled()
    autocast = autocast_state()
    captured = []
    try:
        with uncached_examples(), progress.stage(f"capture of {code.co_name}"):
            return _convert(code, fn, f_globals, args, backend, fullgraph, dynamic, captured)
    except Unsupported as e:
        where = e.where or f"{code.co_filename}:{code.co_firstlineno}"
        if fullgraph:
            raise GraphBreakError(f"ember.compile(fullgraph=True): {e.msg} at {where}") from None
        stats.failures.append(BreakRecord(e.msg, where))
        warn_once(("fail", code), f"ember.compile: {code.co_name} runs eagerly: {e.msg} ({where})")
        return None
    finally:
        torch.random.set_rng_state(rng)
        torch._C._set_grad_enabled(grad)
        restore_autocast_state(autocast)
        release_capture(sum(captured))


def release_capture(example_bytes: int) -> None:
    """Free what the capture computed on its example values before the compiled code runs.
    The translator, its variables and the graph form reference cycles, so the values (with the
    autograd graph of the forward) live until a cyclic collection; a compiled training step
    then traced and ran with the capture's activations still held. The C allocator keeps
    what was freed in its heap, laid out as the capture's values were; it is handed back to the
    system (glibc's malloc_trim), so the first step allocates afresh instead of around those
    holes (its peak resident memory was a third above eager's)."""
    if example_bytes > config.collect_after_capture_bytes:
        gc.collect()
        _trim_heap()


def _trim_heap() -> None:
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc only
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None  # glibc's malloc_trim once looked up; False where there is none


def _convert(code, fn, f_globals, args, backend, fullgraph, dynamic, captured):
    break_at, reason = None, None
    grad = torch.is_grad_enabled()
    autocast = autocast_state()
    policy = None
    if dynamic is not False and code not in static_codes:
        policy = DynamicPolicy(dynamic, code)
    saved = _SavedNothing(config.capture_saves_nothing)
    state = _touched_codes.get(code)
    while True:
        output = OutputGraph(code, lambda: "?", policy)
        output.root_globals = f_globals
        output.generic_modules = state is not None and state.generic
        builder = Builder(output)
        tx = RootTranslator(output, builder, code, fn, f_globals, args, break_at)
        output.where = tx.innermost_where
        try:
            try:
                with saved.hooks():
                    tx.run_root()
            except Exception:
                if not saved.asked:
                    raise
                log.debug("a capture read what its ops saved for backward", exc_info=True)
                saved = _SavedNothing(False)  # capture again, saving as eager does
            else:
                return finish(tx, output, code, backend, reason, fullgraph)
        except RestartAnalysis as r:
            if fullgraph:
                raise Unsupported(r.reason.msg, r.reason.where) from None
            break_at, reason = r.index, r.reason
        except GenericFallback as e:
            log.debug("%s: traced for this instance only: %s", code.co_name, e)
            state.generic, state.refused = False, True
            break_at, reason = None, None
        except SymbolicFallback as e:
            warn_once(("static", code), f"ember.compile: {code.co_name} is compiled with static "
                      f"shapes: {e} ({tx.innermost_where()})")  # fmt: skip
            static_codes.add(code)
            policy, break_at, reason = None, None, None
        finally:
            captured.append(output.example_bytes)  # a number: the capture itself must die
            _dismantle(tx, builder)
        torch._C._set_grad_enabled(grad)
        restore_autocast_state(autocast)


def _dismantle(tx, builder) -> None:
    """Drop what the finished capture's translator and builder hold. Both are in reference
    cycles (the translator is its own `current`, its global loaders close over it, the builder
    caches the variables that hold it), which kept every capture's variables, guards and example
    tensors until a full collection: after a few hundred compile-and-reset cycles the heap had
    grown by the captures of a hundred."""
    tx.__dict__.clear()
    builder.__dict__.clear()


class _SavedNothing:
    """What the capture's ops save for backward: nothing. The capture runs the program on
    example values with grad on, only to learn which results require grad; their autograd graph
    is never run (a backward or autograd.grad in the program breaks the graph, and the capture's
    values are dropped before the compiled code runs). Saved, the activations made the
    capture's peak the eager forward's: GPT-2 (train-amp, H200) 4727 MiB where the compiled
    forward peaks at 2338. A capture that does read a saved value (`asked`) is redone with
    saving as eager does."""

    def __init__(self, active: bool):
        self.active = active
        self.asked = False

    def hooks(self):
        if not self.active:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @staticmethod
    def _pack(tensor):
        return None

    def _unpack(self, _):
        self.asked = True
        raise RuntimeError("ember: the capture saved nothing for backward; capturing again")


def finish(tx, output, code, backend, reason, fullgraph=False):
    """Generate the transformed function for a translated frame."""
    output.drop_restored_attributes()
    output.check_generic_writes()
    arg_names = [sanitize(n) for n in code.co_varnames[: len(tx.fn_args)]]
    cg = CodeGen(output, arg_names)
    kind = tx.result[0]
    if kind == "return":
        roots = [tx.result[1]]
    else:
        _, inst, stack, f_locals = tx.result
        roots = [*stack, *f_locals.values()]
        roots += [c.value for c in tx.cells.values() if isinstance(c, V.CellVT) and c.value]
    for effect in output.side_effects:
        for v in effect[1:]:
            if isinstance(v, V.VT):
                roots.append(v)
            elif isinstance(v, (list, dict)):  # a replayed call's arguments
                roots.extend(v.values() if isinstance(v, dict) else v)
    roots.extend(output.mutated.values())
    outputs = cg.collect_outputs(roots)
    body: list[str] = []
    gm = graph_module(output, outputs)
    has_graph = _count_ops(gm) > 0 or bool(outputs)
    env = output.shape_env
    if has_graph:
        example_inputs = [vt.example for _, _, vt in output.inputs]
        output.cut_example_history()
        if env is not None and env.symbols:
            gm.meta["ember_symbols"] = env.specs()
        elif output.inputs_pinned:  # each call's inputs are the traced ones, as the guards check
            gm.meta[GUARDED_INPUTS_META_KEY] = True
        gm.meta[FULLGRAPH_META_KEY] = bool(fullgraph)  # (for a compile at the first call)
        try:
            # EMBER_REPRO; inside a DDP forward, one backend call per gradient bucket
            compiled = compile_for_ddp(lambda g, ex: call_backend(backend, g, ex, code), gm,
                                       example_inputs)  # fmt: skip
        except Exception as e:  # noqa: BLE001  (a backend that cannot take these symbols)
            if not gm.meta.get("ember_symbols"):
                if isinstance(e, NotImplementedError):  # a construct the backend does not cover
                    log.debug("the backend cannot compile the graph", exc_info=True)
                    first = str(e).splitlines()[0] if str(e) else ""
                    raise Unsupported(f"the backend cannot compile this graph: "
                                      f"{type(e).__name__}: {first}{_raised_at(e)}",
                                      tx.where()) from e  # fmt: skip
                raise
            log.debug("the backend failed on symbolic sizes", exc_info=True)
            raise SymbolicFallback(f"the backend failed on symbolic sizes: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}"
                                   f"{_raised_at(e)}") from e  # fmt: skip
        del example_inputs
        _drop_example_values(gm)
        if compiled is None:
            raise Unsupported("the backend returned None")
        if env is not None and env.symbols:
            for rel in getattr(compiled, "ember_guards", ()):
                env.relations.setdefault(rel, "the backend")
        call = cg.obj(_C.CompiledFunction(compiled, None), "graph")
        inputs = ", ".join(cg.input_exprs([src for src, _, _ in output.inputs]))
        cg.lines.append(f"___o = {call}({inputs})")
    cg.side_effects()
    if kind == "return":
        body.append(f"return {cg.expr(tx.result[1])}")
    else:
        cg.at_break = True
        body += break_code(cg, tx, inst, stack)
        stats.breaks.append(BreakRecord(reason.msg if reason else "graph break",
                                        reason.where if reason else tx.where()))  # fmt: skip
    fn = cg.build(f"___transformed_{code.co_name}".replace("<", "_").replace(">", "_"),
                  tx.f_globals, body)  # fmt: skip
    _C.mark_skip(fn.__code__)
    if env is not None and env.slots:
        output.guards.add_relations(env.guard_relations(), len(env.slots))
    program = output.guards.compile()
    state = _touched_codes.get(code)
    if state is not None:
        state.graphs += has_graph
        state.graphless += not has_graph
    if has_graph:
        stats.graphs.append(GraphRecord(gm, code.co_name, tx.where(), _count_ops(gm),
                                        output.guards.describe()))  # fmt: skip
    if config.verbose:
        print(f"[ember.dynamo] {code.co_name}: graph {has_graph}\n{fn.__ember_source__}")
    if not has_graph and kind == "return" and not output.side_effects and not output.mutated:
        return program, None  # nothing to compile: run the original code under these guards
    return program, fn


def _raised_at(e: BaseException) -> str:
    """Where the innermost Python frame of `e`'s traceback was (an error raised in C++ names the
    Python line that called it), as " [raised at file:line in function]"."""
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f" [raised at {code.co_filename}:{tb.tb_lineno} in {code.co_name}]"


def _drop_example_values(gm) -> None:
    """The interpreter ran the program on real tensors and left each value in its node's meta;
    once the backend has compiled the graph they would only pin a whole call's activations in
    memory for as long as the graph lives (the graph, or the explain record, keeps them)."""
    for node in gm.graph.nodes:
        node.meta.pop("example_value", None)


def _count_ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def break_code(cg: CodeGen, tx, inst, stack) -> list[str]:
    """Run the instruction the graph broke at in Python, then call the resume function."""
    nxt = tx.insts[tx.offset_index[inst.offset] + 1].offset
    name = inst.opname
    if name == "CALL":
        argc = inst.arg
        args = stack[len(stack) - argc :]
        first, second = stack[len(stack) - argc - 2], stack[len(stack) - argc - 1]
        below = stack[: len(stack) - argc - 2]
        fn, args = (second, args) if first is V.NULL else (first, [second, *args])
        names = tx.kw_names
        pos = args[: len(args) - len(names)]
        kws = args[len(args) - len(names) :]
        parts = [cg.expr(a) for a in pos] + [f"{k}={cg.expr(v)}" for k, v in zip(names, kws)]
        call = f"{cg.expr(fn)}({', '.join(parts)})"
        result = cg.temp(call)
        return [f"return {resume_call(cg, tx, nxt, below, result)}"]
    if name == "CALL_FUNCTION_EX":
        has_kw = inst.arg & 1
        kwargs = stack[-1] if has_kw else None
        args = stack[-2] if has_kw else stack[-1]
        fn = stack[-3] if has_kw else stack[-2]
        below = stack[: len(stack) - (4 if has_kw else 3)]
        call = f"{cg.expr(fn)}(*{cg.expr(args)}" + (f", **{cg.expr(kwargs)})" if has_kw else ")")
        result = cg.temp(call)
        return [f"return {resume_call(cg, tx, nxt, below, result)}"]
    if name == "BINARY_SUBSCR":
        result = cg.temp(f"{cg.expr(stack[-2])}[{cg.expr(stack[-1])}]")
        return [f"return {resume_call(cg, tx, nxt, stack[:-2], result)}"]
    if "POP_JUMP" in name:
        cond = cg.expr(stack[-1])
        below = stack[:-1]
        target = inst.argval
        jump_if_true = "IF_TRUE" in name
        on_true = resume_call(cg, tx, target if jump_if_true else nxt, below)
        on_false = resume_call(cg, tx, nxt if jump_if_true else target, below)
        return [f"if {cond}:", f"    return {on_true}", f"return {on_false}"]
    raise Unsupported(f"graph break at {name}")
