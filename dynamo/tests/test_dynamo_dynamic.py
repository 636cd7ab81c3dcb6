"""Dynamic sizes in dynamo: symbolic sizes in the graph, automatic dynamic, mark_dynamic, the
0/1 rule, guards on size relations (C++ guard VM), backends, and export with Dim."""

import copy
import operator
import warnings

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.dynamo import CompileCounter, Dim, SpecializationError, convert, mark_dynamic
from ember.dynamo import backends as B
from ember.dynamo import source as S
from ember.dynamo.guards import GuardSet
from ember.ir import NODE_META_KEY
from ember.ir.symbols import sym
from dynamo_models import BertTiny, GPT2Tiny, ResNetTiny, ViTTiny


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x).softmax(-1)


def _ids(b, t):
    return torch.randint(0, 100, (b, t))


CASES = [
    ("mlp-batch", MLP, lambda n: (torch.randn(n, 16),)),
    ("gpt2-seq", GPT2Tiny, lambda n: (_ids(2, n),)),
    ("gpt2-batch-loss", GPT2Tiny, lambda n: (_ids(n, 8), _ids(n, 8))),
    ("bert-seq", BertTiny, lambda n: (_ids(2, n), torch.ones(2, n, dtype=torch.long))),
    ("cnn-batch", ResNetTiny, lambda n: (torch.randn(n, 3, 16, 16),)),
    ("vit-batch", ViTTiny, lambda n: (torch.randn(n, 3, 16, 16),)),
]


def _assert_same(out, ref):
    for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(ref)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name,build,inputs", CASES, ids=[c[0] for c in CASES])
def test_six_sizes_compile_at_most_twice(name, build, inputs):
    """Default (automatic dynamic): the first size compiles static, the second symbolic, and
    that graph serves every later size; each result matches eager."""
    torch.manual_seed(0)
    model = build().eval()
    ref = copy.deepcopy(model)
    cnt = CompileCounter(dynamic=True)
    compiled = ember.compile(model, backend=cnt)
    for n in (3, 5, 7, 9, 12, 16):
        args = inputs(n)
        _assert_same(compiled(*args), ref(*args))
    assert cnt.frame_count == 2
    assert cnt.graphs[1].meta["ember_symbols"]
    assert not convert.stats.breaks and not convert.stats.failures


