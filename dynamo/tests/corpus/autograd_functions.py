"""Custom torch.autograd.Functions (both forms, ctx features) and torch.utils.checkpoint.

Every case takes inputs that require grad, so the Function's own backward is what a backend must
keep. test_corpus.py checks the graphs and the forward values; test_autograd_function.py (and
tests/test_autograd_function_e2e.py, through aot_eager and inductor) the gradients too.
"""

import torch
import torch.utils.checkpoint as checkpoint
from torch.autograd.function import once_differentiable

from . import case


def leaf(*shape):
    return torch.randn(*shape).requires_grad_()


def one():
    return (leaf(4, 5),)


def two():
    return (leaf(4, 5), leaf(4, 5))


def mat():
    return (leaf(6, 8), leaf(8, 8))


class ScaledSin(torch.autograd.Function):
    """Old form: forward(ctx, ...), save_for_backward, a non-tensor attribute on ctx."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x.sin() * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() * ctx.scale, None


class DoubledGrad(torch.autograd.Function):
    """A backward that is deliberately not the forward's derivative (twice the true one)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * (grad * 2 * x)


class StraightThrough(torch.autograd.Function):
    """Round forward; the gradient passes through (round's derivative would be zero)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class MulSetup(torch.autograd.Function):
    """The setup_context form: forward without ctx, setup_context saves."""

    @staticmethod
    def forward(x, y):
        return x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y = inputs
        ctx.save_for_backward(x, y)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x


class AddScaledSetup(torch.autograd.Function):
    """setup_context reads an argument the call left to its default."""

    @staticmethod
    def forward(x, y, alpha=3.0):
        return x + alpha * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[2]

    @staticmethod
    def backward(ctx, grad):
        return grad, grad * ctx.alpha, None


class NeedsInputGrad(torch.autograd.Function):
    """Reads ctx.needs_input_grad and returns None for the input that needs none."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y.exp()

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        gx = grad * y.exp() if ctx.needs_input_grad[0] else None
        gy = grad * x * y.exp() if ctx.needs_input_grad[1] else None
        return gx, gy


class SortWithIndices(torch.autograd.Function):
    """Two outputs, one marked non-differentiable (the indices)."""

    @staticmethod
    def forward(ctx, x):
        values, indices = torch.sort(x, dim=-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        return torch.zeros_like(grad_values).scatter(-1, indices, grad_values)


class TwoOutputs(torch.autograd.Function):
    """Two differentiable outputs; set_materialize_grads(False) (an unused output's gradient
    may arrive as None)."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * x

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        if g1 is not None:
            out = out + 2 * g1
        if g2 is not None:
            out = out + 2 * x * g2
        return out


class OnceDifferentiableExp(torch.autograd.Function):
    """@once_differentiable on the backward."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class WritesThroughViews(torch.autograd.Function):
    """In-place writes through views in the forward and the backward (`y[0] = 0`) and a masked
    write (the tutorial ReLU's `grad[x < 0] = 0`)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        y = x.clone()
        y[0] = 0
        y[:, 1:].mul_(2)
        return y.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        g = grad.clone()
        g[x < 0] = 0
        g[0] = 0
        g[:, 1:] *= 2
        return g


class AmpMatmul(torch.autograd.Function):
    """torch.amp.custom_fwd / custom_bwd on the forward and backward (as Megatron-style code)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.t() @ grad


class MixedOutputs(torch.autograd.Function):
    """A tensor, an int and a bool tensor out; None saved beside a tensor."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(None, x)
        return x * 2, 3, x > 0

    @staticmethod
    def backward(ctx, grad, grad_int, grad_mask):
        _, x = ctx.saved_tensors
        return grad * 2


class DoubleInPlace(torch.autograd.Function):
    """Writes its input in place and marks it dirty (the in-place op of an extension)."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class ScaleAndTrackMax(torch.autograd.Function):
    """A differentiable output and a running statistic written in place into a buffer that is
    marked dirty and non-differentiable (a BatchNorm-like update)."""

    @staticmethod
    def forward(ctx, x, running):
        running.copy_(torch.maximum(running, x.amax(0)))
        ctx.mark_dirty(running)
        ctx.mark_non_differentiable(running)
        return x * 3, running

    @staticmethod
    def backward(ctx, grad, grad_running):
        return grad * 3, None


class ReluInPlaceSetup(torch.autograd.Function):
    """The setup_context form of an in-place ReLU: the output is the input, saved after the
    write."""

    @staticmethod
    def forward(x):
        return x.relu_()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_dirty(inputs[0])
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (out > 0)


class SizeOnCtx(torch.autograd.Function):
    """Keeps a size on ctx; two outputs, one reduced."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.rows = x.shape[0]
        return x * x, x.sum(0)

    @staticmethod
    def backward(ctx, g, g_sum):
        (x,) = ctx.saved_tensors
        return 2 * x * g + g_sum * ctx.rows


class NeedsInputGradMarked(torch.autograd.Function):
    """setup_context form; x's gradient is 3x where y needs none, so a needs_input_grad that is
    wrong (all True, say) shows in x's gradient, not only in a gradient thrown away."""

    @staticmethod
    def forward(x, y):
        return x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        gx = grad * y * (1.0 if ctx.needs_input_grad[1] else 3.0)
        return gx, (grad * x if ctx.needs_input_grad[1] else None)


class FloatNonDifferentiable(torch.autograd.Function):
    """A float output marked non-differentiable (an int one never requires grad anyway)."""

    @staticmethod
    def forward(ctx, x):
        a, b = x * 2, x.exp()
        ctx.mark_non_differentiable(b)
        return a, b

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_a, grad_b):
        return grad_a * 2


