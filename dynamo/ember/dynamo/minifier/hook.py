"""The backend call of every captured graph, watched when `config.repro` (EMBER_REPRO) is on: a
failing graph is saved, minified and written out as a repro, and a warning says where."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch.fx as fx

from ..config import config
from .checks import (MODES, Failure, accuracy_predicate, eager_reference, error_predicate, mismatch,
                     run_seeded)  # fmt: skip
from .graphs import copy_graph, make_inputs, spec_of
from .reprofile import backend_ref, write_repro
from .search import minify

log = logging.getLogger("ember.dynamo.minifier")
_warned_modes: set = set()
# (graph code, mode, failure, directory) -> what the report said, for graphs already reported
_reported: dict = {}


def call_backend(backend: Callable, gm: fx.GraphModule, example_inputs: list, code):
    """`backend(gm, example_inputs)` for the graph of `code` (the user's frame). With
    EMBER_REPRO=error a failure to compile, or to run the result once, writes a repro (the
    exception still propagates, or surfaces at the first call as it would have); with
    EMBER_REPRO=accuracy a result unlike eager's does (the compiled function is returned all
    the same)."""
    mode = config.repro
    if mode not in MODES:
        if mode and mode not in _warned_modes:
            _warned_modes.add(mode)
            warnings.warn(f"EMBER_REPRO (ember.dynamo.config.repro) is {mode!r}; it must be one "
                          f"of {', '.join(MODES)} (or empty: off)", stacklevel=2)  # fmt: skip
        return backend(gm, example_inputs)
    graph = copy_graph(gm)  # backends may rewrite gm in place
    where = _Where(code.co_name, code.co_filename, code.co_firstlineno)
    symbolic = bool(gm.meta.get("ember_symbols"))
    try:
        compiled = backend(gm, example_inputs)
    except Exception as e:
        # A graph with symbolic sizes that fails is traced again with static ones: report that.
        if mode == "error" and not symbolic:
            _report(mode, graph, example_inputs, backend, where, Failure.of(e))
        raise
    if compiled is None:
        return compiled
    if mode == "error":
        try:
            run_seeded(compiled, example_inputs)
        except Exception as e:  # noqa: BLE001  (it surfaces again at the user's first call)
            _report(mode, graph, example_inputs, backend, where, Failure.of(e))
        return compiled
    try:
        expected = eager_reference(graph, example_inputs, config.repro_tolerance)
        if expected is None:
            log.info("ember.compile: the graph of %s draws random numbers: no accuracy check",
                     where)  # fmt: skip
            return compiled
        result = run_seeded(compiled, example_inputs)
    except Exception:  # noqa: BLE001  (an error, not a difference: EMBER_REPRO=error reports it)
        log.debug("accuracy check: the graph did not run", exc_info=True)
        return compiled
    difference = mismatch(expected, result, config.repro_tolerance)
    if difference is not None:
        _report(mode, graph, example_inputs, backend, where, difference)
    return compiled


def forget() -> None:
    """Forget which failures were reported and warned about (ember.reset)."""
    _reported.clear()
    _warned_modes.clear()


class _Where(NamedTuple):
    """The user's frame: function name, file and first line."""

    name: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.file}:{self.line})"


def _report(mode, graph, inputs, backend, where: _Where, failure) -> None:
    """Save the failing graph and a minimized repro, then warn; never raises (the user's own
    error, or result, matters more than the repro)."""
    # The same graph failing the same way again (a recompile, a second model instance): once.
    key = (graph.code, mode, failure.key if isinstance(failure, Failure) else None,
           config.repro_dir)  # fmt: skip
    if key in _reported:
        message = f"the same failure as before: {_reported[key]}"
    else:
        try:
            message = _reported[key] = _write(mode, graph, inputs, backend, where, failure)
        except Exception as e:  # noqa: BLE001
            log.debug("writing the repro failed", exc_info=True)
            message = f"writing a repro failed: {type(e).__name__}: {e}"
    what = (f"raised {failure}" if isinstance(failure, Failure)
            else f"gave a result unlike eager's ({failure})")  # fmt: skip
    text = f"ember.compile: backend {_name(backend)} {what} on the graph of {where}; {message}"
    try:  # at the user's line, as their own code's warnings are
        warnings.warn_explicit(text, UserWarning, where.file, where.line)
    except Warning:  # warnings turned into errors: the backend's own failure must still surface
        log.warning(text)


def _name(backend) -> str:
    ref = backend_ref(backend)
    return repr(ref.name) if ref.name else repr(getattr(backend, "__name__", backend))


def _write(mode, graph, inputs, backend, where: _Where, failure) -> str:
    directory = _new_directory(where)
    expected = failure if isinstance(failure, Failure) else None
    fails = (error_predicate(backend, expected) if mode == "error"
             else accuracy_predicate(backend, config.repro_tolerance))  # fmt: skip
    # Random inputs of the same specs are what a repro file makes; if they do not fail, the
    # repro keeps the values seen (a failure that depends on them).
    random_ok = fails(graph, make_inputs([spec_of(x) for x in inputs]))
    ref = backend_ref(backend)
    common = dict(backend=ref, mode=mode, expected=expected, tolerance=config.repro_tolerance)
    what = f"{failure}" if expected else f"result unlike eager's: {failure}"
    original = write_repro(directory / "original.py", graph, [spec_of(x) for x in inputs],
                           title=f"The whole graph of {where} that failed in ember.compile "
                           f"(backend {ref.name!r}).", details=f"Failure: {what}\n",
                           input_values=None if random_ok else list(inputs), **common)  # fmt: skip
    if not config.repro_minify:
        return (f"the graph is saved in {original} (minify it: python -m ember.dynamo.minifier "
                f"{original})")  # fmt: skip
    try:
        small = minify(graph, inputs, fails, random_inputs=random_ok,
                       max_seconds=config.repro_max_seconds)  # fmt: skip
    except Exception as e:  # noqa: BLE001  (the whole graph is still saved)
        log.debug("minifying failed", exc_info=True)
        return (f"minifying it failed ({type(e).__name__}: {e}); the whole graph is saved in "
                f"{original}")  # fmt: skip
    repro = write_repro(directory / "repro.py", small.gm, small.specs,
                        title=f"A minimized graph of {where} that fails in ember.compile "
                        f"(backend {ref.name!r}).",
                        details=f"Failure: {what}\n{small.ops_after} of {small.ops_before} calls "
                        f"kept ({small.tests} tries, {small.seconds:.1f} s"
                        f"{'' if small.complete else ', stopped by repro_max_seconds'}).\n",
                        input_values=None if random_ok else small.inputs, **common)  # fmt: skip
    unnamed = "" if ref.name else ("; register the backend by name (ember.dynamo."
                                   "register_backend) and set BACKEND to run it")  # fmt: skip
    return (f"a repro with {small.ops_after} of {small.ops_before} calls is written to {repro} "
            f"(run it with python; the whole graph: {original}){unnamed}")


def _new_directory(where: _Where) -> Path:
    """A fresh directory under config.repro_dir (EMBER_REPRO_DIR) named after the user's
    function, file and line."""
    name, file, line = where
    stem = re.sub(r"\W+", "_", f"{name}_{Path(file).stem}_{line}").strip("_")
    root = Path(config.repro_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = root / (stem if n == 1 else f"{stem}_{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise OSError(f"no free directory name for {stem} under {root}")

