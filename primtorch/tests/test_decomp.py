"""Focused tests of the decomposition table: registration, promotion, precision, backwards."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from ember.primtorch import is_extern, is_prim, trace_to_prims
from ember.primtorch.decomp import DECOMPOSITIONS, register_decomposition
from ember.primtorch.decomp._registry import _binds

aten = torch.ops.aten


def trace(fn, *args):
    gm = trace_to_prims(fn, *args)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert is_prim(n.target) or is_extern(n.target) or n.target is operator.getitem, (
                n.target
            )
    return gm


def prim_names(gm):
    return [n.target.name for n in gm.graph.nodes if n.op == "call_function" and is_prim(n.target)]


def check(fn, *args, **tol):
    gm = trace(fn, *args)
    torch.testing.assert_close(gm(*args), fn(*args), equal_nan=True, **tol)
    return gm


# --- the registry --------------------------------------------------------------------------------


def test_packet_registers_functional_overloads_it_binds():
    assert aten.add.Tensor in DECOMPOSITIONS and aten.add.Scalar in DECOMPOSITIONS
    assert aten.add.out not in DECOMPOSITIONS  # out= variants are functionalised by the tracer
    assert aten.add.int not in DECOMPOSITIONS  # not a tensor op
    assert aten.max.dim in DECOMPOSITIONS and aten.max.other in DECOMPOSITIONS


def test_binding_rejects_other_signatures():
    def unary(self):
        return self

    assert _binds(unary, aten.neg.default._schema)
    assert not _binds(unary, aten.add.Tensor._schema)


def test_register_explicit_overload_and_packet():
    table_before = dict(DECOMPOSITIONS)
    try:

        @register_decomposition(aten.frac.default)
        def frac(self):
            return self

        assert DECOMPOSITIONS[aten.frac.default] is frac
    finally:
        DECOMPOSITIONS.clear()
        DECOMPOSITIONS.update(table_before)


def test_table_has_no_torch_refs():
    for fn in DECOMPOSITIONS.values():
        assert not fn.__module__.startswith("torch."), fn


# --- promotion and semantics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a + b,
        lambda a, b: a / b,
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: torch.remainder(a, b),
        lambda a, b: a * 2.5,
        lambda a, b: a < b,
        lambda a, b: torch.pow(a, 2),
    ],
)
def test_integer_promotion_and_rounding(fn):
    a = torch.tensor([-7, -3, 0, 3, 7, 9])
    b = torch.tensor([2, -2, 3, -4, 5, 2])
    out = check(fn, a, b)
    assert out(a, b).dtype == fn(a, b).dtype


def test_zero_dim_and_scalar_promotion():
    x = torch.randn(3, dtype=torch.float16)
    s = torch.tensor(2.0, dtype=torch.float64)  # a 0-dim tensor does not promote a dim tensor
    gm = check(lambda a, b: a * b + 1, x, s)
    assert gm(x, s).dtype == torch.float16


def test_half_sum_accumulates_in_float32():
    x = torch.full((4096,), 0.1, dtype=torch.float16)
    gm = check(lambda t: t.sum(), x)
    converts = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target.name == "convert_element_type"
    ]
    assert converts[0].args[1] == torch.float32
    exact = x.double().sum()
    assert abs(gm(x).double() - exact) <= abs(x.sum().double() - exact) + 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_softmax_and_norms(dtype):
    x = torch.randn(4, 33, dtype=dtype)
    check(lambda t: torch.softmax(t, -1), x, rtol=2e-2, atol=2e-3)
    check(lambda t: F.layer_norm(t, (33,)), x, rtol=2e-2, atol=2e-2)
    check(lambda t: t.var(1), x, rtol=2e-2, atol=2e-2)


def test_layer_norm_of_a_permuted_input_is_contiguous_as_in_eager():
    """Eager normalises a contiguous copy: a LayerNorm over a permuted NCHW map (ConvNeXt's) is
    contiguous, so the Linear after it folds into one mm, not a bmm over every row of pixels."""
    x, w = torch.randn(2, 6, 4, 5), torch.randn(6, 8)
    fn = lambda t: F.linear(F.layer_norm(t.permute(0, 2, 3, 1), (6,)), w.T)  # noqa: E731
    gm = check(fn, x, rtol=1e-5, atol=1e-5)
    norm = F.layer_norm(x.permute(0, 2, 3, 1), (6,))
    out = trace(lambda t: F.layer_norm(t.permute(0, 2, 3, 1), (6,)), x)(x)
    assert out.stride() == norm.stride() == (120, 30, 6, 1)
    externs = [n.target.name for n in gm.graph.nodes if n.op == "call_function"
               and hasattr(n.target, "name") and n.target.name in ("mm", "bmm")]  # fmt: skip
    assert externs == ["mm"], gm.graph


def test_nan_propagation():
    x = torch.tensor([1.0, float("nan"), -2.0, 0.5])
    check(lambda t: t.clamp(-1, 1), x)
    check(lambda t: torch.maximum(t, t.flip(0)), x)
    check(lambda t: t.argmax(), x)
    check(lambda t: torch.relu(t), x)


# --- indexing ------------------------------------------------------------------------------------


def test_index_put_with_none_and_masks():
    x = torch.randn(3, 4, 5)
    idx = torch.tensor([0, 2, 2])
    v = torch.randn(3, 3, 5)
    check(lambda a, i, b: aten.index_put(a, [None, i], b, True), x, idx, v)
    check(lambda a: a.index_fill(1, torch.tensor([1, 3]), -1.0), x)
    check(lambda a, m: a.masked_fill(m, 2.0), x, x > 0)


def test_boolean_mask_index_is_data_dependent():
    from ember.primtorch import DataDependentError

    x = torch.randn(5)
    with pytest.raises(DataDependentError):
        trace_to_prims(lambda a: a[a > 0], x)


# --- backwards through autograd ------------------------------------------------------------------


def _grads(fn, *inputs):
    def step(*xs):
        xs = [x.detach().requires_grad_() if x.is_floating_point() else x for x in xs]
        out = fn(*xs)
        return torch.autograd.grad(out.sum(), [x for x in xs if x.requires_grad])

    return step, inputs


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.max_pool2d(x, 3, 2, 1),
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=False),
        lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: F.silu(x) + F.hardswish(x) + F.mish(x),
        lambda x: F.leaky_relu(x, 0.2) + F.elu(x) + F.softplus(x) + F.hardtanh(x),
        lambda x: F.group_norm(x, 2),
        lambda x: F.log_softmax(x, 1),
    ],
)
def test_backward_matches_autograd(fn):
    x = torch.randn(2, 4, 6, 5)
    step, inputs = _grads(fn, x)
    check(step, *inputs, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_updates_running_stats():
    from ember.primtorch import Tracer

    x = torch.randn(4, 3, 5, 5)
    mean, var = torch.zeros(3), torch.ones(3)
    tracer = Tracer()
    for i, t in enumerate((x, mean, var)):
        tracer.placeholder(t, f"a{i}")
    with tracer:
        out = F.batch_norm(x, mean, var, training=True, momentum=0.3)
    gm = tracer.output((out, mean, var))
    m2, v2 = torch.zeros(3), torch.ones(3)
    expected = F.batch_norm(x, m2, v2, training=True, momentum=0.3)
    got, new_mean, new_var = gm(x, torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(new_mean, m2)
    torch.testing.assert_close(new_var, v2)


def test_embedding_backward_padding_and_frequency():
    w = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 2, 0], [3, 0, 2, 9]])

    def step(weight):
        weight = weight.detach().requires_grad_()
        out = F.embedding(ids, weight, padding_idx=0, scale_grad_by_freq=True)
        return torch.autograd.grad((out * out).sum(), weight)

    check(step, w)


def test_cross_entropy_with_ignore_index_and_weights():
    logits = torch.randn(6, 5)
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    weight = torch.rand(5)

    def step(x):
        x = x.detach().requires_grad_()
        loss = F.cross_entropy(x, target, weight=weight, label_smoothing=0.1)
        return (loss, *torch.autograd.grad(loss, x))

    check(step, logits)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(5,), (6, 5), (3, 5, 2, 2)])
def test_nll_loss_backward_is_a_pointwise_select(shape, reduction):
    # A scatter into zeros kept two float32 (rows, classes) buffers alive at the backward's peak
    # (the scatter has no lowering); the select by class index fuses into log_softmax's backward.
    torch.manual_seed(0)
    x = torch.randn(shape)
    target = torch.randint(0, 5, shape[:1] + shape[2:] if len(shape) > 1 else ())
    if target.ndim:
        target.view(-1)[0] = -100
    weight = torch.rand(5)

    def step(x):
        x = x.detach().requires_grad_()
        loss = F.nll_loss(F.log_softmax(x, 1 if x.ndim > 1 else 0), target, weight=weight,
                          ignore_index=-100, reduction=reduction)
        return (loss, *torch.autograd.grad(loss.sum(), x))

    gm = check(step, x)
    assert "scatter" not in prim_names(gm)


# --- random --------------------------------------------------------------------------------------


def test_random_ops_use_philox_and_are_replayable():
    x = torch.empty(1000)
    gm = trace(lambda t: (torch.rand_like(t), torch.randn_like(t), torch.bernoulli(t * 0 + 0.3)), x)
    assert "philox_rand" in prim_names(gm)
    u, z, b = gm(x)
    u2, z2, b2 = gm(x)
    assert torch.equal(u, u2) and torch.equal(z, z2) and torch.equal(b, b2)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(z.mean())) < 0.15 and abs(float(z.std()) - 1) < 0.1
    assert 0.25 < float(b.mean()) < 0.35


# --- special cases -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", "tuvw")
@pytest.mark.parametrize("shifted", [False, True])
def test_chebyshev_beyond_the_unrolled_recurrence(kind, shifted):
    from ember.primtorch.decomp.special import RECURRENCE_DEGREE

    name = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    fn = getattr(torch.special, name)
    x = torch.linspace(-1.5, 1.5, 61, dtype=torch.float64)
    x = (x + 1) / 2 if shifted else x
    for n in (0, 3, RECURRENCE_DEGREE + 1, 2 * RECURRENCE_DEGREE + 3, -1):
        degree = torch.full_like(x, n)
        check(fn, x, degree, rtol=1e-9, atol=1e-9)


def test_fractional_max_pool_with_given_samples():
    x = torch.randn(2, 3, 9, 9)
    u = torch.rand(2, 3, 2)
    check(
        lambda a, b: F.fractional_max_pool2d(
            a, (4, 4), output_size=(2, 3), return_indices=True, _random_samples=b
        ),
        x,
        u,
    )
    x3, u3 = torch.randn(2, 3, 7, 8, 9), torch.rand(2, 3, 3)
    check(
        lambda a, b: F.fractional_max_pool3d(
            a, (2, 3, 2), output_size=(3, 4, 5), return_indices=True, _random_samples=b
        ),
        x3,
        u3,
    )


@pytest.mark.parametrize(
    "fn",
    [
        torch.special.modified_bessel_k0,
        torch.special.modified_bessel_k1,
        torch.special.scaled_modified_bessel_k0,
        torch.special.scaled_modified_bessel_k1,
    ],
)
def test_bessel_k_quadrature(fn):
    special = torch.tensor([0.0, -1.0, float("inf"), float("nan"), 1e-30, 1.0], dtype=torch.float64)
    x = torch.cat([special, torch.logspace(-5, 3, 60, dtype=torch.float64)])
    check(fn, x, rtol=1e-10, atol=0)


def test_small_powers_are_products_roots_and_reciprocals():
    # torch special-cases these exponents; pow itself is slow (a scalar libm call per element on
    # the CPU) and inexact for integers
    x = torch.randn(64)
    for exponent, expected in ((2, {"prims.mul"}), (3, {"prims.mul"}), (0.5, {"prims.sqrt"}),
                               (-0.5, {"prims.rsqrt"}), (-1, {"prims.reciprocal"})):  # fmt: skip
        gm = trace_to_prims(lambda a, e=exponent: a**e, x)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert "prims.pow" not in targets and expected <= targets, (exponent, targets)
        out = gm(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, x**exponent, equal_nan=True)
    gm = trace_to_prims(lambda a: a**2.5, x)
    assert "prims.pow" in {str(n.target) for n in gm.graph.nodes}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 2])  # torch's kernel takes the first or the last dim
def test_weight_norm_and_its_backward(dim, dtype):
    # torch.nn.utils.weight_norm's kernel (wav2vec2's positional convolution) and its gradient
    v = torch.randn(6, 4, 5, dtype=dtype)
    g = torch.randn([n if d == dim else 1 for d, n in enumerate(v.shape)], dtype=dtype)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    gm = check(lambda v, g: aten._weight_norm_interface(v, g, dim), v, g, **tol)
    assert gm(v, g)[1].dtype == torch.float32  # the norm, as torch's kernel returns it
    w, norm = aten._weight_norm_interface(v, g, dim)
    grad_w = torch.randn_like(w)
    check(lambda *a: aten._weight_norm_interface_backward(*a, dim), grad_w, v, g, norm, **tol)
    # against autograd of the formula w = g * v / ||v||
    vf, gf = v.float().requires_grad_(), g.float().requires_grad_()
    others = [d for d in range(3) if d != dim]
    (gf * vf / vf.norm(dim=others, keepdim=True)).backward(grad_w.float())
    grad_v, grad_g = aten._weight_norm_interface_backward(grad_w, v, g, norm, dim)
    exact = tol or {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(grad_v.float(), vf.grad, **exact)
    torch.testing.assert_close(grad_g.float(), gf.grad, **exact)
