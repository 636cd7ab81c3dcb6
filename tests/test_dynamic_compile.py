"""Dynamic sizes end to end: ember.compile over many batch sizes with the real backends.

dynamo makes a changed size symbolic at the first recompile; aot_autograd and inductor compile
one program for every size. A graph the symbolic backend cannot take (an output that aliases an
input) is retraced with static sizes: more compiles, never a wrong result.
"""

import pytest
import torch
import torch.nn as nn

import ember
from ember.inductor import metrics

SIZES = (3, 5, 8, 13, 21, 34)


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()  # what sizes earlier tests saw change is per code object: forget it
    yield
    ember.reset()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))

    def forward(self, x):
        return self.net(x).softmax(-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.heads = nn.Linear(16, 48), 4

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_batch_sizes_compile_at_most_twice(backend):
    torch.manual_seed(0)
    model = MLP().eval()
    calls = []

    def counting(gm, example_inputs):
        calls.append(bool(gm.meta.get("ember_symbols")))
        return ember.dynamo.lookup_backend(backend)(gm, example_inputs)

    counting.ember_supports_dynamic = True
    compiled = ember.compile(model, backend=counting)
    metrics.reset()
    with torch.no_grad():
        for n in SIZES:
            x = torch.randn(n, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert calls == [False, True], calls  # static first, then one symbolic graph for the rest
    if backend == "inductor":
        kernels = metrics.generated_kernel_count
        with torch.no_grad():
            compiled(torch.randn(55, 16))
        assert metrics.generated_kernel_count == kernels  # no new kernels for a new size


def _counting(backend, calls):
    def counting(gm, example_inputs):
        calls.append(bool(gm.meta.get("ember_symbols")))
        return ember.dynamo.lookup_backend(backend)(gm, example_inputs)

    counting.ember_supports_dynamic = True
    return counting


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_attention_sequence_lengths_compile_at_most_twice(backend):
    """A 3-d Linear, views with symbolic sizes and causal scaled_dot_product_attention: one
    symbolic program serves every sequence length after the first."""
    torch.manual_seed(0)
    model = Attention().eval()
    calls = []
    compiled = ember.compile(model, backend=_counting(backend, calls))
    with torch.no_grad():
        for t in SIZES:
            x = torch.randn(2, t, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert calls == [False, True], calls


class AliasingOutput(nn.Module):
    def forward(self, x):
        return x.relu(), x.transpose(0, 1)


def test_a_graph_the_symbolic_backend_cannot_take_is_compiled_static():
    model = AliasingOutput()
    compiled = ember.compile(model)
    # the warning says where the backend's error was raised (a file of Ember's, with its line)
    match = r"static shapes: the backend failed on symbolic sizes: .*\[raised at .*\.py:\d+ in \w+\]"
    with torch.no_grad(), pytest.warns(UserWarning, match=match):
        for t in SIZES:
            x = torch.randn(2, t)
            torch.testing.assert_close(compiled(x), model(x))


def _pad_to_16(x):
    n = x.shape[-1]
    y = torch.nn.functional.pad(x, (0, 16 * ((n + 15) // 16) - n))
    return (y * 2).sum(-1), y.exp()


def test_a_size_rounded_up_to_a_multiple_stays_symbolic():
    """As torch's CUDA attention pads its mask: the padded size is ceiling(s/16)*16, printed in
    the kernels and the wrapper, for every length, with one compile."""
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return ember.inductor.compile_fx(gm, example_inputs)

    counting.ember_supports_dynamic = True
    compiled = ember.compile(_pad_to_16, backend=counting, dynamic=True)
    for n in (20, 33, 47, 64):
        x = torch.randn(3, n)
        for got, want in zip(compiled(x), _pad_to_16(x)):
            torch.testing.assert_close(got, want)
    assert len(calls) == 1


@ember.disable
def _square_eagerly(t):
    return t * t


def _sum_after_a_break(x):
    return _square_eagerly(x.sin()).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_backward_that_only_knows_a_size_from_the_forward(backend):
    """The second graph is sum(y) of a symbolic-size y: its backward broadcasts the scalar
    tangent to y's size, which nothing in the backward carried (aot_eager failed with NameError
    's1' in the backward, inductor fell back to static sizes); the forward input of that size is
    saved for it, and one program serves every size with eager's gradients."""
    import warnings

    f = ember.compile(_sum_after_a_break, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no retrace with static sizes
        for n in SIZES[:4]:
            x = torch.randn(n, requires_grad=True)
            f(x).backward()
            ref = x.detach().clone().requires_grad_()
            _sum_after_a_break(ref).backward()
            torch.testing.assert_close(x.grad, ref.grad)
