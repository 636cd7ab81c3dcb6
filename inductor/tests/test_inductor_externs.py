"""Extern calls get their arguments in the layouts their kernels assume."""

import operator

import pytest
import torch
from ember.inductor.cudagraphs import host_work
from ember.inductor.lowering import lower_graph
from ember.inductor.loop_ir import ExternBuffer
from ember.ir import NODE_META_KEY, TensorMeta
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


def _on(device, t):
    return TensorMeta(t.dtype, tuple(t.shape), tuple(t.stride()), 0, device)


def _artifact(g):
    """The artifact of a prim graph, lowered, scheduled and rendered (nothing built or run)."""
    from ember.inductor.pipeline import render_kernels
    from ember.inductor.scheduler import schedule
    from ember.inductor.wrapper import generate

    low = lower_graph(g.module(), g.inputs)
    steps = schedule(low.buffers, [o.name for o in low.outputs if hasattr(o, "name")])
    buffers = {b.name: b for b in [*low.inputs, *low.buffers] if b is not None}
    return low, generate(low, steps, render_kernels(steps, buffers, low.device)).artifact


def test_cpu_work_in_a_gpu_graph_runs_eagerly_and_is_not_graphed():
    # A CUDA program that draws a scalar on the CPU (BART's LayerDrop) and reads it in a kernel:
    # the CPU op runs eagerly, the copy to the GPU is torch's, the kernel is Triton, and a CUDA
    # graph would replay neither of the first two.
    g = PrimGraph()
    x, s = g.input(torch.randn(8, 4)), g.input(torch.tensor(0.5))
    x.meta[NODE_META_KEY] = _on("cuda:0", g.inputs[0])
    e = g(prims.exp, s)
    on_gpu = g(prims.device_put, e, torch.device("cuda:0"))
    y = g(prims.mul, x, g(prims.broadcast_in_dim, on_gpu, (8, 4), ()))
    g.output(y, e)
    low, art = _artifact(g)
    assert low.device == "cuda:0" and art.device == "cuda:0"
    assert {b.op for b in low.buffers if isinstance(b, ExternBuffer)} == {"prims.exp",
                                                                          "prims.device_put"}
    assert [k.language for k in art.kernels] == ["triton"]
    assert host_work(art)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_flash_attentions_host_seed_keeps_a_program_graphed_without_dropout(dropout):
    # The memory-efficient kernel returns its philox seed and offset on the host, but it runs on
    # the GPU: without dropout (the seed unused) its program is still replayed from a CUDA
    # graph; with dropout every replay would return the capture's seed, which the backward reads.
    g = PrimGraph()
    q, k, v = (g.input(_blhe(2, 3, 16, 8)) for _ in range(3))
    for node, t in zip((q, k, v), g.inputs):
        node.meta[NODE_META_KEY] = _on("cuda:0", t)
    res = g(prims.extern.sdpa_efficient, q, k, v, None, True, dropout, False, scale=0.125)
    out, seed = (g.graph.call_function(operator.getitem, (res, i)) for i in (0, 2))
    out.meta[NODE_META_KEY], seed.meta[NODE_META_KEY] = res.meta[NODE_META_KEY][0::2]
    g.output(g(prims.mul, out, 2.0), seed)  # (a training graph saves the seed for its backward)
    low, art = _artifact(g)
    assert any(str(b.meta.device) == "cpu" for b in art.buffers)  # the seed and offset
    assert host_work(art) == (dropout > 0)


def test_a_cpu_index_read_by_a_gpu_kernel_is_copied_to_the_gpu_first():
    # eager indexes a CUDA tensor with CPU indices; the generated kernel reads a GPU copy of them
    g = PrimGraph()
    a, idx = g.input(torch.randn(6, 4)), g.input(torch.tensor([0, 5, 2]))
    a.meta[NODE_META_KEY] = _on("cuda:0", g.inputs[0])
    g.output(g(prims.index, a, [idx]))
    low, art = _artifact(g)
    (copy,) = [b for b in low.buffers if isinstance(b, ExternBuffer)]
    assert copy.op == "prims.device_put" and copy.layout.device == "cuda:0"
    assert torch.equal(copy.fn(g.inputs[1], "cpu"), g.inputs[1])  # torch's copy, runnable
    assert [k.language for k in art.kernels] == ["triton"] and host_work(art)


