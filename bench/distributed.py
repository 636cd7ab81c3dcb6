"""Distributed training on 2 ranks under eager, torch.compile and Ember: a GPT-2-small-sized decoder
trained with AdamW (AMP bf16) under DDP and FSDP2, and a tensor parallel MLP block.

    python bench/distributed.py --out $OUT/dist                   # 2 GPUs, NCCL (< 8 minutes)
    python bench/distributed.py --device cpu --tiny --out /tmp/d  # 2 CPU processes, gloo

The parent spawns a fresh pair of rank processes for each configuration (parallelism x
backend), so a failure, a hang or a memory blow-up of one configuration is recorded as its
error and the next one still runs; results.json and results.md are rewritten after each.

Per configuration: the step time (median of --steps timed steps after warm-up, each step
synchronised), the first step (compiles included), peak GPU memory over the timed steps, graphs
and breaks (Ember: its capture statistics; torch.compile: dynamo's counters), the gradients
after one step against eager's (each rank's local gradients against an eager copy built from
the same weights, same batch, in the same process; relative norm of the difference, summed
over ranks) and, from the torch profiler over --profile-steps steps, NCCL kernel time and the
part of it not overlapped by other kernels on the same GPU (exposed communication).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from datetime import timedelta

import _paths  # noqa: F401  (puts Ember's components on sys.path)
import torch
import torch.nn as nn
import torch.nn.functional as F
from measure import host_profile, merge_intervals

PARALLEL = ("ddp", "fsdp")
BACKENDS = ("eager", "torch_compile", "ember")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for results.json and results.md")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a 2-layer d=64 model (CPU tests)")
    p.add_argument("--quick", action="store_true", help="seq 512, 5 timed steps, 2 profiled")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10, quick 5)")
    p.add_argument("--warmup", type=int, default=2, help="steps after the first, untimed")
    p.add_argument("--profile-steps", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="sequences per rank")
    p.add_argument("--amp", default="bf16", choices=("bf16", "none"))
    p.add_argument("--parallel", default=",".join(PARALLEL), help="ddp,fsdp")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--no-tp", action="store_true", help="skip the tensor parallel MLP block")
    p.add_argument("--host-profile", type=int, default=0,
                   help="steps run under cProfile on rank 0 after the timed ones (host time)")
    p.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole run")
    p.add_argument("--config-timeout", type=float, default=200.0)
    # worker mode (set by the parent)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    ns.steps = ns.steps or (5 if ns.quick else 10)
    ns.profile_steps = ns.profile_steps if ns.profile_steps is not None else (2 if ns.quick else 3)
    if ns.tiny:
        shape = dict(layers=2, d=64, heads=4, vocab=128, seq=32, batch=2, hidden=256)
    else:  # GPT-2 small: 12 layers, d=768, 12 heads, 50257 tokens
        shape = dict(layers=12, d=768, heads=12, vocab=50257, seq=512 if ns.quick else 1024,
                     batch=8, hidden=3072)  # fmt: skip
    for key in ("layers", "seq", "batch"):
        if getattr(ns, key) is not None:
            shape[key] = getattr(ns, key)
    ns.shape = shape
    return ns


# -- the model ---------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, hidden)
        self.out = nn.Linear(hidden, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Decoder(nn.Module):
    """GPT-2's shape (pre-norm blocks, learned positions), an untied head; returns the loss."""

    def __init__(self, layers, d, heads, vocab, seq, hidden, **_):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class TPMLP(nn.Module):
    """The MLP of one block, for tensor parallelism: colwise fc -> GELU -> rowwise out."""

    def __init__(self, d, hidden, **_):
        super().__init__()
        self.fc = nn.Linear(d, hidden)
        self.out = nn.Linear(hidden, d)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x), approximate="tanh"))


# -- measuring -----------------------------------------------------------------------------------


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _amp(cfg, device):
    if cfg.amp == "none":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _grads(model) -> list:
    """Each parameter's local gradient (a DTensor's shard), as float32 copies."""
    return [None if p.grad is None else _local(p.grad).detach().float().clone()
            for p in model.parameters()]  # fmt: skip


