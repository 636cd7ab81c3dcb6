"""Dynamic shapes: a graph module with `ember_symbols` (DYNAMIC.md) compiles once and runs every size.

The graph modules are built the way dynamo hands them over: torch-level fx graphs whose sizes are
`x.size(d)` nodes, with symbolic TensorMeta on the placeholders and the symbols in gm.meta.
"""

import os
import re
import subprocess
import sys

import pytest
import sympy
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ember.aot_autograd import aot_eager
from ember.aot_autograd.dynamic import ShapeMismatch
from ember.inductor import compile_fx, config, metrics
from inductor_helpers import dynamic_gm

SIZES = (2, 3, 5, 8, 13, 31)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = self.l1(x).relu()
        return self.l2(h) + x.mean(0).sum(), h.view(x.size(0), 4, -1).sum(1)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1) * x.size(1), torch.log_softmax(x * 2, 1)


class LayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(24)

    def forward(self, x):
        return self.ln(x).relu()


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, causal=False):
        super().__init__()
        self.heads, self.causal, self.scale = heads, causal, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.size(0), x.size(1), x.size(2)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * self.scale
        if self.causal:
            mask = _causal_mask(t, x.device)
            att = att.masked_fill(~mask, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


@fx.wrap
def _causal_mask(t, device):
    # fx's symbolic_trace cannot pass a Proxy size to torch.ones; wrapped, the call is recorded
    # whole and torch.ones(t, t) runs with symbolic t when aot_autograd traces it.
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


class GPT2Block(nn.Module):
    """GPT-2-like: token and position embeddings, a causal pre-norm block, tied LM head."""

    def __init__(self, vocab=50, dim=32, heads=4, max_len=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.ln_f(x) @ self.wte.weight.t()


def _check(backend, model, make_inputs, dims, sizes=SIZES, upper=None):
    """Compile once at the first size, then every size matches eager with no new kernels."""
    torch.manual_seed(0)
    example = make_inputs(sizes[0])
    gm = dynamic_gm(model, example, dims, upper)
    with torch.no_grad():
        compiled = backend(gm, example)
        kernels = metrics.generated_kernel_count
        for n in sizes:
            inputs = make_inputs(n)
            got, want = compiled(*inputs), model(*inputs)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert metrics.generated_kernel_count == kernels  # one kernel per group, for all sizes
    return compiled


CASES = {
    "mlp": (MLP, lambda n: (torch.randn(n, 16),), [{0: "s0"}]),
    "softmax": (Softmax, lambda n: (torch.randn(3, n + 1),), [{1: "s0"}]),
    "layer_norm": (LayerNorm, lambda n: (torch.randn(n, 2 * n, 24),), [{0: "s0", 1: "s1"}]),
    "attention": (Attention, lambda n: (torch.randn(n % 3 + 2, n + 1, 32),), [{0: "s0", 1: "s1"}]),
    "gpt2": (GPT2Block, lambda n: (torch.randint(0, 50, (2, n + 1)),), [{1: "s0"}]),
}


@fx.wrap
def _size_mask(kind, x):
    """An attention mask built from x's sizes alone, as transformers builds one when none is given."""
    b, t = x.size(0), x.size(1)
    pos = torch.arange(t, device=x.device)
    if kind == "padding":  # the bias of a padding mask of ones: all zeros
        keep = torch.ones(b, t, device=x.device)
        return (1.0 - keep[:, None, None, :]) * torch.finfo(x.dtype).min
    if kind == "causal":  # causal, and within one packed sequence (the ids are all 0 here)
        ids = pos.expand(b, t)
        seq = (torch.diff(ids, prepend=ids[:, :1] - 1) != 1).cumsum(-1)
        rows, cols = torch.arange(b)[:, None, None], pos[None, :, None]
        same = seq[rows, cols] == seq[rows, pos[None, None, :]]
        return ((pos[None, :] <= pos[:, None])[None] & same)[:, None]
    if kind == "wrapped":  # causal but for row 0, which reads row -1: torch's last row
        wide = pos[None, :] <= pos[:, None] + 1
        return wide[pos - 1][None, None]
    if kind == "values":  # read from x's values: never proved, whatever they are
        return (x.sum(-1) > -1e30)[:, None, None, :]
    # the first five keys: every key for the example's 3 positions, not for longer ones
    return (pos < 5)[None, None, None, :]


class MaskedAttention(nn.Module):
    def __init__(self, kind, dim=32, heads=4):
        super().__init__()
        self.kind, self.heads, self.qkv = kind, heads, nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, t, c = x.size(0), x.size(1), x.size(2)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=_size_mask(self.kind, x))
        return out.transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("kind, proof", [("padding", "none"), ("causal", "causal"),
                                         ("first_five", None), ("wrapped", None),
                                         ("values", None)])  # fmt: skip
def test_a_mask_made_from_sizes_is_proved_for_every_size(kind, proof, monkeypatch):
    """A mask proved to allow everything, or to be causal, for every size becomes flash attention
    without a bias; one that only looks so at the example's size (the first five keys of three)
    stays a mask, and every size still matches eager."""
    from ember.primtorch import mask_proof

    verdicts, prove = [], mask_proof.proven_mask_kind
    monkeypatch.setattr(mask_proof, "proven_mask_kind",
                        lambda *a: verdicts.append(prove(*a)) or verdicts[-1])  # fmt: skip
    _check(compile_fx, MaskedAttention(kind).eval(), lambda n: (torch.randn(2, n + 1, 32),),
           [{1: "s0"}])  # fmt: skip
    assert verdicts and set(verdicts) == {proof}


class _CausalOfQuery(nn.Module):
    """A causal mask from the query's length, for keys that are another input."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_query_causal(q))


@fx.wrap
def _query_causal(q):
    pos = torch.arange(q.size(2), device=q.device)
    return (pos[None, :] <= pos[:, None])[None, None].expand(q.size(0), 1, -1, -1)


def test_a_causal_mask_of_the_query_length_guards_the_key_length_equal(monkeypatch):
    """The query's and the keys' lengths are distinct symbols: the mask is proved causal under
    the guard that they are equal (as the mask's columns require), and keys of another length
    are refused."""
    from ember.primtorch import mask_proof

    verdicts, prove = [], mask_proof.proven_mask_kind
    monkeypatch.setattr(mask_proof, "proven_mask_kind",
                        lambda *a: verdicts.append(prove(*a)) or verdicts[-1])  # fmt: skip
    make = lambda n: tuple(torch.randn(2, 3, n + 1, 8) for _ in range(3))  # noqa: E731
    compiled = _check(compile_fx, _CausalOfQuery(), make, [{2: "s0"}, {2: "s1"}, {2: "s1"}])
    assert verdicts == ["causal"]
    equal = {tuple(sorted(map(str, g.args))) for g in compiled.ember_guards if isinstance(g, sympy.Eq)}
    assert ("s0", "s1") in equal
    q, k = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 9, 8)
    with torch.no_grad(), pytest.raises(ShapeMismatch):
        compiled(q, k, k)


def test_cuda_graphs_by_size_key_on_the_inputs_with_symbolic_sizes():
    """A symbolic program's graphs are told apart by its symbolic inputs only (a parameter's
    sizes are the program's); integer arguments, which shift the positions, key on all."""
    from types import SimpleNamespace

    from ember.inductor.cudagraphs import GraphsBySize, varying_inputs
    from ember.ir import TensorMeta
    from ember.ir.artifact import BufferIR

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    metas = {"w": TensorMeta(torch.float32, (4, 8), (8, 1)),
             "x": TensorMeta(torch.float32, (s0, 8), (8, 1)),
             "b": TensorMeta(torch.float32, (4,), (1,))}  # fmt: skip
    art = SimpleNamespace(inputs=("w", "x", "b"),
                          buffers=[BufferIR(n, "input", m) for n, m in metas.items()])  # fmt: skip
    assert varying_inputs(art) == ((1,), 3)
    graphs = GraphsBySize(lambda args: None, varying_inputs(art))
    w, b = torch.randn(4, 8), torch.randn(4)
    x5, x7 = torch.randn(5, 8), torch.randn(7, 8)
    assert graphs.key([w, x5, b]) == graphs.key([torch.randn(4, 8), torch.randn(5, 8), b])
    assert graphs.key([w, x5, b]) != graphs.key([w, x7, b])
    assert graphs.key([w, x5, b]) != graphs.key([w, x5.t().contiguous().t(), b])  # strides
    assert len(graphs.key([w, x5, 5, b])) == 4


def test_a_slice_of_rows_views_into_heads_with_symbolic_sizes():
    """GPT-2's query: a column slice of the fused q/k/v projection (rows of 3*768), viewed as
    heads. It is a strided view for every size (the flash kernel reads it in place); with the
    symbolic sizes only a contiguous tensor used to view, and each layer copied q, k and v."""
    from ember.inductor.lowering_views import view_strides

    b, t = sympy.symbols("s0 s1", integer=True, positive=True)
    assert view_strides([b, t, 768], [2304 * t, 2304, 1], [b, t, 12, 64]) == [
        2304 * t, 2304, 64, 1]  # fmt: skip
    assert view_strides([b, t, 768], [2304 * t, 2304, 1], [b * t, 768]) == [2304, 1]
    # heads transposed back: the length and the heads cannot merge without a copy
    assert view_strides([b, 12, t, 64], [768 * t, 64, 768, 1], [b, 12, t * 64]) is None


def test_symbolic_views_agree_with_the_static_rule():
    """On plain numbers the symbolic view rule decides as the static one, view by view."""
    import random

    from ember.inductor.lowering_views import _symbolic_view_strides, view_strides

    rng = random.Random(0)
    for _ in range(500):
        sizes = [rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 4))]
        base = torch.empty(*[n * rng.choice([1, 2]) for n in sizes])
        v = base[tuple(slice(0, n) for n in sizes)]
        if rng.random() < 0.5:
            v = v.permute(rng.sample(range(v.dim()), v.dim()))
        factors, rest = [], v.numel()
        for p in (2, 3, 2, 3, 2):
            if rest % p == 0 and rng.random() < 0.6:
                factors.append(p)
                rest //= p
        factors.append(rest)
        rng.shuffle(factors)
        want = view_strides(list(v.shape), list(v.stride()), factors)
        got = _symbolic_view_strides(list(v.shape), list(v.stride()), factors)
        assert (got is None) == (want is None), (v.shape, v.stride(), factors)
        if want is not None:
            assert [int(g) for g in got] == [int(w) for w in want], (v.shape, v.stride(), factors)
        if want is not None and v.numel():
            # (and the static rule is right: torch views it with the same strides)
            assert list(v.view(factors).stride()) == [int(w) for w in want]


