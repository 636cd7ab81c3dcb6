"""Progress of long compiles: which stage a compile is in, reported once it has run a while.

Every component marks its stages (`with stage("aot trace"):`, `step("kernel compile", i, n)`);
the outermost stage starts a compile's clock. Once a compile has run `config.after_s` seconds, a
line saying the stage and the elapsed time goes to the "ember.progress" logger at most every
`config.every_s` seconds: at a stage change, and from a watcher thread while one stage runs long
(a C++ build, a big trace). Nothing is printed for compiles shorter than that.

The logger writes to stderr (a handler of its own when logging has none configured, else through
the application's handlers). Overrides of `config`, read at import:
  EMBER_COMPILE_PROGRESS=0         no progress lines
  EMBER_COMPILE_PROGRESS_AFTER=S   the threshold in seconds (default 10)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from typing import Callable, Optional

log = logging.getLogger("ember.progress")


@dataclasses.dataclass
class ProgressConfig:
    """When compile progress is reported."""

    enabled: bool = os.environ.get("EMBER_COMPILE_PROGRESS", "1") not in ("0", "false", "False")
    after_s: float = float(os.environ.get("EMBER_COMPILE_PROGRESS_AFTER", "10"))
    every_s: float = 5.0  # at most one line this often
    clock: Callable[[], float] = time.monotonic  # tests pass a fake one
    watch: bool = True  # also poll from a thread while a stage runs (tests of the clock: off)


config = ProgressConfig()


class _Compile:
    """The compile under way: its start, its stack of stages, when it last reported."""

    def __init__(self, now: float):
        self.start = now
        self.stages: list[str] = []
        self.step: Optional[tuple[int, str]] = None  # (depth of its stage, "kernel compile 3/40")
        self.last_report: Optional[float] = None


_lock = threading.RLock()
_current: Optional[_Compile] = None
# Seconds spent in each stage, by its path from the outermost ("aot_autograd > backward graph
# compile > lowering"), inner stages' time included, summed over the process's compiles.
_totals: dict[str, float] = {}


def stage_totals() -> dict[str, float]:
    """Seconds spent in each stage path so far (see _totals); a copy."""
    with _lock:
        return dict(_totals)


def reset_stage_totals() -> None:
    with _lock:
        _totals.clear()
_handler: Optional[logging.Handler] = None


def _emit(message: str) -> None:
    global _handler
    if not log.hasHandlers() and _handler is None:  # nobody configured logging: stderr
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(_handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.info(message)


def poll() -> None:
    """Report the current stage if the compile has passed the threshold and the last line is
    at least `config.every_s` old."""
    with _lock:
        c = _current
        if c is None or not c.stages or not config.enabled:
            return
        now = config.clock()
        elapsed = now - c.start
        if elapsed < config.after_s:
            return
        if c.last_report is not None and now - c.last_report < config.every_s:
            return
        c.last_report = now
        shown = list(c.stages)
        if c.step is not None and c.step[0] == len(c.stages):
            shown.append(c.step[1])
        _emit(f"ember: compiling for {elapsed:.0f}s; now: {' > '.join(shown)}")


def _watch() -> None:
    """One thread for the process: asleep while no compile runs, else polls once a second, so
    a stage that runs long (a C++ build, a big trace) is reported while it runs."""
    while True:
        _active.wait()
        time.sleep(1.0)
        if config.watch:
            poll()


_active = threading.Event()  # set while a compile runs
_watcher: Optional[threading.Thread] = None


@contextlib.contextmanager
def stage(name: str):
    """Mark a stage of a compile (the outermost one starts the compile's clock)."""
    global _current, _watcher
    with _lock:
        outer = _current is None
        if outer:
            _current = _Compile(config.clock())
            if config.enabled and _watcher is None:
                _watcher = threading.Thread(target=_watch, daemon=True, name="ember-progress")
                _watcher.start()
            _active.set()
        c = _current
        c.stages.append(name)
        path, began = " > ".join(c.stages), config.clock()
    poll()
    try:
        yield
    finally:
        with _lock:
            _totals[path] = _totals.get(path, 0.0) + config.clock() - began
            c.stages.pop()
            if outer:
                _active.clear()
                _current = None


def step(name: str, i: int, n: int) -> None:
    """Within the current stage: `name` i of n (kernel compile 3/40), replacing the last step."""
    with _lock:
        c = _current
        if c is None or not c.stages:
            return
        c.step = (len(c.stages), f"{name} {i}/{n}")
    poll()
