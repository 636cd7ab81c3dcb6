"""Counter-based random prims: deterministic in (seed, offset), sane statistics, Triton's bits."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ember.primtorch import Tracer, prims

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_key_same_values_and_range(dtype):
    a = prims.philox_rand((64, 33), 1234, 10, dtype, "cpu")
    b = prims.philox_rand((64, 33), torch.tensor(1234), torch.tensor(10), dtype, "cpu")
    assert a.dtype == dtype and a.shape == (64, 33) and a.is_contiguous()
    assert torch.equal(a, b)
    assert a.min() >= 0 and a.max() < 1


def test_offsets_and_seeds_select_disjoint_streams():
    base = prims.philox_rand((1000,), 7, 0, torch.float32, "cpu")
    assert not torch.equal(base, prims.philox_rand((1000,), 7, 1000, torch.float32, "cpu"))
    assert not torch.equal(base, prims.philox_rand((1000,), 8, 0, torch.float32, "cpu"))
    # Counter-based: element i depends only on offset + i, so a shifted call is a slice.
    shifted = prims.philox_rand((990,), 7, 10, torch.float32, "cpu")
    assert torch.equal(base[10:], shifted)
    big = prims.philox_bits((4,), -1, 2**32 - 2, "cpu")  # counters cross the 32-bit boundary
    assert big.min() >= 0 and big.max() < 2**32 and len(set(big.tolist())) == 4


def test_statistics():
    u = prims.philox_rand((200_000,), 42, 0, torch.float64, "cpu")
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.01
    bits = prims.philox_bits((100_000,), 42, 0, "cpu")
    for bit in (0, 15, 31):
        assert abs(((bits >> bit) & 1).double().mean().item() - 0.5) < 0.01


def test_low_precision_never_rounds_to_one():
    for dtype in (torch.float16, torch.bfloat16):
        u = prims.philox_rand((100_000,), 3, 0, dtype, "cpu")
        assert u.max() < 1.0
        m = {torch.float16: 11, torch.bfloat16: 8}[dtype]
        assert torch.equal(u.float() * 2**m, (u.float() * 2**m).floor())


def test_traced_random_takes_seed_and_offset_as_inputs():
    seed, offset = torch.tensor(5), torch.tensor(0)
    tracer = Tracer(decompositions={})
    tracer.placeholder(seed, "seed")
    tracer.placeholder(offset, "offset")
    with tracer:
        out = prims.philox_rand((3, 4), seed, offset, torch.float32, "cpu")
    gm = tracer.output(out)
    assert torch.equal(gm(seed, offset), out)
    assert torch.equal(
        gm(torch.tensor(6), offset), prims.philox_rand((3, 4), 6, 0, torch.float32, "cpu")
    )
    assert not torch.equal(gm(seed, torch.tensor(12)), out)


TRITON_CHECK = textwrap.dedent(
    """
    import torch, triton, triton.language as tl
    from ember.primtorch.prims.random import philox_bits_ref

    @triton.jit
    def bits(out_ptr, seed, offset, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out_ptr + i, tl.randint(seed, offset + i))

    for seed, offset in ((0, 0), (123456789012, 5), (-7, 2**31 + 3)):
        out = torch.empty(64, dtype=torch.int32)
        bits[(1,)](out, seed, offset, 64)
        ref = philox_bits_ref(64, seed, offset, "cpu")
        assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, ref)
    print("same bits")
    """
)


def test_bits_equal_tritons_randint():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0 and "same bits" in run.stdout, run.stderr[-2000:]