@pytest.mark.parametrize("name", sorted(CASES))
def test_inductor_cpp_matches_eager_for_every_size(name):
    model, make, dims = CASES[name]
    compiled = _check(compile_fx, model().eval(), make, dims)
    assert compiled.ember_guards == ()


@pytest.mark.parametrize("name", sorted(CASES))
def test_aot_eager_matches_eager_for_every_size(name):
    model, make, dims = CASES[name]
    _check(aot_eager, model().eval(), make, dims)


@pytest.mark.parametrize("name", ["layer_norm"])
def test_inductor_triton_interpreted(name, monkeypatch):
    """Triton kernels take the sizes as arguments; numels and grid are computed per call. (Under
    the interpreter, a reduction loop over a dynamic length cannot run: numpy 2 refuses the
    interpreter's scalar-to-int conversion in range(), so this case reduces over a static
    length; on a GPU the same kernels loop over rnumel.)"""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    model, make, dims = CASES[name]
    if name == "attention":
        make, dims = (lambda n: (torch.randn(n + 1, 4, 32),)), [{0: "s0"}]
    _check(compile_fx, model().eval(), make, dims, sizes=SIZES[:6])


def test_training_gradients_match_eager_for_every_size():
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 5, 32, requires_grad=True)
    gm = dynamic_gm(model, [x], [{0: "s0", 1: "s1"}])
    for backend in (aot_eager, compile_fx):
        compiled = backend(gm, [x])
        for n in SIZES:
            xs = torch.randn(2, n + 1, 32, requires_grad=True)
            compiled(xs).square().sum().backward()
            got = (xs.grad, model.qkv.weight.grad.clone())
            xs.grad = None
            model.zero_grad()
            model(xs).square().sum().backward()
            torch.testing.assert_close(got[0], xs.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[1], model.qkv.weight.grad, rtol=1e-4, atol=1e-4)
            model.zero_grad()


