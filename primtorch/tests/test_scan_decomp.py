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

