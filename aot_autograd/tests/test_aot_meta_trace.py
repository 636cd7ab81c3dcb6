"""Traces on meta-device copies of the inputs: the same graphs as on real values, no
activations held, and the real trace wherever the meta device could change what is recorded."""

import pytest
import torch
import torch.nn.functional as F

from ember.aot_autograd import aot_function, joint, meta_trace, run_as_fx
from ember.ir import NODE_META_KEY


def _block(x, w1, b1, w2, ln_w, ln_b):
    """A transformer MLP block with a mutated-free residual, a view and a softmax."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    h = F.gelu(F.linear(h, w1, b1)) @ w2
    att = F.softmax(x @ x.transpose(-2, -1), dim=-1)
    return (x + h + att @ x).view(-1, x.shape[-1]).sum(0)


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    shapes = [(2, 5, 8), (16, 8), (16,), (16, 8), (8,), (8,)]
    return [torch.randn(s, dtype=dtype, requires_grad=i > 0) for i, s in enumerate(shapes)]


def _graph_text(gm):
    return "\n".join(f"{n.op} {n.target} {n.args} {n.kwargs} {n.meta.get(NODE_META_KEY)}"
                     for n in gm.graph.nodes)  # fmt: skip


@pytest.fixture
def real_clones(monkeypatch):
    """Counts the real copies traces make (a trace on meta makes none)."""
    made = []
    real = joint.clone_input

    def counting(t):
        made.append(t.shape)
        return real(t)

    monkeypatch.setattr(joint, "clone_input", counting)
    monkeypatch.setattr(joint.trace, "__defaults__", (None, counting))
    return made


def _traced(fn, inputs, metadata: bool, monkeypatch):
    monkeypatch.setattr(meta_trace.config, "metadata_trace", metadata)
    compiled = aot_function(fn, run_as_fx)
    out = compiled(*inputs)
    return compiled, out


def test_a_meta_trace_records_the_real_traces_graph_and_computes_what_eager_does(
        monkeypatch, real_clones):  # fmt: skip
    ours = _inputs()
    on_meta, out = _traced(_block, ours, True, monkeypatch)
    assert real_clones == []  # nothing ran on real copies
    on_real, _ = _traced(_block, _inputs(), False, monkeypatch)
    assert real_clones  # the switch works: this one did
    for part in ("joint", "forward", "backward"):
        assert _graph_text(on_meta.last_graphs[part]) == _graph_text(on_real.last_graphs[part])
    assert "meta" not in _graph_text(on_meta.last_graphs["joint"])
    eager = _inputs()
    expected = _block(*eager)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close([t.grad for t in ours[1:]], [t.grad for t in eager[1:]])


def _dropout(x, w):
    return F.dropout(x @ w, 0.5, training=True)


def _attention(x, w):
    q = (x @ w).view(2, 5, 2, 4).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q)


def _autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x @ w


def _to_bf16(x, w):
    return F.layer_norm((x @ w).to(torch.bfloat16), (8,))


@pytest.mark.parametrize("fn", [_dropout, _attention, _autocast, _to_bf16])
def test_what_the_device_decides_is_traced_on_real_values(fn, monkeypatch, real_clones):
    """Random seeds, attention kernels, autocast and the dtype of low-precision statistics are
    chosen by device: those programs are traced on real copies."""
    monkeypatch.setattr(meta_trace.config, "metadata_trace", True)
    x, w = torch.randn(2, 5, 8), torch.randn(8, 8, requires_grad=True)
    torch.manual_seed(1)
    out = aot_function(fn, run_as_fx)(x, w)
    assert real_clones, "traced on meta"
    assert "meta" not in str(out.device)
    if fn is not _dropout:
        torch.testing.assert_close(out, fn(x, w), atol=1e-2, rtol=1e-2)


def test_a_real_trace_reads_the_parameters_where_they_are(monkeypatch, real_clones):
    """On real values only the inputs that are not parameters are copied: a copy of each
    parameter doubled a model's weights for as long as the trace ran."""
    monkeypatch.setattr(meta_trace.config, "metadata_trace", True)
    x, w = torch.randn(2, 5, 8), torch.randn(8, 6, requires_grad=True)
    before = w.detach().clone()
    out = aot_function(_autocast, run_as_fx)(x, w)
    assert real_clones == [x.shape]  # x copied, w read in place
    torch.testing.assert_close(w.detach(), before)
    out.float().sum().backward()
    w2 = before.clone().requires_grad_()
    _autocast(x, w2).float().sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def _scales_its_weight(x, w):
    with torch.no_grad():
        w.mul_(0.5)  # a parameter written where grad is off (an in-place rescale)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x @ w


def test_a_lent_input_is_never_written():
    """The tracer raises before an op writes a tensor it was lent (an inference trace: grad off,
    the program may write a parameter)."""
    from ember.primtorch import LentInputWritten

    w = torch.randn(8, requires_grad=True)
    before = w.detach().clone()

    def program(w):
        w.add_(1.0)
        return w * 2

    with torch.no_grad(), pytest.raises(LentInputWritten):
        joint.trace(program, [w], lend=True)
    torch.testing.assert_close(w.detach(), before, rtol=0, atol=0)


def test_an_inference_program_that_writes_a_parameter_writes_it_once(monkeypatch, real_clones):
    """Grad off, the program may write a parameter: traced again on a copy, it is halved once."""
    monkeypatch.setattr(meta_trace.config, "metadata_trace", True)
    x = torch.randn(2, 5, 8)
    w = torch.randn(8, 6, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    with torch.no_grad():
        out = aot_function(_scales_its_weight, run_as_fx)(x, w)
        expected = _scales_its_weight(x, w_eager)
    assert (8, 6) in real_clones  # the second trace copied w
    torch.testing.assert_close(w.detach(), w_eager.detach(), rtol=0, atol=0)
    torch.testing.assert_close(out, expected)
