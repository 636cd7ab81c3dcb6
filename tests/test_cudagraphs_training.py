"""Training graphs replay from CUDA graphs (inductor cudagraphs.py, `alias_from`): the forward's
saved activations and the backward's gradients come back over the graphs' own memory, so every
training loop shape must still give eager's parameters: a plain loop, gradients accumulated over
several backwards, two forwards before one backward, a caller that keeps last step's outputs, and
dropout's mask agreeing between forward and backward. Skipped without CUDA."""

import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.inductor import metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _mlp():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 128)]
    for _ in range(4):
        layers += [nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 128)]
    return nn.Sequential(*layers, nn.Linear(128, 8)).cuda()


def _batches(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    return [torch.randn(32, 64, device="cuda", generator=g) for _ in range(n)]


def _train(model, batches, *, accumulate=1, keep_outputs=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kept = []
    for i, x in enumerate(batches):
        out = model(x)
        if keep_outputs:
            kept.append(out)  # the caller's: later replays must not change them
        (out.square().mean() / accumulate).backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return kept


def _same_parameters(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=2e-5, rtol=2e-4)


def test_a_training_loop_replays_and_matches_eager():
    eager = _mlp()
    compiled_model = copy.deepcopy(eager)
    metrics.reset()
    _train(ember.compile(compiled_model), _batches(8))
    _train(eager, _batches(8))
    _same_parameters(compiled_model, eager)
    assert metrics.cudagraph_replays >= 8, metrics.cudagraph_skips  # forward and backward


def test_gradients_accumulated_over_backwards_are_not_overwritten():
    # .grad holds the first backward's gradients while the second runs: that call runs plainly
    eager = _mlp()
    compiled_model = copy.deepcopy(eager)
    metrics.reset()
    _train(ember.compile(compiled_model), _batches(12), accumulate=3)
    _train(eager, _batches(12), accumulate=3)
    _same_parameters(compiled_model, eager)
    assert metrics.cudagraph_plain_calls > 0


def test_outputs_the_caller_keeps_stay_its_own():
    eager = _mlp()
    compiled_model = copy.deepcopy(eager)
    got = _train(ember.compile(compiled_model), _batches(6), keep_outputs=True)
    want = _train(eager, _batches(6), keep_outputs=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-4)


def test_two_forwards_before_one_backward():
    # the first forward's saved activations are still held when the second forward runs
    eager = _mlp()
    compiled_model = copy.deepcopy(eager)
    compiled = ember.compile(compiled_model)
    for model in (compiled, eager):
        opt = torch.optim.SGD((compiled_model if model is compiled else eager).parameters(), 0.05)
        batches = _batches(10)
        for a, b in zip(batches[::2], batches[1::2]):
            (model(a).square().mean() - model(b).mean()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    _same_parameters(compiled_model, eager)


def test_dropout_masks_agree_between_replayed_forward_and_backward(monkeypatch):
    from ember.inductor import pipeline

    monkeypatch.setattr(pipeline, "MIN_GRAPHED_STEPS", 1)  # graph even these small programs

    class Drop(nn.Module):  # a weight read in place: the replay copies in only the input
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 256, bias=False)

        def forward(self, t):
            return nn.functional.dropout(self.lin(t), 0.5, training=True) * 1.0

    torch.manual_seed(0)
    model = Drop().cuda()
    drop = ember.compile(model)
    metrics.reset()
    masks = []
    for _ in range(6):
        x = torch.randn(64, 64, device="cuda", requires_grad=True)
        out = drop(x)
        out.sum().backward()
        kept = (out != 0).float()
        assert 0.45 < kept.mean().item() < 0.55
        torch.testing.assert_close(x.grad, (kept * 2) @ model.lin.weight.detach())
        model.lin.weight.grad = None
        masks.append(kept)
    assert not torch.equal(masks[-1], masks[-2])  # each call draws anew
    assert metrics.cudagraph_replays > 0, metrics.cudagraph_skips


def test_a_training_program_of_activations_only_is_not_replayed(monkeypatch):
    # its replays would copy every input into buffers the graph keeps (a loss over logits)
    from ember.inductor import pipeline

    monkeypatch.setattr(pipeline, "MIN_GRAPHED_STEPS", 1)
    loss = ember.compile(lambda t: (t.float().log_softmax(-1) * 2).sum())
    metrics.reset()
    for _ in range(4):
        x = torch.randn(64, 512, device="cuda", requires_grad=True)
        loss(x).backward()
        torch.testing.assert_close(x.grad, 2 - 2 * 512 * x.detach().softmax(-1))
    assert metrics.cudagraph_replays == 0
    assert any("mostly be copied in" in why for why in metrics.cudagraph_skips)


class _HostScalars(nn.Module):
    """Scalars built on the CPU from numbers, read by GPU ops as DeBERTa's attention does:
    `x / sqrt(tensor(d) * 3)`, `log(tensor(max / mid))` in a log bucket, `tensor(k).type_as(x)`;
    six blocks, so each program has launches enough to be replayed (MIN_GRAPHED_STEPS)."""

    def __init__(self):
        super().__init__()
        self.projs = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x):
        for proj in self.projs:
            h = proj(x)
            scale = torch.sqrt(torch.tensor(h.size(-1), dtype=torch.float) * 3)
            h = h / scale.to(dtype=h.dtype)
            bucket = torch.log(h.abs() + 1) / torch.log(torch.tensor(511 / 128))
            floor = torch.tensor(0.25).type_as(h)
            x = torch.where(bucket > floor, bucket, h) + x
        return x


def test_scalars_built_on_the_host_keep_training_on_cuda_graphs():
    torch.manual_seed(0)
    eager = _HostScalars().cuda()
    compiled_model = copy.deepcopy(eager)
    metrics.reset()
    _train(ember.compile(compiled_model), _batches(6))
    _train(eager, _batches(6))
    _same_parameters(compiled_model, eager)
    assert not metrics.cudagraph_skips, metrics.cudagraph_skips
    assert metrics.cudagraph_replays >= 8, metrics.cudagraph_replays  # forward and backward


def test_one_program_for_every_layer_of_a_stack_is_not_replayed_with_weight_copies(monkeypatch):
    # each layer's call runs eagerly (a backward hook), so its forward is its own frame and one
    # compiled program serves every layer: its parameters move from call to call
    from ember.inductor import pipeline

    monkeypatch.setattr(pipeline, "MIN_GRAPHED_STEPS", 1)  # graph these small programs
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(128, 128)
            self.norm = nn.LayerNorm(128)

        def forward(self, x):
            return x + self.norm(torch.nn.functional.gelu(self.fc(x)))

    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(64, 128), *[Layer() for _ in range(6)], nn.Linear(128, 8))
    for layer in eager[1:-1]:
        layer.register_full_backward_hook(lambda *a: None)
    eager = eager.cuda()
    compiled_model = copy.deepcopy(eager)
    metrics.reset()
    _train(ember.compile(compiled_model), _batches(6))
    _train(eager, _batches(6))
    _same_parameters(compiled_model, eager)
    skips = metrics.cudagraph_skips
    assert any("mostly be copied in" in why for why in skips), skips
