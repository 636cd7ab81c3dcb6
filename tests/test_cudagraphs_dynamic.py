"""A program compiled with symbolic sizes replays a CUDA graph per set of sizes, on CUDA, and
every call's result is right and stays its own. Skipped without CUDA."""

import pytest
import torch
import torch.nn as nn

import ember
from ember.inductor import metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def deep_mlp():
    layers = [nn.Linear(64, 96)]
    for _ in range(6):
        layers += [nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 96)]
    return nn.Sequential(*layers).cuda().eval()


def test_one_symbolic_program_replays_a_graph_per_size():
    torch.manual_seed(0)
    model = deep_mlp()
    compiled = ember.compile(model, dynamic=True)
    with torch.no_grad():
        compiled(torch.randn(5, 64, device="cuda"))  # the one compile
    kernels = metrics.generated_kernel_count
    xs = {n: torch.randn(n, 64, device="cuda") for n in (4, 12, 7, 30)}
    order = [4, 12, 7, 30] * 5 + [12, 4, 30, 7]
    replays = metrics.cudagraph_replays
    skips = len(metrics.cudagraph_skips)
    results = []
    with torch.no_grad():
        for n in order:
            out = compiled(xs[n])
            torch.testing.assert_close(out, model(xs[n]), atol=1e-4, rtol=1e-4)
            results.append((n, out))
        for n, out in results:  # replays of this size and of the others overwrote none
            torch.testing.assert_close(out, model(xs[n]), atol=1e-4, rtol=1e-4)
    assert metrics.generated_kernel_count == kernels  # no size compiled again
    assert len(metrics.cudagraph_skips) == skips
    # per size: two plain calls, then a capture that replays; every call after replays
    assert metrics.cudagraph_replays - replays == len(order) - 2 * len(xs)
