"""Kernel counts and replay latencies of the lagging model families: eager, torch.compile
(mode="reduce-overhead") and ember.compile, per representative module (bench/family_models.py).

On a GPU host (bf16 autocast inference, batch 32 images / 8x512 tokens):
    python bench/family_probe.py                       # every family
    python bench/family_probe.py --only mixer,densenet --replays 50
On this CPU-only machine, counting what the CUDA path would generate (Triton rendered under the
interpreter, channels-last convolutions and padded matmuls forced on as on CUDA, no kernel
hoisted ahead of an extern as at real sizes, no timing):
    TRITON_INTERPRET=1 python bench/family_probe.py --device cpu --small --analyze
`--device cpu --small` without --analyze times the C++ path instead.

Per module it prints Ember's generated kernels split by what they do: "copy" (a pure layout copy,
same dtype), "cast" (a dtype conversion only: autocast's weight casts), "cat" (a concatenation
assembled by a copy kernel) and "compute" (the rest), its extern calls by op, and times (median of
CUDA-event replays after warm-up).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402,F401  (this checkout's components first on sys.path)
import family_models  # noqa: E402

_MOVES = {"load", "to_dtype", "constant", "store"}
# a concatenation's pieces: each load masked to its range, picked by index comparisons
_PIECES = {"index_expr", "masked", "masked_result", "where", "lt", "le", "ge", "gt", "logical_and"}
_OP = re.compile(r"^\s*(?:tmp\d+ = )?(\w+)\(")


class KernelCensus:
    """Collects every scheduled kernel and extern call Ember generates while it is installed."""

    def __init__(self):
        self.kinds: collections.Counter = collections.Counter()
        self.externs: collections.Counter = collections.Counter()
        self.copies: list[str] = []
        self.written = 0  # bytes the generated kernels store
        self.torch_kernels = None  # torch.compile's generated kernels, where it ran

    @contextlib.contextmanager
    def installed(self):
        from ember.inductor import pipeline
        from ember.inductor.loop_ir import ExternBuffer

        render = pipeline.render_kernels

        def counting(steps, buffers, device, hints=None):
            for s in steps:
                if isinstance(s, pipeline.Kernel):
                    kind = self.classify(s, buffers)
                    for m in s.members:
                        if m.node.name not in s.local:
                            lay = m.node.layout
                            self.written += int(lay.numel()) * lay.dtype.itemsize
                    self.kinds[kind] += 1
                    if kind == "copy":
                        self.copies.append(self.describe(s))
            for b in buffers.values():
                if isinstance(b, ExternBuffer):
                    self.externs[b.op.split(".")[-1]] += 1
            return render(steps, buffers, device, hints)

        pipeline.render_kernels = counting
        try:
            yield self
        finally:
            pipeline.render_kernels = render

    @staticmethod
    def classify(kernel, buffers) -> str:
        from ember.inductor.loop_ir import TextHandler, loop_vars, set_handler

        used, cast, masked = set(), False, False
        for m in kernel.members:
            node = m.node
            if node.is_reduction():
                return "compute"
            with set_handler(TextHandler()) as h:
                node.body(loop_vars("i", len(node.ranges)), [])
            text = "\n".join(h.lines)
            used |= {m.group(1) for line in h.lines if (m := _OP.match(line))}
            masked |= "masked" in text
            for name in re.findall(r"load\((\w+),", text):
                src = buffers.get(name)
                if src is not None and src.layout.dtype != node.layout.dtype:
                    cast = True
        if used - _MOVES - (_PIECES if masked else set()):
            return "compute"
        return "cast" if cast else "cat" if masked else "copy"

    @staticmethod
    def describe(kernel) -> str:
        return ", ".join(f"{m.node.name}{tuple(int(s) for s in m.node.layout.sizes)}"
                         for m in kernel.members)  # fmt: skip

    def summary(self) -> str:
        kinds = " ".join(f"{k}={self.kinds[k]}" for k in ("compute", "copy", "cast", "cat"))
        ext = " ".join(f"{k}={v}" for k, v in sorted(self.externs.items()))
        theirs = f" torch.compile kernels={self.torch_kernels}" if self.torch_kernels else ""
        return (f"kernels={sum(self.kinds.values())} ({kinds}) "
                f"written={self.written / 2**20:.2f}MiB externs: {ext}{theirs}")


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_replays(fn, args, device, warmup, replays) -> float:
    """Median milliseconds of one call, after `warmup` calls (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn(*args)
    _sync(device)
    times = []
    for _ in range(replays):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def autocast(device):
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=torch.bfloat16)


