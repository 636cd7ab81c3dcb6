"""Merge the results of several runs (the parts of a suite, or several suites and modes) into one
results.md / results.json / charts:

    python bench/merge.py /tmp/bench/bf16-1 /tmp/bench/bf16-2 ... --out /tmp/bench/all
    cp /tmp/bench/all/results.md bench/RESULTS.md

Runs of the same suite, mode and device become one (models in suite order, later parts win on
duplicates); different suites or modes become separate sections, in the order first seen.
"""

import argparse
import json
import sys
from pathlib import Path

import _paths  # noqa: F401 - puts the Ember components on sys.path
import report


def load(path):
    """The runs in a results.json, or in the results.json inside a directory."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    data = json.loads(path.read_text())
    return data.get("runs", [data])


def _key(run):
    return (run["suite"], run["mode"], run["device"], bool(run.get("smoke")))


def merge_runs(runs):
    """Group runs by (suite, mode, device, smoke) and merge each group into one run."""
    groups = {}
    for run in runs:
        groups.setdefault(_key(run), []).append(run)
    return [_merge_group(group) for group in groups.values()]


def _merge_group(group):
    if len(group) == 1:
        return group[0]
    first = group[0]
    backends = []
    for run in group:
        backends += [b for b in run["backends"] if b not in backends]
    records = {}
    for run in group:
        for rec in run["records"]:
            records[(rec["model"], rec["backend"])] = rec
    order = list(first.get("suite_models") or [])
    seen = [m for run in group for m in run["models"]]
    models = [m for m in order if m in seen] + [m for m in dict.fromkeys(seen) if m not in order]
    devices = {run.get("meta", {}).get("device_name") for run in group}
    notes = [n for run in group for n in run.get("notes", [])]
    if len(devices) > 1:
        notes.append("parts ran on different devices: " + ", ".join(sorted(map(str, devices))))
    missing = [b for b in backends for run in group if b not in run["backends"]]
    if missing:
        notes.append("not every part ran every backend: missing cells show as 'missing'")
    return {
        **first,
        "part": "merged from " + ", ".join(str(run.get("part") or "all") for run in group),
        "backends": backends,
        "models": models,
        "records": [records[(m, b)] for m in models for b in backends if (m, b) in records],
        "notes": notes,
        "elapsed_s": sum(run.get("elapsed_s") or 0 for run in group),
        "command": " ; ".join(run.get("command", "-") for run in group),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="run output directories or results.json files")
    p.add_argument("--out", help="output directory (default: merged/ beside the first input)")
    p.add_argument("--no-chart", action="store_true")
    args = p.parse_args(argv)
    runs = merge_runs([run for path in args.inputs for run in load(path)])
    out = Path(args.out) if args.out else Path(args.inputs[0]).resolve().parent / "merged"
    report.write(out, runs, chart=not args.no_chart, log=print)
    print(f"merged {len(args.inputs)} input(s) into {len(runs)} run(s): {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
