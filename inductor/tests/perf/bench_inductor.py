"""Small benchmark: eager vs ember.inductor (compile_fx) on a few models; prints one line each.

Run: python inductor/tests/perf/bench_inductor.py [cuda]. Times are the 20th percentile of
repeated calls (CUDA-synchronised on GPU).
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.inductor import compile_fx, compile_prims, config
from ember.primtorch.trace import trace_to_prims


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *a):
        return self.f(*a)


def bench(f, *a, n=60):
    sync = torch.cuda.synchronize if a[0].is_cuda else (lambda: None)
    for _ in range(5):
        f(*a)
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        f(*a)
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 5] * 1e6


def cases(dev, big):
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    n = 8 if big else 1
    return {
        "pointwise chain": (
            Fn(lambda x: F.gelu(x) * torch.sigmoid(x) + x * 0.5),
            (r(1024 * n, 1024),),
        ),
        "softmax": (Fn(lambda x: torch.softmax(x, -1)), (r(256 * n, 1024),)),
        "layer_norm": (nn.LayerNorm(768), (r(512 * n, 768),)),
        "bias+gelu+residual+LN": (
            Fn(lambda x, b, s, w: F.layer_norm(F.gelu(x + b) + s, (768,), w)),
            (r(512 * n, 768), r(768), r(512 * n, 768), r(768)),
        ),
        "MLP": (
            nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.LayerNorm(256)),
            (r(64 * n, 256),),
        ),
        "tiny add (overhead)": (Fn(lambda x: x + 1), (r(8),)),
    }


def main():
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    config.cache = False
    torch.manual_seed(0)
    with torch.no_grad():
        for name, (m, args) in cases(dev, dev == "cuda").items():
            m = m.to(dev).eval()
            c = compile_fx(m, list(args))
            torch.testing.assert_close(c(*args), m(*args), atol=1e-4, rtol=1e-4)
            g = compile_prims(trace_to_prims(m, *args), list(args))  # no aot_autograd runtime
            te, tc, tg = bench(m, *args), bench(c, *args), bench(g, *args)
            print(
                f"{dev} {name:24s} eager {te:9.1f} us  compile_fx {tc:9.1f} us ({te / tc:5.2f}x)"
                f"  graph only {tg:9.1f} us ({te / tg:5.2f}x)"
            )


if __name__ == "__main__":
    main()