def test_size_outside_range_or_wrong_static_size_is_refused():
    model = Softmax()
    compiled = _check(compile_fx, model, lambda n: (torch.randn(3, n + 1),), [{1: "s0"}],
                      sizes=(4, 9), upper=16)  # fmt: skip
    with pytest.raises(ShapeMismatch, match="outside"):
        compiled(torch.randn(3, 40))
    with pytest.raises(ShapeMismatch, match="expects"):
        compiled(torch.randn(4, 9))


def test_a_branch_on_a_size_becomes_a_guard():
    class Branch(nn.Module):
        def forward(self, x):
            return x * 2 if x.size(0) > 4 else x - 1

    torch.manual_seed(0)
    x = torch.randn(8, 3)
    # fx cannot trace a Python branch on a size: the graph calls the module opaquely, and the
    # branch runs (and is guarded) while aot_autograd traces.
    gm = dynamic_gm(_Traced(Branch()), [x], [{0: "s0"}])
    compiled = aot_eager(gm, [x])
    assert [str(g) for g in compiled.ember_guards] == ["s0 > 4"]
    torch.testing.assert_close(compiled(torch.randn(6, 3) * 0 + 1), torch.full((6, 3), 2.0))
    with pytest.raises(ShapeMismatch, match="guards"):
        compiled(torch.randn(3, 3))


