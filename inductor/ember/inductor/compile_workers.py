"""Triton kernels compiled ahead of their launch in worker processes, not only in threads.

Triton's compile holds the GIL through much of its work: on an H100 host with 16 cores, 16
kernels took 4.9 s on one thread and 1.6 s on 8 or 16 threads (session 18). A worker process
shares no GIL. It compiles for the main process's GPU target into Triton's own on-disk cache,
without touching the GPU (its Triton driver answers device 0, stream 0 and that target); the
main process's compile of the same kernel, same arguments, then finds the result in that cache
and only loads it. Packages' cubins (triton_aot.py) are compiled the same way, as the
`triton.compile` call the main process then makes.

Workers are plain subprocesses running this file, talking over their stdin and stdout, started at
the first kernel a process compiles ahead on a GPU. (multiprocessing's spawn would import the
user's main module again in every worker, which a script without a `__main__` guard does not
survive.) `EMBER_COMPILE_WORKERS=N` sets how many, 0 turns them off. A worker that fails, dies
or cannot start costs nothing but time: the main process compiles the kernel itself, as it
always did, and reports any error the compile has.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import importlib.util
import logging
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading

log = logging.getLogger("ember.inductor")

# Workers at most: each holds torch and Triton (a few hundred MB of host memory).
MAX_WORKERS = 16
# A worker silent this long is given up (ptxas has taken 100 s on one kernel; session 16).
WORKER_TIMEOUT_S = 600.0
# Fewer cores than this: no workers (the compiles' threads already fill them).
MIN_CORES = 8

_LOCK = threading.Lock()
_POOL: list = [None, None]  # [pid of the process that made it, _Pool or None]


def worker_count() -> int:
    """How many compile workers this process uses (EMBER_COMPILE_WORKERS, else one per core up
    to MAX_WORKERS, none below MIN_CORES cores)."""
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
    return min(MAX_WORKERS, cores) if cores >= MIN_CORES else 0


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the other side closed the pipe")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the other side closed the pipe")
    return pickle.loads(data)


class _Pool:
    """Worker processes, each used by one request at a time (idle ones wait in a queue)."""

    def __init__(self, n: int):
        env = dict(os.environ)
        # the worker finds ember (and whatever found it here) where this process did
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        self.procs = []
        for _ in range(n):
            # -P: this file's folder (inductor's modules: config, cache, ...) is not put first
            # on the worker's path, where it would shadow modules of the same names
            self.procs.append(subprocess.Popen(
                [sys.executable, "-P", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))  # fmt: skip
        self.idle: queue.Queue = queue.Queue()
        self.alive = n
        for p in self.procs:
            self.idle.put(p)
        self.threads = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="ember-cw")

    def run(self, request) -> bool:
        proc = self.idle.get()
        if proc is None:  # every worker was lost: pass the word on
            self.idle.put(None)
            return False
        try:
            _send(proc.stdin, request)
            if not select.select([proc.stdout], [], [], WORKER_TIMEOUT_S)[0]:
                raise TimeoutError(f"no answer in {WORKER_TIMEOUT_S} s")
            ok, why = _receive(proc.stdout)
        except Exception as e:  # noqa: BLE001  (died, timed out, garbled: not put back)
            log.debug("ember.inductor: a compile worker was lost: %s: %s", type(e).__name__, e)
            proc.kill()
            with _LOCK:
                self.alive -= 1
                if self.alive == 0:
                    self.idle.put(None)
            return False
        self.idle.put(proc)
        if not ok:
            log.debug("ember.inductor: a compile worker failed: %s", why)
        return ok

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        for p in self.procs:
            try:
                p.stdin.close()  # a worker exits at the end of its input
            except OSError:
                pass


def _pool():
    with _LOCK:
        if _POOL[0] != os.getpid():  # a forked child inherits the object, not the processes
            n, pool = worker_count(), None
            if n:
                try:
                    pool = _Pool(n)
                    atexit.register(pool.close)
                except OSError as e:
                    log.warning("ember.inductor: no compile workers (%s); compiling in threads", e)
            _POOL[:] = [os.getpid(), pool]
        return _POOL[1]


def compile_ahead(path: str, module: str, fn_name: str, target, args: tuple, kwargs: dict):
    """A future (of True when it compiled) of compiling `fn_name` of the kernel file at `path`
    as `fn.warmup(*args, **kwargs)` would, for `target` (a triton GPUTarget), in a worker; None
    without workers."""
    pool = _pool()
    if pool is None:
        return None
    return pool.threads.submit(pool.run, ("warmup", path, module, fn_name, target, args, kwargs))


def compile_source(path: str, module: str, fn_name: str, target, signature: dict,
                   constexprs: dict, attrs: dict, options: dict):  # fmt: skip
    """A future (of True when it compiled) of `triton.compile(ASTSource(fn, signature,
    constexprs, attrs), target=target, options=options)` of `fn_name` of the kernel file at
    `path`, in a worker; None without workers. The same call in this process then only loads
    the result from Triton's cache (how packages compile their cubins, triton_aot.py)."""
    pool = _pool()
    if pool is None:
        return None
    request = ("source", path, module, fn_name, target, signature, constexprs, attrs, options)
    return pool.threads.submit(pool.run, request)


def results(futures) -> list:
    """Wait for ahead-of-launch compiles: whether each succeeded (False for a failure or a lost
    worker, only logged: the caller compiles it again, in process, and reports the error)."""
    out = []
    for future in futures:
        try:
            out.append(future is not None and future.result() is True)
        except Exception as e:  # noqa: BLE001
            log.debug("ember.inductor: a compile worker failed: %s: %s", type(e).__name__, e)
            out.append(False)
    return out


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


def _serve() -> None:
    """A worker's loop: requests on stdin, (ok, error) on stdout, until stdin closes."""
    stdin = sys.stdin.buffer
    # replies on a copy of the pipe; file descriptor 1 becomes stderr, so nothing printed while
    # compiling enters them, not even by a program the compiler runs (ptxas inherits it)
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    modules, target_now = {}, [None]
    while True:
        try:
            kind, path, module, fn_name, target, *rest = _receive(stdin)
        except EOFError:
            return
        try:
            _set_target(target_now, target)
            fn = getattr(_module(modules, path, module), fn_name)
            if kind == "warmup":
                args, kwargs = rest
                fn.warmup(*args, **kwargs)
            else:  # "source": triton.compile of the function with these parameters
                from triton.compiler import ASTSource, compile

                signature, constexprs, attrs, options = rest
                src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
                compile(src, target=target, options=options)
            reply = (True, "")
        except Exception as e:  # noqa: BLE001  (the main process compiles it again)
            reply = (False, f"{type(e).__name__}: {e}")
        _send(stdout, reply)


def _set_target(target_now, target) -> None:
    from triton.runtime.driver import driver

    if target_now[0] != target:  # (asking for driver.active would look for a GPU)
        driver.set_active(_CompileOnlyDriver(target))
        target_now[0] = target


def _module(modules, path, module):
    mod = modules.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[module] = mod
        modules[path] = mod
    return mod


if __name__ == "__main__":  # a worker: this file alone, not the ember.inductor package
    _serve()
