"""ember.export with `Dim(min=1)`: the program traced at sizes >= 2 is checked against the one
traced at 1, and the exported range starts at 1 when they agree; programs that differ at 1 are
refused at export naming the Dim and the op or guard. Numbers against eager at 1, 2 and more, in
process and through a package (standalone too).

Cross-component: dynamo captures twice (export_size_one.py), aot_autograd lowers both to prims,
cpp_wrapper packages the program with inductor's kernels for the whole range.
"""

import inspect
import math
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.cpp_wrapper import EmberRuntimeError, install_run_package, load_package, package
from ember.dynamo import SpecializationError
from ember.dynamo.export_size_one import Trace, _prim_difference

Dim = ember.export.Dim
TOL = dict(atol=1e-4, rtol=1e-4)


class Decoderish(torch.nn.Module):
    """Linear layers over (B, T, D) and causal attention over the T tokens."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, dim))  # fmt: skip
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm(x))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Decoderish().eval()


@pytest.mark.parametrize("example_len", [5, 1])  # an example at 1 is traced at 2, then at 1
def test_a_program_valid_at_one_exports_from_one(model, example_len):
    seq = Dim("seq", min=1, max=16)
    exported = ember.export(model, (torch.randn(2, example_len, 32),),
                            dynamic_shapes=({1: seq},))  # fmt: skip
    ((name, lower, upper),) = [(s.name, s.lower, s.upper) for s in exported.symbols]
    assert (lower, upper) == (1, 16) and exported.inputs[0].meta.sizes[1].name == name
    for t in (1, 2, 9, 16):
        x = torch.randn(2, t, 32)
        with torch.no_grad():
            torch.testing.assert_close(exported(x), model(x), **TOL)


def test_the_package_runs_size_one_in_process_and_standalone(model, tmp_path):
    seq = Dim("seq", min=1, max=16)
    exported = ember.export(model, (torch.randn(3, 4, 32),), dynamic_shapes=({1: seq},))
    path = package(exported, tmp_path / "pkg")
    compiled = load_package(path)
    for t in (1, 2, 11):
        x = torch.randn(3, t, 32)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x)[0], model(x), **TOL)
    with pytest.raises(EmberRuntimeError, match="outside its range"):
        compiled(torch.randn(3, 17, 32))
    x = torch.randn(3, 1, 32)
    np.save(tmp_path / "x.npy", x.numpy())
    run_package = install_run_package(tmp_path / "bin")
    r = subprocess.run([str(run_package), str(path), str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), model(x), **TOL)


def test_two_dims_from_one_are_checked_together_and_apart():
    """Every subset of the min=1 Dims is checked at 1: (1, 1), (1, n) and (n, 1) all run."""
    w = torch.randn(8, 8)

    def f(x, y):
        return (x @ w).softmax(-1).sum(1, keepdim=True) + y.mean(0)

    rows, cols = Dim("rows", min=1, max=8), Dim("cols", min=1, max=8)
    exported = ember.export(f, (torch.randn(3, 4, 8), torch.randn(5, 1, 8)),
                            dynamic_shapes=({0: rows, 1: cols}, {0: cols}))  # fmt: skip
    assert sorted(s.lower for s in exported.symbols) == [1, 1]
    for r, c in ((1, 1), (1, 5), (6, 1), (2, 3)):
        x, y = torch.randn(r, c, 8), torch.randn(c, 1, 8)
        torch.testing.assert_close(exported(x, y), f(x, y), **TOL)


def _squeezed(x):
    return x.squeeze(1) * 2  # the size-1 program drops dimension 1; the traced one keeps it


def _branched(x):
    if x.shape[1] == 1:  # the traced program took the other branch
        return x * 3
    return x * 2


def _line(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


@pytest.mark.parametrize("fn, words", [
    (_squeezed, lambda: f"`squeeze` at {__file__}:{_line(_squeezed, 'squeeze(1)')}"),
    (_branched, lambda: f"assumes Ne(L['x'].size()[1], 1) at {__file__}:"
                        f"{_line(_branched, '== 1')}"),
])  # fmt: skip
def test_a_program_that_differs_at_one_is_refused_naming_the_dim_and_line(fn, words):
    with pytest.raises(SpecializationError) as e:
        ember.export(fn, (torch.randn(2, 5, 4),), dynamic_shapes=({1: Dim("seq", min=1)},))
    assert "Dim 'seq' has min=1" in str(e.value) and words() in str(e.value), str(e.value)
    exported = ember.export(fn, (torch.randn(2, 5, 4),),  # min=2 (the default) exports it
                            dynamic_shapes=({1: Dim("seq", max=9)},))  # fmt: skip
    x = torch.randn(2, 7, 4)
    torch.testing.assert_close(exported(x), fn(x))
    with pytest.raises(ValueError, match=r"outside the exported range \[2, 9\]"):
        exported(torch.randn(2, 1, 4))


def test_size_zero_and_a_dim_of_only_one_are_errors():
    with pytest.raises(ValueError, match="sizes below 1 are not supported"):
        ember.export(lambda x: x.sin(), (torch.randn(3),), dynamic_shapes=({0: Dim("n", min=0)},))
    with pytest.raises(ValueError, match="allows only the size 1"):
        ember.export(lambda x: x.sin(), (torch.randn(1),),
                     dynamic_shapes=({0: Dim("n", min=1, max=1)},))


def test_the_lowered_programs_are_compared_up_to_moves_of_size_one_dimensions():
    """Check 3 alone: two lowered programs, one traced for sizes >= 2, one at 1."""

    def trace(fn, t, dims=None):
        ep = ember.export(fn, (torch.randn(2, t, 4),), dynamic_shapes=dims)
        return Trace(None, ep.graph_module, ep.constants, None, ()), ep.symbols

    dims = ({1: Dim("seq", max=8)},)
    wide, (sym,) = trace(_squeezed, 5, dims)
    subs = {sym.symbol: 1}
    assert "sizes" in _prim_difference(wide, trace(_squeezed, 1)[0], subs)  # (2, 1, 4): (2, 4)
    wide, _ = trace(lambda x: (x * 2).reshape(2, -1, 2, 2).permute(0, 2, 1, 3), 5, dims)
    moved, _ = trace(lambda x: (x * 2).reshape(2, 1, 2, 2).permute(0, 2, 1, 3), 1)
    assert _prim_difference(wide, moved, subs) is None  # moves of unit dims only
    other, _ = trace(lambda x: (x * 3).reshape(2, 1, 2, 2).permute(0, 2, 1, 3), 1)
    assert "argument 2" in _prim_difference(wide, other, subs)
    swapped, _ = trace(lambda x: (x * 2).reshape(2, 1, 2, 2).permute(0, 3, 1, 2), 1)
    assert _prim_difference(wide, swapped, subs) is not None  # the two 2s trade places


def test_guards_proved_by_either_end_of_a_range_export():
    """A relation proved for sizes >= min or for sizes <= max holds in the range: both export."""

    def f(x):
        if x.shape[0] < 10:  # holds for every size up to 9
            return x + 1
        return x - 1

    exported = ember.export(f, (torch.randn(4),), dynamic_shapes=({0: Dim("n", max=9)},))
    torch.testing.assert_close(exported(torch.ones(9)), torch.full((9,), 2.0))
    with pytest.raises(SpecializationError, match="do not guarantee"):
        ember.export(f, (torch.randn(4),), dynamic_shapes=({0: Dim("n", max=12)},))


def test_the_size_one_trace_takes_the_main_trace_s_attention_kernel():
    """torch picks its fused attention kernel by size (on CUDA another one, or the math
    decomposition, for one query row): the size-1 trace is pinned to the kernels the main trace
    recorded, so the same attention is not taken for another program."""
    from torch import fx

    from ember.dynamo.export_size_one import _same_attention_kernels
    from ember.ir import resolve

    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(resolve("extern.sdpa_efficient"), (x, x, x, None, False)))
    with _same_attention_kernels(fx.GraphModule(torch.nn.Module(), graph)):
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()  # restored
    empty = fx.Graph()
    empty.output(empty.placeholder("x"))
    with _same_attention_kernels(fx.GraphModule(torch.nn.Module(), empty)):
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
