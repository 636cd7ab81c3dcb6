"""Runs one model under a list of backends, in this process, and emits one record per backend.

This is the body of a worker process (see run.py): it builds the model once on the CPU with a
fixed seed, computes the eager reference (and a float64 one for bf16/AMP modes), then for each
backend takes a fresh copy of the same weights, compiles, times the first call (cold compile),
checks accuracy, warms up, times steady-state calls, reads peak memory and graph counts, and
finally resets the backend and compiles a fresh wrapper again (warm compile, on-disk cache hit).
"""

import contextlib
import copy
import gc
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import backends as backend_registry
import measure
import turns
import torch
from models import MODELS
from torch import nn


@dataclass(frozen=True)
class Mode:
    """A benchmark mode: inference or a training step, and its numerics."""

    name: str
    train: bool
    autocast: object  # torch dtype for autocast, or None
    fp64_reference: bool
    tolerance: measure.Tolerance
    description: str


MODES = {
    m.name: m
    for m in (
        Mode(
            "infer-bf16",
            False,
            torch.bfloat16,
            True,
            measure.Tolerance(5e-2),
            "inference under torch.autocast(bfloat16), torch.no_grad()",
        ),
        Mode(
            "infer-fp32",
            False,
            None,
            False,
            measure.Tolerance(1e-3),
            "inference in float32, torch.no_grad()",
        ),
        Mode(
            "train-amp",
            True,
            torch.bfloat16,
            True,
            measure.Tolerance(5e-2),
            "training step: forward under autocast(bfloat16), loss = output.float().mean(), "
            "backward, AdamW step",
        ),
        Mode(
            "train-fp32",
            True,
            None,
            False,
            measure.Tolerance(1e-2),
            "training step in float32: forward, loss = output.float().mean(), backward, AdamW step",
        ),
    )
}


def _time_call(step, device):
    """measure.time_call, less the time this worker was stopped by another worker's timed phase
    (see turns.py): a compile's own time."""
    t0 = time.time()
    seconds, result = measure.time_call(step, device)
    return max(0.0, seconds - turns.paused_seconds(t0, time.time())), result


class BenchTimeout(BaseException):
    """Raised by the soft timeout; a BaseException so model code's `except Exception` lets it by."""


