"""Race eager, torch.compile and Ember model by model; write results.md, results.json and a chart.

    python bench/run.py --suite gpu-core --mode infer-bf16 --part 1/4 --out /tmp/bench/bf16-1
    python bench/run.py --suite cpu-core --smoke --out /tmp/bench_smoke

Each model runs in a fresh worker process (all of its backends in that one process, on one
device), so a crash, a hang or leaked state in one backend costs only that (model, backend) cell:
it is recorded as failed with its error and the remaining backends go on in a new worker. See
README.md for the suites, the measurements and the commands.
"""

import argparse
import dataclasses
import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import _paths  # noqa: F401 - puts the Ember components on sys.path
import backends as backend_registry
import models as model_registry
import models_broad
import report
import suites
import workers

GRACE_S = 30.0  # after a soft timeout, time for the worker to write its record before a hard kill
CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "EMBER_CACHE_DIR": "ember",
}


def worker_main(config_path):
    """Entry point of a worker process: run one model, append events to the events file."""
    import faulthandler

    faulthandler.enable()  # a segfault in a backend leaves a Python traceback in the log
    import harness
    import turns

    turns.register()  # other workers' timed phases pause this one (see turns.py)
    cfg = json.loads(Path(config_path).read_text())
    with open(cfg["events"], "a") as events:

        def emit(event):
            event["t"] = time.time()
            events.write(json.dumps(event) + "\n")
            events.flush()

        harness.run_model(cfg, emit)
    return 0


def resolve_device(suite, device, log=print):
    """The device to run on: --device, else the suite's, falling back to the CPU without CUDA."""
    import torch

    device = device or suite.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        log(f"warning: suite {suite.name} is meant for CUDA, which is not available; using the CPU")
        device = "cpu"
    return device


def _cache_env(root):
    return {var: str(Path(root) / sub) for var, sub in CACHE_VARS.items()}


def prepare_caches(ctx, plan):
    """Let each compiling backend make its one-time builds (Ember's native extensions, say) by
    compiling a one-op function into <cache>/_base, which every model's caches start from: so a
    model's cold compile is the model's own, not the first-ever use of the backend."""
    compiled = [
        b
        for b in plan["backends"]
        if backend_registry.get(b).compiles and backend_registry.get(b).prepare
    ]
    base = ctx["cache_root"] / "_base"
    with ctx["prepare_lock"]:  # once per run, before the first model that runs
        if compiled and not base.exists():
            _prepare(ctx, plan, compiled, base)
            base.mkdir(parents=True, exist_ok=True)  # a failed preparation is not retried


def _prepare(ctx, plan, compiled, base):
    cfg = dict(
        plan["cfg"],
        model="add_one",
        mode="infer-fp32",
        batch=None,
        seq=None,
        accuracy=False,
        copy_bw=False,
        backends=compiled,
        timing=dataclasses.asdict(
            dataclasses.replace(plan["timing"], warmup=0, iters=1, loop_calls=0)
        ),
    )
    quiet = dict(
        ctx,
        env={**os.environ, **_cache_env(base)},
        setup={},
        notes=[],
        progress=workers.Progress(1, "ms", log=lambda *a: None),
    )
    ctx["log"]("preparing compile caches (one-op compile per backend) ...")
    workers.run_model_isolated(0, "add_one", cfg, quiet)


def run_one(i, name, ctx, plan, gpu=None):
    """All backends of one model (in a worker process unless --isolate none)."""
    spec = model_registry.MODELS[name]
    backends = plan["backends"]
    missing = model_registry.missing_requirements(spec)
    if missing:
        return workers.skip(ctx, i, name, backends, "skipped", "needs " + ", ".join(missing)), None
    if ctx["deadline"] and time.time() > ctx["deadline"]:
        return workers.skip(ctx, i, name, backends, "not run", "part deadline reached"), None
    batch, seq = plan["batch"], plan["seq"]
    if plan["device"] == "cpu" and name in plan["suite"].cpu_shapes:
        batch, seq = (
            batch or plan["suite"].cpu_shapes[name][0],
            seq or plan["suite"].cpu_shapes[name][1],
        )
    cfg = dict(plan["cfg"], model=name, batch=batch, seq=seq)
    if ctx["isolate"] != "none":
        prepare_caches(ctx, plan)
    model_cache = ctx["cache_root"] / name
    if (ctx["cache_root"] / "_base").exists() and not model_cache.exists():
        shutil.copytree(ctx["cache_root"] / "_base", model_cache, symlinks=True)
    env = {**os.environ, **_cache_env(model_cache), "PYTHONUNBUFFERED": "1"}
    if plan["cfg"].get("threads"):  # OpenMP in generated CPU kernels follows torch's count
        env["OMP_NUM_THREADS"] = str(plan["cfg"]["threads"])
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    host_turns = plan["turns"] == "host" and (plan["gpus"] > 1 or plan["jobs"] > 1)
    if (plan["jobs"] > 1 or host_turns) and "EMBER_BENCH_TIMING_LOCK" not in os.environ:
        # workers sharing a device time their calls one at a time (a lock named in the
        # environment is shared with other runs on the same device too); --turns host: every
        # worker of the host, whatever its GPU, so no compile loads the CPU while a step is timed
        where = "host" if host_turns else gpu or 0
        env["EMBER_BENCH_TIMING_LOCK"] = str(ctx["cache_root"] / f"timing-{where}.lock")
    if ctx["isolate"] == "none":
        os.environ.update(_cache_env(model_cache))
        return workers.run_model_inprocess(i, name, cfg, ctx)
    return workers.run_model_isolated(i, name, cfg, dict(ctx, env=env))


