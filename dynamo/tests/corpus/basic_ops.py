"""Tensor arithmetic, torch functions and tensor methods: one graph each."""

import operator

import torch
import torch.nn.functional as F

from . import case


def r(*shape):
    return torch.randn(*shape)


def two():
    return (r(3, 4), r(3, 4))


def one():
    return (r(3, 4),)


@case(two)
def add(x, y):
    return x + y


@case(two)
def sub_mul_div(x, y):
    return (x - y) * y / (x.abs() + 1)


@case(two)
def pow_neg(x, y):
    return -(x**2) + y ** 3


@case(one)
def negative_number_base_pow(x):
    return (-2) ** x, (-1.5) ** x.abs().round()


@case(two)
def compare_ops(x, y):
    return (x > y), (x <= y), (x == x), (x != y)


@case(lambda: (r(3, 4), r(4, 5)))
def matmul_op(x, y):
    return x @ y


@case(one)
def scalar_ops(x):
    return 2 * x + 1.5 - x / 3 + 7 // 2


@case(one)
def reverse_scalar(x):
    return 1 - x, 2 / (x.abs() + 1), 3**x


@case(one)
def unary_funcs(x):
    return torch.sin(x) + torch.cos(x) + torch.exp(x.clamp(max=2)) + torch.tanh(x)


@case(one)
def sigmoid_relu(x):
    return torch.sigmoid(x) * torch.relu(x)


@case(one)
def functional_acts(x):
    return F.gelu(x) + F.silu(x) + F.leaky_relu(x, 0.1) + F.elu(x)


@case(one)
def softmax_logsoftmax(x):
    return F.softmax(x, dim=-1), F.log_softmax(x, dim=1)


@case(one)
def reductions(x):
    return x.sum(), x.mean(dim=0), x.amax(-1), x.std(), x.var(dim=1, keepdim=True)


@case(one)
def sum_keepdim(x):
    return torch.sum(x, dim=1, keepdim=True) / x.shape[1]


@case(one)
def max_with_indices(x):
    values, indices = torch.max(x, dim=1)
    return values * 2, indices


@case(one)
def max_structseq_attrs(x):
    out = x.max(dim=0)
    return out.values, out.indices


@case(one)
def topk_unpack(x):
    v, i = x.topk(2, dim=-1)
    return v.sum(-1), i


@case(one)
def view_reshape(x):
    return x.view(4, 3).reshape(2, 6).flatten()


@case(one)
def permute_transpose(x):
    return x.t().contiguous(), x.permute(1, 0), x.transpose(0, 1).T


@case(one)
def unsqueeze_squeeze(x):
    return x.unsqueeze(0).unsqueeze(-1).squeeze(-1)


@case(one)
def expand_repeat(x):
    return x[:, :1].expand(3, 4) + x.repeat(1, 1)


@case(two)
def cat_stack(x, y):
    return torch.cat([x, y], dim=0), torch.stack((x, y), dim=1)


@case(one)
def split_chunk(x):
    a, b = x.split(2, dim=1)
    c, d = torch.chunk(x, 2, dim=1)
    return a + c, b * d


@case(one)
def unbind_loop(x):
    total = 0
    for row in x.unbind(0):
        total = total + row
    return total


@case(one)
def index_basic(x):
    return x[0], x[:, 1], x[1:, ::2], x[..., -1]


@case(one)
def index_none(x):
    return x[None, :, None].shape, x[None]


@case(lambda: (r(5, 3), torch.tensor([0, 2, 4])))
def index_tensor(x, idx):
    return x[idx]


@case(one)
def setitem_inplace(x):
    y = x.clone()
    y[0] = 0.0
    y[:, 1] += 1
    return y


@case(one)
def inplace_ops(x):
    y = x * 1
    y.add_(1).mul_(2)
    y.clamp_(min=0)
    return y


@case(one)
def inplace_on_input(x):
    x.mul_(2)
    return x + 1


@case(two)
def where_masked(x, y):
    return torch.where(x > 0, x, y), x.masked_fill(x < 0, 0.0)


@case(one)
def creation_ops(x):
    return torch.zeros_like(x) + torch.ones(3, 4) + torch.full((3, 4), 2.0) + torch.eye(3, 4)


@case(one)
def arange_linspace(x):
    return x + torch.arange(4), torch.linspace(0, 1, steps=5)


@case(one)
def new_methods(x):
    return x.new_zeros(2, 2), x.new_ones((3,)), x.new_full((2,), 3.0)


@case(one)
def dtype_conversion(x):
    return x.to(torch.float64), x.double(), x.int(), x.type(torch.float16), x.long().float()


@case(one, graphs=0)
def tensor_attrs(x):
    return x.shape, x.dtype, x.device, x.ndim, x.size(1), x.dim(), x.numel(), x.requires_grad


@case(one)
def shape_arith(x):
    b, n = x.shape
    return x.view(b * n) * (b + n), x.size()[-1]


@case(one, graphs=0)
def stride_contig(x):
    return x.stride(), x.is_contiguous(), x.t().is_contiguous()


@case(one)
def einsum_bmm(x):
    return torch.einsum("ij,kj->ik", x, x), torch.bmm(x[None], x.t()[None])


@case(one)
def layer_norm_fn(x):
    return F.layer_norm(x, (4,)), F.normalize(x, dim=-1)


@case(lambda: (r(2, 3, 8, 8), r(4, 3, 3, 3)))
def conv_pool(x, w):
    y = F.conv2d(x, w, padding=1)
    return F.max_pool2d(y, 2), F.avg_pool2d(y, 2), F.adaptive_avg_pool2d(y, 1)


@case(one)
def linear_fn(x):
    w = torch.ones(5, 4)
    return F.linear(x, w), F.linear(x, w, torch.zeros(5))


@case(one)
def dropout_eval(x):
    return F.dropout(x, p=0.5, training=False)


@case(one)
def clone_detach(x):
    return x.clone().detach() + x.data


@case(one)
def cumsum_sort(x):
    return x.cumsum(1), torch.sort(x, dim=1).values, x.argsort(dim=0)


@case(one)
def operator_module(x):
    return operator.add(x, 1), operator.mul(x, x), operator.neg(x), operator.getitem(x, 0)


@case(one)
def tril_triu_masks(x):
    mask = torch.tril(torch.ones(3, 4, dtype=torch.bool))
    return x.masked_fill(~mask, float("-inf")).softmax(-1)


@case(lambda: (torch.randint(0, 10, (3, 4)),))
def int_ops(x):
    return x // 3, x % 3, x & 1, x | 2, x ^ 3, x << 1, x >> 1


@case(lambda: (r(3, 4).requires_grad_(),))
def requires_grad_input(x):
    return (x * 2).sum()


@case(one)
def torch_tensor_const(x):
    return x + torch.tensor([1.0, 2.0, 3.0, 4.0])


@case(one)
def chained_methods(x):
    return x.abs().sqrt().log1p().exp().sum(dim=-1).mean()


@case(two)
def tensor_method_descriptor(x, y):
    return torch.Tensor.add(x, y), torch.Tensor.relu(x)


@case(one)
def scalar_tensor_math(x):
    s = x.sum()
    return x / s, x - x.mean()


@case(two)
def number_plus_equals_tensor(x, y):
    # `acc = 0; acc += t`: the number has no in-place add, so Python computes 0 + t (T5's
    # position bias starts this way).
    acc = 0
    acc += x * y
    acc -= y
    return acc
