"""Activation functions and their backwards (gelu, silu, relu family, elu, softplus, ...)."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert, is_integral, like
from ._random import uniform
from ._registry import register_decomposition


def _opmath(x):
    return convert(x, utils.opmath_dtype(x.dtype))


def _act(fn):
    """Compute fn on x in its opmath dtype and return x's dtype."""

    def decomp(self, *args, **kwargs):
        return convert(fn(_opmath(self), *args, **kwargs), self.dtype)

    return decomp


def _act_bwd(fn):
    """fn(g, x, ...) on grad and input in opmath; the result in grad's dtype."""

    def decomp(grad_output, self, *args, **kwargs):
        g = _opmath(grad_output)
        return convert(fn(g, convert(self, g.dtype), *args, **kwargs), grad_output.dtype)

    return decomp


_SQRT1_2 = 1 / math.sqrt(2)
_SQRT_2_PI = math.sqrt(2 / math.pi)
_C = 0.044715


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = prims.mul(prims.add(x, prims.mul(prims.mul(prims.mul(x, x), x), _C)), _SQRT_2_PI)
        return prims.mul(prims.mul(x, 0.5), prims.add(prims.tanh(inner), 1.0))
    return prims.mul(prims.mul(x, 0.5), prims.add(prims.erf(prims.mul(x, _SQRT1_2)), 1.0))


