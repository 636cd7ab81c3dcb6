"""A matmul with a bias and GELU (bf16, 4096 x 4096 x 4096 by default): Ember's max-autotune (a
generated GEMM template with the epilogue fused, or the library call, whichever it measured
faster) against the device's measured bf16 matmul peak (torch.mm) and torch.compile's own
max-autotune.

    python bench/mm_epilogue.py --out $OUT/mm_epilogue            # on a GPU
    python bench/mm_epilogue.py --m 256 --n 256 --k 256 --backends eager,ember   # a quick look

Writes results.json and results.md to --out: milliseconds per call (median of CUDA-event
timings), TFLOP/s (2*M*N*K per call), the fraction of the measured peak, each compiled result's
largest difference from eager, compile seconds, and what Ember chose.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import _paths  # noqa: F401
import torch
import torch.nn.functional as F

import ember
from measure import event_median_ms


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    p.add_argument("--backends", default="eager,ember,torch_compile")
    p.add_argument("--iters", type=int, default=100, help="timed calls per measurement")
    p.add_argument("--out", default=None, help="a directory for results.json and results.md")
    return p.parse_args(argv)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def mm_bias_gelu(a, w, b):
    return F.gelu(a @ w + b)


def measured_peak(dtype, iters: int) -> dict:
    """The best TFLOP/s torch.mm reaches on large square products: the device's matmul peak as
    this software stack can use it (the datasheet number is not measured)."""
    best = {"tflops": 0.0}
    for size in (4096, 8192):
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        ms = event_median_ms(lambda: torch.mm(a, b), iters, warm=5)
        tflops = 2 * size**3 / ms / 1e9
        if tflops > best["tflops"]:
            best = {"tflops": tflops, "shape": size, "ms": ms}
        del a, b
    return best


def compiled(name: str, fn):
    if name == "eager":
        return fn
    if name == "ember":
        return ember.compile(fn, mode="max-autotune")
    if name == "torch_compile":  # bench/ may call torch's compiler; product code may not
        return torch.compile(fn, mode="max-autotune")
    raise ValueError(f"unknown backend {name!r}")


def main(argv=None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("mm_epilogue: needs a CUDA device", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    choices = _Collect()  # Ember's timings of its matmul candidates (logged at INFO)
    ember_log = logging.getLogger("ember.inductor")
    ember_log.setLevel(logging.INFO)
    ember_log.addHandler(choices)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    a = torch.randn(args.m, args.k, device="cuda", dtype=dtype)
    w = torch.randn(args.k, args.n, device="cuda", dtype=dtype) / args.k**0.5
    b = torch.randn(args.n, device="cuda", dtype=dtype)
    flops = 2 * args.m * args.n * args.k
    peak = measured_peak(dtype, args.iters)
    mm_ms = event_median_ms(lambda: torch.mm(a, w), args.iters, warm=5)  # the product alone: no epilogue at all
    with torch.no_grad():
        expected = mm_bias_gelu(a, w, b)
        rows = []
        for name in args.backends.split(","):
            from ember.inductor import metrics

            metrics.reset()
            fn = compiled(name, mm_bias_gelu)
            start = time.perf_counter()
            out = fn(a, w, b).clone()  # CUDA-graph outputs are overwritten by the next replay
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            ms = event_median_ms(lambda: fn(a, w, b), args.iters, warm=5)
            tflops = flops / ms / 1e9
            row = {"backend": name, "ms": ms, "tflops": tflops,
                   "of_peak": tflops / peak["tflops"], "compile_s": compile_s,
                   "max_abs_diff": float((out.float() - expected.float()).abs().max())}  # fmt: skip
            if name == "ember":
                row["choices"] = [m for m in choices.messages if "matmul" in m]
                row["templates"] = metrics.gemm_templates
                row["autotune_runs"] = metrics.gemm_autotune_runs
                row["autotune_cache_hits"] = metrics.gemm_autotune_hits
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"shape": [args.m, args.n, args.k], "dtype": args.dtype,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "measured_peak": peak, "torch_mm_ms": mm_ms, "results": rows}  # fmt: skip
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=2))
        (out / "results.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _markdown(result: dict) -> str:
    m, n, k = result["shape"]
    peak = result["measured_peak"]
    lines = [f"# gelu(a @ w + b), {result['dtype']} {m}x{n}x{k} on {result['device']}", "",
             f"Measured matmul peak (torch.mm, {peak['shape']}^3): {peak['tflops']:.1f} TFLOP/s; "
             f"torch.mm alone at this shape: {result['torch_mm_ms']:.3f} ms",
             "", "| backend | ms | TFLOP/s | of peak | compile s | max abs diff | notes |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["results"]:
        notes = ""
        if r["backend"] == "ember":
            notes = (f"templates {r['templates']}, timed {r['autotune_runs']}, "
                     f"cached {r['autotune_cache_hits']}")  # fmt: skip
        lines.append(f"| {r['backend']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['of_peak']:.0%} "
                     f"| {r['compile_s']:.1f} | {r['max_abs_diff']:.3g} | {notes} |")  # fmt: skip
    for r in result["results"]:
        for line in r.get("choices", ()):
            lines += ["", f"Ember's measurement: {line}"]
        if r["backend"] == "ember" and r.get("choices") == []:
            lines += ["", "Ember timed nothing: its choice came from the cache (see results.json "
                      "of the first run), or no matmul qualified."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
