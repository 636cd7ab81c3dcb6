"""Counter-based random prims: values are a pure function of (seed, offset, element index).

Element i (row-major index into the output) is the first 32-bit word of Philox4x32-10 with key
(seed & 0xffffffff, seed >> 32 & 0xffffffff) and counter (c0, c1, 0, 0), where c0 and c1 are the low
and high 32 bits of `offset + i`. That is Triton's `tl.randint(seed, offset + i)`, so inductor's
Triton code generates the very same bits; the C++ backend implements the same rounds. A call uses
`numel` counters: the caller advances `offset` by at least that much before the next call.

Uniform floats keep the top m bits (m = 24 for float32, 11 for float16, 8 for bfloat16, 32 for
float64): u = (bits >> (32 - m)) * 2**-m, exact in the output dtype, so u is in [0, 1) and never 1.
The reference implementation below uses only int64 torch ops (32-bit products split into 16-bit
halves so that nothing overflows), so it runs anywhere torch does and is deterministic.
"""

from __future__ import annotations

import torch

from ember.ir import TensorMeta

from .. import utils
from .core import prim

_RANDOM = ("random",)

_MASK = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
UNIFORM_BITS = {torch.float32: 24, torch.float64: 32, torch.float16: 11, torch.bfloat16: 8}


def _mulhilo(a: int, b: torch.Tensor):
    """(high, low) 32-bit words of the 64-bit product a * b, for a constant a and b < 2**32."""
    p1 = a * (b >> 16)  # < 2**48
    p0 = a * (b & 0xFFFF)  # < 2**48
    s = ((p1 & 0xFFFF) << 16) + p0
    return (p1 >> 16) + (s >> 32), s & _MASK


def philox_words(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """The first 32-bit word (as int64) of Philox4x32-10 at each element of `counter` (int64),
    with the key from `seed` (int64, broadcast against it)."""
    c0, c1 = counter & _MASK, (counter >> 32) & _MASK
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    return c0


def philox_bits_ref(numel: int, seed, offset, device) -> torch.Tensor:
    """The raw 32-bit words (as int64) for counters offset .. offset + numel - 1."""
    seed = torch.as_tensor(seed, dtype=torch.int64, device=device)
    offset = torch.as_tensor(offset, dtype=torch.int64, device=device)
    return philox_words(seed, torch.arange(numel, dtype=torch.int64, device=device) + offset)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _check_key(name, seed, offset):
    for what, v in (("seed", seed), ("offset", offset)):
        if utils.is_tensor_like(v):
            if v.ndim != 0 or v.dtype is not torch.int64:
                raise TypeError(f"prims.{name}: {what} must be a 0-dim int64 tensor or an int")
        elif not isinstance(v, int):
            raise TypeError(f"prims.{name}: {what} must be a 0-dim int64 tensor or an int")


def _rand_meta(shape, seed, offset, dtype, device):
    _check_key("philox_rand", seed, offset)
    if dtype not in UNIFORM_BITS:
        raise TypeError(f"prims.philox_rand: dtype must be one of {list(UNIFORM_BITS)}")
    return TensorMeta(dtype, shape, utils.make_contiguous_strides_for(shape), 0, str(device))


def _rand_ref(shape, seed, offset, dtype, device):
    bits = philox_bits_ref(_numel(shape), seed, offset, device)
    m = UNIFORM_BITS[dtype]
    compute = torch.float64 if dtype is torch.float64 else torch.float32
    u = (bits >> (32 - m)).to(compute) * (2.0**-m)
    return u.to(dtype).reshape(tuple(int(s) for s in shape))


def _shape_canon(shape, *rest):
    return (tuple(shape), *rest), {}


philox_rand = prim(
    "philox_rand",
    "(int[] shape, Tensor seed, Tensor offset, dtype dtype, device device) -> Tensor",
    meta=_rand_meta,
    ref=_rand_ref,
    canon=_shape_canon,
    tags=_RANDOM,
    doc="uniform [0, 1) from Philox4x32-10 at counters offset + i (see prims/random.py)",
)


def _bits_meta(shape, seed, offset, device):
    _check_key("philox_bits", seed, offset)
    return TensorMeta(torch.int64, shape, utils.make_contiguous_strides_for(shape), 0, str(device))


philox_bits = prim(
    "philox_bits",
    "(int[] shape, Tensor seed, Tensor offset, device device) -> Tensor",
    meta=_bits_meta,
    ref=lambda shape, seed, offset, device: philox_bits_ref(
        _numel(shape), seed, offset, device
    ).reshape(tuple(int(s) for s in shape)),
    canon=_shape_canon,
    tags=_RANDOM,
    doc="the raw 32-bit Philox words (int64 in [0, 2**32)) at counters offset + i",
)
