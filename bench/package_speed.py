"""Packages against Ember in process: a model exported and packaged (bf16 weights and
activations) run by the standalone runtime (`run_package --bench`) and loaded in process, against
`ember.compile` of the same model (CUDA graphs replayed), one model per row.

    python bench/package_speed.py --out $OUT/ps      # bert-base-uncased and vit_base_patch16_224
    python bench/package_speed.py --device cpu --models small_bert,small_vit --batch 2 --out /tmp/ps

Issue #29: "A BERT-base and a ViT-B/16 package (bf16) run standalone at least as fast as Ember in
process". Every figure is the median per-call time over rounds of back-to-back calls,
synchronised once per round (what run_package --bench prints as loop_median_ms). Inputs are the
suite's (bench/models.py: 32 images, or 8 x 512 tokens unless --batch/--seq); outputs are
checked against eager's (relative error of the output).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import _paths  # noqa: F401
import numpy as np
import torch

import ember
from ember.cpp_wrapper import install_run_package, load_package, package
from measure import kernel_table
from models import MODELS


def per_call_ms(fn, device, calls=20, rounds=10):
    """Median over rounds of the per-call time of `calls` back-to-back calls."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(10):  # warm (CUDA graphs are recorded after a few calls)
        fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return round(statistics.median(times), 4)


def rel_err(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def one_model(name, device, dtype, exe, work, args):
    spec = MODELS[name]
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(args.batch or spec.batch, args.seq or spec.seq, gen)
    inputs = tuple((x.to(dtype) if x.is_floating_point() else x).to(device) for x in inputs)
    model = spec.build().to(device).to(dtype).eval()
    row = {"model": name, "shape": spec.describe(args.batch, args.seq)}
    with torch.no_grad():
        want = model(*inputs)
        compiled = ember.compile(model)
        t0 = time.perf_counter()
        got = compiled(*inputs)
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        row["in_process_err"] = rel_err(got, want)
        row["ember_ms"] = per_call_ms(lambda: compiled(*inputs), device)
        ember.reset()
        t0 = time.perf_counter()
        path = package(ember.export(model, inputs), work / f"{name}.pkg", device=device)
        row["package_s"] = round(time.perf_counter() - t0, 1)
        loaded = load_package(path)
        row["package_err"] = rel_err(loaded(*inputs)[0], want)
        row["loaded_ms"] = per_call_ms(lambda: loaded(*inputs), device)
        if args.profile and device == "cuda":
            row["kernels_loaded"] = kernel_table(lambda: loaded(*inputs))
            compiled = ember.compile(model)  # the cache is warm: the same kernels as above
            compiled(*inputs)
            row["kernels_ember"] = kernel_table(lambda: compiled(*inputs))
    files = []
    for i, x in enumerate(inputs):  # bf16 travels as float32 (run_package rounds it back)
        files.append(work / f"{name}.in{i}.npy")
        np.save(files[-1], (x.float() if x.is_floating_point() else x).cpu().numpy())
    run = subprocess.run([str(exe), "--bench", "20", "--rounds", "10", str(path), *map(str, files)],
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode:
        raise RuntimeError(f"run_package exited {run.returncode}: {run.stderr[-1500:]}")
    fields = dict(kv.split("=") for kv in run.stdout.split("bench", 1)[1].split())
    row["standalone_ms"] = float(fields["loop_median_ms"])
    row["standalone_vs_ember"] = round(row["ember_ms"] / row["standalone_ms"], 3)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert-base-uncased,vit_base_patch16_224")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--seq", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", action="store_true",
                   help="also each side's top GPU kernels (torch.profiler; CUDA only)")
    args = p.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    work = Path(tempfile.mkdtemp(prefix="package_speed_"))
    exe = install_run_package(work / "bin")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(one_model(name, args.device, dtype, exe, work, args))
        except Exception as e:  # a model's failure is a result
            traceback.print_exc()
            rows.append({"model": name, "error": f"{type(e).__name__}: {e}"[:400]})
        print(json.dumps(rows[-1]), flush=True)
        ember.reset()
    result = {"device": device_name, "dtype": args.dtype, "torch": torch.__version__, "rows": rows}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    return all("error" not in r for r in rows)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
