"""Programs the differential fuzzer (tools/fuzz.py) found Ember getting wrong, each fixed: compiled
(C++ renderer, or Triton under its interpreter) against eager: outputs, gradients, mutated inputs."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process

import ember  # noqa: E402
from ember.inductor.config import config  # noqa: E402
from rendered_kernels import rendered_kernels  # noqa: E402,F401  (a fixture)


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
        torch.testing.assert_close(c.detach(), e.detach(), equal_nan=True)  # a NaN input
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


@pytest.fixture
def triton_kernels(monkeypatch, rendered_kernels):
    """Render through Triton (run by its interpreter) and collect every kernel rendered, so a
    test can also compile them for sm_90 with the real compiler (which rejects more programs)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(config, "cache", False)  # a cache hit renders nothing to collect
    return rendered_kernels


def _compiles_for_sm90(kernels):
    from ember.inductor import triton_aot

    assert kernels, "no Triton kernel was generated"
    failures = triton_aot.check_kernels(kernels.values())
    assert not failures, "\n\n".join(failures[:2])


@pytest.mark.parametrize("persistent_max", [4096, 0], ids=["persistent", "looped"])
def test_triton_pointwise_stored_inside_a_reduction_loop(triton_kernels, monkeypatch,
                                                         persistent_max):
    # Fuzzer seeds 10027, 10029, 10223, ...: relu(a) fused into the r loop of a product over a
    # size-1 dim stored at an [XBLOCK, 1] address under the [XBLOCK, RBLOCK] mask xmask & rmask;
    # tl.store rejects a mask wider than its pointer ("Expected pointer argument to have shape").
    # The renderer also took a row of (1,), merged away, for no row and looped over it.
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)

    def program(a0):
        return (torch.relu(a0), a0.prod(dim=0, keepdim=True))

    def make_inputs():
        torch.manual_seed(10027)
        return [torch.randn((1, 3, 3))]

    _check(program, make_inputs)
    _compiles_for_sm90(triton_kernels)


@pytest.mark.parametrize("renderer", ["cpp", "triton"])
def test_cat_of_only_empty_1d_pieces(renderer, monkeypatch):
    # Fuzzer seeds 10764, 11145, 11357: cat drops 1-d empty pieces as torch does; when every
    # piece was one, none was left to read (IndexError in the lowering).
    if renderer == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setattr(config, "cpu_backend", renderer)

    def program(a0):
        v0 = a0.reshape(-1)
        return (torch.cat([v0, v0], dim=0) * 2,)

    def make_inputs():
        return [torch.randn((3, 0, 3)).requires_grad_()]

    _check(program, make_inputs)


def test_triton_row_of_size_one_dims_stays_in_registers(triton_kernels):
    # Fuzzer seeds 10453, 12889: a backward whose reductions run over (1, 1) rows. The scheduler
    # kept eq(amax, a) in registers for a later phase (a row that small is persistent), but the
    # renderer judged persistence from the merged r sizes, (), and looped: the later phase found
    # no register ("reads buf2, which it keeps in registers, at an index it did not compute").
    def program(a1):
        return (a1.amax(dim=(1, 2), keepdim=False) * a1,)

    def make_inputs():
        torch.manual_seed(10453)
        return [torch.randn((1, 1, 1)).requires_grad_()]

    _check(program, make_inputs)
    _compiles_for_sm90(triton_kernels)


def test_triton_pow_of_a_negative_base(triton_kernels):
    # Fuzzer seeds 113, 121, 10028: square()'s backward is 2 * pow(x, 1.0), which the renderer
    # spelled exp(log(x) * y) for Triton's interpreter (it has no libdevice): NaN for every
    # negative x. pow's signs and special cases: odd and even integer exponents of a negative
    # base, 0^0 = 1^NaN = 1, 0^-1 = inf, a negative exponent.
    def program(a0, a1, a2):
        return (a0.clamp(-0.5, 0.5).square(), torch.pow(a1, a2))

    def make_inputs():
        torch.manual_seed(113)
        return [torch.randn((3, 4)).requires_grad_(),
                torch.tensor([-2.0, -1.5, -3.0, 0.0, 0.0, 2.0, 1.0, 3.0]),
                torch.tensor([2.0, 3.0, -1.0, 0.0, -1.0, 0.5, float("nan"), -2.0])]  # fmt: skip

    _check(program, make_inputs)