def _run_models(names, ctx, plan, on_done):
    """Run every model, on one GPU or spread over `gpus` GPUs, `jobs` workers per GPU at a time
    (several jobs on one GPU compile side by side; their timed phases take turns, see
    turns.timing_turn)."""
    gpus, jobs = plan["gpus"], plan["jobs"]
    if gpus <= 1 and jobs <= 1:
        for i, name in enumerate(names, 1):
            on_done(name, *run_one(i, name, ctx, plan))
        return
    free = queue.Queue()
    for g in range(gpus):
        for _ in range(jobs):
            free.put(g if gpus > 1 else None)

    def job(i, name):
        gpu = free.get()
        try:
            on_done(name, *run_one(i, name, ctx, plan, gpu))
        finally:
            free.put(gpu)

    threads = [threading.Thread(target=job, args=(i, n)) for i, n in enumerate(names, 1)]
    for t in threads:  # at most gpus * jobs run at once: the others wait for a slot in job()
        t.start()
    for t in threads:
        t.join()


@dataclasses.dataclass
class Options:
    """What to run and how (the CLI flags; see parse_args for each one's meaning)."""

    mode: str = None
    models: list = None
    backends: list = None
    device: str = None
    part: str = None
    smoke: bool = False
    isolate: str = "model"
    model_timeout: float = None
    deadline: float = None
    batch: int = None
    seq: int = None
    warmup: int = None
    iters: int = None
    accuracy: bool = True
    cache_dir: str = None
    chart: bool = True
    gpus: int = 1
    jobs: int = 1
    turns: str = "device"  # whose timed phases take turns: each device's workers, or the host's
    threads: int = None
    command: str = None
    grace: float = GRACE_S
    warm_compile: bool = None  # None: the suite's default
    subset: str = None  # a suite's named subset of models (--core: gpu-broad's gpu-core models)


def _plan(suite, opt, log):
    """Resolve suite defaults and check names; exits with a clear message on a bad option."""
    suite = suites.get(suite) if isinstance(suite, str) else suite
    mode = opt.mode or suite.modes[0]
    if mode not in suite.modes:
        raise SystemExit(f"suite {suite.name} runs modes {', '.join(suite.modes)}, not {mode!r}")
    backends = list(opt.backends or (suite.smoke_backends if opt.smoke else ()) or suite.backends)
    for b in backends:
        backend_registry.get(b)
    if "eager" not in backends:
        backends.insert(0, "eager")  # every speedup is relative to eager, in the same worker
    if opt.subset and opt.subset not in suite.subsets:
        known = ", ".join(suite.subsets) or "none"
        raise SystemExit(f"suite {suite.name} has no subset {opt.subset!r} (its subsets: {known})")
    subset = suite.subsets[opt.subset] if opt.subset else None
    names = list(opt.models or subset or (suite.smoke if opt.smoke else suite.models))
    for m in names:
        if m not in model_registry.MODELS:
            raise SystemExit(f"unknown model {m!r}; known: {', '.join(model_registry.MODELS)}")
    device = resolve_device(suite, opt.device, log)
    timing = suite.smoke_timing if opt.smoke and suite.smoke_timing else suite.timing
    if opt.warmup is not None:
        timing = dataclasses.replace(timing, warmup=opt.warmup)
    if opt.iters:
        timing = dataclasses.replace(timing, iters=opt.iters)
    timeout = opt.model_timeout or suite.model_timeout
    gpus = max(1, opt.gpus if device.startswith("cuda") else 1)
    opt.threads = suite.threads if opt.threads is None else (opt.threads or None)
    jobs = max(1, opt.jobs)
    if opt.isolate == "none" and (gpus > 1 or jobs > 1):
        raise SystemExit("--gpus and --jobs need worker processes (not --isolate none)")
    cfg = {"backends": backends, "mode": mode, "device": device, "accuracy": opt.accuracy,
           "timing": dataclasses.asdict(timing), "timeout": timeout,
           "threads": opt.threads, "copy_bw": suite.name == "roofline",
           "warm_compile": suite.warm_compile if opt.warm_compile is None
           else opt.warm_compile}  # fmt: skip
    if opt.turns not in ("device", "host"):
        raise SystemExit(f"--turns takes device or host, not {opt.turns!r}")
    return {"suite": suite, "mode": mode, "backends": backends, "device": device,
            "timing": timing, "timeout": timeout, "batch": opt.batch, "seq": opt.seq, "cfg": cfg,
            "part_models": suites.part_of(names, opt.part), "gpus": gpus, "jobs": jobs,
            "turns": opt.turns}  # fmt: skip


