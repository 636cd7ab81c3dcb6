"""Neural-network ops: normalisations (forward and backward), embedding, dropout."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from ._common import aten, convert, like, numel
from ._random import uniform
from ._registry import register_decomposition


def _opmath(x):
    return convert(x, utils.opmath_dtype(x.dtype))


def _bcast(t, shape, dims):
    """A reduced tensor broadcast back over `shape`, its values along `dims`."""
    return prims.broadcast_in_dim(t, tuple(shape), tuple(dims))


def _stats_dtype(x):
    # torch's CPU kernels return statistics in the input dtype; the CUDA ones in float32.
    return x.dtype if x.device.type == "cpu" else utils.opmath_dtype(x.dtype)


def _normalize(x, dims, eps):
    """(mean, biased variance, rstd) of x over dims (x already in its compute dtype)."""
    n = numel([x.shape[d] for d in dims])
    mean = prims.div(prims.sum(x, dims), n)
    var = prims.var(x, dims, 0.0)
    return mean, var, prims.rsqrt(prims.add(var, eps))


# --- layer norm ----------------------------------------------------------------------------------


@register_decomposition(aten.native_layer_norm)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axis = input.ndim - len(normalized_shape)
    dims = tuple(range(axis, input.ndim))
    keep = tuple(range(axis))
    x = _opmath(input)
    mean, _, rstd = _normalize(x, dims, eps)
    out = prims.mul(prims.sub(x, _bcast(mean, x.shape, keep)), _bcast(rstd, x.shape, keep))
    out = _affine(out, weight, bias, dims)
    stat_shape = tuple(input.shape[:axis]) + (1,) * len(dims)
    dtype = _stats_dtype(input)
    out = convert(out, input.dtype)
    shape = utils.shape_of(out)
    if not utils.is_contiguous(shape, utils.strides_of(out)):
        # Eager's kernels normalise a contiguous copy of the input: the output is contiguous
        # whatever the input's layout (ConvNeXt's and Swin's norms over a permuted NCHW map).
        # Kept in the input's layout, the Linear after it saw a strided 4-D input and became a
        # bmm over B*H batches with the weight broadcast, where eager runs one mm.
        out = prims.copy_strided(out, utils.make_contiguous_strides_for(shape))
    return (
        out,
        convert(prims.reshape(mean, stat_shape), dtype),
        convert(prims.reshape(rstd, stat_shape), dtype),
    )


def _affine(out, weight, bias, dims):
    if weight is not None:
        out = prims.mul(out, _bcast(convert(weight, out.dtype), out.shape, dims))
    if bias is not None:
        out = prims.add(out, _bcast(convert(bias, out.dtype), out.shape, dims))
    return out


def _sum_to(t, dims):
    return prims.sum(t, tuple(dims)) if dims else t


@register_decomposition(aten.native_layer_norm_backward)
def native_layer_norm_backward(
    grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
):
    axis = input.ndim - len(normalized_shape)
    dims = tuple(range(axis, input.ndim))
    outer = tuple(range(axis))
    x, g = _opmath(input), _opmath(grad_out)
    n = numel(normalized_shape)
    mean_b = prims.broadcast_in_dim(convert(mean, x.dtype), tuple(x.shape), tuple(range(x.ndim)))
    rstd_b = prims.broadcast_in_dim(convert(rstd, x.dtype), tuple(x.shape), tuple(range(x.ndim)))
    x_hat = prims.mul(prims.sub(x, mean_b), rstd_b)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g if weight is None else prims.mul(g, _bcast(convert(weight, x.dtype), x.shape, dims))
        sum_g = _bcast(prims.sum(gw, dims), x.shape, outer)
        sum_gx = _bcast(prims.sum(prims.mul(gw, x_hat), dims), x.shape, outer)
        inner = prims.sub(prims.sub(prims.mul(gw, float(n)), sum_g), prims.mul(x_hat, sum_gx))
        grad_input = convert(prims.mul(prims.div(rstd_b, float(n)), inner), input.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = convert(_sum_to(prims.mul(g, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = convert(_sum_to(g, outer), bias.dtype)
    return grad_input, grad_weight, grad_bias


# --- group norm ----------------------------------------------------------------------------------


@register_decomposition(aten.native_group_norm)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = prims.reshape(_opmath(input), (N, group, (C // group) * HxW))
    mean, _, rstd = _normalize(x, (2,), eps)
    out = prims.mul(prims.sub(x, _bcast(mean, x.shape, (0, 1))), _bcast(rstd, x.shape, (0, 1)))
    out = prims.reshape(out, (N, C, HxW))
    out = _affine(out, weight, bias, (1,))
    dtype = _stats_dtype(input)
    return (
        convert(prims.reshape(out, tuple(input.shape)), input.dtype),
        convert(mean, dtype),
        convert(rstd, dtype),
    )


@register_decomposition(aten.native_group_norm_backward)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    cpg = C // group
    x = prims.reshape(_opmath(input), (N, group, cpg, HxW))
    g = prims.reshape(_opmath(grad_out), (N, group, cpg, HxW))
    mean_b = _bcast(convert(mean, x.dtype), x.shape, (0, 1))
    rstd_b = _bcast(convert(rstd, x.dtype), x.shape, (0, 1))
    x_hat = prims.mul(prims.sub(x, mean_b), rstd_b)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g
        if weight is not None:
            w = prims.reshape(convert(weight, x.dtype), (group, cpg))
            gw = prims.mul(g, _bcast(w, x.shape, (1, 2)))
        n = float(cpg * HxW)
        sum_g = _bcast(prims.sum(gw, (2, 3)), x.shape, (0, 1))
        sum_gx = _bcast(prims.sum(prims.mul(gw, x_hat), (2, 3)), x.shape, (0, 1))
        inner = prims.sub(prims.sub(prims.mul(gw, n), sum_g), prims.mul(x_hat, sum_gx))
        out = prims.mul(prims.div(rstd_b, n), inner)
        grad_input = convert(prims.reshape(out, tuple(input.shape)), input.dtype)
    if output_mask[1] and weight is not None:
        gw = prims.reshape(prims.sum(prims.mul(g, x_hat), (0, 3)), (C,))
        grad_weight = convert(gw, weight.dtype)
    if output_mask[2]:
        dtype = weight.dtype if weight is not None else input.dtype
        grad_bias = convert(prims.reshape(prims.sum(g, (0, 3)), (C,)), dtype)
    return grad_input, grad_weight, grad_bias


# --- batch norm ----------------------------------------------------------------------------------


def _bn_dims(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_apply(x, mean, invstd, weight, bias):
    shape = tuple(x.shape)
    out = prims.mul(prims.sub(x, _bcast(mean, shape, (1,))), _bcast(invstd, shape, (1,)))
    return _affine(out, weight, bias, (1,))


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) in training mode."""
    x = _opmath(input)
    dims = _bn_dims(x)
    mean, var, invstd = _normalize(x, dims, eps)
    out = convert(_bn_apply(x, mean, invstd, weight, bias), input.dtype)
    new_rm = new_rv = None
    if running_mean is not None:
        n = numel([x.shape[d] for d in dims])
        if isinstance(n, int):
            unbiased = prims.mul(var, n / max(n - 1, 1))
        else:  # a symbolic count: integer scalars (n / (n - 1) would be a symbolic float)
            unbiased = prims.div(prims.mul(var, n), n - 1 if n > 1 else 1)
        rm, rv = convert(running_mean, x.dtype), convert(running_var, x.dtype)
        new_rm = prims.add(prims.mul(rm, 1.0 - momentum), prims.mul(mean, momentum))
        new_rv = prims.add(prims.mul(rv, 1.0 - momentum), prims.mul(unbiased, momentum))
        new_rm, new_rv = convert(new_rm, running_mean.dtype), convert(new_rv, running_var.dtype)
    dtype = _stats_dtype(input)
    return out, convert(mean, dtype), convert(invstd, dtype), new_rm, new_rv


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = _opmath(input)
    mean = convert(running_mean, x.dtype)
    invstd = prims.rsqrt(prims.add(convert(running_var, x.dtype), eps))
    return convert(_bn_apply(x, mean, invstd, weight, bias), input.dtype)


