"""EMBER_REPRO through the real backends: aot_eager and inductor on a correct model raise no
alarm and write nothing; a bug injected in front of inductor gives a repro of the one call."""

import operator
import warnings

import pytest
import torch

import ember
from ember.dynamo import config, lookup_backend, minifier, register_backend


@register_backend("inductor_without_gelu")
def inductor_without_gelu(gm, example_inputs):
    """inductor, except that graphs calling gelu are refused."""
    if any(getattr(n.target, "__name__", "") == "gelu" for n in gm.graph.nodes):
        raise NotImplementedError("gelu has no lowering here")
    return lookup_backend("inductor")(gm, example_inputs)


@register_backend("inductor_mul_as_add")
def inductor_mul_as_add(gm, example_inputs):
    """inductor after a wrong rewrite: every `a * b` becomes `a + b`."""
    for node in gm.graph.nodes:
        if node.target is operator.mul:
            node.target = operator.add
    gm.recompile()
    return lookup_backend("inductor")(gm, example_inputs)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.fc1(x)))
        a, b = torch.split(self.fc2(h), 2, dim=1)
        return (a * b).sum() / x.size(0), h[:, :3]


@pytest.fixture(autouse=True)
def _repro_settings(tmp_path, monkeypatch):
    ember.reset()
    monkeypatch.setattr(config, "repro_dir", str(tmp_path))
    torch.manual_seed(0)
    yield
    ember.reset()


def repro_calls(path) -> list:
    saved = minifier.load_repro(path)
    gm = minifier.trace(saved.module_class(), saved.inputs())
    return [getattr(n.target, "__name__", n.target) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method")]  # fmt: skip


@pytest.mark.parametrize("mode", ["error", "accuracy"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_correct_backends_write_nothing(tmp_path, monkeypatch, mode, backend):
    monkeypatch.setattr(config, "repro", mode)
    model, x = Block(), torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ember.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    assert not [w for w in caught if "ember.compile: backend" in str(w.message)]
    assert not list(tmp_path.iterdir())


def test_an_op_inductor_refuses_gives_a_one_call_repro(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    model, x = Block(), torch.randn(8, 16)
    with pytest.warns(UserWarning, match="repro with 1 of"):
        got = ember.compile(model, backend="inductor_without_gelu")(x)  # runs eagerly, as today
    torch.testing.assert_close(got, model(x))
    (directory,) = tmp_path.iterdir()
    assert repro_calls(directory / "repro.py") == ["gelu"]
    saved = minifier.load_repro(directory / "repro.py")
    inputs = saved.inputs()
    gm = minifier.trace(saved.module_class(), inputs)
    backend = minifier.backend_by_name(saved.backend.name, saved.backend.module)
    with pytest.raises(NotImplementedError, match="gelu has no lowering"):
        minifier.check(saved.mode, gm, inputs, backend, saved.expected)


def test_a_wrong_rewrite_before_inductor_gives_a_small_accuracy_repro(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "accuracy")
    model, x = Block(), torch.randn(8, 16)
    with pytest.warns(UserWarning, match="result unlike eager's"):
        ember.compile(model, backend="inductor_mul_as_add")(x)
    (directory,) = tmp_path.iterdir()
    assert repro_calls(directory / "repro.py") == ["mul"]
    saved = minifier.load_repro(directory / "repro.py")
    inputs = saved.inputs()
    gm = minifier.trace(saved.module_class(), inputs)
    backend = minifier.backend_by_name(saved.backend.name, saved.backend.module)
    with pytest.raises(minifier.AccuracyError):
        minifier.check(saved.mode, gm, inputs, backend, saved.expected, saved.tolerance)
