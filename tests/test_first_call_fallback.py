"""A graph whose compile, made at its first call, meets an op Ember cannot lower (no
decomposition: linalg.det, matrix_exp) runs eagerly with a warning, as a capture the backend
refuses does; the error reached the user's program before."""

import gc
import warnings
import weakref

import pytest
import torch

import ember


@pytest.mark.parametrize("op", [torch.linalg.det, torch.linalg.matrix_exp])
def test_an_op_without_a_lowering_runs_eagerly_with_a_warning(op):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 4, requires_grad=True)
    fn = lambda x: (op(x) * 2).sin()  # noqa: E731
    ember.reset()
    compiled = ember.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
        again = compiled(x)  # (the eager runtime is kept: no second compile or warning)
    messages = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert len(messages) == 1 and "NotDecomposableError" in messages[0], messages
    torch.testing.assert_close(out, fn(x))
    torch.testing.assert_close(again, out)
    out.sum().backward()
    got = x.grad.clone()
    x.grad = None
    fn(x).sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_under_fullgraph_it_raises():
    ember.reset()
    compiled = ember.compile(lambda x: torch.linalg.det(x) + 1, fullgraph=True)
    with pytest.raises(NotImplementedError, match="det"):
        compiled(torch.randn(4, 4))


def test_under_fullgraph_the_pieces_of_a_graph_with_control_flow_raise_too():
    def program(x):
        y = torch.linalg.det(x) + 1
        return torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))

    ember.reset()
    with pytest.raises(NotImplementedError, match="det"):
        ember.compile(program, fullgraph=True)(torch.randn(3, 4, 4))


def test_the_eager_runtime_keeps_no_argument_alive():
    ember.reset()
    compiled = ember.compile(lambda x: torch.linalg.det(x) + 1)
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None


def test_a_mutated_argument_sharing_storage_with_another_runs_that_call_eagerly():
    """Two views of one buffer, one written in place: the compiled program assumed distinct
    inputs (it raised MutatedAliasingError into the program); the call runs as written."""

    def step(a, b):
        a.add_(1)
        return b * 2

    ember.reset()
    compiled = ember.compile(step)
    a, b = torch.zeros(3), torch.ones(3)
    torch.testing.assert_close(compiled(a, b), torch.full((3,), 2.0))
    base, expected = torch.arange(6.0), torch.arange(6.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(base[:3], base[3:])
    torch.testing.assert_close(out, step(expected[:3], expected[3:]))
    torch.testing.assert_close(base, expected)
    assert any("runs eagerly" in str(w.message) for w in caught)
    ember.reset()
    with pytest.raises(NotImplementedError, match="shares its storage"):
        ember.compile(step, fullgraph=True)(base[:3], base[3:])
