"""Results: the environment header, the summary (pass rates, geometric-mean speedups), the
markdown tables, results.json and the speedup chart (skipped, with a note, without matplotlib).

results.json holds {"runs": [run, ...]}; a run is what run.run_suite returns: its suite, mode,
device, part, backends, models, records (one per model and backend) and meta (the environment).
"""

import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
from pathlib import Path

import _paths

PASS = "ok"
CG = "torch_compile_cg"  # torch.compile(mode="reduce-overhead"): the like-for-like reference
LABELS = {
    "eager": "eager",
    "torch_compile": "torch.compile",
    "torch_compile_cg": "torch.compile[reduce-overhead]",
    "ember": "ember",
    "ember_inductor": "ember[inductor]",
    "ember_aot_eager": "ember[aot_eager]",
    "ember_eager": "ember[eager]",
    "torch_ember_inductor": "torch.compile+ember.inductor",
    "torch_aot_eager": "torch.compile[aot_eager]",
}


# --------------------------------------------------------------------------------------------
# environment


def _version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_name(device, probe=True):
    import torch

    if device.startswith("cuda") and not probe:
        return device  # the first worker names it (no CUDA context in the parent yet)
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    name = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def _git_commit():
    try:
        out = subprocess.run(  # noqa: PLW1510 - a failure just means "no commit"
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=_paths.ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device, probe_device=True):
    """Date, device name and the versions the header states (probe_device=False: no CUDA)."""
    import torch

    ember = {}
    for c in _paths.COMPONENTS:
        path = _paths.ROOT / c / "VERSION"
        if path.is_file():
            ember[c] = path.read_text().strip()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device_name": _device_name(device, probe_device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "timm": _version("timm"),
        "ember": ember,
        "commit": _git_commit(),
    }


# --------------------------------------------------------------------------------------------
# summary


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def table_of(run):
    """{model: {backend: record}} in run order."""
    table = {m: {} for m in run["models"]}
    for rec in run["records"]:
        table.setdefault(rec["model"], {})[rec["backend"]] = rec
    return table


def speedup(row, backend, over="eager"):
    """t(over) / t(backend) when both have a latency, else None."""
    a, b = row.get(over, {}).get("latency_ms"), row.get(backend, {}).get("latency_ms")
    return a / b if a and b else None


def summarize(run):
    """Pass rates, geometric-mean speedups and median compile times per backend."""
    table, backends = table_of(run), run["backends"]
    counted = [
        m
        for m, row in table.items()
        if any(row.get(b, {}).get("status") != "skipped" for b in backends)
    ]
    all_pass = [
        m for m in counted if all(table[m].get(b, {}).get("status") == PASS for b in backends)
    ]
    out = {"models": len(table), "counted": len(counted), "all_pass": all_pass, "backends": {}}
    for b in backends:
        ok = [m for m in counted if table[m].get(b, {}).get("status") == PASS]
        own = [m for m in ok if table[m].get("eager", {}).get("status") == PASS]
        recs = [table[m][b] for m in ok]
        out["backends"][b] = {
            "passed": len(ok),
            "pass_rate": len(ok) / len(counted) if counted else None,
            "geomean_speedup": geomean(speedup(table[m], b) for m in all_pass),
            "geomean_speedup_own": geomean(speedup(table[m], b) for m in own),
            "geomean_vs_torch": (
                geomean(speedup(table[m], b, "torch_compile") for m in all_pass)
                if "torch_compile" in backends
                else None
            ),
            "geomean_vs_cg": (
                geomean(speedup(table[m], b, CG) for m in all_pass) if CG in backends else None
            ),
            "median_cold_s": _median(r.get("compile_cold_s") for r in recs),
            "median_warm_s": _median(r.get("compile_warm_s") for r in recs),
        }
    ember = headline_backend(backends)
    if ember:
        out["like_for_like"] = {
            "backend": ember,
            "vs_cg": _pairwise(table, counted, ember, CG),
            "vs_torch": _pairwise(table, counted, ember, "torch_compile"),
        }
    return out