def _empty_stats(input):
    return prims.full((0,), 0, _stats_dtype(input), input.device)


def _update_running(running_mean, running_var, new_rm, new_rv):
    # Running statistics are buffers updated in place; the tracer functionalises the copies.
    if new_rm is not None:
        aten.copy_(running_mean, new_rm)
        aten.copy_(running_var, new_rv)


# native_batch_norm's schema does not mark the running statistics as written, so the tracer hands
# it here; the ops that do (_native_batch_norm_legit, _batch_norm_with_update) reach their
# *_functional twins below through the tracer's functionalisation.
@register_decomposition(aten.native_batch_norm)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training or running_mean is None:
        out, mean, invstd, new_rm, new_rv = _bn_train(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
        if training:
            _update_running(running_mean, running_var, new_rm, new_rv)
        return out, mean, invstd
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(input), _empty_stats(input)


# ATen's _batch_norm_impl_index picks cuDNN's kernel for CUDA tensors (when it is not under
# autograd's inference path); its outputs add a reserve buffer (empty here: nothing reads it but
# cuDNN's own backward, which the tracer replaces by its derivative decomposition).
@register_decomposition(aten.cudnn_batch_norm)
def cudnn_batch_norm(input, weight, bias, running_mean, running_var, training,
                     exponential_average_factor, epsilon):  # fmt: skip
    out, mean, invstd = native_batch_norm(input, weight, bias, running_mean, running_var,
                                          training, exponential_average_factor, epsilon)  # fmt: skip
    return out, mean, invstd, _reserve(input)


@register_decomposition(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
    return out, mean, invstd


@register_decomposition(aten._native_batch_norm_legit_functional)
def native_batch_norm_functional(
    input, weight, bias, running_mean, running_var, training, momentum, eps
):
    if training:
        return _bn_train(input, weight, bias, running_mean, running_var, momentum, eps)
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(input), _empty_stats(input), running_mean, running_var


@register_decomposition(aten._native_batch_norm_legit_no_training)
def native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(input), _empty_stats(input)


def _reserve(input):
    return prims.full((0,), 0, torch.uint8, input.device)


@register_decomposition(aten._batch_norm_with_update_functional)
def batch_norm_with_update_functional(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    out, mean, invstd, new_rm, new_rv = _bn_train(
        input, weight, bias, running_mean, running_var, momentum, eps
    )
    return out, mean, invstd, _reserve(input), new_rm, new_rv


@register_decomposition(aten._batch_norm_no_update)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        out, mean, invstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
        return out, mean, invstd, _reserve(input)
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(input), _empty_stats(input), _reserve(input)


@register_decomposition(aten.native_batch_norm_backward)
def native_batch_norm_backward(
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
):
    x, g = _opmath(input), _opmath(grad_out)
    shape, dims = tuple(x.shape), _bn_dims(x)
    if train:
        mean, invstd = convert(save_mean, x.dtype), convert(save_invstd, x.dtype)
    else:
        mean = convert(running_mean, x.dtype)
        invstd = prims.rsqrt(prims.add(convert(running_var, x.dtype), eps))
    x_hat = prims.mul(prims.sub(x, _bcast(mean, shape, (1,))), _bcast(invstd, shape, (1,)))
    sum_g = prims.sum(g, dims)
    sum_gx = prims.sum(prims.mul(g, x_hat), dims)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        scale = invstd if weight is None else prims.mul(invstd, convert(weight, x.dtype))
        gi = g
        if train:
            n = numel([x.shape[d] for d in dims])
            n = float(n) if isinstance(n, int) else n  # float() of a symbolic count would guard
            gi = prims.sub(gi, _bcast(prims.div(sum_g, n), shape, (1,)))
            gi = prims.sub(gi, prims.mul(x_hat, _bcast(prims.div(sum_gx, n), shape, (1,))))
        grad_input = convert(prims.mul(gi, _bcast(scale, shape, (1,))), input.dtype)
    if output_mask[1]:
        grad_weight = convert(sum_gx, weight.dtype if weight is not None else input.dtype)
    if output_mask[2]:
        grad_bias = convert(sum_g, weight.dtype if weight is not None else input.dtype)
    return grad_input, grad_weight, grad_bias


@register_decomposition(aten.batch_norm_backward)
def batch_norm_backward(
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_var,
    update,
    eps,
    output_mask,
    reserve,
):
    return native_batch_norm_backward(
        grad_out,
        input,
        weight,
        running_mean,
        running_var,
        save_mean,
        save_var,
        update,
        eps,
        output_mask,
    )


# cuDNN's batch norm backward, which autograd calls for a cudnn_batch_norm run in training: its
# saved statistics are the mean and the inverse standard deviation (the forward's decomposition
# above returns them so), its reserve buffer is cuDNN's own. A fp32 conv + batch-norm step on
# CUDA reached it while tracing (H200) and had no decomposition.
@register_decomposition(aten.cudnn_batch_norm_backward)
def cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean,
                              save_var, epsilon, reserveSpace):  # noqa: N803 (the schema's)
    everything = [True, True, True]
    return native_batch_norm_backward(grad_output, input, weight, running_mean, running_var,
                                      save_mean, save_var, True, epsilon, everything)


# --- embedding -----------------------------------------------------------------------------------


@register_decomposition(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if indices.ndim == 0:
        return prims.squeeze(prims.index(weight, [prims.reshape(indices, (1,))]), (0,))
    return prims.index(weight, [indices])


@register_decomposition(aten.embedding_dense_backward)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = prims.reshape(convert(indices, torch.int64), (-1,))
    dim = grad_output.shape[-1]
    g = prims.reshape(_opmath(grad_output), (idx.shape[0], dim))
    if padding_idx >= 0:
        keep = prims.broadcast_in_dim(prims.ne(idx, padding_idx), tuple(g.shape), (0,))
        g = prims.where(keep, g, 0.0)
    if scale_grad_by_freq:
        ones = prims.full(tuple(idx.shape), 1, torch.int64, idx.device)
        zeros = prims.full((num_weights,), 0, torch.int64, idx.device)
        counts = prims.index_put(zeros, [idx], ones, True)
        per_row = convert(prims.index(counts, [idx]), g.dtype)
        g = prims.div(g, prims.broadcast_in_dim(per_row, tuple(g.shape), (0,)))
    out = prims.full((num_weights, dim), 0, g.dtype, g.device)
    return convert(prims.index_put(out, [idx], g, True), grad_output.dtype)


# --- dropout -------------------------------------------------------------------------------------


@register_decomposition(aten.native_dropout)
def native_dropout(input, p, train):
    if train is not None and not train:
        return prims.clone(input), like(True, input, torch.bool)
    if p >= 1:
        return like(0, input), like(False, input, torch.bool)
    keep = prims.lt(uniform(tuple(input.shape), torch.float32, input.device), 1.0 - p)
    x = _opmath(input)
    out = prims.mul(prims.mul(x, convert(keep, x.dtype)), 1.0 / (1.0 - p))
    return convert(out, input.dtype), keep


@register_decomposition(aten.native_dropout_backward)
def native_dropout_backward(grad_output, mask, scale):
    if not grad_output.dtype.is_floating_point:
        return aten.mul(aten.mul(grad_output, mask), scale)  # integer grads promote, as in eager
    g = _opmath(grad_output)
    out = prims.mul(prims.mul(g, convert(mask, g.dtype)), float(scale))
    return convert(out, grad_output.dtype)


@register_decomposition(aten._embedding_bag_forward_only, aten._embedding_bag)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices) with a dense (bags x indices) membership mask."""
    idx = convert(prims.reshape(indices, (-1,)), torch.int64)
    n = idx.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = prims.iota(n, 0, 1, torch.int64, idx.device)
    starts = convert(prims.slice_in_dim(offsets, 0, bags, 1, 0), torch.int64)
    if include_last_offset:
        ends = convert(prims.slice_in_dim(offsets, 1, bags + 1, 1, 0), torch.int64)
    else:
        ends = prims.cat(
            [
                prims.slice_in_dim(convert(offsets, torch.int64), 1, bags, 1, 0),
                prims.full((1,), n, torch.int64, idx.device),
            ],
            0,
        )
    member = aten.logical_and(
        aten.le(aten.unsqueeze(starts, 1), pos), aten.lt(pos, aten.unsqueeze(ends, 1))
    )
    offset2bag = aten.sub(aten.sum(aten.le(aten.unsqueeze(starts, 1), pos), [0]), 1)
    if padding_idx >= 0:
        member = aten.logical_and(member, aten.ne(idx, padding_idx))
    rows = _opmath(prims.index(weight, [idx]))  # (N, D)
    if per_sample_weights is not None:
        rows = aten.mul(rows, aten.unsqueeze(convert(per_sample_weights, rows.dtype), 1))
    mask = aten.unsqueeze(member, 2)
    count = aten.sum(member, [1])
    if mode == 2:
        picked = aten.where(mask, aten.unsqueeze(rows, 0), -math.inf)
        out = aten.amax(picked, [1])
        which = aten.argmax(picked, 1)
        max_indices = aten.where(aten.unsqueeze(aten.gt(count, 0), 1), aten.index(idx, [which]), 0)
        out = aten.where(aten.unsqueeze(aten.gt(count, 0), 1), out, 0.0)
    else:
        out = aten.sum(aten.where(mask, aten.unsqueeze(rows, 0), 0.0), [1])
        if mode == 1:
            out = aten.div(out, aten.unsqueeze(aten.clamp_min(count, 1), 1))
        max_indices = aten.zeros((bags,), dtype=torch.int64, device=idx.device)
    return convert(out, weight.dtype), offset2bag, count, max_indices
