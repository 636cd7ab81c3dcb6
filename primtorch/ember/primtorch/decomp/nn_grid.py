"""grid_sampler_2d/3d (bilinear, nearest, bicubic; zeros/border/reflection padding) as gathers."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert
from ._registry import register_decomposition

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_A = -0.75


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return prims.mul(prims.mul(prims.add(coord, 1.0), 0.5), float(size - 1))
    return prims.mul(prims.sub(prims.mul(prims.add(coord, 1.0), float(size)), 1.0), 0.5)


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return prims.mul(coord, 0.0)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = prims.abs(prims.sub(coord, low))
    extra = prims.fmod(x, span)
    flips = prims.floor(prims.div(x, span))
    even = prims.eq(prims.fmod(flips, 2.0), 0.0)
    return prims.where(even, prims.add(extra, low), prims.add(prims.sub(span, extra), low))


def _clip(coord, size):
    return prims.minimum(prims.maximum(coord, 0.0), float(size - 1))


def _pad_coord(coord, size, padding_mode, align_corners):
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _read(flat, coords, sizes, c):
    """Values of flat (N, C, prod(sizes)) at integer float coords (one (N, L) tensor per spatial
    dim, outermost first); 0 where any coordinate is out of bounds."""
    inside, index = None, None
    for coord, size in zip(coords, sizes):
        ok = prims.bitwise_and(prims.ge(coord, 0.0), prims.le(coord, float(size - 1)))
        inside = ok if inside is None else prims.bitwise_and(inside, ok)
    for coord, size in zip(coords, sizes):
        i = convert(prims.where(inside, coord, 0.0), torch.int64)
        index = i if index is None else prims.add(prims.mul(index, size), i)
    n, length = index.shape
    index = prims.broadcast_in_dim(index, (n, c, length), (0, 2))
    values = prims.gather(flat, 2, index)
    mask = prims.broadcast_in_dim(inside, (n, c, length), (0, 2))
    return prims.where(mask, values, 0.0)


def _weight(w, shape):
    return prims.broadcast_in_dim(w, shape, (0, 2))


def _cubic_weights(t):
    def near(x):
        return prims.add(prims.mul(prims.mul(prims.sub(prims.mul(x, _A + 2), _A + 3), x), x), 1.0)

    def far(x):
        inner = prims.add(prims.mul(prims.sub(prims.mul(x, _A), 5 * _A), x), 8 * _A)
        return prims.sub(prims.mul(inner, x), 4 * _A)

    return [far(prims.add(t, 1.0)), near(t), near(prims.sub(1.0, t)), far(prims.sub(2.0, t))]


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    compute = utils.opmath_dtype(input.dtype)
    nsp = input.ndim - 2
    n, c = input.shape[0], input.shape[1]
    sizes = list(input.shape[2:])
    out_sizes = tuple(grid.shape[1:-1])
    length = 1
    for o in out_sizes:
        length *= o
    flat = prims.reshape(convert(input, compute), (n, c, math.prod(sizes)))
    g = prims.reshape(convert(grid, compute), (n, length, nsp))
    # grid's last dim lists coordinates innermost first (x for W, y for H, z for D).
    coords = []
    for i in range(nsp):
        comp = nsp - 1 - i
        gi = prims.squeeze(prims.slice_in_dim(g, comp, comp + 1, 1, 2), (2,))
        coords.append(_unnormalize(gi, sizes[i], align_corners))
    shape = (n, c, length)
    if interpolation_mode == _BICUBIC:
        if nsp != 2:
            raise NotImplementedError("bicubic grid sampling is 2-d only")
        out = _bicubic(flat, coords, sizes, c, shape, padding_mode, align_corners)
    else:
        coords = [
            _pad_coord(x, size, padding_mode, align_corners) for x, size in zip(coords, sizes)
        ]
        if interpolation_mode == _NEAREST:
            out = _read(flat, [prims.round(x) for x in coords], sizes, c)
        else:
            out = _linear(flat, coords, sizes, c, shape)
    return convert(prims.reshape(out, (n, c) + out_sizes), input.dtype)


def _linear(flat, coords, sizes, c, shape):
    lows = [prims.floor(x) for x in coords]
    fracs = [prims.sub(x, lo) for x, lo in zip(coords, lows)]
    out = None
    for corner in range(2 ** len(coords)):
        picks, wgt = [], None
        for i, (lo, t) in enumerate(zip(lows, fracs)):
            high = (corner >> (len(coords) - 1 - i)) & 1
            picks.append(prims.add(lo, 1.0) if high else lo)
            w = t if high else prims.sub(1.0, t)
            wgt = w if wgt is None else prims.mul(wgt, w)
        term = prims.mul(_read(flat, picks, sizes, c), _weight(wgt, shape))
        out = term if out is None else prims.add(out, term)
    return out


def _bicubic(flat, coords, sizes, c, shape, padding_mode, align_corners):
    (y, x), (h, w) = coords, sizes
    x0, y0 = prims.floor(x), prims.floor(y)
    wx, wy = _cubic_weights(prims.sub(x, x0)), _cubic_weights(prims.sub(y, y0))
    out = None
    for j in range(4):
        yy = _pad_coord(prims.add(y0, float(j - 1)), h, padding_mode, align_corners)
        row = None
        for i in range(4):
            xx = _pad_coord(prims.add(x0, float(i - 1)), w, padding_mode, align_corners)
            term = prims.mul(_read(flat, [yy, xx], sizes, c), _weight(wx[i], shape))
            row = term if row is None else prims.add(row, term)
        term = prims.mul(row, _weight(wy[j], shape))
        out = term if out is None else prims.add(out, term)
    return out


@register_decomposition(aten.grid_sampler_2d, aten.grid_sampler_3d)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)
