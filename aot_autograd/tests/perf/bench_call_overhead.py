"""Per-call overhead of aot_module_simplified's callable over calling the compiled graph directly.

Run: python aot_autograd/tests/perf/bench_call_overhead.py [--fx]. The compiler returns the
outputs it computed at compile time (a graph costing ~0.2 us), so the difference is the
aot_autograd runtime alone; --fx runs the prim graphs instead. Times are medians of repeated
batches of calls (the machine is shared: compare medians of several runs).
"""

import statistics
import sys
import time

import torch
import torch.nn as nn

from ember.aot_autograd import aot_module_simplified


def per_call_us(f, args, n=2000, reps=15) -> float:
    for _ in range(200):
        f(*args)
    batches = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            f(*args)
        batches.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(batches)


class Add(nn.Module):
    def forward(self, x):
        return (x + 1,)


class MLP(nn.Module):
    def __init__(self, layers=8, width=32):
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width),
                                                                       nn.ReLU())])  # fmt: skip

    def forward(self, x):
        return (self.body(x),)


def _compiler(kind: str, captured: dict):
    def precomputed(gm, example):
        with torch.no_grad():
            outs = list(gm(*example))
        fn = lambda *a: outs  # noqa: E731
        captured.setdefault("forward", fn)
        return fn

    def fx_forward(gm, example):
        captured.setdefault("forward", gm.forward)
        return gm

    return fx_forward if kind == "fx" else precomputed


def measure(name, module, x, training: bool, kind: str, guarded: bool) -> None:
    captured: dict = {}
    module.requires_grad_(training)
    x.requires_grad_(training and name == "add")
    run = aot_module_simplified(module, [x], fw_compiler=_compiler(kind, captured), guarded=guarded)
    with torch.enable_grad() if training else torch.no_grad():
        run(x)
        state = [*module.parameters(), *module.buffers()]
        graph = captured["forward"]
        t_run = per_call_us(run, (x,))
        t_graph = per_call_us(lambda x: graph(*state, x), (x,))
    mode = "training " if training else "inference"
    key = "guarded" if guarded else "keyed  "
    print(f"{name:5s} {mode} {key}: call {t_run:7.1f} us  graph {t_graph:7.1f} us  "
          f"overhead {t_run - t_graph:6.1f} us", flush=True)  # fmt: skip


def main():
    kind = "fx" if "--fx" in sys.argv else "precomputed"
    torch.manual_seed(0)
    for training in (False, True):
        for guarded in (False, True):
            measure("add", Add(), torch.randn(8), training, kind, guarded)
            measure("mlp8", MLP(), torch.randn(1, 32), training, kind, guarded)


if __name__ == "__main__":
    main()
