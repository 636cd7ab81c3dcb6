"""User operators (torch.library): one graph node each, mutation and autograd as in eager."""

import torch

from . import case


@torch.library.custom_op("ember_corpus::mysin", mutates_args=())
def mysin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@mysin.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ember_corpus::sin_grad", mutates_args=())
def sin_grad(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@sin_grad.register_fake
def _(x):
    return torch.empty_like(x)


def _sin_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


sin_grad.register_autograd(_sin_backward, setup_context=_sin_setup)


@torch.library.custom_op("ember_corpus::accumulate", mutates_args=("acc",))
def accumulate(acc: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> None:
    acc.add_(x, alpha=alpha)


@accumulate.register_fake
def _(acc, x, alpha=1.0):
    return None


@torch.library.custom_op("ember_corpus::split_sign", mutates_args=())
def split_sign(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clamp(min=0), x.clamp(max=0)


@split_sign.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op("ember_corpus::weighted_sum", mutates_args=())
def weighted_sum(xs: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    return sum(w * x for w, x in zip(weights, xs))


@weighted_sum.register_fake
def _(xs, weights):
    return torch.empty_like(xs[0])


# An operator defined with the low-level Library API: a schema, a CPU kernel and a fake kernel.
_LIB = torch.library.Library("ember_corpus_lib", "DEF")
_LIB.define("scale_shift(Tensor x, float scale, *, float shift=0.0) -> Tensor")
_LIB.impl("scale_shift", lambda x, scale, shift=0.0: x * scale + shift, "CPU")
torch.library.register_fake("ember_corpus_lib::scale_shift",
                            lambda x, scale, shift=0.0: torch.empty_like(x), lib=_LIB)  # fmt: skip


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(3, 4),)


def grad_input():
    return (r(3, 4).requires_grad_(),)


@case(one)
def custom_op_between_torch_ops(x):
    return mysin(x * 2) + 1


@case(one)
def custom_op_through_torch_ops_packet(x):
    return torch.ops.ember_corpus.mysin(x).relu()


@case(one)
def library_op_with_kwarg_only_argument(x):
    y = torch.ops.ember_corpus_lib.scale_shift(x, 2.0, shift=1.0)
    return torch.ops.ember_corpus_lib.scale_shift.default(y, 0.5) - x


@case(lambda: (r(3, 4), r(3, 4)))
def mutating_op_on_an_input(acc, x):
    accumulate(acc, x, alpha=2.0)
    return acc * 3


@case(one)
def mutating_op_on_an_intermediate(x):
    acc = torch.zeros_like(x)
    accumulate(acc, x)
    accumulate(acc, x.cos())
    return acc + 1


@case(one)
def op_with_two_outputs(x):
    pos, neg = split_sign(x - 0.5)
    return pos * 2 + neg


@case(lambda: (r(3, 4), r(3, 4), r(3, 4)))
def op_taking_a_list_of_tensors(a, b, c):
    return weighted_sum([a, b * 2, c], [1.0, 0.5, -1.0])


@case(grad_input)
def op_with_autograd_formula_needing_gradients(x):
    return sin_grad(x * 2).sum()


@case(grad_input, graphs=3, breaks=1)
def op_without_autograd_formula_needing_gradients(x):
    # Eager runs the operator (the graph breaks there; torch raises only if a backward reaches
    # it). The three graphs: x * 2, the operator's own Python kernel (a user function the
    # dispatcher calls, compiled as any frame is), and the resumed `+ 1`.
    return mysin(x * 2) + 1


@case(one)
def op_without_autograd_formula_in_inference(x):
    with torch.no_grad():
        y = mysin(x)
    return y * x


@case(one)
def op_called_in_a_loop(x):
    for _ in range(3):
        x = mysin(x) + x
    return x
