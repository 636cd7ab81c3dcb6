"""A kernel-level diff of one model: Ember against torch.compile(mode="reduce-overhead"), one
profiled call of each, kernel time grouped side by side, and the source of Ember's worst kernels.

    python bench/profile_diff.py resnet50 --mode infer-bf16 --out $OUT/prof-resnet50
    python bench/profile_diff.py small_bert --device cpu --out /tmp/prof   # CPU ops, a smoke run

The model is built as run.py builds it (harness.Task: same weights, inputs, autocast and
no_grad). Each side is compiled, warmed up (CUDA graphs recorded), then one call (a replay) runs
under torch.profiler. Kernels are grouped twice: by kind (matmul, convolution, attention, fused
pointwise, ...) for the side-by-side table, and one by one (Triton kernels without their numeric
suffix) for the per-side lists. A kernel launched outside a CUDA graph carries the ATen op that
launched it; inside a replay only its name says what it is: torch's Triton kernels are named
after the ATen ops they fuse (triton_poi_fused_add_mul_0), Ember's are numbered (kernel12), so
their description comes from the operations in their generated source, which both compilers
leave in their cache directories (fresh ones in a temporary folder, or --cache-dir). Ember numbers kernels per graph:
in a model of several graphs, kernel3 may be several kernels, grouped as one and shown with the
first source found. Writes DIR/profile_diff.md and the raw events as DIR/events.json.
"""

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

import _paths  # noqa: F401 - puts the Ember components on sys.path

TRITON_KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent reduction",
                "tem": "template", "for": "foreach"}  # fmt: skip
# (kind, pattern over the lower-cased kernel name), first match wins.
CATEGORIES = (
    ("attention", r"flash|fmha|attention|sdpa|softmax_warp"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit_gemm|winograd|cudnn"),
    ("matmul", r"gemm|nvjet|cutlass|cublas|xmma|matmul|\bmm\b|addmm|aten::(mm|bmm|linear)"),
    ("memcpy/memset", r"memcpy|memset|copy_kernel|aten::(copy_|clone|contiguous)"),
    ("fused pointwise (Triton)", r"^triton_poi|^triton_for"),
    ("fused reduction (Triton)", r"^triton_(red|per)"),
    ("Ember kernel", r"^kernel\d+$|^k[0-9a-f]{16}$"),  # numbered, or named by a source hash
    ("ATen reduction", r"reduce_kernel|aten::(sum|mean|amax|max|min|softmax|_softmax|norm)"),
    ("ATen norm", r"norm|welford"),
    ("ATen elementwise", r"elementwise|aten::"),
)
# Triton calls that say nothing about what a kernel computes.
PLUMBING = {"load", "store", "program_id", "arange", "full", "zeros", "where", "constexpr",
            "broadcast_to", "reshape", "num_programs", "static_assert", "multiple_of",
            "max_contiguous", "cdiv", "to", "view", "expand_dims", "debug_barrier"}  # fmt: skip


# --------------------------------------------------------------------------------------------
# pure parsing: events are dicts {"name": kernel name, "us": device time, "op": ATen op or None}


def kernel_key(name):
    """A kernel's name without what varies between copies of it: the numeric suffix of Triton
    kernels (triton_poi_fused_add_0 -> triton_poi_fused_add) and template arguments."""
    name = name.strip()
    if name.startswith("triton_"):
        return re.sub(r"_\d+$", "", name)
    if name.startswith("void "):
        name = name[5:]
    return re.sub(r"<.*", "<...>", name)[:120]


def category(name, op=None):
    """The kind of work a kernel does, from its name (and the ATen op that launched it)."""
    low = name.lower()
    for kind, pattern in CATEGORIES:
        if re.search(pattern, low) or (op and re.search(pattern, op.lower())):
            return kind
    return "other"


def fused_ops(name, source=None):
    """What a kernel fuses: torch's Triton names list the ATen ops (triton_poi_fused_add_mul_0 ->
    'add, mul'); otherwise the math its source calls (tl.exp, libdevice.tanh, tl.sum, tl.dot)."""
    m = re.match(r"triton_(\w{3})_fused_(.*?)(_\d+)?$", name)
    if m:
        kind = TRITON_KINDS.get(m.group(1), m.group(1))
        return f"{kind}: {m.group(2).replace('_', ', ')}"
    if not source:
        return ""
    calls = re.findall(r"\b(?:tl|libdevice|tl\.math|math)\.(\w+)\(|\bstd::(\w+)\(", source)
    calls = [a or b for a, b in calls]
    ops = list(dict.fromkeys(c for c in calls if c not in PLUMBING))
    reduces = any(c in ("sum", "max", "min", "reduce", "argmax", "argmin") for c in ops)
    kind = "matmul" if "dot" in ops else ("reduction" if reduces else "pointwise")
    return f"{kind}: {', '.join(ops[:10]) or 'copy'}"


def group_events(events, by="category"):
    """{group: {"count", "us", "kernels": {key: us}, "ops": {ATen op: us}}}, by="category" (the
    kind of work) or "kernel" (kernel_key)."""
    groups = {}
    for e in events:
        key = category(e["name"], e.get("op")) if by == "category" else kernel_key(e["name"])
        g = groups.setdefault(key, {"count": 0, "us": 0.0, "kernels": {}, "ops": {}})
        g["count"] += 1
        g["us"] += e["us"]
        k = kernel_key(e["name"])
        g["kernels"][k] = g["kernels"].get(k, 0.0) + e["us"]
        if e.get("op"):
            g["ops"][e["op"]] = g["ops"].get(e["op"], 0.0) + e["us"]
    return groups


def side_by_side(ember_events, torch_events, by="category"):
    """Rows {group, ember_count, ember_us, torch_count, torch_us, diff_us} (diff = Ember minus
    torch: above 0, Ember spends more), the largest difference first."""
    e, t = group_events(ember_events, by), group_events(torch_events, by)
    rows = []
    for key in dict.fromkeys(list(e) + list(t)):
        ge, gt = e.get(key, {}), t.get(key, {})
        rows.append({"group": key, "ember_count": ge.get("count", 0),
                     "ember_us": ge.get("us", 0.0), "torch_count": gt.get("count", 0),
                     "torch_us": gt.get("us", 0.0),
                     "diff_us": ge.get("us", 0.0) - gt.get("us", 0.0)})  # fmt: skip
    return sorted(rows, key=lambda r: (-abs(r["diff_us"]), r["group"]))


def worst_kernels(events, n=3):
    """The `n` kernels (by kernel_key) with the most total time: [(key, us, count)]."""
    groups = group_events(events, by="kernel")
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["us"])
    return [(k, g["us"], g["count"]) for k, g in ranked[:n]]


