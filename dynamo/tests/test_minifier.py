"""The minifier: EMBER_REPRO=error|accuracy shrinks a failing 200-call graph to a repro of a few
calls that reproduces (in a fresh process); nothing is written when the backend is right; the
CLI minifies a saved graph; minify() finds failures that need two distant nodes."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import minifier_backends  # noqa: F401  (registers the backends with injected bugs)
import pytest
import torch
import torch.fx as fx

import ember
from ember.dynamo import config, minifier

HERE = Path(__file__).absolute()


@pytest.fixture(autouse=True)
def _repro_settings(tmp_path, monkeypatch):
    ember.reset()
    monkeypatch.setattr(config, "repro_dir", str(tmp_path / "repros"))
    yield
    ember.reset()


def chain(x, y):
    """About 200 pointwise calls; one sin and one cos in the middle, far apart."""
    for i in range(66):
        x = (x + 0.1) * 0.99
        x = torch.abs(x) if i % 2 else x - y
        if i == 30:
            x = torch.sin(x)
        if i == 45:
            x = torch.cos(x)
    return x


def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8)  # y is broadcast


def run_python(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def repro_ops(path) -> int:
    saved = minifier.load_repro(path)
    gm = minifier.trace(saved.module_class(), saved.inputs())
    return minifier.count_ops(gm)


def only_directory(tmp_path) -> Path:
    found = list((tmp_path / "repros").iterdir())
    assert len(found) == 1, found
    return found[0]


def test_error_mode_writes_a_small_repro_that_raises_the_same_error(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    compiled = ember.compile(chain, backend="fails_on_sin")
    with pytest.warns(UserWarning, match="repro with 1 of 2.. calls") as record:
        with pytest.raises(RuntimeError, match="sin is not supported"):
            compiled(*inputs())  # the backend's own error still propagates
    warning = record[0]
    directory = only_directory(tmp_path)
    assert str(directory / "repro.py") in str(warning.message)
    assert f"chain ({HERE}:{chain.__code__.co_firstlineno})" in str(warning.message)
    assert (warning.filename, warning.lineno) == (str(HERE), chain.__code__.co_firstlineno)
    assert repro_ops(directory / "original.py") > 190
    assert repro_ops(directory / "repro.py") <= 10

    done = run_python("repro.py", cwd=directory)
    assert done.returncode != 0
    assert "RuntimeError: sin is not supported (graph of 3 nodes)" in done.stderr, done.stderr


def test_a_result_that_fails_when_run_is_reported_and_needs_both_nodes(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    compiled = ember.compile(chain, backend="fails_running_sin_and_cos")
    with pytest.warns(UserWarning, match="ValueError: sin next to cos"):
        with pytest.raises(ValueError, match="miscompiled"):
            compiled(*inputs())  # raised by the compiled function, as without EMBER_REPRO
    saved = minifier.load_repro(only_directory(tmp_path) / "repro.py")
    gm = minifier.trace(saved.module_class(), saved.inputs())
    names = sorted(getattr(n.target, "__name__", n.target) for n in gm.graph.nodes
                   if n.op in ("call_function", "call_method"))  # fmt: skip
    assert names == ["cos", "sin"]


def test_accuracy_mode_writes_a_small_repro(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "accuracy")
    x, y = inputs()
    compiled = ember.compile(chain, backend="perturbs_cos")
    with pytest.warns(UserWarning, match="result unlike eager's"):
        result = compiled(x, y)
    # The user still gets the backend's result (EMBER_REPRO only reports).
    assert not torch.allclose(result, chain(x, y), atol=1e-3)
    saved = minifier.load_repro(only_directory(tmp_path) / "repro.py")
    small_inputs = saved.inputs()
    gm = minifier.trace(saved.module_class(), small_inputs)
    assert minifier.count_ops(gm) <= 10
    backend = minifier.backend_by_name(saved.backend.name, saved.backend.module)
    with pytest.raises(minifier.AccuracyError, match="result differs from eager"):
        minifier.check(saved.mode, gm, small_inputs, backend, saved.expected, saved.tolerance)
    # what the correct backend makes of the same repro: no failure
    assert not minifier.check(saved.mode, gm, small_inputs, ember.dynamo.lookup_backend("eager"))


@pytest.mark.parametrize("mode", ["error", "accuracy"])
def test_a_correct_backend_writes_nothing(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(config, "repro", mode)
    x, y = inputs()

    def no_sin(x):
        return (x + 1).cos()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ember.compile(chain, backend="eager")(x, y), chain(x, y))
        torch.testing.assert_close(ember.compile(no_sin, backend="fails_on_sin")(x), no_sin(x))
    assert not (tmp_path / "repros").exists() or not any((tmp_path / "repros").iterdir())


def test_cli_minifies_a_saved_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    monkeypatch.setattr(config, "repro_minify", False)
    with pytest.warns(UserWarning, match="python -m ember.dynamo.minifier"):
        with pytest.raises(RuntimeError):
            ember.compile(chain, backend="fails_on_sin")(*inputs())
    directory = only_directory(tmp_path)
    assert sorted(p.name for p in directory.iterdir()) == ["original.py"]

    done = run_python("-m", "ember.dynamo.minifier", "original.py", cwd=directory)
    assert done.returncode == 0, done.stderr
    assert "1 of 2" in done.stdout
    assert repro_ops(directory / "repro.py") == 1


def test_minify_programmatic_keeps_the_two_nodes_that_fail_together():
    def program(a, b):
        for i in range(40):
            a = a * 1.5 if i != 7 else torch.sin(a)
            b = b - a if i != 31 else torch.cos(b)
        return a + b

    gm = fx.symbolic_trace(program)
    example = [torch.randn(3, 3), torch.randn(3, 3)]

    def fails(g, inputs):
        assert len(inputs) == len([n for n in g.graph.nodes if n.op == "placeholder"])
        targets = {getattr(n.target, "__name__", None) for n in g.graph.nodes}
        return {"sin", "cos"} <= targets

    small = minifier.minify(gm, example, fails)
    assert small.ops_before == 81 and small.ops_after == 2 and small.complete
    assert len(small.inputs) == len(small.specs) == 2
    assert [s.shape for s in small.specs] == [(3, 3), (3, 3)]


def test_failures_match_by_type_and_message_with_numbers_masked():
    failure = minifier.Failure.of(RuntimeError("op add_57 at 0x7f12ab: shape [4, 8]\nmore"))
    assert failure.matches(RuntimeError("op add_3 at 0x55aa: shape [4, 8]"))
    assert not failure.matches(ValueError("op add_3 at 0x55aa: shape [4, 8]"))
    assert not failure.matches(RuntimeError("op mul_3 at 0x55aa: shape [4, 8]"))


def test_random_inputs_keep_specs():
    base = torch.randn(6, 5)[1:, ::2]  # offset, strided
    spec = minifier.TensorSpec.of(base)
    (made,) = minifier.make_inputs([spec])
    assert (made.shape, made.stride(), made.storage_offset()) == (base.shape, base.stride(), 5)
    lo, hi = spec.range
    assert lo <= made.min().item() and made.max().item() <= hi
    ints = minifier.TensorSpec.of(torch.tensor([3, 7, 5]))
    assert set(minifier.make_inputs([ints])[0].tolist()) <= set(range(3, 8))
    assert minifier.make_inputs([spec], seed=1)[0].ne(made).any()


def test_values_are_saved_when_random_inputs_do_not_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    x, y = inputs()
    x[1, 2] = float("nan")
    with pytest.warns(UserWarning, match="FloatingPointError"):
        with pytest.raises(FloatingPointError):
            ember.compile(chain, backend="fails_on_nan_inputs")(x, y)
    directory = only_directory(tmp_path)
    saved = minifier.load_repro(directory / "repro.py")
    assert saved.input_values == "repro_inputs.pt" and (directory / saved.input_values).is_file()
    values = saved.inputs()
    assert any(v.isnan().any() for v in values)
    gm = minifier.trace(saved.module_class(), values)
    assert minifier.count_ops(gm) <= 10
    backend = minifier.backend_by_name(saved.backend.name, saved.backend.module)
    with pytest.raises(FloatingPointError):
        minifier.check(saved.mode, gm, values, backend, saved.expected)


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("EMBER_REPRO", "accuracy")
    monkeypatch.setenv("EMBER_REPRO_DIR", "/somewhere/repros")
    monkeypatch.setenv("EMBER_REPRO_MINIFY", "0")
    fresh = type(config)()
    assert (fresh.repro, fresh.repro_dir, fresh.repro_minify) == ("accuracy", "/somewhere/repros",
                                                                   False)  # fmt: skip
    monkeypatch.delenv("EMBER_REPRO")
    assert type(config)().repro == ""


def test_the_same_failure_is_written_once(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "repro", "error")
    for _ in range(2):  # a second function object of the same code: compiled and failing again
        compiled = ember.compile(lambda x: torch.sin(x) * 2, backend="fails_on_sin")
        with pytest.warns(UserWarning, match="repro") as record, pytest.raises(RuntimeError):
            compiled(torch.randn(3))
    assert "the same failure as before" in str(record[0].message)
    only_directory(tmp_path)
    ember.reset()  # forgets it: the next failure is written again
    with pytest.warns(UserWarning, match="repro with 1 of 2 calls"), pytest.raises(RuntimeError):
        compiled(torch.randn(3))
    assert len(list((tmp_path / "repros").iterdir())) == 2


def test_repro_files_round_trip_the_graph(tmp_path):
    def program(x):
        a, b = torch.split(x * 2, 2, dim=1)
        return torch.ones(3) + a.sum(), b.view(x.size(0), -1)

    x = torch.randn(4, 4)
    gm = fx.symbolic_trace(program)  # torch.ones(3) is a constant there: make it a call again
    (constant,) = [n for n in gm.graph.nodes if n.op == "get_attr"]
    with gm.graph.inserting_before(constant):
        constant.replace_all_uses_with(gm.graph.call_function(torch.ones, (3,)))
    gm.graph.erase_node(constant)
    gm.recompile()
    specs = [minifier.TensorSpec.of(x)]
    ref = minifier.backend_ref(ember.dynamo.lookup_backend("fails_on_sin"))
    path = minifier.write_repro(tmp_path / "r.py", gm, specs, ref, "error",
                                minifier.Failure("RuntimeError", "x"), title="t")  # fmt: skip
    saved = minifier.load_repro(path)
    assert (saved.backend.name, saved.specs, saved.mode) == ("fails_on_sin", specs, "error")
    back = minifier.trace(saved.module_class(), [x])
    ops = lambda g: [(n.op, n.target) for n in g.graph.nodes]  # noqa: E731
    assert ops(back) == ops(gm)  # torch.ones stays a call, not a constant of the module
    torch.testing.assert_close(back(x), program(x))
    assert all("example_value" in n.meta for n in back.graph.nodes if n.op != "output")


def test_cli_refuses_a_file_that_is_no_repro(tmp_path, capsys):
    from ember.dynamo.minifier.__main__ import main

    (tmp_path / "other.py").write_text("x = 1\n")
    assert main([str(tmp_path / "other.py")]) == 2
    assert "is not an ember repro file" in capsys.readouterr().err
