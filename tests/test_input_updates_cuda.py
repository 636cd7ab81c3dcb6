"""A KV cache written in place under CUDA graphs (inductor/input_updates.py, cudagraphs.py): the
replayed graph writes the caller's buffers (read in place, at fixed addresses) and returns them
as views, so a step copies in only its changing arguments. Skipped without CUDA."""

import pytest
import torch

import ember
from ember.inductor import metrics
from input_updates_model import Cache, _CountCopies

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_a_replayed_step_writes_the_cache_in_place():
    ember.reset()
    model, ref = Cache(rounds=4).cuda(), Cache(rounds=4).cuda()
    compiled = ember.compile(model)
    addresses = (model.k.data_ptr(), model.v.data_ptr())
    replays = metrics.cudagraph_replays
    torch.manual_seed(0)
    with torch.no_grad():
        for i in range(8):
            new, pos = torch.randn(1, 2, 1, 4, device="cuda"), torch.tensor([i], device="cuda")
            counter = _CountCopies()
            with counter:
                got = compiled(new, pos)
            torch.testing.assert_close(got, ref(new, pos))
            torch.testing.assert_close(model.k, ref.k)
            torch.testing.assert_close(model.v, ref.v)
    assert metrics.cudagraph_replays - replays >= 4
    assert (model.k.data_ptr(), model.v.data_ptr()) == addresses
    assert counter.n <= 2  # the two arguments copied in; nothing of the caches
