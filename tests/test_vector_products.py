"""matrix @ vector and vector @ vector (aten.mv, aten.dot, aten.addmv) compile, with eager's
values and gradients: they had no decomposition, and the compile that first meets them runs at
the call, where the error reached the user's program."""

import torch

import ember


def test_matrix_vector_and_vector_vector_products():
    torch.manual_seed(0)
    a, b, s = torch.randn(4, 3), torch.randn(3), torch.randn(4)
    nans = torch.full((4,), float("nan"))  # (beta=0 ignores them)
    cases = [(lambda m, v: m @ v, (a, b)), (lambda u, v: u @ v, (b, b.flip(0))),
             (lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0), (s, a, b)),
             (lambda s, m, v: torch.addmv(s, m, v, beta=0), (nans, a, b))]  # fmt: skip
    for fn, args in cases:
        ember.reset()
        torch.testing.assert_close(ember.compile(fn)(*args), fn(*args))


def test_their_gradients():
    torch.manual_seed(0)
    m, v = torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    ember.reset()
    ember.compile(lambda m, v: (m @ v).square().sum() + v @ v)(m, v).backward()
    got = m.grad.clone(), v.grad.clone()
    m.grad = v.grad = None
    ((m @ v).square().sum() + v @ v).backward()
    torch.testing.assert_close(got, (m.grad, v.grad))