def headline_backend(backends):
    """The Ember backend the like-for-like headline races against torch_compile_cg (None when
    the run has no torch_compile_cg): `ember` if it ran, else the first ember* backend."""
    if CG not in backends:
        return None
    embers = [b for b in backends if b.startswith("ember")]
    return "ember" if "ember" in embers else (embers[0] if embers else None)


def _pairwise(table, models, backend, over):
    """Geomean of t(over) / t(backend) over the models both passed, and how many they are."""
    both = [m for m in models
            if all(table[m].get(b, {}).get("status") == PASS for b in (backend, over))]  # fmt: skip
    ratios = [speedup(table[m], backend, over) for m in both]
    return {"geomean": geomean(ratios), "models": len(both),
            "wins": sum(1 for r in ratios if r and r > 1)}  # fmt: skip


# --------------------------------------------------------------------------------------------
# markdown


def fmt(value, spec=".3g", none="-"):
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return format(value, spec)


def _times(value):
    return "-" if value is None else f"{value:.2f}x"


def fmt_latency(ms, unit="ms"):
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if unit == "us" else f"{ms:.3f} ms"


def _cell(text, limit=None):
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def _status_cell(rec, limit=70):
    status = rec.get("status", "missing")
    if status == PASS:
        return PASS
    err = rec.get("error")
    return _cell(f"{status}: {err}" if err else status, limit)


def _header(run):
    meta = run.get("meta", {})
    ember = ", ".join(f"{k} {v}" for k, v in meta.get("ember", {}).items()) or "-"
    bits = [
        f"date {meta.get('date', '-')}",
        f"device {meta.get('device_name', run['device'])} ({run['device']})",
        f"torch {meta.get('torch', '-')}",
        f"triton {meta.get('triton')}",
        f"Python {meta.get('python', '-')}",
    ]
    for pkg in ("transformers", "timm"):
        if meta.get(pkg):
            bits.append(f"{pkg} {meta[pkg]}")
    bits += [f"ember ({ember})", f"commit {meta.get('commit') or '-'}"]
    import harness

    mode = harness.MODES.get(run["mode"])
    lines = [
        " · ".join(bits),
        "",
        f"- mode: {run['mode']}: {mode.description if mode else '-'}",
    ]
    if CG in run["backends"]:
        lines.append(
            "- like for like: the headline, the first table and the chart race Ember against "
            "torch.compile(mode=\"reduce-overhead\"), which replays CUDA graphs as Ember does; "
            "default torch.compile is the second column"
        )
    lines += [
        (
            f"- timing: {run['timing']}; compile: cold = first call with caches empty of this "
            "model, "
            + ("warm = first call of a fresh wrapper after the backend's reset() (on-disk "
               "caches warm)" if run.get("warm_compile", True)
               else "warm: not measured (--warm-compile off)")
        ),
        "- memory: "
        + (
            "torch.cuda.max_memory_allocated over the timed calls"
            if run["device"].startswith("cuda")
            else "RSS growth from before compiling to the peak of the timed calls"
        ),
        _setup_line(run),
        (
            f"- per (model, backend) timeout {fmt(run.get('model_timeout_s'), 'g')} s; "
            f"isolation: {run.get('isolate', 'model')}; "
            + (f"CPU threads {run['threads']}; " if run.get("threads") else "")
            + (
                f"{run['jobs']} models at a time per device (compiles overlap; a timed phase runs "
                "with the other workers stopped, as does a warm compile; cold compile times "
                "leave out the time stopped, though they include the shared CPU); "
                if run.get("jobs", 1) > 1
                else ""
            )
            + "elapsed "
            f"{fmt(run.get('elapsed_s'), '.0f')} s"
        ),
        f"- command: `{run.get('command', '-')}`",
    ]
    return lines


def _setup_line(run):
    setup = run.get("setup") or {}
    parts = []
    for key, label in (
        ("start_s", "worker start"),
        ("build_s", "model build"),
        ("reference_s", "eager + float64 references"),
    ):
        value = _median(s.get(key) for s in setup.values())
        if value is not None:
            parts.append(f"{label} {value:.1f} s")
    return "- per-model setup (median, not in any timing): " + (", ".join(parts) or "-")