def grad_agreement(got: list, ref: list) -> dict:
    """||got - ref|| / ||ref|| over all parameters of this rank, and the worst parameter's."""
    num = den = 0.0
    worst = 0.0
    missing = 0
    for g, r in zip(got, ref):
        if r is None or g is None:
            missing += (r is None) != (g is None)
            continue
        d2, r2 = float((g - r).pow(2).sum()), float(r.pow(2).sum())
        num, den = num + d2, den + r2
        worst = max(worst, math.sqrt(d2 / r2) if r2 > 0 else math.sqrt(d2))
    return {"rel": num, "den": den, "worst_param_rel": worst, "missing": missing}


def exposed_time(comm, compute) -> float:
    """Length of the union of `comm` intervals not covered by the union of `compute` ones."""
    comm, compute = merge_intervals(comm), merge_intervals(compute)
    exposed, j = 0.0, 0
    for s, e in comm:
        covered = 0.0
        while j < len(compute) and compute[j][1] <= s:
            j += 1
        k = j
        while k < len(compute) and compute[k][0] < e:
            covered += min(e, compute[k][1]) - max(s, compute[k][0])
            k += 1
        exposed += (e - s) - covered
    return exposed


def comm_spans(comm, compute) -> dict:
    """kind -> [(duration, exposed)] of each communication kernel in start order, by kind (the
    kernel's name): `comm` holds (name, start, end), exposed is the part of it no `compute`
    interval covers."""
    merged = merge_intervals(compute)
    out: dict = {}
    for name, s, e in sorted(comm, key=lambda k: k[1]):
        out.setdefault(name, []).append((e - s, exposed_time([(s, e)], merged)))
    return out


def matched_exposure(per_rank: list):
    """(communication, exposed communication) summed over collectives, each collective's the
    least over the ranks: a kernel of a collective spans its rank's wait for the others, so the
    rank that arrived last shows the transfer itself. The ranks' kernels of one kind are matched
    in start order (every rank issues the collectives in one order); collectives of different
    kinds running at once (FSDP's next all-gather beside a reduce-scatter) each count. None if
    the ranks' kernels do not match."""
    if not per_rank or any(not isinstance(r, dict) for r in per_rank):
        return None
    kinds = set(per_rank[0])
    if any(set(r) != kinds or any(len(r[k]) != len(per_rank[0][k]) for k in kinds)
           for r in per_rank):  # fmt: skip
        return None
    comm = exposed = 0.0
    for k in kinds:
        for spans in zip(*(r[k] for r in per_rank)):
            comm += min(d for d, _ in spans)
            exposed += min(x for _, x in spans)
    return comm, exposed


def _is_comm_kernel(name: str) -> bool:
    n = name.lower()
    return "nccl" in n


def _is_compute_kernel(name: str) -> bool:
    n = name.lower()
    return not _is_comm_kernel(n) and not n.startswith(("memcpy", "memset"))


def profile_comm(step, cfg, device) -> dict:
    """NCCL kernel time per step and the part no other kernel on this GPU overlaps (ms)."""
    from torch.profiler import ProfilerActivity, profile

    # kernels only on the GPU: CPU ops would multiply the events to parse by ten
    acts = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    _sync(device)
    with profile(activities=acts) as prof:
        for _ in range(cfg.profile_steps):
            step()
        _sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    named = [(e.name, e.time_range.start, e.time_range.end) for e in kernels
             if _is_comm_kernel(e.name)]  # fmt: skip
    comm = [(s, e) for _, s, e in named]
    compute = [(e.time_range.start, e.time_range.end) for e in kernels
               if _is_compute_kernel(e.name)]  # fmt: skip
    if not kernels:
        return {"note": "no device kernels (CPU run): exposed communication not measured"}
    n = max(cfg.profile_steps, 1)
    comm_ms = sum(e - s for s, e in merge_intervals(comm)) / 1e3 / n
    busy_ms = sum(e - s for s, e in merge_intervals(comm + compute)) / 1e3 / n
    exposed_ms = exposed_time(comm, compute) / 1e3 / n
    return {"comm_ms": comm_ms, "exposed_comm_ms": exposed_ms,
            "overlapped_pct": 100.0 * (1 - exposed_ms / comm_ms) if comm_ms else None,
            "comm_kernels": len(comm),
            "gpu_busy_ms": busy_ms,  # any kernel running: the rest of a step is host time
            "spans": comm_spans(named, compute), "steps": n}  # matched over ranks by _worker


