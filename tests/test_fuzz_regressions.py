"""Programs the differential fuzzer (tools/fuzz.py) found Ember getting wrong, each fixed: compiled
(C++ renderer, or Triton under its interpreter) against eager: outputs, gradients, mutated inputs."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process

import ember  # noqa: E402
from ember.inductor.config import config  # noqa: E402


def _check(program, make_inputs):
    eager_in, comp_in = make_inputs(), make_inputs()
    want = program(*eager_in)
    got = ember.compile(program, backend="inductor", fullgraph=True)(*comp_in)
    torch.testing.assert_close(got, want)
    loss = [o.sum() for o in want if o.requires_grad]
    if loss:
        sum(loss).backward()
        sum(o.sum() for o in got if o.requires_grad).backward()
    for e, c in zip(eager_in, comp_in):
        torch.testing.assert_close(c.detach(), e.detach())
        if e.requires_grad:
            torch.testing.assert_close(c.grad, e.grad)


def test_copy_from_a_python_number_into_a_view_of_an_input():
    # Fuzzer seed 8: aten.copy got the number 2 unwrapped and the decomposition broadcast an int.
    def program(a0, a1):
        a1.clamp_(min=0)
        v1 = a1.sum(dim=[0, 1], keepdim=True)
        a1.transpose(0, -1)[0].copy_(2)
        v3 = torch.rsqrt(a0.abs() + 1)
        a1[..., 1:].sub_(v1)
        return (v3,)

    def make_inputs():
        torch.manual_seed(8)
        return [torch.randn((1, 1, 1)).requires_grad_(), torch.randn((5, 4))]

    _check(program, make_inputs)


def test_backward_of_an_empty_input():
    # Fuzzer seed 25: a (5, 0) input's value edges had capacity 0 and the min cut left the
    # backward needing the unsaved input.
    def program(a0):
        v1 = a0.sum(dim=(0, 1), keepdim=True)
        v3 = a0.abs()
        return (torch.sin(v1), torch.maximum(torch.sin(v1), v3))

    def make_inputs():
        return [torch.randn((0, 5)).transpose(-1, -2).requires_grad_()]

    _check(program, make_inputs)


def test_triton_integer_and_bool_max_min(monkeypatch):
    # Fuzzer seeds 171, 193, 249: Triton's max/min started from a float infinity, which an
    # integer accumulator cannot hold (OverflowError), and made a bool amax a float32 (`&` failed).
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setattr(config, "cpu_backend", "triton")

    def program(a0, a1, a2):
        v0 = a0.bitwise_not().amax(dim=0, keepdim=True)
        v1 = a1.amin(dim=(0, 2), keepdim=True)
        v2 = a2.amax(dim=(0, 2), keepdim=True)
        return (v0, v1, v2 & a2)

    def make_inputs():
        torch.manual_seed(171)
        return [torch.randint(-4, 5, (3, 4), dtype=torch.int64),
                torch.randint(-4, 5, (2, 3, 4), dtype=torch.int32),
                torch.rand((2, 3, 4)) > 0.5]  # fmt: skip

    _check(program, make_inputs)