def headline_lines(summary):
    """The like-for-like headline: Ember over torch.compile(mode="reduce-overhead") first (both
    replay CUDA graphs), default torch.compile second; empty without torch_compile_cg."""
    lfl = summary.get("like_for_like")
    if not lfl:
        return []
    cg, tc = lfl["vs_cg"], lfl["vs_torch"]
    name = LABELS.get(lfl["backend"], lfl["backend"])
    line = (
        f"**{name} vs torch.compile(mode=\"reduce-overhead\") (like for like: both replay CUDA "
        f"graphs): {_times(cg['geomean'])} geomean over the {cg['models']} models both passed, "
        f"faster on {cg['wins']}**"
    )
    if tc["models"]:
        line += (
            f"; vs default torch.compile: {_times(tc['geomean'])} over {tc['models']} "
            f"(faster on {tc['wins']})"
        )
    return [line + ". Above 1: Ember is faster.", ""]


def _summary_lines(run, summary):
    like = CG in run["backends"]
    ratios = (["geomean vs torch.compile[reduce-overhead]"] if like else []) + (
        ["geomean vs torch.compile"]
    )
    head = (
        "| backend | passed | pass rate | "
        + " | ".join(ratios)
        + " | geomean speedup over eager (all-pass models) | geomean speedup over eager (own "
        "passes) | median cold compile s | median warm compile s |"
    )
    lines = headline_lines(summary) + [head, "|---" * (7 + len(ratios)) + "|"]
    for b, s in summary["backends"].items():
        rate = f"{100 * s['pass_rate']:.0f}%" if s["pass_rate"] is not None else "-"
        cells = ([_times(s["geomean_vs_cg"])] if like else []) + [_times(s["geomean_vs_torch"])]
        lines.append(
            f"| {LABELS.get(b, b)} | {s['passed']}/{summary['counted']} | {rate} | "
            + " | ".join(cells)
            + f" | {_times(s['geomean_speedup'])} | {_times(s['geomean_speedup_own'])} | "
            f"{fmt(s['median_cold_s'], '.1f')} | {fmt(s['median_warm_s'], '.1f')} |"
        )
    n = len(summary["all_pass"])
    lines += [
        "",
        (
            f"Table geomeans over the {n} of {summary['counted']} models that passed under "
            "every backend (own passes: the models that backend and eager passed); the headline "
            "above is over the models both of its backends passed. Speedup = eager latency / "
            "backend latency; vs X = X's latency / backend latency (above 1: faster than X)."
        ),
    ]
    skipped = summary["models"] - summary["counted"]
    if skipped:
        lines.append(f"{skipped} model(s) skipped for a missing package (not counted).")
    return lines


def _like_for_like_lines(run, table):
    """Per model: Ember's latency against torch.compile[reduce-overhead]'s, then default
    torch.compile's; the first table of a run that raced torch_compile_cg."""
    ember = headline_backend(run["backends"])
    if not ember:
        return []
    unit = run["unit"]
    tc = "torch_compile" in run["backends"]
    lines = [
        f"| # | model | family | shape | {LABELS.get(ember, ember)} | "
        "torch.compile[reduce-overhead] | **vs reduce-overhead** | "
        + ("torch.compile | vs torch.compile |" if tc else ""),
        "|---" * (7 + 2 * tc) + "|",
    ]
    import models as model_registry

    for i, (m, row) in enumerate(table.items(), 1):
        spec = model_registry.MODELS.get(m)
        cells = [str(i), m, (spec.family if spec else "") or "-"]
        cells.append(next((r.get("shape") for r in row.values() if r.get("shape")), "-"))
        for b in [ember, CG] + (["torch_compile"] if tc else []):
            rec = row.get(b, {})
            cells.append(fmt_latency(rec.get("latency_ms"), unit) if rec.get("status") == PASS
                         else _status_cell(rec, 40))  # fmt: skip
            if b != ember:
                both = rec.get("status") == PASS and row.get(ember, {}).get("status") == PASS
                ratio = speedup(row, ember, b) if both else None
                cells.append((f"**{ratio:.2f}x**" if b == CG else f"{ratio:.2f}x")
                             if ratio else "-")  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _matrix_lines(run, table):
    others = [b for b in run["backends"] if b != "eager"]
    lines = [
        "| # | model | shape | eager | " + " | ".join(LABELS.get(b, b) for b in others) + " |",
        "|---|---|---|---|" + "---|" * len(others),
    ]
    for i, (m, row) in enumerate(table.items(), 1):
        eager = row.get("eager", {})
        cells = [
            fmt_latency(eager.get("latency_ms"), run["unit"])
            if eager.get("status") == PASS
            else _status_cell(eager, 50)
        ]
        for b in others:
            rec, s = row.get(b, {}), speedup(row, b)
            if rec.get("status") == PASS and s:
                cells.append(f"{s:.2f}x")
            elif rec.get("status") == "inaccurate" and s:
                cells.append(f"{s:.2f}x (inaccurate)")
            else:
                cells.append(_status_cell(rec, 50))
        shape = next((r.get("shape") for r in row.values() if r.get("shape")), "-")
        lines.append(f"| {i} | {m} | {shape} | " + " | ".join(cells) + " |")
    return lines