def _capture_counts(backend) -> dict:
    if backend == "ember":
        import ember.dynamo
        from ember.inductor import metrics

        s = ember.dynamo.convert.stats
        return {"graphs": len(s.graphs), "breaks": len(s.breaks) + len(s.failures),
                # each captured graph's pieces, one per DDP gradient bucket (1: not split)
                "pieces": [g.gm.meta.get("ember_ddp_pieces", 1) for g in s.graphs],
                "cudagraphs": {"replays": metrics.cudagraph_replays,
                               "plain_calls": metrics.cudagraph_plain_calls,
                               "given_up": metrics.cudagraph_skips[:4]},
                "break_reasons": sorted({f"{b.reason} @ {b.where}" for b in s.breaks
                                         + s.failures})[:8]}  # fmt: skip
    if backend == "torch_compile":
        from torch._dynamo.utils import counters

        reasons = counters.get("graph_break", {})
        return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
                "breaks": int(sum(reasons.values())),
                "break_reasons": sorted({r.splitlines()[0] for r in reasons})[:8]}
    return {}


def _compile(model, backend):
    if backend == "eager":
        return model
    if backend == "torch_compile":
        return torch.compile(model)
    if backend == "ember":
        import ember

        return ember.compile(model)
    raise ValueError(f"unknown backend {backend}")


def _reset_compilers():
    import ember
    import torch._dynamo

    from torch._dynamo.utils import counters

    ember.reset()
    torch._dynamo.reset()
    counters.clear()  # reset() keeps dynamo's counters (graphs, breaks)


# -- one configuration, on each rank -------------------------------------------------------------


def _batches(cfg, device, rank, n):
    s = cfg.shape
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(n):
        idx = torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1), generator=gen)
        out.append((idx[:, :-1].to(device), idx[:, 1:].to(device)))
    return out


