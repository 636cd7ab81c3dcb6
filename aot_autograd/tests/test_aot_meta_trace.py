"""Traces on values without data that report the inputs' device: the same graphs as on real
values, no activations held, and the real trace where one needs values."""

import contextlib

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
    """Counts the real copies traces make (a trace without data makes none)."""
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


def test_a_trace_without_data_records_the_real_traces_graph_and_computes_what_eager_does(
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


def _attention_constant_mask(x, w):
    """A mask the program builds from sizes alone: its values choose the kernel (causal)."""
    q = (x @ w).view(2, 5, 2, 4).transpose(1, 2)
    mask = torch.ones(5, 5, dtype=torch.bool, device=x.device).tril()
    return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def _autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x @ w


def _to_bf16(x, w):
    return F.layer_norm((x @ w).to(torch.bfloat16), (8,))


def _batch_norm(x, w):
    h = (x @ w).transpose(1, 2)
    return F.batch_norm(h, torch.zeros(8), torch.ones(8), w[0], w[1], training=True)


@pytest.mark.parametrize("fn", [_dropout, _attention, _attention_constant_mask, _autocast,
                                _to_bf16, _batch_norm])  # fmt: skip
def test_what_the_device_decides_is_traced_without_data_as_on_real_values(
        fn, monkeypatch, real_clones):  # fmt: skip
    """Random seeds, attention kernels, autocast and the dtype of low-precision statistics are
    chosen by device: values without data that report the real device record what real values
    record (plain meta tensors did not, and these programs were traced on real copies)."""
    x, w = torch.randn(2, 5, 8), torch.randn(8, 8, requires_grad=True)
    torch.manual_seed(1)
    without_data, out = _traced(fn, (x, w), True, monkeypatch)
    assert real_clones == []
    torch.manual_seed(1)
    on_real, expected = _traced(fn, (x, w), False, monkeypatch)
    assert real_clones
    for part in ("joint", "forward", "backward"):
        text = _graph_text(without_data.last_graphs[part])
        assert text == _graph_text(on_real.last_graphs[part])
        assert "meta" not in text
    torch.testing.assert_close(out, expected)  # the same seed drew the same dropout mask
    if fn is not _dropout:
        torch.testing.assert_close(out, fn(x, w), atol=1e-2, rtol=1e-2)


def _bf16_step(ours, autocast: bool):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        out = _block(*ours)
    out.float().sum().backward()
    return out, [t.grad for t in ours[1:]]


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "bf16_values"])
def test_a_bf16_program_is_traced_without_data(autocast, monkeypatch, real_clones):
    """Under CPU autocast, and on bfloat16 values: the graphs of a trace on real values, no
    real copy made, and eager's values and gradients within bfloat16's precision."""
    dtype = torch.float32 if autocast else torch.bfloat16
    compiled = {}
    for metadata in (True, False):
        monkeypatch.setattr(meta_trace.config, "metadata_trace", metadata)
        aot = aot_function(_block, run_as_fx)
        compiled[metadata] = aot
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
              else contextlib.nullcontext()):  # fmt: skip
            aot(*_inputs(dtype))
        assert (real_clones == []) == metadata
    for part in ("joint", "forward", "backward"):
        assert _graph_text(compiled[True].last_graphs[part]) == _graph_text(
            compiled[False].last_graphs[part])  # fmt: skip
    out, grads = _bf16_step(_inputs(dtype), autocast)
    monkeypatch.setattr(meta_trace.config, "metadata_trace", True)
    aot = aot_function(_block, run_as_fx)
    ours = _inputs(dtype)
    with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
          else contextlib.nullcontext()):  # fmt: skip
        compiled_out = aot(*ours)
    compiled_out.float().sum().backward()
    assert compiled_out.dtype == out.dtype
    torch.testing.assert_close(compiled_out, out, atol=5e-2, rtol=2e-2)
    torch.testing.assert_close([t.grad for t in ours[1:]], grads, atol=1e-1, rtol=2e-2)


def test_what_needs_values_is_traced_on_real_values(monkeypatch, real_clones):
    """A trace without data that needs a value falls back to real values and computes what
    eager does: here attention's constant mask, were it not computed again from its prims."""
    from ember.primtorch import attention

    monkeypatch.setattr(attention, "_constant_value", lambda tracer, t: t)
    x, w = torch.randn(2, 5, 8), torch.randn(8, 8, requires_grad=True)
    compiled, out = _traced(_attention_constant_mask, (x, w), True, monkeypatch)
    assert real_clones
    torch.testing.assert_close(out, _attention_constant_mask(x, w))


def test_a_value_read_by_the_program_is_refused_in_either_trace(monkeypatch):
    """`.item()` stops the trace without data, and the real trace refuses it as before."""
    from ember.primtorch import DataDependentError

    def reads(x, w):
        return (x @ w) * (x.sum().item() > 0)

    monkeypatch.setattr(meta_trace.config, "metadata_trace", True)
    with pytest.raises(DataDependentError):
        aot_function(reads, run_as_fx)(torch.randn(2, 8), torch.randn(8, 8, requires_grad=True))


def test_value_checks_trace_on_real_values(monkeypatch, real_clones):
    """EMBER_PRIMTORCH_CHECK compares decompositions with eager on values."""
    from ember.primtorch.config import config as primtorch_config

    monkeypatch.setattr(primtorch_config, "check", True)
    _traced(_block, _inputs(), True, monkeypatch)
    assert real_clones


def test_a_real_trace_reads_the_parameters_where_they_are(monkeypatch, real_clones):
    """On real values only the inputs that are not parameters are copied: a copy of each
    parameter doubled a model's weights for as long as the trace ran."""
    monkeypatch.setattr(meta_trace.config, "metadata_trace", False)  # the real trace lends
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
    monkeypatch.setattr(meta_trace.config, "metadata_trace", False)  # the real trace lends
    x = torch.randn(2, 5, 8)
    w = torch.randn(8, 6, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    with torch.no_grad():
        out = aot_function(_scales_its_weight, run_as_fx)(x, w)
        expected = _scales_its_weight(x, w_eager)
    assert (8, 6) in real_clones  # the second trace copied w
    torch.testing.assert_close(w.detach(), w_eager.detach(), rtol=0, atol=0)
    torch.testing.assert_close(out, expected)


def _conv_diagonal(x, w, b):
    return F.conv2d(x, w, b).diagonal(0, 2, 3) * 1


def _conv_unfold(x, w, b):
    return F.conv2d(x, w, b).unfold(2, 2, 1) * 1


@pytest.mark.parametrize("metadata", [True, False], ids=["meta", "real"])
def test_views_of_a_channels_last_convolution_address_its_layout(metadata, monkeypatch):
    """torch's meta convolution returns a contiguous output for an NHWC input where the CPU's
    kernel returns NHWC: `diagonal` and `unfold` (as_strided views) took their strides from the
    contiguous one and read the wrong elements of the real output."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    w, b = torch.randn(4, 3, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    _, out = _traced(_conv_diagonal, [x, w, b], metadata, monkeypatch)
    expected = _conv_diagonal(x, w, b)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (w, b))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (w, b)))
    with torch.no_grad():
        _, out = _traced(_conv_unfold, [x, w, b], metadata, monkeypatch)
        torch.testing.assert_close(out, _conv_unfold(x, w, b))
