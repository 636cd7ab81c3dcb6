"""On CUDA, a training trace runs on values without data that report the GPU
(aot_autograd/device_meta.py): it records the graphs a trace on real values records (autocast,
fused dropout, attention's kernel, cuDNN batch norm decided as on the GPU), holds no
activations on the device, and the compiled gradients match eager. Skipped without CUDA."""

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot_autograd import aot_module, api, joint, meta_trace, run_as_fx
from ember.ir import NODE_META_KEY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Block(nn.Module):
    """A pre-norm transformer block: causal attention by F.scaled_dot_product_attention (with
    attention dropout), a GELU MLP, residual dropout."""

    def __init__(self, d=256, heads=4, p=0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class ConvBN(nn.Module):
    """Convolutions with batch norm (cuDNN's on the GPU) in training mode."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.c2, self.b2 = nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


def _graph_text(gm):
    return "\n".join(f"{n.op} {n.target} {n.args} {n.kwargs} {n.meta.get(NODE_META_KEY)}"
                     for n in gm.graph.nodes)  # fmt: skip


def _make(name, p=0.1):
    torch.manual_seed(0)
    if name == "block":
        return Block(p=p).cuda(), torch.randn(8, 256, 256, device="cuda")
    return ConvBN().cuda(), torch.randn(32, 3, 32, 32, device="cuda")


def _autocast(on: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _step(run, x, autocast: bool, seed: int = 3):
    torch.manual_seed(seed)
    with _autocast(autocast):
        loss = run(x).float().pow(2).mean()
    loss.backward()
    return loss.detach()


def _traced_step(model, x, autocast, metadata, monkeypatch):
    """(the compiled module, its loss, gradients, the real copies its trace made, the trace's
    peak of device memory above where it started)."""
    monkeypatch.setattr(meta_trace.config, "metadata_trace", metadata)
    copies, peak = [], []
    real_clone, real_trace = joint.clone_input, api.trace

    def counting(t):
        copies.append(t.shape)
        return real_clone(t)

    def measured(*args, **kwargs):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = real_trace(*args, **kwargs)
        peak.append(torch.cuda.max_memory_allocated() - before)
        return out

    monkeypatch.setattr(joint, "clone_input", counting)
    monkeypatch.setattr(joint.trace, "__defaults__", (None, counting))
    monkeypatch.setattr(api, "trace", measured)
    compiled = aot_module(model, run_as_fx)
    _step(compiled, x, autocast)
    monkeypatch.undo()
    # Values from a second step, of a seed set after the trace: a trace on real values draws
    # its own random numbers (dropout) from the device's generator, one without data does not,
    # so the first steps' dropout masks differ between the two (as the first step's of eager
    # and a real trace do).
    model.zero_grad()
    loss = _step(compiled, x, autocast)
    grads = [p.grad.clone() for p in model.parameters()]
    return compiled, loss, grads, copies, peak[0]


@pytest.mark.parametrize("name,autocast", [("block", True), ("block", False),
                                           ("convbn", False), ("convbn", True)])  # fmt: skip
def test_a_trace_without_data_records_the_real_traces_graphs(name, autocast, monkeypatch):
    model, x = _make(name)
    runs = {}
    for metadata in (True, False):
        runs[metadata] = _traced_step(copy.deepcopy(model), x, autocast, metadata, monkeypatch)
    without, real = runs[True], runs[False]
    assert without[3] == [], "the trace made real copies: it ran on real values"
    assert real[3], "the switch did not turn the trace without data off"
    for part in ("joint", "forward", "backward"):
        text = _graph_text(without[0]._compiled.last_graphs[part])
        assert text == _graph_text(real[0]._compiled.last_graphs[part]), part
        assert "meta" not in text
    # the same graphs and seed: the same dropout masks, the same values
    torch.testing.assert_close(without[1], real[1])
    torch.testing.assert_close(without[2], real[2])
    assert without[4] < 2**20, f"the trace held {without[4] / 2**20:.1f} MiB of the device"
    assert real[4] > 4 * 2**20  # a real trace's activations (2-4 MiB each)


@pytest.mark.parametrize("name,autocast", [("block", True), ("convbn", False),
                                           ("convbn", True)])  # fmt: skip
def test_compiled_gradients_match_eager(name, autocast):
    """Through ember.compile (inductor), traced without data; dropout off, so eager's values
    are the reference."""
    model, x = _make(name, p=0.0)
    reference = copy.deepcopy(model)
    loss = _step(ember.compile(model), x, autocast)
    want = _step(reference, x, autocast)
    tol = dict(atol=2e-2, rtol=2e-2) if autocast else dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(loss, want, **tol)
    for (name_, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m, n=name_: f"{n}: {m}")
    for b, c in zip(model.buffers(), reference.buffers()):  # batch norm's running statistics
        torch.testing.assert_close(b, c, **tol)
