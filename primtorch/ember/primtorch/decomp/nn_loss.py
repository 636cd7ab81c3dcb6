"""Loss functions (forward and backward): nll, mse, smooth-l1/huber, bce, margins."""

from __future__ import annotations

import torch

from ember.primtorch import prims, utils

from ._common import aten, broadcast_shape, c, convert, numel
from ._registry import register_decomposition

_NONE, _MEAN, _SUM = 0, 1, 2


def _opmath(x):
    return convert(x, utils.opmath_dtype(x.dtype))


def _reduce(loss, reduction):
    if reduction == _NONE:
        return loss
    dims = tuple(range(loss.ndim))
    total = prims.sum(loss, dims) if dims else loss
    if reduction == _MEAN:
        return prims.div(total, c(numel(loss.shape), total))  # symbolic numel stays symbolic
    return total


def _grad_scale(grad_output, shape, reduction):
    """grad_output broadcast over the loss's elementwise shape (divided by numel for mean)."""
    g = _opmath(grad_output)
    if reduction == _NONE:
        return utils.broadcast_to(g, tuple(shape))
    if reduction == _MEAN:
        g = prims.div(g, c(numel(shape), g))
    return utils.broadcast_to(g, tuple(shape))


def _pair(self, target):
    shape = broadcast_shape(self, target)  # ints, or sympy expressions for symbolic sizes
    x = utils.broadcast_to(_opmath(self), shape)
    t = utils.broadcast_to(convert(target, x.dtype), shape)
    return x, t


# --- nll -----------------------------------------------------------------------------------------


def _nll_parts(self, target, weight, ignore_index):
    """(class dim, safe target, per-element weight with ignored entries 0)."""
    cdim = 0 if self.ndim == 1 else 1
    t = convert(target, torch.int64)
    keep = prims.ne(t, int(ignore_index))
    safe = prims.where(keep, t, 0)
    x = _opmath(self)
    if weight is None:
        w = convert(keep, x.dtype)
    else:
        w = prims.where(keep, prims.index(convert(weight, x.dtype), [safe]), 0.0)
    return cdim, safe, w, x


def _nll_forward(self, target, weight, reduction, ignore_index):
    cdim, safe, w, x = _nll_parts(self, target, weight, ignore_index)
    picked = prims.squeeze(prims.gather(x, cdim, prims.expand_dims(safe, (cdim,))), (cdim,))
    loss = prims.neg(prims.mul(picked, w))
    dims = tuple(range(loss.ndim))
    total_weight = prims.sum(w, dims) if dims else w
    if reduction == _NONE:
        out = loss
        total_weight = prims.full((), 0, x.dtype, x.device)
    else:
        out = prims.sum(loss, dims) if dims else loss
        if reduction == _MEAN:
            out = prims.div(out, total_weight)
    return convert(out, self.dtype), convert(total_weight, self.dtype)


@register_decomposition(aten.nll_loss_forward, aten.nll_loss2d_forward)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@register_decomposition(aten.nll_loss_backward, aten.nll_loss2d_backward)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    cdim, safe, w, x = _nll_parts(self, target, weight, ignore_index)
    g = _opmath(grad_output)
    if reduction == _MEAN:
        g = prims.div(g, convert(total_weight, g.dtype))
    g = utils.broadcast_to(g, tuple(w.shape))
    value = prims.neg(prims.mul(w, g))
    # Each row's one nonzero, written as a pointwise select against the class index rather than
    # a scatter into zeros: inductor fuses it into log_softmax's backward and the cast to the
    # logits' dtype, so no float32 (rows, classes) buffer is made. The scatter (no lowering)
    # held two: its zeros and its out-of-place result (GPT-2's loss on 4096 tokens: 2 x 785 MiB
    # at the backward's peak, where torch.compile holds one bf16 gradient).
    shape = tuple(self.shape)
    classes = prims.broadcast_in_dim(
        prims.iota(shape[cdim], 0, 1, torch.int64, x.device), shape, (cdim,)
    )
    hit = prims.eq(classes, utils.broadcast_to(prims.expand_dims(safe, (cdim,)), shape))
    out = prims.where(hit, utils.broadcast_to(prims.expand_dims(value, (cdim,)), shape), 0.0)
    return convert(out, self.dtype)