def _wrap(model, parallel, device):
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def train_config(cfg, parallel, backend, device, rank) -> dict:
    """Step time, memory, capture counts, first-step gradients against eager's, comm overlap."""
    torch.manual_seed(0)
    base = Decoder(**cfg.shape).to(device)
    batches = _batches(cfg, device, rank, 4)
    report = {}

    def make_step(model, opt):
        state = {"i": 0}

        def step():
            idx, tgt = batches[state["i"] % len(batches)]
            state["i"] += 1
            with _amp(cfg, device):
                loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return step

    ref = None
    if backend != "eager":  # eager's gradients after one step, from the same weights and batch
        eager = _wrap(copy.deepcopy(base), parallel, device)
        with _amp(cfg, device):
            loss = eager(*batches[0])
        loss.backward()
        ref = _grads(eager)
        del eager, loss
    _reset_compilers()
    model = _compile(_wrap(copy.deepcopy(base), parallel, device), backend)
    del base
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = make_step(model, opt)
    _sync(device)
    t0 = time.perf_counter()
    idx, tgt = batches[0]
    with _amp(cfg, device):
        loss = model(idx, tgt)
    loss.backward()
    if ref is not None:
        report["grad_vs_eager"] = grad_agreement(_grads(model), ref)
        del ref
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    report["first_step_s"] = time.perf_counter() - t0
    for _ in range(cfg.warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(cfg.steps):
        t = time.perf_counter()
        loss = step()
        _sync(device)
        times.append(time.perf_counter() - t)
    report["step_ms"] = 1e3 * statistics.median(times)
    report["step_ms_all"] = [round(1e3 * t, 3) for t in times]
    report["loss"] = float(loss)
    if device.type == "cuda":
        report["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        report["mem_phases_gib"] = memory_phases(model, opt, batches[0], cfg, device)
    report.update(_capture_counts(backend))
    if cfg.profile_steps:
        report["profile"] = profile_comm(step, cfg, device)
    if cfg.host_profile:  # every rank steps (collectives); rank 0's host is profiled
        report["host_profile"] = host_profile(step, cfg.host_profile, device, rank == 0)
    return report


def memory_phases(model, opt, batch, cfg, device) -> dict:
    """One more step, with the memory allocated (and the peak since the last reading) after
    its forward, backward, optimizer step and zero_grad: where a peak comes from."""
    out = {}

    def read(name):
        _sync(device)
        out[name] = (round(torch.cuda.memory_allocated(device) / 2**30, 3),
                     round(torch.cuda.max_memory_allocated(device) / 2**30, 3))  # fmt: skip
        torch.cuda.reset_peak_memory_stats(device)

    read("before")
    with _amp(cfg, device):
        loss = model(*batch)
    read("forward")
    loss.backward()
    del loss
    read("backward")
    opt.step()
    read("optimizer")
    opt.zero_grad(set_to_none=True)
    read("zero_grad")
    return out


def tp_config(cfg, device, rank) -> dict:
    """The MLP block with colwise fc and rowwise out: eager DTensor, torch.compile, Ember."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import parallelize_module

    s = cfg.shape
    mesh = init_device_mesh(device.type, (2,))
    torch.manual_seed(0)
    base = TPMLP(s["d"], s["hidden"]).to(device)
    plan = {"fc": ColwiseParallel(), "out": RowwiseParallel()}
    gen = torch.Generator().manual_seed(5)  # the same input on both ranks (Replicate)
    x = torch.randn(s["batch"], s["seq"], s["d"], generator=gen).to(device)
    results = {}
    refs: dict = {}  # eager's output and gradients: "fp32" and "amp"
    for backend in cfg.backend_list:
        try:
            model = parallelize_module(copy.deepcopy(base), mesh, plan)
            fn = _compile(model, backend)
            xi = x.clone().requires_grad_()

            def step(amp=True):
                with _amp(cfg, device) if amp else torch.autocast(device.type, enabled=False):
                    y = fn(xi)
                y.float().pow(2).mean().backward()
                return y

            r = {}
            # float32 first (the exact check), then the configured AMP (the timed one); the
            # compilers are reset between, so the counts are those of the timed graphs
            for phase in ("fp32", "amp"):
                _reset_compilers()
                model.zero_grad(set_to_none=True)
                xi.grad = None
                t0 = time.perf_counter()
                y = step(amp=phase == "amp")
                _sync(device)
                r[f"{phase}_first_step_s"] = time.perf_counter() - t0
                got = {"out": y.detach().float(), "x_grad": xi.grad.float().clone(),
                       "grads": _grads(model)}  # fmt: skip
                if backend == "eager":
                    refs[phase] = got
                elif phase in refs:
                    ref = refs[phase]
                    r[f"{phase}_out_rel"] = float((got["out"] - ref["out"]).norm()
                                                  / ref["out"].norm())  # fmt: skip
                    r[f"{phase}_x_grad_rel"] = float((got["x_grad"] - ref["x_grad"]).norm()
                                                     / ref["x_grad"].norm())  # fmt: skip
                    agree = grad_agreement(got["grads"], ref["grads"])
                    r[f"{phase}_grad_rel"] = (math.sqrt(agree["rel"] / agree["den"])
                                              if agree["den"] else 0.0)  # fmt: skip
                if phase == "fp32":
                    r["fp32_counts"] = _capture_counts(backend)
            times = []
            for i in range(cfg.warmup + cfg.steps):
                model.zero_grad(set_to_none=True)
                xi.grad = None
                t = time.perf_counter()
                step()
                _sync(device)
                if i >= cfg.warmup:
                    times.append(time.perf_counter() - t)
            r["step_ms"] = 1e3 * statistics.median(times)
            r.update(_capture_counts(backend))
            results[backend] = r
        except Exception as e:  # noqa: BLE001  (recorded; the other backends still run)
            results[backend] = {"error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
    return results


def _match_ranks(profile, dist) -> None:
    """Communication time per step from the ranks' kernels matched collective by collective
    (`matched_exposure`), in place of this rank's spans."""
    spans = profile.pop("spans", None) if isinstance(profile, dict) else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, spans)  # every rank takes part, profiled or not
    got = matched_exposure(everyone) if spans is not None else None
    if got is not None:
        n = profile["steps"]
        profile["matched_comm_ms"] = got[0] / 1e3 / n
        profile["matched_exposed_comm_ms"] = got[1] / 1e3 / n


def _worker(cfg) -> None:
    import torch.distributed as dist

    rank = cfg.rank
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg.port))
    if cfg.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=2,
                            timeout=timedelta(seconds=max(60, int(cfg.config_timeout))))
    cfg.backend_list = [b for b in cfg.backends.split(",") if b]
    try:
        if cfg.worker == "tp":
            report = tp_config(cfg, device, rank)
        else:
            parallel, backend_name = cfg.worker.split(":")
            try:
                report = train_config(cfg, parallel, backend_name, device, rank)
            except Exception as e:  # noqa: BLE001  (recorded by the parent)
                report = {"error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        # gradient agreement over both ranks' shards; a rank that failed has no numbers
        ok = torch.tensor([0.0 if "error" in report else 1.0])
        agree = report.get("grad_vs_eager")
        sums = torch.tensor([agree["rel"], agree["den"]] if agree else [0.0, 0.0],
                            dtype=torch.float64)  # fmt: skip
        if backend == "nccl":
            ok, sums = ok.to(device), sums.to(device)
        dist.all_reduce(ok)
        dist.all_reduce(sums)
        if agree is not None:
            agree["rel"] = math.sqrt(float(sums[0]) / float(sums[1])) if float(sums[1]) else 0.0
            del agree["den"]
        report["ranks_ok"] = int(ok.item())
        _match_ranks(report.get("profile"), dist)
        if device.type == "cuda":
            report["gpu"] = torch.cuda.get_device_name(device)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(cfg.out, f"{cfg.worker.replace(':', '_')}.rank{rank}.json"), "w") as f:
        json.dump(report, f)


