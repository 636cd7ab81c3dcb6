"""`with torch.autocast(...)` blocks inside compiled code (a rotary embedding computed in float32
under an outer bfloat16 autocast, as transformers' Llama does): the switches are part of the graph,
and compiled graphs are not cast a second time by the caller's autocast."""

import pytest
import torch

import ember


def rotary_like(a, b):
    with torch.autocast("cpu", enabled=False):
        c = a.float() @ b.float()  # float32 even under the caller's bfloat16 autocast
    return c.cos() * (a @ b).float()


def with_break_inside(a, b):
    with torch.autocast("cpu", enabled=False):
        c = a @ b
        print("a graph break inside the block")
        d = c @ b
    return c + d


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_autocast_off_block_under_outer_autocast(backend):
    a = torch.randn(16, 16, requires_grad=True)
    b = torch.randn(16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = rotary_like(a, b)
        got = ember.compile(rotary_like, backend=backend)(a, b)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    (ga,) = torch.autograd.grad(got.sum(), a)
    (wa,) = torch.autograd.grad(want.sum(), a)
    torch.testing.assert_close(ga, wa, atol=1e-4, rtol=1e-4)
    assert torch.is_autocast_enabled("cpu") is False


def test_graph_records_the_switches():
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ember.compile(rotary_like, backend=keep)(a, b)
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    switches = [t for t in targets if t is torch.set_autocast_enabled]
    assert len(switches) == 2  # off before the float32 matmul, back on after it


def test_break_inside_a_block_leaves_no_autocast_state_behind():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = with_break_inside(a, b)
        got = ember.compile(with_break_inside)(a, b)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)
    assert not torch.is_autocast_enabled("cpu")
