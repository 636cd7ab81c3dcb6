"""Per-call overhead of ember.compile on CPU: a cache hit (guards + call) on a one-op function
against eager, and guard evaluation for a module with 100 parameters.

Run: .venv/bin/python bench/overhead_cpu.py   (prints one line per measurement)
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

_ROOT = Path(__file__).resolve().parents[1]
for _c in ("ir", "dynamo"):
    sys.path.insert(0, str(_ROOT / _c))

import ember  # noqa: E402
from ember.dynamo._native import _C  # noqa: E402


def per_call_us(fn, *args, n=20000, repeat=7):
    """Best-of-`repeat` mean time of one call, in microseconds."""
    for _ in range(200):
        fn(*args)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def one_op(x):
    return x + 1


class Hundred(nn.Module):
    """50 linear layers: 100 parameters."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(50)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def main():
    torch.set_num_threads(1)
    x = torch.ones(4)
    compiled = ember.compile(one_op, backend="eager")
    compiled(x)
    eager_us = per_call_us(one_op, x)
    hit_us = per_call_us(compiled, x)
    print(f"one-op function: eager {eager_us:.2f} us, compiled cache hit {hit_us:.2f} us, "
          f"overhead {hit_us - eager_us:.2f} us")  # fmt: skip

    m = Hundred()
    cm = ember.compile(m, backend="eager")
    xm = torch.ones(1, 2)
    cm(xm)
    code = type(m).forward.__code__
    (program, _, _), = _C.entries(code)
    args = (Hundred.forward, m, xm)  # the hook's view: (function, *frame arguments)
    builtins_dict = vars(__import__("builtins"))
    guard_us = per_call_us(program.check, args, Hundred.forward.__globals__, builtins_dict, n=2000)
    assert program.check(args, Hundred.forward.__globals__, {}) == -1
    eager_m = per_call_us(m, xm, n=500)
    comp_m = per_call_us(cm, xm, n=500)
    print(f"100-parameter module: {program.size} guard instructions, guard check {guard_us:.2f} us;"
          f" eager call {eager_m:.1f} us, compiled call {comp_m:.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
