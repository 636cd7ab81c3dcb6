"""Lowerings against eager: views, broadcasting, reductions, casts, half types, layouts, indexing."""

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import check


def test_views_stay_views_and_compose():
    x = torch.randn(4, 6, 5)
    check(lambda a: (a.permute(2, 0, 1) * 2).reshape(5, 24)[1:4, ::3].t() + 1, x)
    check(lambda a: a.transpose(0, 1).flip(0).unsqueeze(1).expand(6, 3, 4, 5).sum(1), x)
    check(lambda a: a.view(24, 5)[::2].narrow(1, 1, 3).contiguous(), x)


def test_reshape_of_a_computed_value():
    check(lambda a: (a.exp().t().reshape(-1, 3) + 1).sum(0), torch.randn(6, 4))


def test_broadcasting():
    check(lambda a, b, c: a * b + c, torch.randn(3, 1, 5), torch.randn(4, 1), torch.randn(5))


@pytest.mark.parametrize("dims", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
def test_reductions_over_dims(dims):
    x = torch.randn(5, 7, 9)
    check(lambda a: (a.sum(dims), a.amax(dims), a.mean(dims), a.var(dims)), x, atol=1e-5, rtol=1e-4)


def test_other_reductions():
    x = torch.randn(6, 11)
    check(
        lambda a: (a.prod(1), a.amin(0), a.argmax(1), a.argmin(), (a > 0).any(1), (a > -3).all()), x
    )


def test_eight_bit_integers_wrap_and_vectorise():
    """uint8/int8 arithmetic wraps as torch's does (C++ promotes it to int), and 8-bit loads,
    shifts and masks feed float math through the vector loop (a nibble unpack, a group scale)."""
    u = torch.randint(0, 256, (37, 70), dtype=torch.uint8)
    i = torch.randint(-128, 128, (37, 70), dtype=torch.int8)
    f = torch.randn(37, 70)
    shifts = torch.tensor([0, 4], dtype=torch.uint8)
    check(lambda u, i: (u + u, i * 3, -i, u << 2), u, i)
    check(lambda u, i, f: (u.float() / 255 + f, i.t().float(), ((u >> 3) & 7).float() + (i >> 2),
                           (u | 17).to(torch.bfloat16) * f.to(torch.bfloat16)), u, i, f)  # fmt: skip
    unpack = check(lambda u, s, f: ((u.unsqueeze(-1) >> s) & 15).reshape(37, 140)[:, :128]
                   .reshape(37, 4, 32).float().mul(f[:, :4, None]).sum((1, 2)), u, shifts, f,
                   atol=1e-4, rtol=1e-5)  # fmt: skip
    assert "ember::vload_u8_dup2" in unpack.source and "ember::vshr" in unpack.source
    check(lambda f: f.unsqueeze(-1).expand(37, 70, 3).reshape(37, 210) * 2, f)


def test_integer_and_bool_math():
    a = torch.randint(-20, 20, (5, 8))
    b = torch.randint(1, 7, (5, 8))
    check(lambda a, b: (a // b, a % b, a * b - 3, torch.maximum(a, b), (a & b) | 1, a.sum(1)), a, b)
    check(lambda a, b: torch.where(a > b, a.float() / b, b.float().sqrt()), a, b)


def test_dtype_casts():
    x = torch.randn(4, 9) * 100
    check(
        lambda a: (
            a.to(torch.int32),
            a.to(torch.int64).float() + 0.5,
            (a > 0).float(),
            a.double() * 2,
        ),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32(dtype):
    x, y = torch.randn(8, 40, dtype=dtype), torch.randn(40, dtype=dtype)
    tol = dict(atol=2e-2, rtol=2e-2)
    check(lambda a, b: (a * b + 1).exp().to(dtype), x, y, **tol)
    check(lambda a: torch.softmax(a.float(), -1).to(dtype), x, **tol)
    check(lambda a: a.sum(-1), x, **tol)


def test_channels_last_inputs_keep_their_layout():
    x = torch.randn(2, 5, 6, 7).to(memory_format=torch.channels_last)
    b = torch.randn(5, 1, 1)
    compiled = check(lambda a, b: torch.sigmoid(a) * b + a, x, b)
    assert "x0 + ember::W" in compiled.source or "ember::vload" in compiled.source


def test_cat_pad_gather_index():
    a, b = torch.randn(3, 4), torch.randn(3, 2)
    check(lambda a, b: torch.cat([a * 2, b, a], 1), a, b)
    check(lambda a: F.pad(a, (1, 2, 0, 1), value=-1.0), a)
    idx = torch.randint(0, 4, (3, 5))
    check(lambda a, i: torch.gather(a, 1, i), a, idx)
    check(lambda a, i: a.index_select(1, i[0]), a, idx)
    emb = torch.randn(10, 6)
    check(lambda w, i: F.embedding(i, w) * 2, emb, torch.randint(0, 10, (2, 3)))


def test_creation_and_iota():
    check(
        lambda a: a + torch.arange(5.0) + torch.ones(5) * 3 - torch.full((4, 5), 2.0),
        torch.randn(4, 5),
    )


def test_unsupported_prim_falls_back_to_its_reference():
    check(lambda a: torch.special.i0(a) + 1, torch.randn(6), fallbacks=("prims.i0",))


def test_math_functions():
    x = torch.rand(4, 19) + 0.1
    check(
        lambda a: (
            a.log(),
            a.log1p(),
            a.rsqrt(),
            a.erf(),
            a.atan(),
            a.pow(1.5),
            a.floor(),
            a.round(),
            (a * 30).tanh(),
            (-a * 80).exp(),
            a.erfinv() if False else a.reciprocal(),
        ),
        x,
        atol=1e-5,
        rtol=1e-5,
    )



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_erfinv_to_the_ends_and_signbit(dtype):
    """erfinv is exact (inf) at -1 and 1, NaN outside, and as precise as float64 asks in
    float64 (its float approximation refined by Newton steps in double); signbit keeps -0.0's
    and NaNs' sign bit (std::signbit on a float widened from bfloat16 made GCC 12 fail when it
    vectorized the loop for AVX512)."""
    inner = torch.linspace(-0.999, 0.999, 257, dtype=torch.float64)
    ends = torch.tensor([-1.0, 1.0, -1.5, 2.0, float("nan"), 0.0, -0.0, 0.5])
    x = torch.cat([inner, ends.double()]).to(dtype)
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3}.get(dtype)
    check(lambda a: (a.erfinv(), torch.signbit(a)), x,
          **({} if tol is None else dict(atol=tol, rtol=tol)))  # fmt: skip
    if dtype == torch.float64:
        check(lambda a: a.erfinv(), x, atol=1e-12, rtol=1e-12)

def test_vector_math_over_extreme_ranges():
    x = torch.cat(
        [
            torch.linspace(-110, 95, 4001),
            torch.tensor([0.0, -0.0, 1e-8, -1e-8, float("inf"), float("-inf"), float("nan")]),
        ]
    )
    check(
        lambda a: (
            a.exp(),
            a.tanh(),
            a.sigmoid(),
            a.erf(),
            torch.maximum(a, a * 0.5),
            a.abs().sqrt(),
            (a * 0.01).floor(),
        ),
        x,
        atol=1e-6,
        rtol=2e-6,
    )