def extract_source(text, name):
    """The definition of kernel `name` in a generated source text (Triton: its decorators and
    `def`; C++: the function through its closing brace), or None."""
    m = re.search(rf"^((?:@.*\n)*)def {re.escape(name)}\(", text, re.M)
    if m:
        lines = text[m.start():].split("\n")
        i = next(k for k, line in enumerate(lines) if line.startswith("def "))
        while i < len(lines) and not lines[i].rstrip().endswith(":"):
            i += 1  # a signature over several lines
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
            end += 1  # the body: indented or blank lines
        return "\n".join(lines[:end]).rstrip()
    m = re.search(rf"^[^\n;{{}}]*\b{re.escape(name)}\s*\([^;{{]*\)\s*\{{", text, re.M)
    if m:
        depth, i = 0, text.index("{", m.start())
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[m.start(): j + 1]
    return None


def _strings(obj):
    """Every string inside a parsed JSON value (cache entries keep sources as JSON strings)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def source_texts(root, limit_bytes=20_000_000):
    """Every generated source text under a cache directory: plain files (.py, .cpp, .ttir ...)
    as they are, and the strings inside JSON entries (one JSON value per line)."""
    for path in sorted(Path(root).rglob("*")) if root and Path(root).is_dir() else []:
        if not path.is_file() or path.stat().st_size > limit_bytes:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        for line in text.splitlines():
            if line[:1] in "{[" and len(line) > 100:
                try:
                    yield from (s for s in _strings(json.loads(line)) if "\n" in s)
                except ValueError:
                    pass


def find_sources(roots, names):
    """{kernel name: its source} for the names found under the cache directories `roots`."""
    found, wanted = {}, set(names)
    for root in roots:
        for text in source_texts(root):
            for name in list(wanted):
                if name in text:
                    src = extract_source(text, name)
                    if src:
                        found[name] = src
                        wanted.discard(name)
            if not wanted:
                return found
    return found


def render(model, mode, device, ember_events, torch_events, sources, walls, n_worst=3,
           timed=None, order=None):
    """The markdown report (pure: everything it shows is passed in)."""
    us = lambda v: f"{v:,.1f}"  # noqa: E731
    lines = [f"# Kernel diff: {model} ({mode}, {device})", "",
             "One profiled call of each: Ember (CUDA-graph replay on a GPU) against "
             "torch.compile(mode=\"reduce-overhead\"). Device time per kernel group; diff = Ember "
             "minus torch (above 0: Ember spends more).", ""]  # fmt: skip
    te = sum(e["us"] for e in ember_events)
    tt = sum(e["us"] for e in torch_events)
    for side, wall in walls.items():
        lines.append(f"- {side}: wall time of the profiled call {wall * 1e3:,.3f} ms")
    for side, events in (("ember", ember_events), ("torch", torch_events)):
        tl = timeline(events)
        if tl:
            lines.append(f"- {side}: the profiled call's kernels span {us(tl['span_us'])} us on "
                         f"the GPU, {us(tl['idle_us'])} us of it with no kernel running")
    for side, t in (timed or {}).items():
        if "event_ms" in t:  # a GPU's timings (the CPU has the profiled call's wall time)
            lines.append(f"- {side}: {t['event_ms']:.3f} ms a call as the race times it (CUDA "
                         f"events, median of 20 back-to-back calls); {t['host_us']:,.0f} us of "
                         "host time to issue a call")
    if order:
        lines.append(f"- compiled and timed in this order, in one process: {', '.join(order)}")
    lines += ["", "| kernel group | ember count | ember us | torch count | torch us | diff us |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in side_by_side(ember_events, torch_events):
        lines.append(f"| {r['group']} | {r['ember_count']} | {us(r['ember_us'])} | "
                     f"{r['torch_count']} | {us(r['torch_us'])} | {us(r['diff_us'])} |")  # fmt: skip
    lines.append(f"| **total** | {len(ember_events)} | **{us(te)}** | {len(torch_events)} | "
                 f"**{us(tt)}** | **{us(te - tt)}** |")  # fmt: skip
    more = [r for r in side_by_side(ember_events, torch_events) if r["diff_us"] > 0]
    lines += ["", "## Where Ember spends more", ""]
    lines += [f"- {r['group']}: +{us(r['diff_us'])} us ({r['ember_count']} kernels against "
              f"{r['torch_count']})" for r in more] or ["- nowhere: every group is at most torch's"]
    for side, events in (("Ember", ember_events), ("torch.compile", torch_events)):
        lines += ["", f"## {side}: kernels by time", "",
                  "| kernel | count | us | what it is |", "|---|---|---|---|"]  # fmt: skip
        groups = group_events(events, by="kernel")
        for key, g in sorted(groups.items(), key=lambda kv: -kv[1]["us"])[:25]:
            what = fused_ops(key, sources.get(key)) or ", ".join(sorted(g["ops"])) or category(key)
            lines.append(f"| `{key[:90]}` | {g['count']} | {us(g['us'])} | {what} |")
    lines += ["", f"## Ember's {n_worst} most expensive kernels: generated source", ""]
    for key, t, count in worst_kernels(ember_events, n_worst):
        lines += [f"### `{key[:90]}`: {us(t)} us over {count} launch(es)", ""]
        src = sources.get(key)
        lines += (["```python", src, "```"] if src else
                  ["(no generated source: a library kernel, or not found in the caches)"])  # fmt: skip
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# profiling (needs torch; on the GPU: CUDA kernels, on the CPU: the CPU ops)


def _aten_ancestor(evt):
    while evt is not None:
        if evt.name.startswith("aten::"):
            return evt.name
        evt = evt.cpu_parent
    return None


def events_of(prof, device):
    """The profiler's kernels as event dicts: on CUDA every device kernel, with the ATen op that
    launched it where the profiler links one (none inside a CUDA-graph replay, whose kernels hang
    off cudaGraphLaunch); on the CPU every leaf CPU op, with its self time."""
    from torch.autograd import DeviceType

    evts = list(prof.events())
    out = []
    if device.startswith("cuda"):
        launched_by = {}  # kernel name -> ATen op, from the CPU events the kernels are linked to
        for e in evts:
            if e.device_type == DeviceType.CPU and getattr(e, "kernels", None):
                op = _aten_ancestor(e)
                for k in e.kernels:
                    if op:
                        launched_by.setdefault(k.name, op)
        for e in evts:
            if e.device_type == DeviceType.CUDA:
                out.append({"name": e.name, "us": float(e.time_range.elapsed_us()),
                            "start": float(e.time_range.start), "end": float(e.time_range.end),
                            "op": launched_by.get(e.name)})  # fmt: skip
        return out
    for e in evts:
        if e.device_type == DeviceType.CPU and not e.cpu_children and e.self_cpu_time_total > 0:
            out.append({"name": e.name, "us": float(e.self_cpu_time_total),
                        "op": _aten_ancestor(e.cpu_parent)})  # fmt: skip
    return out


def timeline(events) -> dict | None:
    """The GPU timeline of one profiled call: span from the first kernel's start to the last's
    end, and the part of it no kernel ran (launch gaps, waits for the host), in microseconds."""
    from measure import merge_intervals

    busy = merge_intervals((e["start"], e["end"]) for e in events if "start" in e)
    if not busy:
        return None
    span = busy[-1][1] - busy[0][0]
    return {"span_us": span, "idle_us": span - sum(e - s for s, e in busy)}


def steady(step, device, calls=20) -> dict:
    """As the race times a call (CUDA events around each of `calls` back-to-back calls, the
    median), and the host's microseconds to issue one call (the same calls, no waiting)."""
    import measure
    import torch

    if not device.startswith("cuda"):
        return {}
    ms = measure.event_median_ms(step, calls)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return {"event_ms": ms, "host_us": host_us}


