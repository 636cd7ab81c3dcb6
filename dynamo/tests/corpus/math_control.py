"""math and operator on constants, shape arithmetic, constant-folded control flow, grad modes."""

import math
import operator

import torch

from . import case


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(4, 6),)


@case(one)
def math_sqrt_scale(x):
    return x / math.sqrt(x.shape[-1])


@case(one)
def math_functions(x):
    return x * math.exp(1) + math.log(8, 2) + math.floor(2.7) + math.ceil(2.1) + math.pi


@case(one)
def math_trig_consts(x):
    return x * math.cos(0) + math.sin(math.pi / 2) + math.inf * 0 if False else x * math.cos(0)


@case(one)
def math_isclose_gcd(x):
    return x * math.gcd(12, 18) if math.isclose(0.1 + 0.2, 0.3) else x


@case(one)
def operator_functions(x):
    return operator.sub(x, 1), operator.truediv(x, 2), operator.pow(x, 2), operator.not_(False)


@case(one)
def operator_itemgetter_free(x):
    return operator.getitem([x, x * 2], 1), operator.contains([1, 2], 2)


@case(one)
def shape_based_loop(x):
    out = x
    for _ in range(x.shape[0] // 2):
        out = out * 2
    return out


@case(one)
def shape_view_math(x):
    b, n = x.shape
    h = 2
    return x.view(b, h, n // h).transpose(0, 1).reshape(h * b, -1)


@case(one)
def numel_dim_math(x):
    return x.reshape(-1) * x.numel() / x.dim()


@case(one)
def size_comparison_branch(x):
    if x.size(0) == 4 and x.size(1) >= 6:
        y = x.sum(0)
    else:
        y = x.sum(1)
    return y


@case(one)
def dtype_branch(x):
    if x.dtype == torch.float32:
        return x.double()
    return x


@case(one)
def device_branch(x):
    return x + 1 if x.device.type == "cpu" else x


@case(one)
def is_floating_point_branch(x):
    return x * 2 if x.is_floating_point() else x


@case(one)
def nested_loops(x):
    acc = x * 0
    for i in range(2):
        for j in range(3):
            acc = acc + x * (i + j)
    return acc


@case(one)
def loop_over_list_of_fns(x):
    for fn in (torch.sin, torch.cos, torch.tanh):
        x = fn(x)
    return x


@case(one)
def dict_of_ops(x):
    ops = {"relu": torch.relu, "neg": torch.neg}
    return ops["relu"](x) + ops["neg"](x)


@case(one)
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y


@case(lambda: (r(4, 6).requires_grad_(),))
def no_grad_mixed(x):
    with torch.no_grad():
        y = x * 2
    return x * y


@case(lambda: (r(4, 6).requires_grad_(),))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 3
    return y


@case(lambda: (r(4, 6).requires_grad_(),))
def set_grad_enabled_ctx(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    return y + x


@case(one)
def is_grad_enabled_branch(x):
    return x * 2 if torch.is_grad_enabled() else x


@case(one)
def early_return(x):
    if x.shape[0] > 1:
        return x[0]
    y = x * 2
    return y


@case(one)
def walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


@case(one)
def match_free_elif_chain(x):
    k = x.shape[1]
    if k == 1:
        return x
    elif k == 6:
        return x * 6
    else:
        return -x


@case(one)
def int_float_mix(x):
    scale = 1 / 3
    n = 7 // 2
    return x * scale * n + 0.5


@case(one)
def bool_arith(x):
    return x * (True + True) + (3 - False)


@case(one)
def string_format_specs(x):
    s = "{:.2f}-{}".format(3.14159, "a") + f"{x.shape[0]:03d}"
    return x * len(s)


@case(one)
def tuple_compare_shapes(x):
    return x * 2 if x.shape == (4, 6) else x


@case(one)
def torch_size_ops(x):
    s = x.shape
    return torch.zeros(s[:-1] + (2,)), torch.Size([2, 3]).numel()


@case(one)
def finfo_eps(x):
    return x + torch.finfo(x.dtype).eps if False else x + 1e-6


@case(one)
def clamp_with_consts(x):
    lo, hi = -0.5, 0.5
    return x.clamp(lo, hi), torch.clamp(x, min=lo)


@case(lambda: (r(4, 6), r(6, 3)))
def addmm_baddbmm(x, w):
    b = torch.zeros(3)
    return torch.addmm(b, x, w), torch.baddbmm(torch.zeros(1, 4, 3), x[None], w[None])


@case(lambda: (r(2, 4, 6),))
def sdpa(x):
    return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)


@case(lambda: (r(4, 6),))
def rng_dropout_train(x):
    return torch.nn.functional.dropout(x, 0.5, training=True)


@case(lambda: (r(4, 6),))
def rng_randn_like(x):
    return x + torch.randn_like(x)


@case(lambda: (torch.arange(12.0).view(3, 4),))
def gather_scatter(x):
    idx = torch.tensor([[0, 1], [2, 3], [1, 0]])
    return x.gather(1, idx), torch.zeros(3, 4).scatter(1, idx, 1.0)


@case(lambda: (r(4, 6),))
def flip_roll_pad(x):
    return x.flip(0), x.roll(1, dims=1), torch.nn.functional.pad(x, (1, 1))


@case(lambda: (r(4, 6),))
def one_hot_argmax(x):
    return torch.nn.functional.one_hot(x.argmax(-1), 6)


@case(lambda: (r(4, 6),))
def norms(x):
    return x.norm(), torch.linalg.vector_norm(x, dim=1), x.pow(2).sum().rsqrt()


@case(lambda: (r(4, 6),))
def complex_indexing(x):
    return x[[0, 2]], x[1:3, [0, 5]], x[:, None, 2:]


@case(lambda: (r(4, 6),))
def logical_ops(x):
    a, b = x > 0, x < 0.5
    return a & b, a | b, ~a, torch.logical_xor(a, b)


@case(lambda: (r(4, 6),))
def any_all_tensor_methods(x):
    return (x > 0).any(), (x > -10).all(dim=1)


@case(lambda: (r(4, 6),))
def cross_entropy_loss(x):
    target = torch.tensor([0, 1, 2, 3])
    return torch.nn.functional.cross_entropy(x, target)


@case(lambda: (r(4, 6),))
def mse_l1_losses(x):
    y = torch.zeros_like(x)
    return torch.nn.functional.mse_loss(x, y), torch.nn.functional.l1_loss(x, y)
