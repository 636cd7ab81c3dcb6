"""Custom autograd.Functions and checkpoint through backends that trace the joint graph
(aot_eager, inductor on CPU): forward and gradients as eager's, the user's own backward in the
backward graph, and checkpointed activations recomputed instead of saved."""

import sys
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint as checkpoint

import ember
from ember.aot_autograd import aot_eager, min_cut_partition, saved_bytes
from ember.ir import RECOMPUTE_META_KEY

sys.path.insert(0, str(Path(__file__).parents[1] / "dynamo" / "tests"))
import corpus.autograd_functions as cases  # noqa: E402
from corpus import CASES  # noqa: E402

from ember.dynamo import convert  # noqa: E402

CORPUS = [c for c in CASES if c.name.startswith("autograd_functions.")]


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def _outputs_and_grads(fn, inputs):
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs) if o.requires_grad)
    loss.backward()
    return outs, [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def _check_against_eager(case, backend):
    torch.manual_seed(0)
    expected_out, expected = _outputs_and_grads(case.fn, case.inputs())
    torch.manual_seed(0)
    breaks0, failures0 = len(convert.stats.breaks), len(convert.stats.failures)
    got_out, got = _outputs_and_grads(ember.compile(case.fn, backend=backend), case.inputs())
    assert len(convert.stats.breaks) == breaks0 and len(convert.stats.failures) == failures0
    for g, e in zip(got_out, expected_out):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_aot_eager_matches_eager(case):
    _check_against_eager(case, "aot_eager")


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_inductor_matches_eager(case):
    _check_against_eager(case, "inductor")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_users_backward_is_the_one_run(backend):
    # DoubledGrad's backward is twice the derivative of x * x: a backend deriving its own
    # gradient from the forward's ops would give 2x, the user's gives 4x
    x = torch.randn(8, requires_grad=True)
    ember.compile(cases.wrong_by_design_backward, backend=backend, fullgraph=True)(x).backward()
    torch.testing.assert_close(x.grad, 4 * x.detach())


_SCALE = 2.0


class _GlobalScaleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * _SCALE


def test_a_global_the_backward_reads_is_guarded():
    # aot_eager bakes the backward into its graph: a changed global must recompile it
    global _SCALE
    f = ember.compile(lambda t: _GlobalScaleBackward.apply(t).sum(), backend="aot_eager")
    x = torch.randn(3, requires_grad=True)
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    _SCALE, x.grad = 5.0, None
    try:
        f(x).backward()
    finally:
        _SCALE = 2.0
    torch.testing.assert_close(x.grad, torch.full((3,), 5.0))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dropout_recomputed_in_the_backward_draws_the_forward_mask(backend):
    def f(x):
        body = lambda t: torch.nn.functional.dropout(t, 0.5, training=True) * 1.0  # noqa: E731
        return checkpoint.checkpoint(body, x, use_reentrant=False)

    from ember.inductor import metrics

    x = torch.randn(2000, requires_grad=True)
    metrics.reset()
    out = ember.compile(f, backend=backend, fullgraph=True)(x)
    out.sum().backward()
    kept = (out != 0).float()
    assert 0.4 < kept.mean().item() < 0.6
    torch.testing.assert_close(x.grad, kept * 2)
    # the draws are kernels (the forward's and the backward's recomputation), not references
    assert not [f for f in metrics.fallbacks if "philox" in f], metrics.fallbacks


class _Recording:
    """aot_eager whose min-cut partition records the bytes each forward saves."""

    def __init__(self):
        self.saved = []

    def partition(self, gm, *, num_fwd_outputs):
        fw, bw = min_cut_partition(gm, num_fwd_outputs=num_fwd_outputs)
        self.saved.append(saved_bytes(fw, num_fwd_outputs))
        return fw, bw

    def __call__(self, gm, example_inputs):
        return aot_eager(gm, example_inputs, partition_fn=self.partition)


def _mlp(t, w):
    return torch.tanh(torch.tanh(t @ w) @ w) @ w


def _plain(x, w):
    return _mlp(_mlp(x, w), w).sum()


def _checkpointed(x, w):
    h = checkpoint.checkpoint(_mlp, x, w, use_reentrant=False)
    return checkpoint.checkpoint(_mlp, h, w, use_reentrant=True).sum()


def test_checkpoint_saves_fewer_activations_with_the_same_gradients():
    saved = {}
    grads = {}
    for fn in (_plain, _checkpointed):
        ember.reset()
        torch.manual_seed(0)
        x, w = torch.randn(64, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)
        rec = _Recording()
        ember.compile(fn, backend=rec, fullgraph=True)(x, w).backward()
        (saved[fn.__name__],) = rec.saved
        grads[fn.__name__] = (x.grad, w.grad)
        xe, we = x.detach().requires_grad_(), w.detach().requires_grad_()
        fn(xe, we).backward()
        torch.testing.assert_close(x.grad, xe.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(w.grad, we.grad, atol=1e-4, rtol=1e-4)
    # plain: the tanh activations (64x32 floats each) are kept; checkpointed: x and w only
    assert saved["_checkpointed"] <= (64 * 32 + 32 * 32) * 4 < saved["_plain"]
    for a, b in zip(grads["_plain"], grads["_checkpointed"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_checkpoint_through_inductor_matches_eager():
    torch.manual_seed(0)
    x, w = torch.randn(16, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = ember.compile(_checkpointed, backend="inductor", fullgraph=True)(x, w)
    expected = _checkpointed(xe, we)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    out.backward()
    expected.backward()
    torch.testing.assert_close(x.grad, xe.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad, we.grad, atol=1e-4, rtol=1e-4)


def test_dynamic_sizes_through_aot_eager():
    fn = cases.size_saved_on_ctx
    f = ember.compile(fn, backend="aot_eager")
    breaks0 = len(convert.stats.breaks)
    for n in (3, 4, 5, 6):  # the third size compiles the frame with a symbolic size
        x = torch.randn(n, 2, requires_grad=True)
        f(x).backward()
        xe = x.detach().clone().requires_grad_()
        fn(xe).backward()
        torch.testing.assert_close(x.grad, xe.grad)
    assert len(convert.stats.breaks) == breaks0


class _CheckpointedMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.tensor(1.5))

    def forward(self, x):
        body = lambda t: self.b(torch.relu(self.a(t))) * self.scale  # noqa: E731
        return checkpoint.checkpoint(body, x, use_reentrant=False).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpoint_in_a_module_trains_like_eager(backend):
    # the parameters reach the node-by-node trace of a checkpointed graph under their names
    import copy

    torch.manual_seed(0)
    eager = _CheckpointedMLP()
    model = copy.deepcopy(eager)
    compiled = ember.compile(model, backend=backend)
    for rows in (3, 4, 5):  # the third compiles with a symbolic size where the backend can
        x = torch.randn(rows, 8)
        eager.zero_grad()
        model.zero_grad()
        eager(x).backward()
        compiled(x).backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_inductors_graph_cache_tells_checkpointed_graphs_apart():
    # same ops, one partitioned to recompute: a cached program of one must not serve the other
    import torch.fx as fx

    from ember.inductor.fx_cache import fx_graph_text

    plain, tagged = fx.symbolic_trace(_mlp), fx.symbolic_trace(_mlp)
    for n in tagged.graph.nodes:
        if n.op == "call_function":
            n.meta[RECOMPUTE_META_KEY] = True
    assert fx_graph_text(plain) != fx_graph_text(tagged)


def _written_in_the_frame(w):
    y = w * 3
    out = cases.DoubleInPlace.apply(y)  # marks y dirty: eager writes it and returns it
    return out is y, (y * w).sum()


def _running_max(x, running):
    out, r = cases.ScaleAndTrackMax.apply(x, running)
    return out.sum(), r is running


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_mark_dirty_through_the_joint_graph_matches_eager(backend):
    breaks0 = len(convert.stats.breaks)
    w = torch.randn(6, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    same, loss = ember.compile(_written_in_the_frame, backend=backend, fullgraph=True)(w)
    e_same, e_loss = _written_in_the_frame(we)
    assert same and e_same
    torch.testing.assert_close(loss, e_loss)
    loss.backward()
    e_loss.backward()
    torch.testing.assert_close(w.grad, we.grad)
    # a buffer marked dirty and non-differentiable: an input mutation, the caller's tensor written
    x, running = torch.randn(5, 6, requires_grad=True), torch.zeros(6)
    xe, running_e = x.detach().clone().requires_grad_(), running.clone()
    f = ember.compile(_running_max, backend=backend, fullgraph=True)
    for _ in range(2):  # the second call reads the first call's write
        total, same = f(x, running)
        e_total, e_same = _running_max(xe, running_e)
        assert same and e_same
        torch.testing.assert_close(running, running_e)
        torch.testing.assert_close(total, e_total)
    total.backward()
    e_total.backward()
    torch.testing.assert_close(x.grad, xe.grad)
    assert len(convert.stats.breaks) == breaks0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_mark_dirty_without_gradients_writes_the_callers_tensor(backend):
    def f(x):
        out = cases.DoubleInPlace.apply(x)
        return out is x, out + 1

    x = torch.randn(6)
    xe = x.clone()
    same, out = ember.compile(f, backend=backend, fullgraph=True)(x)
    e_same, e_out = f(xe)
    assert same and e_same
    torch.testing.assert_close(x, xe)
    torch.testing.assert_close(out, e_out)


def _written_frame_input(y, w):
    out = cases.DoubleInPlace.apply(y)  # y: the caller's tensor, needing grad, not a leaf
    return out is y, out * w, y


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_mark_dirty_of_a_frame_input_matches_eager(backend):
    # the graph reads the new value; the caller's tensor is written after it, and the input the
    # graph read is never saved for the backward (autograd would find it overwritten)
    breaks0 = len(convert.stats.breaks)
    f = ember.compile(_written_frame_input, backend=backend, fullgraph=True)
    w = torch.randn(6, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    y, ye = w * 3, we * 3
    same, out, back = f(y, w)
    e_same, e_out, e_back = _written_frame_input(ye, we)
    assert same and e_same and back is y
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(out, e_out)
    (out.sum() + (y * y).sum()).backward()
    (e_out.sum() + (ye * ye).sum()).backward()
    torch.testing.assert_close(w.grad, we.grad)
    assert len(convert.stats.breaks) == breaks0
