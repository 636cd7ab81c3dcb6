"""Timed phases that take turns on a shared device, with the other workers paused.

With `--jobs N`, several worker processes share one device: while one times its calls, the
others compile. Taking turns on a lock keeps two timed phases apart, but not a timed phase from
another worker's compile: the compiles load the host's cores (and an autotuner's benchmark runs
load the GPU), and a model whose calls are bound by the CPU (eager, a wrapper that launches many
kernels) then reads slower than it runs alone. So the worker that holds the turn stops the other
workers' process groups (SIGSTOP) for its timed phase and continues them (SIGCONT) afterwards.

Each worker is the leader of its own process group (the runner starts it in a new session), so
stopping the group stops its compile subprocesses too. A worker registers its group in a
directory beside the lock file; the holder of the turn logs each pause there, and a worker
subtracts the time it spent stopped from the compile times it reports (`paused_seconds`). The
runner continues every registered group whenever a worker ends (`resume_all`), so a worker that
died or was killed in its timed phase leaves nobody stopped.
"""

import contextlib
import os
import signal
import time
from pathlib import Path

LOCK_ENV = "EMBER_BENCH_TIMING_LOCK"


def _registry(lock_path):
    return Path(str(lock_path) + ".workers")


def _lock_path():
    return os.environ.get(LOCK_ENV)


def register():
    """Record this worker's process group as one to pause during other workers' timed phases
    (only a process that leads its own group: stopping a group it shares would stop the
    runner)."""
    lock = _lock_path()
    if not lock or os.getpgid(0) != os.getpid():
        return
    reg = _registry(lock)
    reg.mkdir(parents=True, exist_ok=True)
    (reg / str(os.getpid())).touch()


def unregister(lock_path, pid):
    """Forget a worker's group (the runner calls this when the worker ends or is killed)."""
    if lock_path:
        with contextlib.suppress(FileNotFoundError):
            (_registry(lock_path) / str(pid)).unlink()


def _others(reg):
    me = os.getpid()
    for entry in reg.iterdir() if reg.is_dir() else ():
        if entry.name.isdigit() and int(entry.name) != me:
            yield int(entry.name)


def _signal_group(pgid, sig):
    try:
        if os.getpgid(pgid) != pgid:  # the pid was reused by a process that leads no group
            return False
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@contextlib.contextmanager
def _holding(lock_path):
    """The turn: an exclusive lock on the file (freed by the system if its holder dies)."""
    import fcntl

    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def resume_all(lock_path):
    """Continue every registered worker group: the runner calls this when a worker ended, which
    may have died or been killed in its timed phase with the others stopped. It takes the turn
    first (a dead holder's is free), so it never continues groups in a live holder's turn."""
    if not lock_path:
        return
    with _holding(lock_path):
        for pgid in _others(_registry(lock_path)):
            _signal_group(pgid, signal.SIGCONT)


@contextlib.contextmanager
def timing_turn():
    """Held around warm-up and timed calls: an exclusive lock on the file EMBER_BENCH_TIMING_LOCK
    names makes the workers' timed phases take turns, and the other registered workers are
    stopped while the holder times."""
    path = _lock_path()
    if not path:
        yield
        return
    reg = _registry(path)
    with _holding(path):
        stopped = [g for g in _others(reg) if _signal_group(g, signal.SIGSTOP)]
        start = time.time()
        try:
            yield
        finally:
            end = time.time()
            if stopped:  # logged before the groups continue, so each finds its pause logged
                with open(reg / "pauses.log", "a") as log:
                    log.write("".join(f"{g} {start:.6f} {end:.6f}\n" for g in stopped))
            for g in stopped:
                _signal_group(g, signal.SIGCONT)


def paused_seconds(t0, t1, pid=None):
    """Seconds of the wall-clock interval [t0, t1] during which this worker's group was stopped
    by another worker's timed phase (0 when nothing pauses workers)."""
    path = _lock_path()
    if not path:
        return 0.0
    log = _registry(path) / "pauses.log"
    if not log.exists():
        return 0.0
    me, total = str(pid or os.getpid()), 0.0
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == me:
            total += max(0.0, min(t1, float(parts[2])) - max(t0, float(parts[1])))
    return total
