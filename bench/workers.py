"""Worker processes: each runs one model under a list of backends (harness.run_model) and
appends events to a file; the parent watches it for time and death.

A backend that crashes or hangs its worker costs only its own (model, backend) cell: the parent
kills the worker's process group on a hard timeout, records the cell as crashed/timeout with the
last error line from the worker's log, and starts a new worker for the backends still to run.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import report
import turns

POLL_S = 0.2
RUN_PY = Path(__file__).resolve().with_name("run.py")
_print_lock = threading.Lock()


class Progress:
    """Prints one line per (model, backend) start and result."""

    def __init__(self, total, unit, log=print):
        self.total, self.unit, self.log = total, unit, log
        self.eager_ms = {}

    def start(self, i, model, phase):
        with _print_lock:
            self.log(f"[{i}/{self.total}] {model} {phase} ...")

    def result(self, i, model, rec):
        parts = [f"[{i}/{self.total}] {model} {rec['backend']} {rec['status']}"]
        lat = rec.get("latency_ms")
        if lat is not None:
            parts.append(report.fmt_latency(lat, self.unit))
            if rec["backend"] == "eager":
                self.eager_ms[model] = lat
            elif self.eager_ms.get(model):
                parts.append(f"({self.eager_ms[model] / lat:.2f}x eager)")
        for key, label in (("compile_cold_s", "cold"), ("compile_warm_s", "warm")):
            if rec.get(key) is not None:
                parts.append(f"{label} {rec[key]:.1f}s")
        if rec.get("error"):
            parts.append("- " + rec["error"][:160])
        with _print_lock:
            self.log(" ".join(parts))


class Worker:
    """One worker process for one model and a list of backends, watched for time and death."""

    def __init__(self, cfg, workdir, env):
        stem = Path(workdir) / f"worker-{threading.get_ident()}-{time.monotonic_ns()}"
        self.events_path, self.log_path = stem.with_suffix(".jsonl"), stem.with_suffix(".log")
        self.events_path.touch()
        self.title = f"{cfg['model']}: {', '.join(cfg['backends'])}"
        config_path = stem.with_suffix(".json")
        config_path.write_text(json.dumps(dict(cfg, events=str(self.events_path))))
        cmd = [sys.executable, "-u", str(RUN_PY), "--worker", str(config_path)]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._lock = env.get(turns.LOCK_ENV)
        self._events = open(self.events_path)  # noqa: SIM115 - read as it grows; close() closes
        self._partial = ""

    def events(self):
        """Complete event lines written since the last call."""
        out = []
        chunk = self._partial + self._events.read()
        lines = chunk.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                out.append(json.loads(line))
        return out

    def kill(self):
        """Kill the worker's whole process group (it may have compile subprocesses)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def log_tail(self, lines=12):
        """The last lines this worker wrote to its log (to explain a crash)."""
        text = self.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def close(self, run_log):
        """Append this worker's output to the run's log (under a lock: workers may be parallel);
        continue the other workers, which this one, dead or killed in its timed phase, may have
        left stopped."""
        turns.unregister(self._lock, self.proc.pid)
        turns.resume_all(self._lock)
        self._events.close()
        text = self.log_path.read_text(errors="replace")
        with _print_lock, open(run_log, "a") as f:
            f.write(f"\n===== {self.title} =====\n{text}")


def exit_description(proc):
    """'exit code 1' or 'killed by SIGSEGV'."""
    rc = proc.returncode
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def crash_error(worker, phase, killed):
    """The error text for a backend whose worker died or was killed in `phase`."""
    if killed:
        return f"{killed} (worker killed during {phase})"
    tail = worker.log_tail()
    last = next(
        (x for x in reversed(tail) if "Error" in x or "Fatal" in x or "Exception" in x),
        tail[-1] if tail else "",
    )
    return f"worker {exit_description(worker.proc)} during {phase}: {last.strip()[:300]}"


def run_model_isolated(i, name, cfg, ctx):
    """Run one model's backends in worker processes; return ({backend: record}, shape)."""
    state = {"records": {}, "pending": list(cfg["backends"]), "shape": None}
    for _attempt in range(len(cfg["backends"]) + 1):
        if not state["pending"]:
            break
        worker = Worker(dict(cfg, backends=state["pending"]), ctx["workdir"], ctx["env"])
        try:
            phase, killed = _watch(worker, i, name, cfg, ctx, state)
        finally:
            if worker.proc.poll() is None:  # we are being interrupted: take the worker along
                worker.kill()
            worker.close(ctx["run_log"])
        _after_exit(worker, phase, killed, i, name, ctx, state)
    for b in state["pending"]:
        error = "no progress after worker restarts"
        state["records"][b] = _announce(ctx, i, name, b, {"status": "crashed", "error": error})
    return state["records"], state["shape"]