def test_triton_bfloat16_rounds_to_nearest(triton_kernels):
    # Fuzzer seeds 227, 10136: Triton's interpreter converts float32 to bfloat16 by dropping
    # bits (toward zero) where eager and the GPU round to nearest even: a1.abs() + 1 in bfloat16
    # came out one bfloat16 step (0.8%) low, and a0 divided by it 1.5% off.
    def program(a0, a1):
        return (a0 / (a1.abs() + 1), a0.to(torch.bfloat16), (a0 * 3).to(torch.bfloat16) * 2)

    def make_inputs():
        torch.manual_seed(227)
        return [torch.randn((2, 4)) * 100, torch.randn((), dtype=torch.bfloat16)]

    _check(program, make_inputs)
    x = torch.randn(4096) * 100
    x[:5] = torch.tensor([float("inf"), -float("inf"), float("nan"), 3.4e38, -0.0])
    got = ember.compile(lambda x: (x.to(torch.bfloat16), (x + 1).to(torch.bfloat16) + 0))(x)
    torch.testing.assert_close(got[0], x.to(torch.bfloat16), atol=0, rtol=0, equal_nan=True)
    want = (x + 1).to(torch.bfloat16) + 0
    torch.testing.assert_close(got[1], want, atol=0, rtol=0, equal_nan=True)


def test_output_view_keeps_its_base_from_being_overwritten():
    # Fuzzer seed 12376: v2[1::2], a graph output, is a view of cat's buffer; the next kernel
    # (reading the buffer for the last time) wrote its own result over it in place.
    def program(a0):
        a0.mul_(2)
        a0.sub_(a0)
        v2 = torch.cat([a0, a0], dim=0)
        v3 = a0 / (v2.abs() + 1)
        return (v2[1::2], torch.where(a0 > 0, v3, 1.5))

    def make_inputs():
        torch.manual_seed(12376)
        return [torch.randn((1, 1), dtype=torch.bfloat16)]

    _check(program, make_inputs)


def test_cpp_bool_bitwise_and_into_a_bool_max(monkeypatch):
    # Fuzzer seeds 21070, 21750: in C++ `bool & bool` is an int, and ember::max_prop(bool, int)
    # matched no overload (the kernel failed to build).
    monkeypatch.setattr(config, "cpu_backend", "cpp")

    def program(a0):
        v0 = a0 & a0
        return (v0.amax(dim=0, keepdim=True), (v0 | a0).amin(dim=1), (v0 ^ a0))

    def make_inputs():
        torch.manual_seed(21750)
        return [(torch.rand((3, 5)) > 0.5).transpose(-1, -2)]

    _check(program, make_inputs)


def test_aot_eager_backward_reads_a_symbol_only_a_tangent_carries():
    # Fuzzer seed 62956 (aot_eager, sizes made symbolic by an earlier compile): the backward of
    # cat([a, a]) gets a tangent of 2*s elements and nothing of size s; run as fx, it named s
    # without binding it (NameError). The symbol is now read from the tangent's size.
    def program(a0, a1):
        v0 = torch.cat([a1, a1], dim=0)
        a0.clamp_(min=0)
        return (v0 * 3,)

    def make_inputs():
        torch.manual_seed(62956)
        return [torch.randn((1, 4), dtype=torch.float16).transpose(-1, -2),
                torch.randn((5,), dtype=torch.float32).requires_grad_()]

    for sizes in ((5,), (7,)):
        eager_in, comp_in = make_inputs(), make_inputs()
        eager_in[1] = torch.randn(sizes).requires_grad_()
        comp_in[1] = eager_in[1].detach().clone().requires_grad_()
        compiled = ember.compile(program, backend="aot_eager", dynamic=True, fullgraph=True)
        want, got = program(*eager_in), compiled(*comp_in)
        want[0].sum().backward()
        got[0].sum().backward()
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(comp_in[1].grad, eager_in[1].grad)
        torch.testing.assert_close(comp_in[0], eager_in[0])