def _gelu_backward(g, x, approximate="none"):
    if approximate == "tanh":
        x2 = prims.mul(x, x)
        inner = prims.mul(prims.add(x, prims.mul(prims.mul(x2, x), _C)), _SQRT_2_PI)
        t = prims.tanh(inner)
        left = prims.mul(prims.add(t, 1.0), 0.5)
        d_inner = prims.mul(prims.add(prims.mul(x2, 3 * _C), 1.0), _SQRT_2_PI)
        right = prims.mul(prims.mul(prims.mul(x, 0.5), prims.sub(1.0, prims.mul(t, t))), d_inner)
        return prims.mul(g, prims.add(left, right))
    cdf = prims.mul(prims.add(prims.erf(prims.mul(x, _SQRT1_2)), 1.0), 0.5)
    pdf = prims.mul(prims.exp(prims.mul(prims.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return prims.mul(g, prims.add(cdf, prims.mul(x, pdf)))


register_decomposition(aten.gelu)(_act(_gelu))
register_decomposition(aten.gelu_backward)(_act_bwd(_gelu_backward))


def _silu(x):
    return prims.mul(x, prims.sigmoid(x))


def _silu_backward(g, x):
    s = prims.sigmoid(x)
    return prims.mul(g, prims.mul(s, prims.add(prims.mul(x, prims.sub(1.0, s)), 1.0)))


register_decomposition(aten.silu)(_act(_silu))
register_decomposition(aten.silu_backward)(_act_bwd(_silu_backward))


def _softplus_raw(x, beta=1.0, threshold=20.0):
    bx = prims.mul(x, float(beta))
    soft = prims.div(prims.log1p(prims.exp(bx)), float(beta))
    return prims.where(prims.gt(bx, float(threshold)), x, soft)


def _mish(x):
    return prims.mul(x, prims.tanh(_softplus_raw(x)))


def _mish_backward(g, x):
    s = prims.sigmoid(x)
    t = prims.tanh(_softplus_raw(x))
    return prims.mul(g, prims.add(t, prims.mul(prims.mul(x, s), prims.sub(1.0, prims.mul(t, t)))))


register_decomposition(aten.mish)(_act(_mish))
register_decomposition(aten.mish_backward)(_act_bwd(_mish_backward))
register_decomposition(aten.softplus)(_act(_softplus_raw))


@register_decomposition(aten.softplus_backward)
def softplus_backward(grad_output, self, beta, threshold):
    def fn(g, x):
        bx = prims.mul(x, float(beta))
        z = prims.exp(bx)
        return prims.where(
            prims.gt(bx, float(threshold)), g, prims.div(prims.mul(g, z), prims.add(z, 1.0))
        )

    return _act_bwd(fn)(grad_output, self)


@register_decomposition(aten.relu)
def relu(self):
    if self.dtype is torch.bool:
        raise TypeError("relu does not take bool tensors")
    zero = 0 if is_integral(self.dtype) else 0.0
    return prims.where(prims.le(self, zero), zero, self)


@register_decomposition(aten.threshold)
def threshold(self, threshold, value):
    t = threshold if not is_integral(self.dtype) else int(threshold)
    v = value if not is_integral(self.dtype) else int(value)
    return prims.where(prims.le(self, t), like(v, self), self)


@register_decomposition(aten.threshold_backward)
def threshold_backward(grad_output, self, threshold):
    t = threshold if not is_integral(self.dtype) else int(threshold)
    zero = 0 if is_integral(grad_output.dtype) else 0.0
    return prims.where(prims.le(self, t), zero, grad_output)


@register_decomposition(aten.sigmoid_backward)
def sigmoid_backward(grad_output, output):
    def fn(g, y):
        return prims.mul(g, prims.mul(prims.sub(1.0, y), y))

    return _act_bwd(fn)(grad_output, output)


@register_decomposition(aten.tanh_backward)
def tanh_backward(grad_output, output):
    def fn(g, y):
        return prims.mul(g, prims.sub(1.0, prims.mul(y, y)))

    return _act_bwd(fn)(grad_output, output)


@register_decomposition(aten.hardtanh)
def hardtanh(self, min_val=-1, max_val=1):
    if is_integral(self.dtype):
        min_val, max_val = int(min_val), int(max_val)  # torch keeps integer inputs integer
    return aten.clamp(self, min_val, max_val)


@register_decomposition(aten.hardtanh_backward)
def hardtanh_backward(grad_output, self, min_val, max_val):
    outside = prims.bitwise_or(prims.le(self, float(min_val)), prims.ge(self, float(max_val)))
    return prims.where(outside, like(0, grad_output), grad_output)


def _hardsigmoid(x):
    return prims.div(prims.minimum(prims.maximum(prims.add(x, 3.0), 0.0), 6.0), 6.0)


register_decomposition(aten.hardsigmoid)(_act(_hardsigmoid))


@register_decomposition(aten.hardsigmoid_backward)
def hardsigmoid_backward(grad_output, self):
    def fn(g, x):
        inside = prims.bitwise_and(prims.gt(x, -3.0), prims.lt(x, 3.0))
        return prims.where(inside, prims.div(g, 6.0), 0.0)

    return _act_bwd(fn)(grad_output, self)


register_decomposition(aten.hardswish)(_act(lambda x: prims.mul(x, _hardsigmoid(x))))


@register_decomposition(aten.hardswish_backward)
def hardswish_backward(grad_output, self):
    def fn(g, x):
        mid = prims.mul(g, prims.add(prims.div(x, 3.0), 0.5))
        out = prims.where(prims.le(x, 3.0), mid, g)
        return prims.where(prims.lt(x, -3.0), 0.0, out)

    return _act_bwd(fn)(grad_output, self)


@register_decomposition(aten.leaky_relu)
def leaky_relu(self, negative_slope=0.01):
    def fn(x):
        return prims.where(prims.gt(x, 0.0), x, prims.mul(x, float(negative_slope)))

    return _act(fn)(self)


@register_decomposition(aten.leaky_relu_backward)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    def fn(g, x):
        return prims.where(prims.gt(x, 0.0), g, prims.mul(g, float(negative_slope)))

    return _act_bwd(fn)(grad_output, self)


@register_decomposition(aten.elu)
def elu(self, alpha=1, scale=1, input_scale=1):
    def fn(x):
        neg = prims.mul(prims.expm1(prims.mul(x, float(input_scale))), float(alpha) * float(scale))
        return prims.where(prims.gt(x, 0.0), prims.mul(x, float(scale)), neg)

    return _act(fn)(self)


@register_decomposition(aten.elu_backward)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    a, s, i = float(alpha), float(scale), float(input_scale)

    def fn(g, x):
        if is_result:
            neg = prims.mul(prims.mul(g, i), prims.add(x, a * s))
        else:
            neg = prims.mul(prims.mul(g, i * a * s), prims.exp(prims.mul(x, i)))
        return prims.where(prims.le(x, 0.0), neg, prims.mul(g, s))

    return _act_bwd(fn)(grad_output, self_or_result)


@register_decomposition(aten.celu)
def celu(self, alpha=1.0):
    return aten.elu(self, alpha, 1.0, 1.0 / alpha)


@register_decomposition(aten.hardshrink)
def hardshrink(self, lambd=0.5):
    small = prims.le(prims.abs(self), float(lambd))
    return prims.where(small, like(0, self), self)


@register_decomposition(aten.hardshrink_backward)
def hardshrink_backward(grad_out, self, lambd):
    small = prims.le(prims.abs(self), float(lambd))
    return prims.where(small, like(0, grad_out), grad_out)


@register_decomposition(aten.softshrink)
def softshrink(self, lambd=0.5):
    def fn(x):
        lam = float(lambd)
        out = prims.where(prims.gt(x, lam), prims.sub(x, lam), 0.0)
        return prims.where(prims.lt(x, -lam), prims.add(x, lam), out)

    return _act(fn)(self)


@register_decomposition(aten.softshrink_backward)
def softshrink_backward(grad_output, self, lambd):
    small = prims.le(prims.abs(self), float(lambd))
    return prims.where(small, like(0, grad_output), grad_output)


@register_decomposition(aten.log_sigmoid_forward)
def log_sigmoid_forward(self):
    def fn(x):
        return prims.sub(prims.minimum(x, 0.0), prims.log1p(prims.exp(prims.neg(prims.abs(x)))))

    # The buffer only helps torch's own CPU backward; the decomposed backward does not read it.
    return _act(fn)(self), prims.full((0,), 0, self.dtype, self.device)


@register_decomposition(aten.log_sigmoid_backward)
def log_sigmoid_backward(grad_output, self, buffer):
    return _act_bwd(lambda g, x: prims.mul(g, prims.sigmoid(prims.neg(x))))(grad_output, self)


@register_decomposition(aten.glu)
def glu(self, dim=-1):
    dim = utils.canonicalize_dim(self.ndim, dim)
    half = self.shape[dim] // 2
    a = prims.slice_in_dim(self, 0, half, 1, dim)
    b = prims.slice_in_dim(self, half, 2 * half, 1, dim)
    x = _opmath(a)
    return convert(prims.mul(x, prims.sigmoid(_opmath(b))), self.dtype)


@register_decomposition(aten.glu_backward)
def glu_backward(grad_output, self, dim):
    dim = utils.canonicalize_dim(self.ndim, dim)
    half = self.shape[dim] // 2
    g = _opmath(grad_output)
    a = _opmath(prims.slice_in_dim(self, 0, half, 1, dim))
    s = prims.sigmoid(_opmath(prims.slice_in_dim(self, half, 2 * half, 1, dim)))
    ga = prims.mul(g, s)
    gb = prims.mul(prims.mul(prims.mul(g, a), s), prims.sub(1.0, s))
    return convert(prims.cat([ga, gb], dim), grad_output.dtype)


def _prelu_weight(self, weight):
    # weight has one value per channel (dim 1) or one value in all.
    if weight.numel() == 1 or self.ndim < 2:
        return utils.broadcast_to(prims.reshape(weight, ()), tuple(self.shape))
    return prims.broadcast_in_dim(prims.reshape(weight, (-1,)), tuple(self.shape), (1,))


@register_decomposition(aten._prelu_kernel)
def _prelu_kernel(self, weight):
    w = convert(_prelu_weight(self, weight), self.dtype)
    return prims.where(prims.gt(self, 0.0), self, prims.mul(w, self))


@register_decomposition(aten._prelu_kernel_backward)
def _prelu_kernel_backward(grad_output, self, weight):
    w = convert(_prelu_weight(self, weight), self.dtype)
    pos = prims.gt(self, 0.0)
    grad_input = prims.where(pos, grad_output, prims.mul(w, grad_output))
    grad_weight = prims.where(pos, 0.0, prims.mul(self, grad_output))
    return grad_input, grad_weight


@register_decomposition(aten.rrelu_with_noise_functional)
def rrelu_with_noise_functional(
    self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None
):
    """(output, new noise): rrelu_with_noise writes the slopes it drew into `noise`."""
    if not training:
        return aten.leaky_relu(self, (lower + upper) / 2), noise
    x = _opmath(self)
    slope = uniform(tuple(self.shape), x.dtype, self.device, lower, upper)
    pos = prims.ge(x, 0.0)
    out = convert(prims.where(pos, x, prims.mul(x, slope)), self.dtype)
    return out, convert(prims.where(pos, 1.0, slope), noise.dtype)