# -- the parent ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(cfg, argv, name, timeout) -> dict:
    """Run configuration `name` on two fresh rank processes; rank 0's report or the failure."""
    port = _free_port()
    log_path = os.path.join(cfg.out, "run.log")
    procs = []
    with open(log_path, "a") as log:
        log.write(f"\n===== {name} =====\n")
        log.flush()
        for rank in (0, 1):
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", name,
                   "--rank", str(rank), "--port", str(port)]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        start = time.monotonic()
        timed_out = False
        for p in procs:
            try:
                p.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    path = os.path.join(cfg.out, f"{name.replace(':', '_')}.rank0.json")
    if os.path.exists(path):
        with open(path) as f:
            report = json.load(f)
        os.remove(path)
        other = path.replace("rank0", "rank1")
        if os.path.exists(other):
            os.remove(other)
        report["wall_s"] = time.monotonic() - start
        return report
    why = f"timed out after {timeout:.0f} s" if timed_out else (
        f"rank processes exited with {[p.returncode for p in procs]}")  # fmt: skip
    return {"error": f"{why} (see run.log)", "wall_s": time.monotonic() - start}


def _env(cfg) -> dict:
    env = {"torch": torch.__version__, "device": cfg.device, "world_size": 2,
           "shape": cfg.shape, "amp": cfg.amp, "steps": cfg.steps, "warmup": cfg.warmup,
           "profile_steps": cfg.profile_steps}  # fmt: skip
    return env  # the GPU's name comes from the ranks (the parent never initialises CUDA)


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def _graphs(r) -> str:
    """Captured graphs, and the pieces they were cut into where DDP's buckets cut them."""
    pieces = r.get("pieces") or []
    extra = f" ({sum(pieces)} pieces)" if any(p > 1 for p in pieces) else ""
    return f"{r.get('graphs', '-')}{extra}"