@contextlib.contextmanager
def soft_timeout(seconds):
    """Raise BenchTimeout in the main thread after `seconds` (no limit if None or off the main
    thread; at once if the time is already up)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    if seconds <= 0:
        raise BenchTimeout("part deadline reached")

    def on_alarm(signum, frame):
        raise BenchTimeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def error_text(exc):
    """One line: the exception type and message (the traceback goes to the log)."""
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg}"[:2000]


class Task:
    """One model, its inputs and references, in one mode on one device."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.spec = MODELS[cfg["model"]]
        self.mode = MODES[cfg["mode"]]
        self.device = torch.device(cfg["device"])
        self.timing = measure.Timing(**cfg["timing"])
        self.master = self._build()
        self.is_module = isinstance(self.master, nn.Module)
        if self.mode.train and (
            not self.is_module or not any(True for _ in self.master.parameters())
        ):
            raise ValueError(f"{self.spec.name} has no parameters to train; use an infer-* mode")
        self.batch = cfg.get("batch") or self.spec.batch
        self.seq = cfg.get("seq") or self.spec.seq
        cpu_inputs = self.spec.make_inputs(self.batch, self.seq, torch.Generator().manual_seed(1))
        cast = self.mode.autocast if self.spec.kernel else None  # kernels run in the mode's dtype
        self.inputs = tuple(
            t.to(self.device, cast) if (cast and t.is_floating_point()) else t.to(self.device)
            for t in cpu_inputs
        )
        self.ref = self.ref64 = self.eager64 = None
        self.copy_gbps = None

    # -- building blocks ------------------------------------------------------------------

    def _build(self):
        """The model with seeded random weights, kept on the CPU (each backend copies it).

        On a GPU the weights are initialised there (big transformers models initialise ~10x
        faster than on the CPU), then moved to the CPU; on any error, built on the CPU."""
        if self.device.type == "cuda":
            try:
                torch.manual_seed(0)
                with torch.device(self.device):
                    model = self.spec.build()
                return model.to("cpu") if isinstance(model, nn.Module) else model
            except Exception:  # noqa: BLE001 - an init that only works on the CPU: build there
                traceback.print_exc()
        torch.manual_seed(0)
        return self.spec.build()

    def fresh(self, dtype=None):
        """A fresh device copy of the model (the same weights every time), in the mode's state."""
        if not self.is_module:
            return self.master
        model = copy.deepcopy(self.master)
        model = model.to(device=self.device, dtype=dtype) if dtype else model.to(self.device)
        return model.train(self.mode.train)

    def context(self, autocast=True):
        """The context a call runs in: no_grad for inference, autocast for bf16 modes."""
        stack = contextlib.ExitStack()
        if not self.mode.train:
            stack.enter_context(torch.no_grad())
        if autocast and self.mode.autocast is not None and not self.spec.kernel:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.mode.autocast))
        return stack

    def make_step(self, fn, model, inputs=None, autocast=True, optimizer=True):
        """A no-argument closure running one inference call or one training step of `fn`."""
        inputs = self.inputs if inputs is None else inputs
        if not self.mode.train:  # runs inside outer(): no per-call context-manager cost
            return lambda: fn(*inputs)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if optimizer else None

        def train_step():
            for p in model.parameters():
                p.grad = None
            with self.context(autocast):
                out = fn(*inputs)
            measure.tensors_of(out)[0].float().mean().backward()
            if opt is not None:
                opt.step()
            return out

        return train_step

    def outer(self, autocast=True):
        """Held around every call of a phase: inference's no_grad/autocast (training: nothing;
        its steps enter autocast themselves, around the forward only)."""
        return contextlib.nullcontext() if self.mode.train else self.context(autocast)

    def observed(self, model, out):
        """What accuracy compares: the output (inference) or the first step's gradients."""
        if self.mode.train:
            return [p.grad for p in model.parameters()]
        return measure.tensors_of(out)

    # -- phases ---------------------------------------------------------------------------

    def reference(self):
        """Eager's result, and (bf16/AMP modes) a float64 eager result and eager's drift from it."""
        model = self.fresh()
        with self.outer():
            out = self.make_step(model, model, optimizer=False)()
        self.ref = measure.to_cpu(self.observed(model, out))
        del model, out
        note = None
        if self.mode.fp64_reference and self.cfg.get("accuracy", True):
            try:
                self.ref64 = self._reference64()
                on_device = [None if t is None else t.to(self.device) for t in self.ref]
                self.eager64 = measure.eager_vs_fp64(on_device, self.ref64)
                del on_device
            except Exception as e:  # noqa: BLE001 - e.g. no float64 kernel: compare with eager
                note = f"no float64 reference ({error_text(e)[:200]})"
                self.ref64 = self.eager64 = None
        if self.spec.kernel and self.cfg.get("copy_bw"):
            self.copy_gbps = self._copy_bandwidth()
        self.cleanup()
        return note

    def _reference64(self):
        model = self.fresh(torch.float64)
        inputs = tuple(t.double() if t.is_floating_point() else t for t in self.inputs)
        benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = False  # tuning every float64 conv is slow and useless
        try:
            with self.outer(autocast=False):
                out = self.make_step(model, model, inputs, autocast=False, optimizer=False)()
        finally:
            torch.backends.cudnn.benchmark = benchmark
        result = measure.to_cpu(self.observed(model, out), torch.float64)
        del model, out
        return result

    def _copy_bandwidth(self):
        """GB/s of a large device copy (bytes read + written), the roofline's practical peak."""
        n = max(t.numel() * t.element_size() for t in self.inputs) // 4
        src = torch.randn(n, device=self.device)
        dst = torch.empty_like(src)
        copy = lambda: dst.copy_(src)
        measure.warm_up(copy, str(self.device), 2)
        ms, _ = measure.time_steady(copy, str(self.device), self.timing)
        return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9

    def run_backend(self, backend):
        """Compile, check, time and re-compile `fn` under one backend; return its record."""
        with self.outer():
            return self._run_backend(backend)

    def _run_backend(self, backend):
        rec = {"status": "ok"}
        model = self.fresh()
        fn = model if self.is_module else self.master
        mem = measure.Memory(str(self.device))
        mem.begin()
        backend.begin()
        step = self.make_step(backend.compile(fn), model)
        first_s, out = _time_call(step, str(self.device))
        rec["compile_cold_s" if backend.compiles else "first_call_s"] = first_s
        rec["first_peak_mem_mb"] = mem.peak_mb()  # the compiling call's (a training step's)
        if self.cfg.get("accuracy", True):
            rec["accuracy"] = measure.compare(
                self.observed(model, out), self.ref, self.ref64, self.eager64, self.mode.tolerance
            )
        if self.spec.kernel and self.cfg.get("copy_bw"):
            rec["bytes"] = sum(t.numel() * t.element_size() for t in self.inputs)
            rec["bytes"] += sum(t.numel() * t.element_size() for t in measure.tensors_of(out))
        del out
        self._time(step, rec, mem)
        del step
        rec.update(backend.stats(fn, self.inputs, lambda: self.context()))
        if backend.compiles and self.cfg.get("warm_compile", True):
            self._warm_compile(backend, fn, model, rec)
        accuracy = rec.get("accuracy")
        if accuracy and not accuracy["ok"]:
            rec["status"], rec["error"] = "inaccurate", accuracy["why"]
        if backend.compiles and rec.get("graphs") == 0:
            # Nothing was captured: the "compiled" numbers are eager's, so this is no pass.
            why = rec.get("last_failure") or "no frame was converted"
            rec["status"], rec["error"] = "fallback", f"captured no graph, ran eagerly: {why}"
        return rec

    def _time(self, step, rec, mem):
        with turns.timing_turn():
            measure.warm_up(step, str(self.device), self.timing.warmup)
            mem.before_timed()
            rec["latency_ms"], rec["iters"] = measure.time_steady(
                step, str(self.device), self.timing
            )
        rec["peak_mem_mb"], rec["mem_kind"] = mem.peak_mb(), mem.kind
        if self.spec.kernel and self.cfg.get("copy_bw"):
            rec["gbps"] = rec["bytes"] / (rec["latency_ms"] * 1e-3) / 1e9
            if self.copy_gbps:
                rec["copy_gbps"] = self.copy_gbps
                rec["pct_copy_bw"] = 100 * rec["gbps"] / self.copy_gbps

    def _warm_compile(self, backend, fn, model, rec):
        if not backend.reset():
            rec["compile_warm_s"] = None
            rec["warm_note"] = "backend has no reset()"
            return
        step = self.make_step(backend.compile(fn), model)
        # A warm compile takes about a second, so it is timed as the calls are: in this worker's
        # turn, with the other workers stopped (their compiles would otherwise share the CPU).
        with turns.timing_turn():
            rec["compile_warm_s"], _ = _time_call(step, str(self.device))
        hits = backend.cache_hits()
        if hits is not None:
            rec["warm_cache_hits"] = hits

    def cleanup(self):
        """Free what the last phase left behind, so the next backend starts from the same state."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def configure_process(cfg):
    """Process-wide settings shared by every backend (cuDNN autotuning, CPU threads)."""
    if torch.device(cfg["device"]).type == "cuda":
        torch.backends.cudnn.benchmark = True
    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])


def device_name(device):
    """The GPU's name (e.g. 'NVIDIA H100 80GB HBM3'), or None on the CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _time_left(cfg):
    """The soft timeout of the next phase: the per-model timeout, capped by the part deadline."""
    timeout = cfg.get("timeout") or None
    if cfg.get("deadline"):
        left = cfg["deadline"] - time.time()
        timeout = left if timeout is None else min(timeout, left)
    return timeout


