"""Random numbers for decompositions, from the counter-based Philox prims.

Each random call takes a key (seed, offset) and uses `numel` counters from offset on. If the
recorder (tracer) offers `rng_key(numel, device)`, it decides (a consumer such as aot_autograd can
make the seed a graph input). Otherwise the seed is drawn once per recorder from torch's default
generator (so `torch.manual_seed` makes a trace reproducible) and becomes a 0-dim int64 tensor the
tracer lifts as a constant; offsets advance by each call's numel.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ember.primtorch import prims
from ember.primtorch.prims import core
from ember.primtorch.symbolic import to_expr

from ._common import convert, numel

_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_EAGER = object()
_EAGER_STATE: dict = {}


class _Key:
    def __init__(self, seed):
        self.seed = seed
        self.offset = 0


def _draw_seed(device) -> torch.Tensor:
    with _disable_current_modes():
        return torch.empty((), dtype=torch.int64).random_().to(device)


def rng_key(count, device):
    """(seed tensor, offset int) for a call that uses `count` Philox counters."""
    recorder = core.current_recorder()
    hook = getattr(recorder, "rng_key", None)
    if hook is not None:
        return hook(count, device)
    if recorder is None:
        key = _EAGER_STATE.get(str(device))
        if key is None:
            key = _EAGER_STATE[str(device)] = _Key(_draw_seed(device))
    else:
        per = _STATE.setdefault(recorder, {})
        key = per.get(str(device))
        if key is None:
            key = per[str(device)] = _Key(_draw_seed(device))
    offset = key.offset
    key.offset += counters_used(count)
    return key.seed, offset


# A call whose number of counters is symbolic gets a block this large, so offsets stay ints.
SYMBOLIC_COUNTER_BLOCK = 2**40


def counters_used(count) -> int:
    """How far a call's `count` counters advance the offset: rounded up to a multiple of 4, so
    calls never share a Philox block (what Triton assumes); a symbolic count (a size that varies
    per call) takes SYMBOLIC_COUNTER_BLOCK (no tensor has 2**40 elements), so calls never share
    counters at any size and no size is specialised."""
    count = to_expr(count)
    if isinstance(count, int) or getattr(count, "is_Integer", False):
        return (int(count) + 3) // 4 * 4
    return SYMBOLIC_COUNTER_BLOCK


_UNIFORM_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def uniform(shape, dtype, device, low=0.0, high=1.0):
    """Uniform samples in [low, high) of `dtype` (16-bit floats are drawn in float32)."""
    draw = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    seed, offset = rng_key(numel(shape), device)
    u = prims.philox_rand(tuple(shape), seed, offset, draw, device)
    if low != 0.0 or high != 1.0:
        u = prims.add(prims.mul(u, float(high - low)), float(low))
    return convert(u, dtype)


def normal(shape, dtype, device, mean=0.0, std=1.0):
    """Normal samples (Box-Muller over two uniform draws)."""
    compute = torch.float64 if dtype is torch.float64 else torch.float32
    u1 = uniform(shape, compute, device)
    u2 = uniform(shape, compute, device)
    radius = prims.sqrt(prims.mul(prims.log(prims.sub(1.0, u1)), -2.0))  # 1 - u1 is in (0, 1]
    z = prims.mul(radius, prims.cos(prims.mul(u2, 2 * math.pi)))
    if std != 1.0 or mean != 0.0:
        z = prims.add(prims.mul(z, float(std)), float(mean))
    return convert(z, dtype)


def randint(shape, low, high, dtype, device):
    """Integers uniform in [low, high) (from 32 random bits: ranges up to 2**32)."""
    span = int(high) - int(low)
    if span <= 0:
        raise ValueError(f"random range [{low}, {high}) is empty")
    if span > 2**32:
        raise NotImplementedError("random integers over a range wider than 2**32")
    seed, offset = rng_key(numel(shape), device)
    bits = prims.philox_bits(tuple(shape), seed, offset, device)
    return convert(prims.add(prims.remainder(bits, span), int(low)), dtype)
