"""cumsum as a masked reduction (the decomposition packages use: the C++ runtime has no scan)."""

import pytest
import torch

from ember.primtorch.decomp import EXTERN_DECOMPOSITIONS
from ember.primtorch.decomp.scan import cumsum_as_reduction

CASES = [((4, 7), 1, None), ((3, 5, 6), 0, None), ((9,), 0, torch.float64), ((2, 6), -1, None),
         ((), 0, None), ((3, 1), 1, torch.int32)]  # fmt: skip


@pytest.mark.parametrize("shape,dim,dtype", CASES)
@pytest.mark.parametrize("kind", ["float", "int", "bool"])
def test_cumsum_as_reduction_matches_aten(shape, dim, dtype, kind):
    torch.manual_seed(0)
    x = {"float": lambda: torch.randn(shape), "int": lambda: torch.randint(-3, 4, shape),
         "bool": lambda: torch.rand(shape) > 0.5}[kind]()  # fmt: skip
    want = torch.cumsum(x, dim, dtype=dtype)
    got = cumsum_as_reduction(x, dim, dtype=dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_registered_for_targets_without_a_scan():
    assert EXTERN_DECOMPOSITIONS[torch.ops.aten.cumsum.default] is cumsum_as_reduction


def test_cudnn_batch_norm_inference_decomposes_like_batch_norm():
    """cuDNN's batch norm (what ATen picks for CUDA tensors) decomposes without a GPU: only its
    prims run while tracing."""
    from ember.primtorch import trace_to_prims

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5

    def f(x, w, b, rm, rv):
        return torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)[0]

    gm = trace_to_prims(f, x, w, b, rm, rv)
    want = torch.nn.functional.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)
    torch.testing.assert_close(gm(x, w, b, rm, rv)[0] if isinstance(gm(x, w, b, rm, rv), (tuple, list))
                               else gm(x, w, b, rm, rv), want)  # fmt: skip
