"""Triton kernels compiled ahead of their launch in worker processes, not only in threads.

Triton's compile holds the GIL through much of its work: on an H100 host with 16 cores, 16
kernels took 4.9 s on one thread and 1.6 s on 8 or 16 threads (session 18), while a GPT-2
training step compiles some 300 kernel configs. A worker process shares no GIL. It compiles
for the main process's GPU target into Triton's own on-disk cache, without touching the GPU
(its Triton driver answers device 0, stream 0 and that target); the main process's compile of
the same kernel, same arguments, then finds the result in that cache and only loads it.

Workers are started (spawned, so no CUDA state is inherited) at the first kernel a process
compiles ahead on a GPU; `EMBER_COMPILE_WORKERS=N` sets how many, 0 turns them off. A worker
that fails or a pool that cannot start costs nothing but the time: the main process compiles the
kernel itself, as it did before, and reports any error the compile has.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import logging
import multiprocessing
import os
import sys
import threading

log = logging.getLogger("ember.inductor")

# Workers at most: each holds torch and Triton (a few hundred MB of host memory).
MAX_WORKERS = 16

_LOCK = threading.Lock()
_POOL: list = [None, None]  # [pid of the process that made it, executor or None]


def worker_count() -> int:
    """How many compile workers this process uses (EMBER_COMPILE_WORKERS, else the cores up to
    MAX_WORKERS; none on machines of fewer than 4 cores, where threads do as well)."""
    text = os.environ.get("EMBER_COMPILE_WORKERS")
    if text is not None:
        try:
            n = int(text)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(
                f"EMBER_COMPILE_WORKERS must be a whole number of processes (0: none), got {text!r}"
            )
        return n
    cores = os.cpu_count() or 1
    return min(MAX_WORKERS, cores) if cores >= 4 else 0


def pool():
    """This process's worker pool, started on first use (None when there are no workers)."""
    with _LOCK:
        if _POOL[0] != os.getpid():  # a forked child inherits the object, not the processes
            n = worker_count()
            executor = None
            if n:
                try:
                    executor = concurrent.futures.ProcessPoolExecutor(
                        n, mp_context=multiprocessing.get_context("spawn")
                    )
                except (OSError, ValueError) as e:
                    log.warning("ember.inductor: no compile workers (%s); compiling in threads", e)
            _POOL[:] = [os.getpid(), executor]
        return _POOL[1]


def compile_ahead(path: str, module: str, fn_name: str, target, args: tuple, kwargs: dict):
    """A future of compiling `fn_name` of the kernel file at `path` as `fn.warmup(*args,
    **kwargs)` would, for `target` (a triton GPUTarget), in a worker; None without workers."""
    executor = pool()
    if executor is None:
        return None
    try:
        return executor.submit(_compile_in_worker, path, module, fn_name, target, args, kwargs)
    except RuntimeError:  # the pool broke (a worker died) or is shutting down
        with _LOCK:
            _POOL[:] = [None, None]
        return None


def wait(futures) -> None:
    """Wait for ahead-of-launch compiles; a failed one is only logged (the caller compiles
    again, in process, and that compile reports the error)."""
    for future in futures:
        if future is None:
            continue
        try:
            future.result()
        except Exception as e:  # noqa: BLE001
            log.debug("ember.inductor: a compile worker failed: %s: %s", type(e).__name__, e)


# --- in the worker --------------------------------------------------------------------------


class _CompileOnlyDriver:
    """What Triton's compile path asks of its driver, answered without a GPU. Anything else (a
    launch, device properties) is an error: a worker only compiles."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def __getattr__(self, name):
        raise AttributeError(f"a compile worker's Triton driver has no {name!r}")


_MODULES: dict = {}
_DRIVER_FOR: list = [None]  # the target this worker's driver answers


def _compile_in_worker(path, module, fn_name, target, args, kwargs):
    from triton.runtime.driver import driver

    if _DRIVER_FOR[0] != target:  # (asking for driver.active would look for a GPU)
        driver.set_active(_CompileOnlyDriver(target))
        _DRIVER_FOR[0] = target
    mod = _MODULES.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[module] = mod
        _MODULES[path] = mod
    getattr(mod, fn_name).warmup(*args, **kwargs)
    return True