def write_report(cfg, results: dict) -> None:
    env = _env(cfg)
    with open(os.path.join(cfg.out, "results.json"), "w") as f:
        json.dump({"env": env, "results": results}, f, indent=1)
    lines = ["# Distributed training: eager vs torch.compile vs Ember (2 ranks)", "",
             f"`{json.dumps(env)}`", "",
             f"Step: median of {cfg.steps} steps after {cfg.warmup} warm-up steps (AdamW, "
             f"AMP {cfg.amp}); memory: peak allocated over the timed steps; grad rel: "
             "||g - g_eager|| / ||g_eager|| after one step, over both ranks; comm / exposed "
             "comm: NCCL kernel time per step, and the part of it no other kernel on the GPU "
             "overlaps, each collective's the least over the ranks (a kernel also spans its "
             "rank's wait for the other: the rank that arrived last shows the transfer), summed "
             "over collectives (two running at once both count); in brackets, rank 0's own "
             "(waits included, overlapping kernels merged).", "",
             "| config | step ms | first step s | peak GiB | graphs | breaks | grad rel | "
             "comm ms | exposed comm ms | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        if name == "tp":
            continue
        prof = r.get("profile", {})
        err = r.get("error", "")
        lines.append(f"| {name} | {_fmt(r.get('step_ms'))} | {_fmt(r.get('first_step_s'))} | "
                     f"{_fmt(r.get('peak_mem_gib'), '.2f')} | {_graphs(r)} | "
                     f"{r.get('breaks', '-')} | "
                     f"{_fmt(r.get('grad_vs_eager', {}).get('rel'), '.2e')} | "
                     f"{_fmt(prof.get('matched_comm_ms'), '.2f')} "
                     f"({_fmt(prof.get('comm_ms'), '.2f')}) | "
                     f"{_fmt(prof.get('matched_exposed_comm_ms'), '.2f')} "
                     f"({_fmt(prof.get('exposed_comm_ms'), '.2f')}) | {err[:120]} |")
    if "tp" in results:
        lines += ["", "## Tensor parallel MLP block (colwise fc -> GELU -> rowwise out)", "",
                  "Relative differences from eager DTensor (output, input gradient, parameter "
                  f"gradients) in float32 and under AMP {cfg.amp}; step: forward + backward "
                  "under AMP; graphs/breaks: of the AMP compile.", "",
                  "| backend | step ms | first s | graphs | breaks | fp32 out / x grad / grads "
                  "| amp out / x grad / grads | error |", "|---|---|---|---|---|---|---|---|"]
        tp = results["tp"]
        for backend, r in (tp.items() if "error" not in tp else [("all", tp)]):
            if not isinstance(r, dict):
                continue
            rels = {ph: " / ".join(_fmt(r.get(f"{ph}_{k}_rel"), ".1e")
                                   for k in ("out", "x_grad", "grad")) for ph in ("fp32", "amp")}
            lines.append(f"| {backend} | {_fmt(r.get('step_ms'), '.2f')} | "
                         f"{_fmt(r.get('amp_first_step_s'))} | {r.get('graphs', '-')} | "
                         f"{r.get('breaks', '-')} | {rels['fp32']} | {rels['amp']} | "
                         f"{r.get('error', '')[:120]} |")
    reasons = {n: r.get("break_reasons") for n, r in results.items()
               if isinstance(r, dict) and r.get("break_reasons")}  # fmt: skip
    if reasons:
        lines += ["", "## Break reasons", ""]
        lines += [f"- {n}: {'; '.join(rs)}" for n, rs in reasons.items()]
    with open(os.path.join(cfg.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for name, r in results.items():
        if isinstance(r, dict) and r.get("host_profile"):
            with open(os.path.join(cfg.out, f"host_{name.replace(':', '_')}.txt"), "w") as f:
                f.write(r["host_profile"])


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = _args(argv)
    if cfg.worker:
        _worker(cfg)
        return {}
    os.makedirs(cfg.out, exist_ok=True)
    start = time.monotonic()
    import ember  # noqa: F401  (builds Ember's C++ extension here once, not in a timed config)

    names = [] if cfg.no_tp else ["tp"]
    backends = [b for b in cfg.backends.split(",") if b]
    parallels = [p for p in cfg.parallel.split(",") if p]
    # eager first (the reference), then Ember, then torch.compile (if the deadline comes, what
    # is lost is the reference compiler's numbers, not Ember's); DDP before FSDP2 for each
    order = sorted(backends, key=lambda b: ("eager", "ember", "torch_compile").index(b)
                   if b in BACKENDS else len(BACKENDS))  # fmt: skip
    names += [f"{p}:{b}" for b in order for p in parallels]
    results: dict = {n: {"error": "not run (deadline)"} for n in names}
    for name in names:
        left = cfg.deadline - (time.monotonic() - start)
        if left < 20:
            break
        print(f"[distributed] {name} ({left:.0f} s left)", flush=True)
        # eager runs and the small TP block need far less than a compiled model: a hang there
        # must not eat the compilers' time
        cap = cfg.config_timeout if name.split(":")[-1] in ("ember", "torch_compile") else 120
        results[name] = _run_pair(cfg, argv, name, min(cap, left))
        write_report(cfg, results)
    write_report(cfg, results)
    print(open(os.path.join(cfg.out, "results.md")).read(), flush=True)
    return results


if __name__ == "__main__":
    main()
