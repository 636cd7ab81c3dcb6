"""Cutting graphs at DDP gradient-bucket boundaries (distributed.py), without a process group:
the active DDP module is a stand-in holding the bucket cap and the parameters DDP reduces."""

import contextlib
import types

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import ember.dynamo
from ember.dynamo import distributed


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)  # 2176 bytes of parameters
        self.b = torch.nn.Linear(32, 32)  # 4224
        self.c = torch.nn.Linear(32, 8)  # 1056

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(h))).sum(-1), h


@contextlib.contextmanager
def active_ddp(model, cap_bytes):
    """What DDP's _inside_ddp_forward publishes while the wrapped module runs."""
    fake = types.SimpleNamespace(bucket_bytes_cap=cap_bytes,
                                 _module_parameters=list(model.parameters()))  # fmt: skip
    old = DistributedDataParallel._active_ddp_module
    DistributedDataParallel._active_ddp_module = fake
    try:
        yield fake
    finally:
        DistributedDataParallel._active_ddp_module = old


def _run(model, cap_bytes, x):
    ember.reset()
    counter = ember.dynamo.CompileCounter()
    compiled = ember.compile(model, backend=counter)
    with active_ddp(model, cap_bytes):
        out, h = compiled(x)
    return counter, out, h


@pytest.mark.parametrize("cap,pieces", [(1024, 3), (4096, 2), (1 << 20, 1)])
def test_pieces_follow_the_bucket_cap(cap, pieces):
    # Walking back from the output: c (1056 bytes) fills a 1 KiB bucket; b fills the next; a is
    # the last. A 4 KiB cap holds c and b (5280 bytes >= 4096 closes it), then a.
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 16, requires_grad=True)
    counter, out, h = _run(model, cap, x)
    assert counter.frame_count == pieces
    assert len(ember.dynamo.convert.stats.graphs) == 1
    ref_out, ref_h = model(x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h, ref_h)
    grads = torch.autograd.grad(out.sum() + h.sum(), [x, *model.parameters()])
    ref = torch.autograd.grad(ref_out.sum() + ref_h.sum(), [x, *model.parameters()])
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)


def test_each_parameter_lands_in_one_piece_in_reverse_order():
    torch.manual_seed(0)
    model = MLP()
    counter, _, _ = _run(model, 1024, torch.randn(4, 16))
    names = []
    for gm in counter.graphs:
        ids = {n.meta.get("ember_param_id") for n in gm.graph.nodes}
        names.append(sorted(k for k, p in model.named_parameters() if id(p) in ids))
    assert names == [["a.bias", "a.weight"], ["b.bias", "b.weight"], ["c.bias", "c.weight"]]


def test_no_split_without_grad_or_outside_ddp():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 16)
    ember.reset()
    counter = ember.dynamo.CompileCounter()
    compiled = ember.compile(model, backend=counter)
    compiled(x)  # no DDP forward active
    with active_ddp(model, 1024), torch.no_grad():
        compiled(x)  # inference: nothing to all-reduce
    assert counter.frame_count == 2


def test_ddp_module_is_not_traced_its_inner_module_is():
    model = MLP()
    assert distributed.captured_module(model) is model
    assert distributed.eager_call_reason(model) is None