class _Traced(nn.Module):
    """Wraps a module so fx records one opaque call (the branch runs while aot_autograd traces)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return _call_inner(self.inner, x)


@fx.wrap
def _call_inner(inner, x):
    return inner(x)


@pytest.mark.parametrize("backend", [aot_eager, compile_fx], ids=["aot_eager", "inductor"])
def test_training_mlp_gradients_match_eager_for_every_size(backend):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 16, requires_grad=True)
    compiled = backend(dynamic_gm(model, [x], [{0: "s0"}]), [x])
    for n in SIZES:
        xs = torch.randn(n, 16, requires_grad=True)
        out = compiled(xs)
        (out[0].square().sum() + out[1].sum()).backward()
        got = (xs.grad, model.l1.weight.grad.clone())
        xs.grad = None
        model.zero_grad()
        want = model(xs)
        (want[0].square().sum() + want[1].sum()).backward()
        torch.testing.assert_close(got[0], xs.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1], model.l1.weight.grad, rtol=1e-4, atol=1e-4)
        model.zero_grad()


@pytest.mark.parametrize("name", ["attention", "gpt2"])
def test_triton_kernels_of_attention_models_take_sizes_as_arguments(name, monkeypatch):
    """The Triton kernels of a symbolic attention graph (rendered, not run: the interpreter cannot
    loop a reduction over a dynamic length) read the sizes from arguments and launch on grids
    computed from them; the example's sizes (prime hints) appear nowhere in their source."""
    from ember.inductor import pipeline

    programs = []

    class RenderOnly:
        def __init__(self, program, constants):
            programs.append(program)

    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(pipeline, "CompiledGraph", RenderOnly)
    model, make, dims = CASES[name]
    torch.manual_seed(0)
    example = make(36)  # hints 37 (and 2 for attention's batch: 36 % 3 + 2)
    with torch.no_grad():
        compile_fx(dynamic_gm(model().eval(), example, dims), example)
    (program,) = programs
    kernels = [k for k in program.kernels if k.language == "triton"]
    assert kernels
    symbols = {s for d in dims for s in d.values()}
    for k in kernels:
        compile(k.source, k.name, "exec")  # valid Python
        assert "37" not in k.source and "1369" not in k.source, k.source  # 37, 37**2
        grid = {s.name for g in k.grid for s in sympy.sympify(g).free_symbols}
        assert grid and grid <= symbols, k.grid  # launched on a grid computed from the sizes
        signature = k.source.split("def ", 1)[1].split(")", 1)[0]
        assert all(s in signature.split(", ") for s in grid), signature


