"""ember.export with a dynamic batch through the real lowering (aot_autograd + primtorch)."""

import pytest
import torch
import torch.nn as nn

import ember
from ember.dynamo import Dim
from ember.dynamo import backends as B


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x).softmax(-1)


def test_export_dynamic_with_real_lowering():
    """Once ember.aot_autograd lowers symbolic graphs, a model exports for every batch size."""
    lower = B.resolve_entry("export_lowering")
    if not getattr(lower, "ember_supports_dynamic", False):
        pytest.skip("the export lowering does not take symbolic sizes yet")
    model = MLP().eval()
    ep = ember.export(model, (torch.randn(4, 16),), dynamic_shapes={"x": {0: Dim("b")}})
    for b in (2, 5, 9):
        x = torch.randn(b, 16)
        torch.testing.assert_close(ep(x), model(x))