def _accuracy_cells(rec):
    acc = rec.get("accuracy")
    if not acc:
        return ["-", "-", "-"]
    ratio = acc.get("err64_ratio")
    third = f"{ratio:.2f}" if ratio is not None else f"rel rmse {acc.get('rel_rmse', 0):.1e}"
    return [f"{acc['max_abs']:.2e}", f"{acc['max_rel']:.2e}", third]


def _detail_lines(run, table):
    kernels = any("gbps" in r for r in run["records"])
    unit = "us" if run["unit"] == "us" else "ms"
    cg = CG in run["backends"]
    head = (
        f"| model | backend | status | latency ({unit}) | speedup | "
        + ("vs reduce-overhead | " if cg else "")
        + "vs torch.compile | cold "
        "compile s | warm compile s | first-step peak MiB | peak MiB | graphs | breaks | max abs err | max rel err | "
        "fp64 err ratio |"
    )
    sep = "|---" * (15 + cg) + "|"
    if kernels:
        head += " GB/s | % of copy BW |"
        sep += "---|---|"
    lines = [head, sep]
    for m, row in table.items():
        for b in run["backends"]:
            rec = row.get(b, {})
            lat = rec.get("latency_ms")
            lat = None if lat is None else (lat * 1e3 if unit == "us" else lat)
            cells = [
                m,
                LABELS.get(b, b),
                _status_cell(rec, 90),
                fmt(lat, ".4g"),
                fmt(speedup(row, b), ".2f"),
            ] + ([fmt(speedup(row, b, CG), ".2f")] if cg else []) + [
                fmt(speedup(row, b, "torch_compile"), ".2f") if "torch_compile" in row else "-",
                fmt(rec.get("compile_cold_s"), ".1f"),
                fmt(rec.get("compile_warm_s"), ".1f"),
                fmt(rec.get("first_peak_mem_mb"), ".0f"),
                fmt(rec.get("peak_mem_mb"), ".0f"),
                fmt(rec.get("graphs")),
                fmt(rec.get("breaks")),
            ] + _accuracy_cells(rec)
            if kernels:
                cells += [fmt(rec.get("gbps"), ".0f"), fmt(rec.get("pct_copy_bw"), ".0f")]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    graphed = [(m, LABELS.get(b, b), row[b]) for m, row in table.items()
               for b in run["backends"] if "cudagraph_replays" in row.get(b, {})]  # fmt: skip
    if any(r["cudagraph_replays"] or r.get("cudagraph_skipped") for *_, r in graphed):
        lines += ["", "Calls replayed from CUDA graphs (warm-up and timed calls): " + ", ".join(
            f"{m} / {b} {r['cudagraph_replays']}" for m, b, r in graphed) + "."]  # fmt: skip
        lines += [f"- {m} / {b}: a CUDA graph was given up: {_cell(r['cudagraph_skipped'], 300)}"
                  for m, b, r in graphed if r.get("cudagraph_skipped")]  # fmt: skip
    return lines