def analyze(name, small, device):
    """Compile one family the way CUDA would (Triton, NHWC convolutions, padded matmuls) and
    return its census; values are checked against eager."""
    import ember
    from ember.inductor.config import config

    saved = {k: getattr(config, k) for k in ("cpu_backend", "conv_channels_last", "pad_mm",
                                             "cache", "fx_cache", "hoist_max_bytes")}  # fmt: skip
    config.cpu_backend, config.conv_channels_last, config.pad_mm = "triton", True, True
    config.cache = config.fx_cache = False
    if small:  # as at real sizes, where every buffer is larger than hoist_max_bytes
        config.hoist_max_bytes = 0
    try:
        model, inputs = family_models.build(name, small)
        model = model.eval().to(device)
        inputs = tuple(t.to(device) for t in inputs)
        census = KernelCensus()
        with torch.no_grad(), autocast(device), census.installed():
            got = ember.compile(model)(*inputs)
            want = model(*inputs)
        check(got, want)
        return census
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def check(got, want, strict=True):
    """Ember's outputs against eager's (bf16 tolerances); at real sizes (strict=False) a larger
    error is printed and the timing goes on."""
    flat_got = [t for t in torch.utils._pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    flat_want = [t for t in torch.utils._pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    assert len(flat_got) == len(flat_want)
    for g, w in zip(flat_got, flat_want):
        try:
            torch.testing.assert_close(g.float(), w.float(), atol=5e-2, rtol=5e-2)
        except AssertionError as e:
            if strict:
                raise
            print(f"    values differ from eager beyond bf16 tolerance: {str(e).splitlines()[2:4]}")


def race(name, small, device, warmup, replays):
    """Times of eager, torch.compile(reduce-overhead) and ember.compile on one family, with
    Ember's kernel census."""
    import ember
    from ember.inductor.config import config

    config.cache = config.fx_cache = False  # every kernel is rendered, so the census sees it
    model, inputs = family_models.build(name, small)
    model = model.eval().to(device)
    inputs = tuple(t.to(device) for t in inputs)
    census = KernelCensus()
    row = {}
    with torch.no_grad(), autocast(device):
        row["eager"] = time_replays(model, inputs, device, warmup, replays)
        with census.installed():
            compiled = ember.compile(model)
            want = model(*inputs)
            check(compiled(*inputs), want, strict=small)
        row["ember"] = time_replays(compiled, inputs, device, warmup, replays)
        if device.startswith("cuda"):
            # bench/ may race torch's compiler (ARCHITECTURE.md)
            importlib.import_module("torch._dynamo").reset()
            torch_metrics = importlib.import_module("torch._inductor.metrics")
            torch_metrics.reset()
            ro = torch.compile(model, mode="reduce-overhead")
            row["reduce-overhead"] = time_replays(ro, inputs, device, warmup, replays)
            census.torch_kernels = torch_metrics.generated_kernel_count
    return row, census


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="CPU-sized modules")
    p.add_argument("--analyze", action="store_true", help="census of the CUDA path, no timing")
    p.add_argument("--only", default="", help="comma-separated families")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--copies", action="store_true", help="list each layout-copy kernel")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(family_models.FAMILIES)
    for name in names:
        try:
            if args.analyze:
                census, row = analyze(name, args.small, args.device), {}
            else:
                row, census = race(name, args.small, args.device, args.warmup, args.replays)
        except Exception as e:  # one family's failure is reported, the others still run
            print(f"{name:12s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        times = " ".join(f"{k}={v:.3f}ms" for k, v in row.items())
        ratio = ""
        if "reduce-overhead" in row:
            ratio = f" ember/ro speed={row['reduce-overhead'] / row['ember']:.2f}x"
        print(f"{name:12s} {census.summary()} {times}{ratio}", flush=True)
        if args.copies:
            for c in census.copies:
                print(f"    copy: {c}")


if __name__ == "__main__":
    main()