def run_suite(suite, out_dir, log=print, **options):
    """Run a suite (or part of it) and write results.md/json and a chart into `out_dir`.

    `options` are the fields of `Options`. Returns the run dict that results.json holds. Never
    raises for a model or backend failure: those become records with status failed, timeout,
    crashed, inaccurate or fallback and their error. Interrupted (SIGTERM, Ctrl-C), it records
    the models it did not finish as "not run", writes the results, then re-raises.
    """
    started = time.time()
    opt = Options(**options)
    plan = _plan(suite, opt, log)
    suite, names = plan["suite"], plan["part_models"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_root = Path(opt.cache_dir or tempfile.mkdtemp(prefix="ember-bench-cache-"))
    workdir = Path(tempfile.mkdtemp(prefix="ember-bench-work-"))
    run = _new_run(suite, plan, opt)
    plan["cfg"]["deadline"] = started + opt.deadline if opt.deadline else None
    ctx = {"workdir": workdir, "progress": workers.Progress(len(names), suite.unit, log),
           "deadline": plan["cfg"]["deadline"], "notes": run["notes"], "isolate": opt.isolate,
           "grace": opt.grace, "setup": run["setup"], "cache_root": cache_root,
           "run_log": out_dir / "run.log", "log": log, "meta": run["meta"],
           "prepare_lock": threading.Lock()}  # fmt: skip
    log(
        f"suite {suite.name} mode {plan['mode']} on {plan['device']}: {len(names)} models x "
        f"{len(plan['backends'])} backends ({', '.join(plan['backends'])}); output in {out_dir}"
    )
    results, lock = {}, threading.Lock()

    def on_done(name, records, shape):
        with lock:
            results[name] = (records, shape)
            run["records"] = _ordered_records(names, plan["backends"], results)
            run["elapsed_s"] = time.time() - started
            report.write(out_dir, [run], chart=False)  # partial results survive a kill

    try:
        _run_models(names, ctx, plan, on_done)
    except BaseException:
        for name in names:  # keep every model in the table, even when interrupted
            if name not in results:
                stub = {"status": "not run", "error": "the run was interrupted"}
                results[name] = ({b: stub for b in plan["backends"]}, None)
        run["records"] = _ordered_records(names, plan["backends"], results)
        run["elapsed_s"] = time.time() - started
        report.write(out_dir, [run], chart=False)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if opt.cache_dir is None:
            shutil.rmtree(cache_root, ignore_errors=True)
    run["elapsed_s"] = time.time() - started
    run["meta"] = report.environment(plan["device"])
    report.write(out_dir, [run], chart=opt.chart, log=log)
    log(report.markdown([run]))
    return run


def _new_run(suite, plan, opt):
    """The run dict that results.json holds, before any model ran."""
    return {
        "suite": suite.name, "mode": plan["mode"], "device": plan["device"], "part": opt.part,
        "smoke": opt.smoke, "backends": plan["backends"], "models": plan["part_models"],
        "suite_models": list(suite.models), "unit": suite.unit,
        "timing": plan["timing"].describe(plan["device"]), "records": [], "notes": [],
        "command": opt.command or "run_suite(...)", "isolate": opt.isolate, "gpus": plan["gpus"],
        "jobs": plan["jobs"], "turns": plan["turns"], "threads": opt.threads,
        "model_timeout_s": plan["timeout"], "setup": {},
        "warm_compile": plan["cfg"]["warm_compile"],
        # Versions now (no CUDA in this process yet): the device name comes from the first
        # worker, and the whole environment is read again at the end.
        "meta": report.environment(plan["device"], probe_device=False),
    }  # fmt: skip


def _ordered_records(names, backends, results):
    records = []
    for name in names:
        if name in results:
            recs, shape = results[name]
            records += [{"model": name, "backend": b, "shape": shape, **recs[b]} for b in backends]
    return records


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", help=f"one of {', '.join(suites.SUITES)}")
    p.add_argument(
        "--mode",
        help="infer-bf16, infer-fp32, train-amp or train-fp32 (default: the suite's first)",
    )
    p.add_argument("--models", help="comma-separated subset of the suite's models (or any known)")
    p.add_argument(
        "--backends",
        help="comma-separated, from: "
        + ", ".join(backend_registry.BACKENDS)
        + " (eager is always added)",
    )
    p.add_argument("--part", help="i/n: run the i-th of n parts (merge them with merge.py)")
    p.add_argument("--out", help="output directory")
    p.add_argument("--device", help="cuda or cpu (default: the suite's device)")
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch and OpenMP kernels in the workers (default: the suite's; "
        "cpu-core uses 1, steady on shared machines; 0: torch's default)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="run models side by side on this many GPUs of one host, one worker per GPU",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="workers per device at a time: their compiles overlap; a worker's warm-up and timed "
        "calls run with the other workers stopped (cold and warm compile times then include "
        "the sharing of the CPU, less the time stopped)",
    )
    p.add_argument(
        "--turns",
        choices=("device", "host"),
        default="device",
        help="whose workers a timed phase stops: its device's (default), or every worker of the "
        "host (with --gpus N: no other GPU's compile loads the CPU while a step is timed, at "
        "the cost of timed phases taking turns across GPUs)",
    )
    p.add_argument("--smoke", action="store_true", help="the suite's quick subset (cpu-core)")
    p.add_argument(
        "--core",
        action="store_true",
        help="only the suite's gpu-core models (gpu-broad: the 19 of gpu-core; same as "
        "--suite gpu-core but reported under the broad suite)",
    )
    p.add_argument(
        "--model-timeout",
        type=float,
        help="seconds per model and backend, compile included (default: the suite's)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        help="seconds for the whole run; models not started by then are recorded as 'not run'",
    )
    p.add_argument("--batch-size", type=int, help="override every model's batch size")
    p.add_argument("--seq-len", type=int, help="override every text model's sequence length")
    p.add_argument("--warmup", type=int, help="warm-up calls after the first (compiling) call")
    p.add_argument("--iters", type=int, help="timed calls at most (rounds for the overhead suite)")
    p.add_argument("--no-accuracy", action="store_true", help="skip the accuracy checks")
    p.add_argument(
        "--warm-compile",
        choices=("on", "off"),
        help="time a warm compile per backend (default: the suite's; gpu-broad: off)",
    )
    p.add_argument(
        "--isolate",
        choices=("model", "none"),
        default="model",
        help="model: a worker process per model (default); none: all in this process",
    )
    p.add_argument(
        "--cache-dir",
        help="keep compile caches here (default: a fresh temporary dir "
        "per run, so cold compiles are cold)",
    )
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument("--list", action="store_true", help="list suites, models and backends")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def list_all():
    for s in suites.SUITES.values():
        print(f"{s.name}: {s.description}\n  modes: {', '.join(s.modes)}\n  models: "
              f"{', '.join(s.models)}")  # fmt: skip
        if s.smoke:
            print(f"  smoke: {', '.join(s.smoke)}")
        if s.parts:
            pieces = ", ".join(f"{m} {n}" for m, n in s.parts.items())
            print(f"  parts on the device (an H100 host): {pieces}")
        for subset, names in s.subsets.items():
            print(f"  --{subset}: {', '.join(names)}")
    print("families (gpu-broad):")
    broad = suites.SUITES["gpu-broad"].models
    for family, what in models_broad.FAMILIES.items():
        names = [m for m in broad if model_registry.MODELS[m].family == family]
        print(f"  {family} ({len(names)}): {what}\n    {', '.join(names)}")
    print("backends:")
    for b in backend_registry.BACKENDS.values():
        print(f"  {b.name}: {b.description}")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: running workers are killed, results are kept


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.list:
        list_all()
        return 0
    if not args.suite or not args.out:
        raise SystemExit("need --suite and --out (or --list)")

    def split(s):
        return [x.strip() for x in s.split(",") if x.strip()] if s else None

    run_suite(
        args.suite, args.out, mode=args.mode, models=split(args.models),
        backends=split(args.backends), device=args.device, part=args.part, smoke=args.smoke,
        isolate=args.isolate, model_timeout=args.model_timeout, deadline=args.deadline,
        batch=args.batch_size, seq=args.seq_len, warmup=args.warmup, iters=args.iters,
        accuracy=not args.no_accuracy, cache_dir=args.cache_dir, chart=not args.no_chart,
        gpus=args.gpus, jobs=args.jobs, turns=args.turns, threads=args.threads, subset="core" if args.core else None,
        warm_compile=None if args.warm_compile is None else args.warm_compile == "on",
        command="python bench/run.py " + " ".join(argv),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