def _error_lines(run):
    lines = []
    for rec in run["records"]:
        if rec.get("status") not in (PASS, "skipped") and rec.get("error"):
            lines.append(
                f"- **{rec['model']} / {LABELS.get(rec['backend'], rec['backend'])}** "
                f"({rec['status']}): {_cell(rec['error'], 600)}"
            )
    return lines


def run_title(run):
    part = f", part {run['part']}" if run.get("part") else ""
    smoke = " (smoke)" if run.get("smoke") else ""
    return f"{run['suite']}{smoke} / {run['mode']}{part}"


def markdown(runs, title="Ember benchmarks"):
    """The whole results.md text for one or more runs."""
    lines = [f"# {title}", ""]
    for run in runs:
        table, summary = table_of(run), summarize(run)
        lines += [f"## {run_title(run)}", ""] + _header(run) + [""]
        lines += ["### Summary", ""] + _summary_lines(run, summary) + [""]
        copy = [r["copy_gbps"] for r in run["records"] if r.get("copy_gbps")]
        if copy:
            lines += [
                "Device copy bandwidth (large tensor copy_, bytes read + written): "
                + f"{max(copy):.0f} GB/s.",
                "",
            ]
        like = _like_for_like_lines(run, table)
        if like:
            lines += ["### Ember vs torch.compile[reduce-overhead], like for like", ""]
            lines += like + [""]
        lines += ["### Speedup over eager", ""] + _matrix_lines(run, table) + [""]
        lines += ["### Details", ""] + _detail_lines(run, table) + [""]
        errors = _error_lines(run)
        if errors:
            lines += ["### Failures", ""] + errors + [""]
        if run.get("notes"):
            lines += ["### Notes", ""] + [f"- {_cell(n)}" for n in run["notes"]] + [""]
        if run.get("chart_note"):
            lines += [f"Chart: {run['chart_note']}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# chart and files


def chart_name(run):
    return f"speedup-{run['suite']}-{run['mode']}.png"


def draw_chart(run, path):
    """A bar chart of speedup over eager per model, one bar per backend; a note if impossible."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - the chart is optional
        return f"skipped ({type(e).__name__}: {e}); pip install matplotlib for it"
    table = table_of(run)
    models = list(table)
    ember = headline_backend(run["backends"])
    if ember:  # like for like: Ember over reduce-overhead first, over default torch.compile next
        refs = [b for b in (CG, "torch_compile") if b in run["backends"]]
        bars_of = [(f"{LABELS.get(ember, ember)} vs {LABELS[r]}", ember, r) for r in refs]
        ylabel = f"{LABELS.get(ember, ember)} speedup over torch.compile (x: failed)"
    else:
        bars_of = [(LABELS.get(b, b), b, "eager") for b in run["backends"] if b != "eager"]
        ylabel = "speedup over eager (x: failed)"
    width = 0.8 / max(len(bars_of), 1)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(models) * max(len(bars_of), 1) + 2), 4.5))
    for j, (label, b, over) in enumerate(bars_of):
        xs = [i + (j - (len(bars_of) - 1) / 2) * width for i in range(len(models))]
        ys = [
            speedup(table[m], b, over)
            if all(table[m].get(k, {}).get("status") == PASS for k in (b, over))
            else 0
            for m in models
        ]
        bars = ax.bar(xs, [y or 0 for y in ys], width, label=label)
        for x, y, m in zip(xs, ys, models):
            if not y:
                ax.text(
                    x, 0.02, "x", ha="center", va="bottom", color=bars.patches[0].get_facecolor()
                )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(
        f"{run_title(run)} on {run.get('meta', {}).get('device_name', run['device'])}", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(out_dir, runs, chart=True, log=None):
    """Write results.json, results.md and (if asked) a chart per run into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for run in runs:
        run["summary"] = summarize(run)
        if chart:
            note = draw_chart(run, out_dir / chart_name(run))
            run["chart_note"] = note
            run["chart"] = None if note else chart_name(run)
            if note and log:
                log(f"chart {note}")
    (out_dir / "results.json").write_text(json.dumps({"runs": runs}, indent=1, default=str))
    (out_dir / "results.md").write_text(markdown(runs))
