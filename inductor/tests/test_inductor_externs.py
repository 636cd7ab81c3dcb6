"""Extern calls get their arguments in the layouts their kernels assume."""

import operator

import torch
from ember.inductor.lowering import lower_graph
from ember.inductor.loop_ir import ExternBuffer
from ember.primtorch import prims
from inductor_helpers import PrimGraph


def _blhe(b, h, length, e, dtype=torch.bfloat16):
    return torch.randn(b, length, h, e, dtype=dtype).transpose(1, 2)


def test_efficient_attention_backward_gets_out_in_blhe_layout():
    # The memory-efficient backward kernel reads `out` with a row stride of heads * head_dim,
    # whatever `out`'s strides are: a contiguous (B, H, L, E) `out` must be copied into the
    # (B, L, H, E) layout its forward wrote, and one already in it is passed as is.
    b, h, length, e = 2, 3, 16, 8
    for out_arg, copied in ((torch.randn(b, h, length, e, dtype=torch.bfloat16), True),
                            (_blhe(b, h, length, e), False)):  # fmt: skip
        g = PrimGraph()
        grad, q, k, v = (g.input(_blhe(b, h, length, e)) for _ in range(4))
        bias = g.input(torch.randn(b, h, length, length, dtype=torch.bfloat16))
        out = g.input(out_arg)
        lse = g.input(torch.randn(b, h, 32))
        seed, offset = g.input(torch.tensor(0)), g.input(torch.tensor(0))
        grads = g(prims.extern.sdpa_efficient_backward, grad, q, k, v, bias, out, lse, seed,
                  offset, 0.0, [True, True, True, False], False, scale=0.125)  # fmt: skip
        dq = g.graph.call_function(operator.getitem, (grads, 0))
        dq.meta.update(grads.meta)
        g.output(dq)
        low = lower_graph(g.module(), g.inputs)
        ext = next(b for b in low.buffers if isinstance(b, ExternBuffer))
        passed = ext.args[5]
        assert tuple(int(s) for s in passed.layout.strides) == (length * h * e, e, h * e, 1)
        assert (passed.name != "arg5") == copied


def test_efficient_attention_bias_rows_are_aligned():
    # The memory-efficient kernels need attn_bias rows at 16-element alignment: a 77-token mask
    # gets rows of 80 (eager pads the same way); an aligned one is passed as it is.
    from ember.primtorch.prims.extern import ARG_STRIDES

    rule = ARG_STRIDES["extern.sdpa_efficient"][3]
    assert rule((2, 3, 77, 77), (17787, 5929, 77, 1)) == (18480, 6160, 80, 1)
    assert rule((2, 3, 64, 64), (4096, 0, 64, 1)) == (4096, 0, 64, 1)
    assert rule((2, 3, 77, 77), None) == (18480, 6160, 80, 1)
    assert ARG_STRIDES["extern.sdpa_efficient_backward"][4] is rule


def test_an_argument_copied_into_padded_rows_keeps_its_values(monkeypatch):
    # The copy behind that rule writes a buffer larger than its elements; an extern reads it.
    from ember.primtorch.prims import extern
    from inductor_helpers import check

    monkeypatch.setitem(extern.ARG_STRIDES, "extern.mm",
                        {0: lambda sizes, strides: (((sizes[1] + 15) // 16) * 16, 1)})  # fmt: skip
    check(lambda x, y: torch.relu(x) @ y, torch.randn(5, 7), torch.randn(7, 3))


def test_padded_rows_are_whole_rows(monkeypatch):
    # A kernel reading aligned rows reads the last row's padding too: the buffer behind the
    # padded copy must hold whole rows (5 rows of 16 here), not end at the last element.
    from ember.inductor.loop_ir import AliasBuffer
    from ember.primtorch.prims import extern

    monkeypatch.setitem(extern.ARG_STRIDES, "extern.mm",
                        {0: lambda sizes, strides: (((sizes[1] + 15) // 16) * 16, 1)})  # fmt: skip
    g = PrimGraph()
    x, y = g.input(torch.randn(5, 7)), g.input(torch.randn(7, 3))
    g.output(g(prims.extern.mm, g(prims.abs, x), y))
    low = lower_graph(g.module(), g.inputs)
    ext = next(b for b in low.buffers if isinstance(b, ExternBuffer))
    arg = ext.args[0]
    assert tuple(int(s) for s in arg.layout.strides) == (16, 1)
    held = arg.source if isinstance(arg, AliasBuffer) else arg
    assert int(held.layout.storage_size()) == 5 * 16