@case(lambda: (leaf(4, 5), torch.randn(4, 5)))
def needs_input_grad_changes_the_gradient(x, y):
    return NeedsInputGradMarked.apply(x.sin(), y)


@case(two)
def needs_input_grad_both(x, y):
    return NeedsInputGradMarked.apply(x, y.cos())


@case(one)
def float_output_marked_non_differentiable(x):
    a, b = FloatNonDifferentiable.apply(x)
    return a, b, b * 3  # b and what is made from it alone do not require grad


@case(one)
def mark_dirty_non_leaf_input(x):
    y = x * 1.5  # needs grad, not a leaf: eager writes it and rebases its history
    out = DoubleInPlace.apply(y)
    return out * x, y


@case(lambda: (leaf(4, 5), torch.zeros(5)))
def mark_dirty_non_differentiable_buffer(x, running):
    out, r = ScaleAndTrackMax.apply(x.sin(), running)
    return out + r, running * 1


@case(one)
def mark_dirty_setup_context_form(x):
    h = x - 0.25
    out = ReluInPlaceSetup.apply(h)
    return (out * x).sum(), h


@case(lambda: (leaf(4, 5), 3.0))
def old_form_ctx_attribute(x, scale):
    return ScaledSin.apply(x * 2, scale) + 1


@case(one)
def wrong_by_design_backward(x):
    return DoubledGrad.apply(x).sum()


@case(one)
def straight_through_rounding(x):
    return StraightThrough.apply(x.tanh()) * 3


@case(two)
def setup_context_form(x, y):
    return MulSetup.apply(x.sin(), y) + x


@case(two)
def setup_context_default_argument(x, y):
    return AddScaledSetup.apply(x, y.cos())


@case(lambda: (leaf(4, 5), torch.randn(4, 5)))
def needs_input_grad_partial(x, y):
    return NeedsInputGrad.apply(x, y)


@case(one)
def non_differentiable_output(x):
    values, indices = SortWithIndices.apply(x)
    return values * 2, indices


@case(one)
def unused_output_gradient_is_none(x):
    a, _ = TwoOutputs.apply(x)
    return a.sum()


@case(one)
def once_differentiable_backward(x):
    return OnceDifferentiableExp.apply(x) * x


@case(two)
def two_functions_chained(x, y):
    return MulSetup.apply(ScaledSin.apply(x, 0.5), DoubledGrad.apply(y))


@case(one)
def in_place_writes_through_views(x):
    return WritesThroughViews.apply(x * 1.5).t()


@case(mat)
def amp_decorated_function(x, w):
    return AmpMatmul.apply(x, w).tanh()


@case(one)
def tensor_int_and_mask_outputs(x):
    a, n, mask = MixedOutputs.apply(x)
    return a * n * mask, mask


@case(one)
def size_saved_on_ctx(x):
    a, b = SizeOnCtx.apply(x.sin())
    return a.sum() + b.sum() * x.shape[0]


def _block(t, w):
    return torch.tanh(t @ w) @ w


@case(mat)
def checkpoint_non_reentrant(x, w):
    return checkpoint.checkpoint(_block, x, w, use_reentrant=False).relu()


@case(mat)
def checkpoint_reentrant(x, w):
    return checkpoint.checkpoint(_block, x.sin(), w, use_reentrant=True) + x.sum()


@case(mat)
def checkpoint_with_kwargs_and_function_inside(x, w):
    def body(t, w, *, scale):
        return ScaledSin.apply(t @ w, scale)

    return checkpoint.checkpoint(body, x, w, use_reentrant=False, scale=2.0).sum()
