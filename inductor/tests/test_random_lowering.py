"""Random prims lower to kernels: `philox_rand`/`philox_bits` are pointwise bodies that draw the
very numbers the prims' reference draws (same seed, same counters), in both renderers, and fuse
with the ops that read them (a dropout is one kernel)."""

import os

import pytest
import torch
from ember.inductor import compile_prims, config, metrics
from ember.primtorch import prims
from inductor_helpers import PrimGraph


@pytest.fixture(params=["cpp", "triton"])
def renderer(request, monkeypatch):
    if request.param == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels on CPU tensors run only in its interpreter (a GPU host)")
    monkeypatch.setattr(config, "cpu_backend", request.param)
    return request.param


def _run(g: PrimGraph):
    metrics.reset()
    compiled = compile_prims(g.module(), list(g.inputs))
    return compiled(*g.inputs)


SEED = torch.tensor(0x1234_5678_9ABC_DEF0 - 2**63, dtype=torch.int64)  # both key words used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_uniform_draws_are_the_references_bit_for_bit(renderer, dtype):
    # an offset past 2**32: the counter's high word is used too
    shape, offset = (37, 50), 2**32 + 1000
    g = PrimGraph()
    seed = g.input(SEED)
    g.output(g(prims.philox_rand, shape, seed, offset, dtype, "cpu"))
    (got,) = _run(g)
    expected = prims.philox_rand(shape, SEED, offset, dtype, "cpu")
    assert got.dtype == dtype and got.shape == shape
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert metrics.fallbacks == [] and metrics.generated_kernel_count == 1
    assert 0.4 < got.float().mean() < 0.6 and got.min() >= 0 and got.max() < 1


def test_raw_words_with_a_tensor_offset(renderer):
    g = PrimGraph()
    seed = g.input(SEED)
    offset = g.input(torch.tensor(12345, dtype=torch.int64))
    g.output(g(prims.philox_bits, (3, 5, 7), seed, offset, "cpu"))
    (got,) = _run(g)
    expected = prims.philox_bits((3, 5, 7), SEED, torch.tensor(12345), "cpu")
    assert torch.equal(got, expected)
    assert int(got.min()) >= 0 and int(got.max()) < 2**32
    assert metrics.fallbacks == []


def test_a_dropout_is_one_kernel_with_the_references_mask(renderer):
    x = torch.randn(64, 33)
    g = PrimGraph()
    a, seed = g.input(x), g.input(SEED)
    u = g(prims.philox_rand, tuple(x.shape), seed, 0, torch.float32, "cpu")
    keep = g(prims.ge, u, 0.25)
    g.output(g(prims.where, keep, g(prims.mul, a, 1 / 0.75), 0.0))
    (got,) = _run(g)
    mask = prims.philox_rand(tuple(x.shape), SEED, 0, torch.float32, "cpu") >= 0.25
    torch.testing.assert_close(got, torch.where(mask, x / 0.75, 0.0))
    assert metrics.generated_kernel_count == 1 and metrics.fallbacks == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_draws_are_the_references_bit_for_bit(dtype):
    shape, offset = (129, 1000), 2**32 + 7
    seed = SEED.cuda()
    g = PrimGraph()
    s = g.input(seed)
    g.output(g(prims.philox_rand, shape, s, offset, dtype, "cuda"))
    (got,) = _run(g)
    expected = prims.philox_rand(shape, SEED, offset, dtype, "cpu")
    assert got.is_cuda and metrics.fallbacks == []
    torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=0)


def test_a_chain_of_dropouts_is_split_so_no_kernel_draws_more_than_the_cap(renderer):
    # a backward's recomputed residual stream: h_i = h_(i-1) + dropout(a_i), every h_i kept
    from ember.inductor.lowering import lower_graph
    from ember.inductor.scheduler import MAX_RANDOM_DRAWS, Kernel, random_draws, schedule

    xs = [torch.randn(16, 24) for _ in range(9)]
    g = PrimGraph()
    seed = g.input(SEED)
    h, outs, expected = g.input(xs[0]), [], [xs[0]]
    for i, x in enumerate(xs[1:]):
        offset = 1000 * i
        u = g(prims.philox_rand, tuple(x.shape), seed, offset, torch.float32, "cpu")
        h = g(prims.add, h, g(prims.where, g(prims.lt, u, 0.9), g(prims.div, g.input(x), 0.9), 0.0))
        outs.append(h)
        mask = prims.philox_rand(tuple(x.shape), SEED, offset, torch.float32, "cpu") < 0.9
        expected.append(expected[-1] + torch.where(mask, x / 0.9, 0.0))
    g.output(*outs)
    low = lower_graph(g.module(), list(g.inputs))
    names = [o.name for o in low.outputs if hasattr(o, "name")]
    kernels = [s for s in schedule(low.buffers, names) if isinstance(s, Kernel)]
    draws = [sum(random_draws(m.node) for m in k.members) for k in kernels]
    # every draw is computed somewhere (one a second time: a draw read by two kernels is
    # inlined into both), and no kernel computes more than the cap
    assert sum(draws) >= 8 and max(draws) <= MAX_RANDOM_DRAWS, draws
    for got, want in zip(_run(g), expected[1:]):
        torch.testing.assert_close(got, want)