def profile_side(task, backend_name, warmup, host_calls=0):
    """Compile `task`'s model with a bench backend, warm up, time it as the race does, profile
    one call: (events, wall s, steady timings; with `host_calls`, the cProfile text of that many
    calls under timed["host_profile"])."""
    import backends as backend_registry
    import measure
    import torch
    from torch.profiler import ProfilerActivity, profile

    backend = backend_registry.get(backend_name)
    model = task.fresh()
    fn = model if task.is_module else task.master
    backend.begin()
    device = str(task.device)
    with task.outer():
        step = task.make_step(backend.compile(fn), model)
        measure.warm_up(step, device, warmup + 1)  # +1: the compiling call
        timed = steady(step, device)
        if host_calls:
            timed["host_profile"] = measure.host_profile(step, host_calls, device)
        activities = [ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
    backend.reset()
    return events_of(prof, device), wall, timed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--mode", default="infer-bf16")
    p.add_argument("--out", default="/tmp/profile_diff")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ember-backend", default="ember")
    p.add_argument("--torch-backend", default="torch_compile_cg")
    p.add_argument("--cache-dir", help="compile caches (default: a fresh temporary folder)")
    p.add_argument("--worst", type=int, default=3, help="how many Ember kernels to show source of")
    p.add_argument("--torch-first", action="store_true",
                   help="compile and time torch.compile before Ember (the race's order)")
    p.add_argument("--host-profile", type=int, default=0, metavar="N",
                   help="also profile N calls of each side on the host (cProfile): "
                   "host_<backend>.txt under --out")
    args = p.parse_args(argv)
    out = Path(args.out)
    # Outside --out: the caches hold hundreds of files, and only what is under $OUT comes back
    # from a device call (a few files at most).
    caches = Path(args.cache_dir or tempfile.mkdtemp(prefix="profile-diff-caches-"))
    # Fresh caches: the compilers' generated sources for this model only, found by kernel name.
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("EMBER_CACHE_DIR", "ember")):  # fmt: skip
        os.environ[var] = str(caches / sub)
    import harness
    import measure
    import torch

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA here: pass --device cpu")
    timing = measure.Timing(warmup=args.warmup, iters=1, max_seconds=1.0)
    cfg = {"model": args.model, "mode": args.mode, "device": device, "batch": args.batch_size,
           "seq": args.seq_len, "timing": dataclasses.asdict(timing)}  # fmt: skip
    harness.configure_process(dict(cfg, threads=None))
    task = harness.Task(cfg)
    sides, errors = {}, []
    order = (args.ember_backend, args.torch_backend)[:: -1 if args.torch_first else 1]
    for name in order:
        try:
            sides[name] = profile_side(task, name, args.warmup, args.host_profile)
        except Exception as e:  # noqa: BLE001 - one side failing still leaves the other's table
            traceback.print_exc()
            errors.append(f"- {name} failed: {type(e).__name__}: {' '.join(str(e).split())[:500]}")
            sides[name] = ([], float("nan"), {})
    (ember_events, ember_wall, ember_t) = sides[args.ember_backend]
    (torch_events, torch_wall, torch_t) = sides[args.torch_backend]
    names = [k for k, *_ in worst_kernels(ember_events, args.worst)]
    names += [k for k in group_events(ember_events, by="kernel") if k not in names][:40]
    sources = find_sources([caches / "ember", caches / "inductor"], names)
    text = render(args.model, args.mode, device, ember_events, torch_events, sources,
                  {args.ember_backend: ember_wall, args.torch_backend: torch_wall}, args.worst,
                  {args.ember_backend: ember_t, args.torch_backend: torch_t}, order)
    if errors:
        text += "\n\n## Failures\n\n" + "\n".join(errors) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_diff.md").write_text(text)
    (out / "events.json").write_text(json.dumps({"ember": ember_events, "torch": torch_events}))
    for name, (_, _, timed) in sides.items():
        if timed.get("host_profile"):
            (out / f"host_{name}.txt").write_text(timed.pop("host_profile"))
    print(text)
    print(f"\nwritten: {out / 'profile_diff.md'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