def _watch(worker, i, name, cfg, ctx, state):
    """Follow a worker's events until it exits (or is killed for time); return its last phase
    and why it was killed (None if it exited by itself)."""
    spawned = time.time()
    phase, phase_start, killed = None, time.time(), None
    while True:
        done = worker.proc.poll() is not None
        for ev in worker.events():
            if ev["event"] == "phase":
                phase, phase_start = ev["phase"], time.time()
                if phase == "build":
                    ctx["setup"].setdefault(name, {})["start_s"] = ev["t"] - spawned
                if phase in state["pending"]:
                    ctx["progress"].start(i, name, phase)
            else:
                _on_event(ev, i, name, ctx, state)
        if done:
            return phase, killed
        now = time.time()
        if now - phase_start > cfg["timeout"] + ctx["grace"]:
            killed = f"timed out after {cfg['timeout']:g} s (hard limit)"
        elif ctx["deadline"] and now > ctx["deadline"] + ctx["grace"]:
            killed = "part deadline reached"
        if killed:
            worker.kill()
            continue  # one more pass reads what it wrote before dying
        time.sleep(POLL_S)


def _on_event(ev, i, name, ctx, state):
    pending, records = state["pending"], state["records"]
    if ev["event"] == "ready":
        state["shape"] = ev.get("shape")
        if ev.get("device_name") and "meta" in ctx:
            ctx["meta"]["device_name"] = ev["device_name"]
        ctx["setup"].setdefault(name, {}).update(
            build_s=ev.get("build_s"), reference_s=ev.get("reference_s")
        )
        if ev.get("note"):
            ctx["notes"].append(f"{name}: {ev['note']}")
    elif ev["event"] == "fatal":
        for b in pending:
            records[b] = _announce(ctx, i, name, b, {"status": ev["status"], "error": ev["error"]})
        pending.clear()
    elif ev["event"] == "record" and ev["backend"] in pending:
        records[ev["backend"]] = _announce(ctx, i, name, ev["backend"], ev["record"])
        pending.remove(ev["backend"])


def _after_exit(worker, phase, killed, i, name, ctx, state):
    """Record what a dead or killed worker left unfinished."""
    pending = state["pending"]
    if not pending:
        return
    status = "timeout" if killed else "crashed"
    if phase in pending:  # died inside a backend: that backend fails, the rest get a new worker
        rec = {"status": status, "error": crash_error(worker, phase, killed)}
        state["records"][phase] = _announce(ctx, i, name, phase, rec)
        pending.remove(phase)
    elif phase in (None, "build", "reference"):
        error = "eager reference: " + crash_error(worker, phase or "start-up", killed)
        for b in pending:
            state["records"][b] = _announce(ctx, i, name, b, {"status": status, "error": error})
        pending.clear()
    # else: it stopped between backends (a soft timeout ends a worker): a new one goes on


def _announce(ctx, i, model, backend, rec):
    ctx["progress"].result(i, model, dict(rec, backend=backend))
    return rec


def run_model_inprocess(i, name, cfg, ctx):
    """Run one model's backends in this process (--isolate none: for debugging)."""
    import harness

    records, state = {}, {"shape": None}

    def emit(ev):
        if ev["event"] == "phase" and ev["phase"] in cfg["backends"]:
            ctx["progress"].start(i, name, ev["phase"])
        elif ev["event"] == "ready":
            state["shape"] = ev.get("shape")
            if ev.get("device_name") and "meta" in ctx:
                ctx["meta"]["device_name"] = ev["device_name"]
            ctx["setup"][name] = {
                "build_s": ev.get("build_s"),
                "reference_s": ev.get("reference_s"),
            }
            if ev.get("note"):
                ctx["notes"].append(f"{name}: {ev['note']}")
        elif ev["event"] == "fatal":
            for b in cfg["backends"]:
                records[b] = _announce(
                    ctx, i, name, b, {"status": ev["status"], "error": ev["error"]}
                )
        elif ev["event"] == "record":
            records[ev["backend"]] = _announce(ctx, i, name, ev["backend"], ev["record"])

    harness.run_model(cfg, emit)
    return records, state["shape"]


def skip(ctx, i, model, backends, status, error):
    """Records for a model that does not run (a missing package, the part's deadline)."""
    return {b: _announce(ctx, i, model, b, {"status": status, "error": error}) for b in backends}