def test_cudnn_attention_lowers_to_one_extern_call_in_its_declared_layout():
    # extern.sdpa_cudnn (inference): the bias gets 16-element rows (a 77-key mask: rows of 80),
    # q/k/v keep their (B, L, H, E) views, and the output buffer has the query's layout, which
    # the wrapper's restride (and the extern's own reference) guarantee whatever cuDNN returns
    g = PrimGraph()
    q, k, v = (g.input(_blhe(2, 3, 77, 16)) for _ in range(3))
    bias = g.input(torch.randn(2, 1, 77, 77, dtype=torch.bfloat16))
    for node, t in zip((q, k, v, bias), g.inputs):
        node.meta[NODE_META_KEY] = _on("cuda:0", t)
    g.output(g(prims.extern.sdpa_cudnn, q, k, v, bias, False, scale=0.25))
    low, art = _artifact(g)
    ext = next(b for b in low.buffers if isinstance(b, ExternBuffer))
    assert ext.op == "extern.sdpa_cudnn"
    assert tuple(int(s) for s in ext.args[3].layout.strides) == (77 * 80, 77 * 80, 80, 1)
    assert [a.name for a in ext.args[:3]] == ["arg0", "arg1", "arg2"]  # no copies
    assert tuple(int(s) for s in ext.layout.strides) == (77 * 3 * 16, 16, 3 * 16, 1)
    (step,) = [s for s in art.steps if s.kind == "extern"]
    assert step.target == "extern.sdpa_cudnn" and step.kwargs == {"scale": 0.25}


def test_cudnn_attention_through_aot_autograd_and_the_wrapper(monkeypatch):
    # compile_fx end to end (functionalize, the tracer, lowering, the wrapper) on the CPU, with
    # torch's choice stubbed to cuDNN and the kernel stood in by eager attention of its call
    import torch.fx as fx
    import torch.nn.functional as F
    from ember.inductor import compile_fx, config
    from ember.primtorch import attention
    from torch.nn.attention import SDPBackend

    calls = []

    def ref(query, key, value, attn_bias=None, is_causal=False, *, scale=None):
        calls.append(attn_bias.stride())
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_bias, scale=scale)

    monkeypatch.setattr(attention, "torch_choice",
                        lambda *a, cudnn=None: SDPBackend.CUDNN_ATTENTION)  # fmt: skip
    monkeypatch.setattr(prims.extern.sdpa_cudnn, "ref", ref)
    monkeypatch.setattr(config, "cache", False)

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, keep):
            return F.scaled_dot_product_attention(q * 2, k, v, attn_mask=keep)

    q, k, v = (torch.randn(2, 4, 77, 16, dtype=torch.bfloat16) for _ in range(3))
    keep = torch.rand(2, 1, 77, 77) > 0.3
    keep[..., 0] = True
    with torch.no_grad():
        got = compile_fx(fx.symbolic_trace(Attend()), [q, k, v, keep])(q, k, v, keep)
        want = Attend()(q, k, v, keep)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert calls == [(77 * 80, 77 * 80, 80, 1)] * 2  # traced, then run: rows of 80
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_cpu_flash_attention_gets_inputs_with_a_contiguous_last_dim():
    """torch's CPU flash kernel reads q, k and v as if their last dim were contiguous: with
    transposed inputs it returned NaN and garbage, no error. The extern now gets them so
    (ARG_STRIDES), copied where they are not."""
    import torch.nn.functional as F
    from ember.inductor import compile_prims
    from ember.primtorch import trace_to_prims

    def fn(q, k, v):
        t = lambda x: x.transpose(-1, -2)  # noqa: E731
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(t(q), t(k), t(v))[0]

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    want = F.scaled_dot_product_attention(*(x.transpose(-1, -2).contiguous() for x in (q, k, v)))
    with torch.no_grad():
        out = compile_prims(trace_to_prims(fn, q, k, v), [q, k, v])(q, k, v)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