# --- regression losses ---------------------------------------------------------------------------


@register_decomposition(aten.mse_loss)
def mse_loss(self, target, reduction=_MEAN):
    x, t = _pair(self, target)
    d = prims.sub(x, t)
    return convert(_reduce(prims.mul(d, d), reduction), self.dtype)


@register_decomposition(aten.mse_loss_backward)
def mse_loss_backward(grad_output, self, target, reduction):
    x, t = _pair(self, target)
    g = _grad_scale(grad_output, x.shape, reduction)
    return convert(prims.mul(prims.mul(prims.sub(x, t), 2.0), g), self.dtype)


@register_decomposition(aten.smooth_l1_loss)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    x, t = _pair(self, target)
    d = prims.abs(prims.sub(x, t))
    if beta == 0:
        return convert(_reduce(d, reduction), self.dtype)
    quad = prims.div(prims.mul(prims.mul(d, d), 0.5), float(beta))
    loss = prims.where(prims.lt(d, float(beta)), quad, prims.sub(d, 0.5 * beta))
    return convert(_reduce(loss, reduction), self.dtype)


@register_decomposition(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    x, t = _pair(self, target)
    d = prims.sub(x, t)
    g = _grad_scale(grad_output, x.shape, reduction)
    if beta == 0:
        slope = prims.sign(d)
    else:
        slope = prims.where(
            prims.lt(prims.abs(d), float(beta)), prims.div(d, float(beta)), prims.sign(d)
        )
    return convert(prims.mul(slope, g), self.dtype)


@register_decomposition(aten.huber_loss)
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    x, t = _pair(self, target)
    d = prims.abs(prims.sub(x, t))
    quad = prims.mul(prims.mul(d, d), 0.5)
    lin = prims.mul(prims.sub(d, 0.5 * delta), float(delta))
    loss = prims.where(prims.lt(d, float(delta)), quad, lin)
    return convert(_reduce(loss, reduction), self.dtype)


@register_decomposition(aten.huber_loss_backward)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    x, t = _pair(self, target)
    d = prims.sub(x, t)
    g = _grad_scale(grad_output, x.shape, reduction)
    slope = prims.minimum(prims.maximum(d, -float(delta)), float(delta))
    return convert(prims.mul(slope, g), self.dtype)


# --- classification losses -----------------------------------------------------------------------


def _weighted(loss, weight):
    if weight is None:
        return loss
    return prims.mul(loss, utils.broadcast_to(convert(weight, loss.dtype), tuple(loss.shape)))


@register_decomposition(aten.binary_cross_entropy)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = _pair(self, target)
    log_x = prims.maximum(prims.log(x), -100.0)
    log_1mx = prims.maximum(prims.log(prims.sub(1.0, x)), -100.0)
    loss = prims.neg(prims.add(prims.mul(t, log_x), prims.mul(prims.sub(1.0, t), log_1mx)))
    return convert(_reduce(_weighted(loss, weight), reduction), self.dtype)


@register_decomposition(aten.binary_cross_entropy_backward)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = _pair(self, target)
    g = _grad_scale(grad_output, x.shape, reduction)
    denom = prims.maximum(prims.mul(prims.sub(1.0, x), x), 1e-12)
    out = prims.mul(prims.div(prims.sub(x, t), denom), g)
    return convert(_weighted(out, weight), self.dtype)


@register_decomposition(aten.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=_MEAN):
    x, t = _pair(self, target)
    # log(1 + exp(-x)) computed stably as max(-x, 0) + log1p(exp(-|x|)).
    softplus_neg = prims.add(
        prims.maximum(prims.neg(x), 0.0), prims.log1p(prims.exp(prims.neg(prims.abs(x))))
    )
    if pos_weight is not None:
        pw = utils.broadcast_to(convert(pos_weight, x.dtype), tuple(x.shape))
        log_weight = prims.add(prims.mul(prims.sub(pw, 1.0), t), 1.0)
        softplus_neg = prims.mul(log_weight, softplus_neg)
    loss = prims.add(prims.mul(prims.sub(1.0, t), x), softplus_neg)
    return convert(_reduce(_weighted(loss, weight), reduction), self.dtype)


@register_decomposition(aten.soft_margin_loss)
def soft_margin_loss(self, target, reduction=_MEAN):
    x, t = _pair(self, target)
    loss = prims.log1p(prims.exp(prims.neg(prims.mul(t, x))))
    return convert(_reduce(loss, reduction), self.dtype)


@register_decomposition(aten.soft_margin_loss_backward)
def soft_margin_loss_backward(grad_output, self, target, reduction):
    x, t = _pair(self, target)
    g = _grad_scale(grad_output, x.shape, reduction)
    z = prims.exp(prims.neg(prims.mul(t, x)))
    out = prims.mul(prims.div(prims.mul(prims.neg(t), z), prims.add(z, 1.0)), g)
    return convert(out, self.dtype)


@register_decomposition(aten.multi_margin_loss)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    x = _opmath(self)
    x2 = x if x.ndim == 2 else prims.reshape(x, (1, numel(x.shape)))
    n, c = x2.shape
    t = prims.reshape(convert(target, torch.int64), (n, 1))
    x_y = utils.broadcast_to(prims.gather(x2, 1, t), (n, c))
    z = prims.maximum(prims.add(prims.sub(x2, x_y), float(margin)), 0.0)
    if p == 2:
        z = prims.mul(z, z)
    if weight is not None:
        w_y = prims.index(convert(weight, x.dtype), [prims.reshape(t, (n,))])
        z = prims.mul(z, prims.broadcast_in_dim(w_y, (n, c), (0,)))
    cls = prims.broadcast_in_dim(prims.iota(c, 0, 1, torch.int64, x.device), (n, c), (1,))
    z = prims.where(prims.eq(cls, utils.broadcast_to(t, (n, c))), 0.0, z)
    per_sample = prims.div(prims.sum(z, (1,)), float(c))
    if x.ndim == 1:
        per_sample = prims.reshape(per_sample, ())
    if reduction == _NONE:
        return convert(per_sample, self.dtype)
    return convert(_reduce(per_sample, reduction), self.dtype)


@register_decomposition(aten.multilabel_margin_loss_forward)
def multilabel_margin_loss_forward(self, target, reduction):
    x = _opmath(self)
    x2 = x if x.ndim == 2 else prims.reshape(x, (1, numel(x.shape)))
    n, c = x2.shape
    t = prims.reshape(convert(target, torch.int64), (n, c))
    # Targets are valid up to the first -1 in each row.
    stop = prims.eq(t, -1)
    pos = prims.iota(c, 0, 1, torch.int64, x.device)
    before = prims.le(
        prims.broadcast_in_dim(pos, (c, c), (1,)), prims.broadcast_in_dim(pos, (c, c), (0,))
    )
    seen = prims.any(
        prims.bitwise_and(
            prims.broadcast_in_dim(stop, (n, c, c), (0, 2)),
            prims.broadcast_in_dim(before, (n, c, c), (1, 2)),
        ),
        (2,),
    )
    valid = prims.logical_not(seen)
    safe = prims.where(valid, t, 0)
    hits = prims.scatter_add(
        prims.full((n, c), 0, x.dtype, x.device), 1, safe, convert(valid, x.dtype)
    )
    is_target = convert(prims.gt(hits, 0.0), x.dtype)
    x_t = prims.gather(x2, 1, safe)
    diff = prims.add(
        prims.sub(
            prims.broadcast_in_dim(x2, (n, c, c), (0, 2)),
            prims.broadcast_in_dim(x_t, (n, c, c), (0, 1)),
        ),
        1.0,
    )
    mask = prims.bitwise_and(
        prims.broadcast_in_dim(valid, (n, c, c), (0, 1)),
        prims.broadcast_in_dim(prims.eq(is_target, 0.0), (n, c, c), (0, 2)),
    )
    loss = prims.where(mask, prims.maximum(diff, 0.0), 0.0)
    per_sample = prims.div(prims.sum(loss, (1, 2)), float(c))
    if x.ndim == 1:
        per_sample = prims.reshape(per_sample, ())
        is_target = prims.reshape(is_target, (c,))
    out = per_sample if reduction == _NONE else _reduce(per_sample, reduction)
    return convert(out, self.dtype), convert(is_target, self.dtype)
