"""Accumulating index_put on CUDA (GPU only): the wrapper's kernel for `prims.index_put` adds
through one index tensor with atomic adds (index_add_), equal to torch's sorting index_put_ for
negative indices, broadcast values and repeats; a deterministic run keeps torch's kernel; and an
embedding with many lookups of few rows (a relative position bias) trains through a compiled
step with eager's gradient and without the sorting kernel."""

import pytest
import torch

import ember
from ember.inductor import runtime

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accumulation_equals_torchs_with_negatives_broadcasts_and_repeats(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(32, 8, device="cuda", generator=g).to(dtype)
    idx = torch.randint(-32, 32, (300, 7), device="cuda", generator=g)
    for values in (torch.randn(300, 7, 8, device="cuda", generator=g).to(dtype),
                   torch.randn(8, device="cuda", generator=g).to(dtype)):  # fmt: skip
        want = aten.index_put.default(a.float(), [idx], values.float(), True)
        got = runtime.extern("prims.index_put")(a, [idx], values, True)
        assert got.dtype == dtype and got.shape == a.shape
        # bf16: repeats summed in float32 and rounded once, as torch's kernel does
        want = want.to(dtype).float()
        rtol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # a sum's order may flip one rounding
        torch.testing.assert_close(got.float(), want, atol=1e-4, rtol=rtol)
    assert torch.equal(a, a.clone())  # the input is not written


def test_deterministic_runs_keep_torchs_kernel(monkeypatch):
    def atomic(*args, **kwargs):
        raise AssertionError("index_add_ (atomic adds) in a deterministic run")

    monkeypatch.setattr(torch.Tensor, "index_add_", atomic)
    a = torch.zeros(4, 3, device="cuda")
    idx = torch.tensor([0, 1, 1, 3], device="cuda")
    values = torch.ones(4, 3, device="cuda")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = runtime.extern("prims.index_put")(a, [idx], values, True)
    finally:
        torch.use_deterministic_algorithms(was)
    assert got.sum(1).tolist() == [3.0, 6.0, 0.0, 3.0]


def test_a_relative_position_bias_trains_fast_with_eagers_gradient():
    """T5's bias: 512 x 512 bucket indices into 32 rows x 8 heads. torch's sorting index_put_
    took 10 ms a step for its gradient on an H200 (bench/profile_diff.py t5-small)."""
    torch.manual_seed(0)
    bias = torch.nn.Embedding(32, 8).cuda()
    buckets = torch.randint(0, 32, (512, 512), device="cuda")
    scores = torch.randn(2, 8, 512, 512, device="cuda")

    def step(model):
        out = (scores + model(buckets).permute(2, 0, 1)).softmax(-1)
        (out * scores).sum().backward()

    step(bias)
    want = bias.weight.grad.clone()
    bias.weight.grad = None
    compiled = ember.compile(bias)
    for _ in range(3):
        bias.weight.grad = None
        step(compiled)
    torch.testing.assert_close(bias.weight.grad, want, atol=1e-3, rtol=1e-4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bias.weight.grad = None
        step(compiled)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert not any("indexing_backward" in n for n in names), "the sorting kernel ran"
    assert any("index" in n.lower() for n in names), names  # index_add_'s kernel did