def run_model(cfg, emit):
    """Run cfg['model'] under cfg['backends'], calling emit(event) for phases and records.

    Returns False when the process should not be reused (a soft timeout interrupted a phase).
    """
    configure_process(cfg)
    try:
        emit({"event": "phase", "phase": "build"})
        t0 = time.perf_counter()
        with soft_timeout(_time_left(cfg)):
            task = Task(cfg)
        emit({"event": "phase", "phase": "reference"})
        t1 = time.perf_counter()
        with soft_timeout(_time_left(cfg)):
            note = task.reference()
        emit(
            {
                "event": "ready",
                "shape": task.spec.describe(task.batch, task.seq),
                "note": note,
                "build_s": t1 - t0,
                "reference_s": time.perf_counter() - t1,
                "device_name": device_name(task.device),
            }
        )
    except BaseException as e:  # noqa: BLE001 - a timeout here fails the model, not the run
        traceback.print_exc()
        status = "timeout" if isinstance(e, BenchTimeout) else "failed"
        emit({"event": "fatal", "status": status, "error": "eager reference: " + error_text(e)})
        return not isinstance(e, BenchTimeout)
    for name in cfg["backends"]:
        backend = backend_registry.get(name)
        emit({"event": "phase", "phase": name})
        start = time.perf_counter()
        reusable = True
        timeout = _time_left(cfg)
        try:
            if timeout is not None and timeout <= 1:
                raise BenchTimeout("not run: part deadline reached")
            with soft_timeout(timeout):
                rec = task.run_backend(backend)
        except BenchTimeout as e:
            rec, reusable = {"status": "timeout", "error": str(e)}, False
        except Exception as e:  # noqa: BLE001 - a backend failure is a result, not a crash
            traceback.print_exc()
            rec = {"status": "failed", "error": error_text(e)}
        rec["wall_s"] = time.perf_counter() - start
        emit({"event": "record", "backend": name, "record": rec})
        with contextlib.suppress(Exception):
            backend.reset()
        task.cleanup()
        if not reusable:
            return False
    return True
