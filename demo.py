"""The README's main command: compile a small built-in model on the CPU and race it against eager.

`./bazelw run //:demo` compiles a small transformer-style MLP block with the best Ember backend that
works here (inductor, else aot_eager, else eager), checks the result against eager and prints both
timings. It grows with the project.
"""

import sys
import time

import torch

import ember

BACKENDS = ("inductor", "aot_eager", "eager")


class Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual: the heart of a transformer MLP."""

    def __init__(self, dim=256, hidden=1024):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def median_ms(fns, x, rounds=100):
    """Median time of each function in ms, timed in alternation so load affects both alike."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn(x)
            samples.append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] * 1e3 for t in times]


def main() -> int:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(64, 256)
    with torch.no_grad():
        expected = model(x)
        for backend in BACKENDS:
            try:
                compiled = ember.compile(model, backend=backend)
                start = time.perf_counter()
                got = compiled(x)
                compile_s = time.perf_counter() - start
            except Exception as e:  # a backend still being built: say so and try the next one
                print(f"backend {backend!r} unavailable: {type(e).__name__}: {e}".splitlines()[0])
                continue
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            eager_ms, ember_ms = median_ms((model, compiled), x)
            print(f"model: LayerNorm+MLP block, input {tuple(x.shape)}, float32, CPU")
            print(f"backend: {backend} (first call incl. compile {compile_s:.2f} s)")
            print(f"result matches eager: max abs diff {(got - expected).abs().max().item():.2e}")
            print(f"eager: {eager_ms:.3f} ms   ember[{backend}]: {ember_ms:.3f} ms   "
                  f"speedup {eager_ms / ember_ms:.2f}x")  # fmt: skip
            return 0
    print("no Ember backend could compile the demo model", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