def test_eager_backend_symbolic_graph():
    """backend="eager": the graph computes sizes with size/floordiv nodes, not constants."""

    def f(x):
        b, t = x.shape[0], x.size(1)
        return x.view(b, t // 2, 2).sum(-1) * t

    compiled = ember.compile(f, backend="eager", dynamic=True)
    for t in (4, 6, 8, 10):
        x = torch.randn(3, t)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(convert.stats.graphs) == 1
    gm = convert.stats.graphs[0].gm
    targets = [n.target for n in gm.graph.nodes]
    assert "size" in targets and operator.floordiv in targets
    s0, s1 = sym("s0"), sym("s1")
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert ph.meta[NODE_META_KEY].sizes == (s0, s1)
    assert ph.meta[NODE_META_KEY].strides == (s1, 1)
    assert [s.name for s in gm.meta["ember_symbols"]] == ["s0", "s1"]
    assert all(s.lower == 2 and s.upper is None for s in gm.meta["ember_symbols"])


def test_gather_result_has_the_index_sizes():
    """HF BERT gathers token types by position: the result's sizes are the index's, symbolic."""
    buf = torch.zeros(1, 16, dtype=torch.long)

    def f(x):
        pos = torch.arange(x.size(1)).expand(x.size(0), -1)
        types = torch.gather(buf.expand(x.size(0), -1), 1, pos)
        return x + types.view(types.size(0), types.size(1), 1)

    compiled = ember.compile(f, backend="eager", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a static-shapes fallback warns
        for t in (4, 6, 9):
            x = torch.randn(2, t, 3)
            torch.testing.assert_close(compiled(x), f(x))
    assert len(convert.stats.graphs) == 1


def _rotary(x, table, pos):
    """Rotary embeddings as GPT-J and CodeGen index them: a table gathered by a position tensor,
    interleaved, a trailing new dim."""
    sincos = table[pos]  # (1, t, 8): an integer tensor index
    sin = sincos[..., None, :4]
    sin = sin.repeat_interleave(2, dim=3).view(sin.size(0), sin.size(1), 1, 8)
    swapped = x[..., [1, 0, 3, 2, 5, 4, 7, 6]]  # a list index on the last dim
    return (x * sin + swapped).view(sincos.size(0), swapped.size(1), -1)


def _pairs(x):
    """Advanced indices side by side (SqueezeBERT-like), an in-place add, and baddbmm with its
    matrices as keywords (BLOOM's alibi scores)."""
    b, t = x.shape[0], x.shape[1]
    rows = torch.arange(b)[:, None].expand(b, t)
    cols = torch.arange(t)[None, :].expand(b, t)
    picked = x[rows, cols]  # (b, t, 8)
    picked += 1
    picked = picked.view(picked.size(0), picked.size(1), 8)
    scores = torch.baddbmm(torch.zeros(b, 1, t), batch1=picked, batch2=picked.transpose(1, 2))
    return scores.view(scores.size(0), scores.size(1), t).sum(1)[:, :, None] * picked


@pytest.mark.parametrize("fn,make", [
    (_rotary, lambda t: (torch.randn(1, t, 2, 8), torch.randn(64, 8), torch.arange(t)[None])),
    (_pairs, lambda t: (torch.randn(2, t, 8),)),
], ids=["rotary", "pairs"])  # fmt: skip
def test_indexing_by_arrays_keeps_sizes_symbolic(fn, make):
    """Integer tensor and list indices, x[..., None], repeat_interleave, in-place operators and
    baddbmm's keyword matrices have symbolic sizes (a size read of an unknown one falls back to
    static shapes, which warns)."""
    compiled = ember.compile(fn, backend="eager", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (4, 6, 9):
            args = make(t)
            torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(convert.stats.graphs) == 1


def test_dynamic_true_one_compile_and_dynamic_false_each_size():
    def f(x):
        return torch.relu(x) + x.shape[0]

    dyn, static = CompileCounter(dynamic=True), CompileCounter(dynamic=True)
    fd = ember.compile(f, backend=dyn, dynamic=True)
    fs = ember.compile(f, backend=static, dynamic=False)
    for n in (2, 3, 4, 5, 6, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(fd(x), f(x))
        torch.testing.assert_close(fs(x), f(x))
    assert dyn.frame_count == 1
    assert static.frame_count == 6
    assert all("ember_symbols" not in g.meta for g in static.graphs)


def test_backend_without_flag_gets_static_graphs():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm.meta.get("ember_symbols"))
        return gm.forward

    f = ember.compile(lambda x: x * 2, backend=backend, dynamic=True)
    for n in (2, 3, 4):
        torch.testing.assert_close(f(torch.ones(n)), torch.full((n,), 2.0))
    assert seen == [None, None, None]


def test_zero_and_one_are_specialised():
    cnt = CompileCounter(dynamic=True)
    f = ember.compile(lambda x: x.sum(0) * x.shape[0], backend=cnt, dynamic=True)
    for n in (1, 5, 1, 9, 0):
        x = torch.randn(n, 4)
        torch.testing.assert_close(f(x), x.sum(0) * n)
    assert cnt.frame_count == 3  # 1, then >= 2 (5 and 9), then 0; the second 1 hits
    sizes = [_placeholder_sizes(g) for g in cnt.graphs]
    assert sizes == [(1, sym("s0")), (sym("s0"), sym("s1")), (0, sym("s0"))]
    assert all(s.lower == 2 for g in cnt.graphs for s in g.meta["ember_symbols"])


def _placeholder_sizes(gm):
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder")
    return ph.meta[NODE_META_KEY].sizes


def test_mark_dynamic_range_and_recompile_outside():
    cnt = CompileCounter(dynamic=True)
    f = ember.compile(lambda x: x.cumsum(1), backend=cnt)
    for t in (4, 9, 16, 32, 6):
        x = mark_dynamic(torch.randn(2, t), 1, min=4, max=16)
        torch.testing.assert_close(f(x), x.cumsum(1))
    assert cnt.frame_count == 2  # 4..16 share one graph; 32 is outside: its own compile
    (spec,) = cnt.graphs[0].meta["ember_symbols"]
    assert (spec.lower, spec.upper) == (4, 16)
    assert "ember_symbols" not in cnt.graphs[1].meta


def test_branch_on_size_records_a_guard():
    cnt = CompileCounter(dynamic=True)

    def f(x):
        if x.size(1) > 8:
            return x[:, :8] * 2
        return x + 1

    cf = ember.compile(f, backend=cnt, dynamic=True)
    for t in (3, 5, 7, 10, 12, 20, 4):
        x = torch.randn(2, t)
        torch.testing.assert_close(cf(x), f(x))
    assert cnt.frame_count == 2
    guards = convert.stats.graphs[0].guards + convert.stats.graphs[1].guards
    assert "sizes: _slot1 <= 8" in guards and "sizes: _slot1 > 8" in guards


def test_python_ints_from_sizes_rebuilt_after_the_graph():
    cnt = CompileCounter(dynamic=True)

    def f(x):
        n = x.shape[0] * 2 + 1
        return x.relu(), n, x.shape

    cf = ember.compile(f, backend=cnt, dynamic=True)
    for b in (3, 6):
        y, n, shape = cf(torch.randn(b, 5))
        assert n == 2 * b + 1 and shape == torch.Size([b, 5]) and type(shape) is torch.Size
    assert cnt.frame_count == 1


def test_backend_ember_guards_are_checked():
    class Even:
        ember_supports_dynamic = True

        def __init__(self):
            self.calls = 0

        def __call__(self, gm, example_inputs):
            self.calls += 1
            fn = gm.forward

            def run(*args):
                return fn(*args)

            run.ember_guards = (sympy.Eq(sympy.Mod(sym("s0"), 2), 0),)
            return run

    backend = Even()
    f = ember.compile(lambda x: x * 3, backend=backend, dynamic=True)
    for n in (2, 4, 6):
        torch.testing.assert_close(f(torch.ones(n)), torch.full((n,), 3.0))
    assert backend.calls == 1
    f(torch.ones(5))  # odd: the backend's guard fails, so the stale graph is not reused
    assert backend.calls == 2


def test_broadcast_of_two_symbols_guards_equality():
    cnt = CompileCounter(dynamic=True)
    f = ember.compile(lambda a, b: a + b, backend=cnt, dynamic=True)
    f(torch.ones(4), torch.ones(4))
    f(torch.ones(6), torch.ones(6))
    assert cnt.frame_count == 1
    with pytest.raises(RuntimeError):
        f(torch.ones(6), torch.ones(5))  # guard fails, recompiles, and eager-equivalent error
    assert "sizes: Eq(_slot1, _slot0)" in convert.stats.graphs[0].guards


def test_non_row_major_input_stays_static():
    cnt = CompileCounter(dynamic=True)
    f = ember.compile(lambda x: x * 2, backend=cnt, dynamic=True)
    f(torch.ones(4, 6).t())
    assert "ember_symbols" not in cnt.graphs[0].meta


def test_guard_vm_reads_sizes_and_evaluates_relations():
    src = S.LocalSource("x", 0)
    gs = GuardSet()
    x = torch.ones(3, 8)
    gs.add("SYM_TENSOR", src, (torch.Tensor, x.dtype, x.device, False, (3, -1)))
    slot = sympy.Symbol("_slot0", integer=True, positive=True)
    from ember.ir.symbols import FloorDiv

    gs.add_relations([slot >= 4, sympy.Eq(sympy.Mod(slot, 4), 0), FloorDiv(slot, 4) < 5], 1)
    prog = gs.compile()

    def check(t):
        return prog.check((None, t), {}, {})

    assert check(torch.ones(3, 8)) == -1
    assert check(torch.ones(3, 16)) == -1
    assert check(torch.ones(3, 20)) >= 0  # 20 // 4 == 5
    assert check(torch.ones(3, 6)) >= 0  # 6 % 4
    assert check(torch.ones(2, 8)) >= 0  # static size
    assert check(torch.ones(8, 3).t()) >= 0  # strides
    assert check(torch.ones(3, 8, dtype=torch.float64)) >= 0


# -- export -------------------------------------------------------------------------------------
def _stand_in_lowering(monkeypatch):
    """The symbolic torch-level graph as the 'lowered' one: tests dynamo's half of export while
    ember.aot_autograd cannot lower symbolic graphs (functions without constants only)."""

    def lower(gm, inputs, constants, names):
        assert not constants
        return gm, {}

    lower.ember_supports_dynamic = True
    monkeypatch.setitem(B._RESOLVED, "export_lowering", lower)


def test_export_with_dim_shared_dim_and_multiple(monkeypatch):
    _stand_in_lowering(monkeypatch)

    def f(x, y, z):
        return (x + y).sum(-1), z.view(z.shape[0] // 2, 2, -1).sum(1)

    batch = Dim("batch", min=2, max=64)
    args = (torch.randn(4, 3), torch.randn(4, 3), torch.randn(8, 5))
    ep = ember.export(f, args, dynamic_shapes=({0: batch}, {0: batch}, {0: 2 * batch}))
    assert [(s.name, s.lower, s.upper) for s in ep.symbols] == [("s0", 2, 64)]
    s0 = sym("s0")
    assert [i.meta.sizes[0] for i in ep.inputs] == [s0, s0, 2 * s0]
    for b in (2, 7, 64):
        a = (torch.randn(b, 3), torch.randn(b, 3), torch.randn(2 * b, 5))
        _assert_same(ep(*a), f(*a))
    with pytest.raises(ValueError, match="outside"):
        ep(torch.randn(65, 3), torch.randn(65, 3), torch.randn(130, 5))
    with pytest.raises(ValueError):
        ep(torch.randn(4, 3), torch.randn(5, 3), torch.randn(8, 5))  # a shared Dim differs


def test_export_specialisation_names_the_size_and_line():
    def f(x):
        if x.shape[1] == 8:  # forces the declared size to 8
            return x * 2
        return x

    seq = Dim("seq")
    with pytest.raises(SpecializationError, match=r"L\['x'\].size\(\)\[1\].*'seq'.*:\d+") as e:
        ember.export(f, (torch.randn(2, 8),), dynamic_shapes={"x": {1: seq}})
    line = f.__code__.co_firstlineno + 1
    assert f"test_dynamo_dynamic.py:{line}" in str(e.value)


def test_export_unshared_dims_that_must_be_equal_fail():
    with pytest.raises(SpecializationError, match="shared Dim"):
        ember.export(lambda x, y: x + y, (torch.randn(4), torch.randn(4)),
                     dynamic_shapes=({0: Dim("a")}, {0: Dim("b")}))  # fmt: skip


def test_export_dynamic_size_of_one_is_refused():
    with pytest.raises(SpecializationError, match="0, 1"):
        ember.export(lambda x: x * 2, (torch.randn(1, 3),), dynamic_shapes=({0: Dim("b")},))


def test_chunk_of_a_dynamic_size_guards_the_count_without_crashing():
    # The count of chunks is guarded (CeilDiv(s0, CeilDiv(s0, 2)) == 2); solving that guard for a
    # pinned symbol evaluated it at s0 = 0 and raised ZeroDivisionError out of the compile.
    def f(x):
        a, b = x.chunk(2)
        return a * 2 + b

    cnt = CompileCounter(dynamic=True)
    g = ember.compile(f, backend=cnt, dynamic=True)
    for n in (4, 6, 10, 16):
        x = torch.randn(n, 3)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1 and cnt.graphs[0].meta["ember_symbols"]