class SoftmaxMatmul(nn.Module):
    def forward(self, x, w):
        d = x.softmax(-1)
        return torch.mm(d, w) * 2, d + 1


def test_inplace_donation_with_symbolic_sizes(monkeypatch):
    """A kernel may write over a dying buffer of symbolic size (the memory-saving donation was
    refused there while a dynamic ResNet-BN's wrong gradients were unexplained: a member read the
    donor after another had written over it, a fault of static sizes too)."""
    from ember.inductor import pipeline

    sources = []

    class Capturing(pipeline.CompiledGraph):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sources.append(self.source)

    monkeypatch.setattr(pipeline, "CompiledGraph", Capturing)
    make = lambda n: (torch.randn(n + 1, 8), torch.randn(8, 8))  # noqa: E731
    _check(compile_fx, SoftmaxMatmul(), make, [{0: "s0"}, {}])
    (source,) = sources
    donors = re.findall(r"# reuses (buf\d+)", source)  # in the same layout: `bufN = bufM`
    assert any(f"{d} = empty_strided((s0" in source for d in donors), source


class SquareMask(torch.nn.Module):
    """A (b, n, n) pointwise value: its flat index splits by a product of symbols, n * n."""

    def forward(self, x):
        return x * 2 + x.transpose(1, 2)


def test_triton_index_split_by_a_product_of_sizes(monkeypatch):
    # GPT-2's causal mask on the GPU: `x // (s1 * s1)` printed as `x // s1 * s1` read out of
    # bounds (an illegal address). Interpreted here, the wrong split gives wrong values.
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    make = lambda n: (torch.randn(3, n + 1, n + 1),)  # noqa: E731
    _check(compile_fx, SquareMask(), make, [{1: "s0", 2: "s0"}], sizes=SIZES[:4])


_TEAM_SCRIPT = """
import os, torch
from ember.inductor import compile_fx
from inductor_helpers import dynamic_gm

class Pointwise(torch.nn.Module):
    def forward(self, x):
        return (x * 2 + 1).relu()

torch.set_num_threads(4)
gm = dynamic_gm(Pointwise(), [torch.randn(8, 64)], [{0: "s0"}])
compiled = compile_fx(gm, [torch.randn(8, 64)])
big, small = torch.randn(2048, 64), torch.randn(300, 64)
compiled(big)
team = set(os.listdir("/proc/self/task"))
for _ in range(6):
    assert torch.equal(compiled(small), (small * 2 + 1).relu())
    assert torch.equal(compiled(big), (big * 2 + 1).relu())
print("new threads", len(set(os.listdir("/proc/self/task")) - team))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_a_symbolic_kernel_keeps_its_openmp_threads_across_sizes():
    """A C++ kernel's parallel loop uses OpenMP's whole team, and one with a symbolic total under
    PARALLEL_MIN elements runs serially through the `if` clause. A team sized by each call's work
    (libgomp ends the surplus threads when a smaller team follows a larger one) started new
    threads at every large call. Four OpenMP threads, so that the sizes 2048x64 and 300x64 would
    ask for different teams."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", _TEAM_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == "0", run.stdout
