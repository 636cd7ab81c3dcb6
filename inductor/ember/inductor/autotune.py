"""Choice by measurement: candidate kernels timed on random inputs of the real layouts in a
subprocess, the fastest remembered on disk (max-autotune's matmul templates, gemm_template.py).

A `Choice` is a list of launches (a Triton kernel from its source with one launch config, or an
extern call by its vocabulary name) over named tensors; its time is the sum of its launches'.
`pick_many` times every problem the cache does not know (a graph's matmuls) in one worker.
The worker process (`python -m ember.inductor.autotune JOB`) compiles every Triton candidate on
a thread pool, then times each one (CUDA: triton.testing.do_bench; CPU: the median of a few
runs), printing one result line per choice as it goes. A candidate that fails to compile or
run is dropped; one that takes the worker down (a crash, not an exception) is dropped too: the
parent starts another worker for the rest, one candidate at a time, so the crash is pinned to
its candidate. The winner is stored under the cache directory by a hash of the device's name,
the versions, the tensors' layouts and every choice (so the template's source, its epilogue
and its configs): a warm start never times again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from ember.ir import cache_files

from . import metrics
from .runtime import cache_dir

log = logging.getLogger("ember.inductor")
RESULT = "EMBER_AUTOTUNE"  # the worker's result lines: RESULT <choice> <ms> | RESULT <i> error ..
TIMEOUT_S = 600


@dataclasses.dataclass
class Choice:
    """One candidate: its name and its launches, each a dict with "kind" "triton" (source, name,
    args: tensor names, sizes: the numels the kernel takes after its pointers, cfgs: its launch
    configs, of which the fastest counts, as Ember's runtime autotunes a kernel's block sizes)
    or "extern" (op, args: tensor names as {"tensor": name} or plain values, kwargs)."""

    label: str
    launches: list


def tensor_spec(layout) -> dict:
    """A loop-IR Layout as the worker rebuilds it (random values, the same strides)."""
    return {"dtype": str(layout.dtype).removeprefix("torch."),
            "sizes": [int(s) for s in layout.sizes], "strides": [int(s) for s in layout.strides],
            "offset": int(layout.offset), "storage": int(layout.storage_size())}  # fmt: skip


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"cpu {platform.machine()} {platform.processor()}"


def job_key(job: dict) -> str:
    import triton

    text = json.dumps([device_name(job["device"]), torch.__version__, triton.__version__, job],
                      sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / "gemm_autotune" / f"{key}.json"


def pick(choices: list[Choice], tensors: dict, device: str) -> tuple[int, dict]:
    """The index of the fastest choice that ran, and every choice's time in ms (None: failed),
    from the on-disk cache when these choices were timed before on this device. Raises
    RuntimeError when no choice ran."""
    (result,) = pick_many([(choices, tensors)], device)
    if isinstance(result, Exception):
        raise result
    return result


def pick_many(problems: list, device: str) -> list:
    """`pick` for several (choices, tensors) problems (a graph's matmuls): those not in the
    cache are timed together, in one worker (one process start and one CUDA context for all).
    Each result is (index, times), or a RuntimeError where no choice of that problem ran."""
    jobs = [{"device": device, "tensors": tensors,
             "choices": [dataclasses.asdict(c) for c in choices]}  # fmt: skip
            for choices, tensors in problems]
    results: list = [None] * len(jobs)
    misses = []
    for j, job in enumerate(jobs):
        key = job_key(job)
        labels = [c["label"] for c in job["choices"]]
        try:
            stored = json.loads(_path(key).read_text())
            if stored.get("key") == key and stored.get("winner") in labels:
                metrics.gemm_autotune_hits += 1
                results[j] = (labels.index(stored["winner"]), stored.get("times", {}))
                continue
        except (OSError, ValueError, AttributeError):
            pass
        misses.append((j, key))
    if not misses:
        return results
    metrics.gemm_autotune_runs += len(misses)
    merged, spans = _merged([jobs[j] for j, _ in misses], device)
    times = measure(merged)
    for (j, key), (lo, hi) in zip(misses, spans):
        labels = [c["label"] for c in jobs[j]["choices"]]
        mine = times[lo:hi]
        ran = [i for i, t in enumerate(mine) if t is not None]
        if not ran:
            results[j] = RuntimeError("ember.inductor autotune: no candidate ran: "
                                      + ", ".join(labels))  # fmt: skip
            continue
        best = min(ran, key=mine.__getitem__)
        by_label = dict(zip(labels, mine))
        entry = {"key": key, "winner": labels[best], "times": by_label}
        cache_files.try_write_atomic(_path(key), json.dumps(entry))
        log.debug("autotune: %s", by_label)
        results[j] = (best, by_label)
    return results


def _merged(jobs: list, device: str) -> tuple[dict, list]:
    """One job timing every choice of `jobs` (their tensors kept apart by a prefix), and the
    span of each job's choices in it."""
    tensors, choices, spans = {}, [], []
    for j, job in enumerate(jobs):
        def name(t, j=j):
            return f"{j}/{t}"

        tensors.update({name(t): spec for t, spec in job["tensors"].items()})
        lo = len(choices)
        for c in job["choices"]:
            launches = []
            for launch in c["launches"]:
                if launch["kind"] == "extern":
                    args = [{"tensor": name(a["tensor"])} if isinstance(a, dict) else a
                            for a in launch["args"]]  # fmt: skip
                else:
                    args = [name(a) for a in launch["args"]]
                launches.append({**launch, "args": args})
            choices.append({"label": c["label"], "launches": launches})
        spans.append((lo, len(choices)))
    return {"device": device, "tensors": tensors, "choices": choices}, spans


def measure(job: dict) -> list[Optional[float]]:
    """Each choice's time in ms (None where it failed or crashed its worker), from workers."""
    n = len(job["choices"])
    times: dict[int, Optional[float]] = {}
    serial = False
    while len(times) < n:
        todo = [i for i in range(n) if i not in times]
        done, died, started = _run_worker(job, todo, serial)
        times.update(done)
        if not died:
            for i in todo:  # (a worker that ends normally has reported every choice)
                times.setdefault(i, None)
            continue
        if serial and started is not None and started not in done:
            # one candidate at a time: the one it had started took it down
            log.debug("autotune: %s crashed its worker", job["choices"][started]["label"])
            times[started] = None
        elif serial and not done:  # it died before any candidate (no device, no memory)
            log.debug("autotune: the worker died before timing anything")
            times.update(dict.fromkeys(todo))
        serial = True  # (a worker whose CUDA context an error broke ends, and the rest go on)
    return [times[i] for i in range(n)]


def _run_worker(job: dict, todo: list, serial: bool) -> tuple[dict, bool, Optional[int]]:
    """Run one worker on the choices `todo`: (their results so far, whether it died before
    reporting them all, the last choice it started)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps({**job, "todo": todo, "serial": serial}))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
        try:
            proc = subprocess.run([sys.executable, "-m", "ember.inductor.autotune", str(path)],
                                  env=env, capture_output=True, timeout=TIMEOUT_S)  # fmt: skip
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:  # a hung candidate: as a crash
            out, rc = e.stdout or b"", -1
    out = out.decode(errors="replace")
    done, started = {}, None
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[0] != RESULT:
            continue
        i = int(parts[1])
        if parts[2] == "start":
            started = i
        elif parts[2] == "error":
            log.debug("autotune: %s failed: %s", job["choices"][i]["label"], parts[3:])
            done[i] = None
        else:
            done[i] = float(parts[2])
    return done, rc != 0 and len(done) < len(todo), started


# --- the worker ----------------------------------------------------------------------------------


def _make_tensor(spec: dict, device: str) -> torch.Tensor:
    dtype = getattr(torch, spec["dtype"])
    n = max(spec["storage"], 1)
    if dtype.is_floating_point:
        base = torch.randn(n, device=device).to(dtype)
    elif dtype == torch.bool:
        base = torch.rand(n, device=device) < 0.5
    else:
        base = torch.randint(0, 2, (n,), device=device).to(dtype)
    return base.as_strided(spec["sizes"], spec["strides"], spec["offset"])


def _launchers(launch: dict, tensors: dict) -> list:
    """No-argument callables running one launch, one per launch config (Triton's module is
    loaded, the kernel not yet compiled)."""
    from .runtime import _grid, _load_module, block_constants, extern, launch_options

    if launch["kind"] == "extern":
        fn = extern(launch["op"])
        args = [tensors[a["tensor"]] if isinstance(a, dict) else a for a in launch["args"]]
        kwargs = launch.get("kwargs", {})
        return [lambda: fn(*args, **kwargs)]
    kernel = getattr(_load_module(launch["source"]), launch["name"])
    sizes, args = launch["sizes"], [tensors[a] for a in launch["args"]]

    def run(cfg):
        grid, consts, options = _grid(sizes, cfg), block_constants(cfg), launch_options(cfg)
        return lambda: kernel[grid](*args, *sizes, **consts, **options)

    return [run(cfg) for cfg in launch["cfgs"]]


def _time(fn, device: str) -> float:
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=50))
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return sorted(runs)[1]


def _worker(path: str) -> None:
    job = json.loads(Path(path).read_text())
    device = job["device"]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    torch.manual_seed(0)
    tensors = {name: _make_tensor(spec, device) for name, spec in job["tensors"].items()}
    choices = job["choices"]

    def prepare(i):
        if device.startswith("cuda"):  # the current device is per thread
            torch.cuda.set_device(torch.device(device))
        calls = [_launchers(launch, tensors) for launch in choices[i]["launches"]]
        for alternatives in calls:
            for call in alternatives:  # the first run compiles
                call()
        return calls

    ready: dict = {}
    if not job["serial"]:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
            futures = {i: pool.submit(prepare, i) for i in job["todo"]}
        for i, f in futures.items():
            ready[i] = f.exception() or f.result()
    for i in job["todo"]:
        print(f"{RESULT} {i} start", flush=True)
        try:
            calls = ready.get(i)
            if calls is None or isinstance(calls, BaseException):
                # prepared again on its own: a failure beside other compiles may be theirs
                # (Triton's interpreter patches triton.language for the thread that runs it)
                calls = prepare(i)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            ms = sum(min(_time(c, device) for c in alternatives) for alternatives in calls)
            print(f"{RESULT} {i} {ms!r}", flush=True)
        except Exception as e:  # noqa: BLE001  (reported to the parent, which drops the choice)
            print(f"{RESULT} {i} error {type(e).__name__}: {str(e)[:200]!r}", flush=True)
            if _cuda_broken(device):
                sys.exit(3)  # an illegal address spoils the context: the rest in a new worker


def _cuda_broken(device: str) -> bool:
    """Whether the CUDA context is unusable after an error (a sticky fault, as from an
    out-of-bounds access), so that every later launch in this process would fail too."""
    if not device.startswith("cuda"):
        return False
    try:
        torch.cuda.synchronize()
        torch.empty(1, device=device).add_(1)
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001
        return True


if __name__ == "__main__":
    _worker(sys.argv[1])


__all__ = ["Choice", "measure", "pick", "pick_many", "tensor_spec"]
