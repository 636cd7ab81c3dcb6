"""Split reductions: a reduction of few long rows becomes partial reductions over chunks, then a
reduction of the partials, so every streaming multiprocessor has work.

A reduction kernel runs one program per block of output elements: a sum over 4096 rows of 768
columns (a LayerNorm's weight gradient, a Linear's bias gradient) or over N*H*W positions per
channel (a batch norm's statistics and gradients in a training step) gets a few dozen programs,
each walking thousands of rows while most of the GPU idles (H100: 83 us for a 4096 x 768
gradient, several times the time its bytes take). Here such a reduction over r is rewritten as

    partial[s, x] = reduce over j of value(x, r = s * chunk + j)     (S programs' worth of rows)
    out[x]        = reduce over s of partial[s, x]

in the loop IR, before scheduling: the partial buffer is an ordinary reduction (its x dims are the
split parts, then the output's), the final one reads it, and the scheduler fuses each with its
neighbours as it would any reduction (the output's consumers join the final reduction). Only
reductions whose combine is the reduction itself (sum, prod, max, min, any) are split, only with
static sizes, and each split dimension is cut into equal chunks (a divisor of its size).
"""

from __future__ import annotations

import math

import sympy

from .config import config, on_for
from .loop_ir import ComputedBuffer, Layout, Reduction, compute_dtype, loop_vars, ops
from .scheduler import loads_walk_columns, record

# Reductions combined by themselves: a partial sum's sum is the sum.
SPLITTABLE = ("sum", "prod", "max", "min", "any")
# A reduction with fewer programs than this is split (a block of 16 columns, or a row, a program).
MIN_PROGRAMS = 512
# ... into enough parts for about this many programs,
TARGET_PROGRAMS = 1024
# ... each part at least this many elements of its row (fewer would cost more than they save),
MIN_CHUNK = 256
# ... and at least this many parts (fewer leave the GPU as idle as before).
MIN_PARTS = 4
# Columns a program of a column-walking reduction takes (scheduler.walks_columns's blocks).
COLUMN_BLOCK = 16


def split_reductions(buffers: list, device: str) -> list:
    """`buffers` with each reduction of few long rows replaced by its partial and final ones."""
    if not on_for(config.split_reductions, device):
        return buffers
    out = []
    for b in buffers:
        parts = _parts(b) if isinstance(b, ComputedBuffer) and b.is_reduction() else None
        out.extend(_split(b, parts) if parts else [b])
    return out


def _ints(sizes):
    sizes = [sympy.sympify(s) for s in sizes]
    return [int(s) for s in sizes] if all(s.is_Integer for s in sizes) else None


def _walks_columns(b: ComputedBuffer) -> bool:
    """Whether the reduction's reads walk columns (scheduler.loads_walk_columns): a sum over
    the rows of a row-major matrix, per column."""
    xs, rs = loop_vars("x", len(b.ranges)), loop_vars("r", len(b.reduction_ranges))
    loads = [index for _, index in record(b, xs, rs).loads]
    return loads_walk_columns(loads, xs, b.ranges, rs)


def _parts(b: ComputedBuffer):
    """How to cut each reduced dimension (a factor per dim, their product the number of parts),
    or None when the reduction keeps one kernel."""
    d = b.data
    ranges, rranges = _ints(b.ranges), _ints(b.reduction_ranges)
    if d.reduction_type not in SPLITTABLE or ranges is None or rranges is None:
        return None
    x, r = math.prod(ranges), math.prod(rranges)
    columns = _walks_columns(b)
    programs = math.ceil(x / COLUMN_BLOCK) if columns else x
    if programs >= MIN_PROGRAMS or r < MIN_CHUNK * MIN_PARTS:
        return None
    if not columns and r <= config.persistent_reduction_max:
        return None  # a row one block holds (a decoding step's norm): one kernel with its readers
    # a power of two: enough parts for TARGET_PROGRAMS, none shorter than MIN_CHUNK
    want = min(1 << max(0, math.ceil(math.log2(TARGET_PROGRAMS / programs))), r // MIN_CHUNK)
    want = 1 << (want.bit_length() - 1)
    factors, left = [], want
    for n in rranges:  # the outermost dims first: each part a run of whole inner rows
        f = math.gcd(n, left)  # the largest power of two dividing both
        factors.append(f)
        left //= f
    parts = math.prod(factors)
    return factors if parts >= MIN_PARTS else None


def _contiguous(sizes) -> tuple:
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _split(b: ComputedBuffer, factors) -> list:
    d = b.data
    rranges = _ints(b.reduction_ranges)
    chunks = [n // f for n, f in zip(rranges, factors)]
    split_dims = [i for i, f in enumerate(factors) if f > 1]
    kept_dims = [i for i, c in enumerate(chunks) if c > 1]
    nsplit = len(split_dims)
    part_dtype = compute_dtype(d.dtype) if d.dtype.is_floating_point else d.dtype
    part_sizes = (*[factors[i] for i in split_dims], *b.ranges)
    part_layout = Layout(part_dtype, b.layout.device, part_sizes, _contiguous(part_sizes))

    def part_inner(index, rindex, inner=d.inner_fn):
        s, x = list(index[:nsplit]), list(index[nsplit:])
        j = dict(zip(kept_dims, rindex))
        full = []
        for i, c in enumerate(chunks):
            base = s[split_dims.index(i)] * c if i in split_dims else sympy.S.Zero
            full.append(base + j.get(i, sympy.S.Zero))
        return inner(x, full)

    part = ComputedBuffer(
        f"{b.name}_part",
        part_layout,
        Reduction(part_sizes, tuple(chunks[i] for i in kept_dims), d.reduction_type, part_inner,
                  part_dtype, d.src_dtype),  # fmt: skip
    )

    def final_inner(index, rindex, name=part.name, layout=part_layout):
        return ops.load(name, layout.index([*rindex, *index]))

    final = ComputedBuffer(
        b.name,
        b.layout,
        Reduction(b.ranges, tuple(factors[i] for i in split_dims), d.reduction_type, final_inner,
                  d.dtype, part_dtype),  # fmt: skip
    )
    return [part, final]


__all__ = ["split_reductions"]
