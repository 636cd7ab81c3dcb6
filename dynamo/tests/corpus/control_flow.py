"""torch.cond, torch.while_loop and map: each call one node with subgraphs, no graph break."""

import functorch.experimental.control_flow as control_flow
import torch
import torch.nn as nn

from . import case, module_case

SCALE = torch.linspace(0.5, 2.0, 6)


def vec():
    return (torch.randn(6),)


def two():
    return torch.randn(6), torch.randn(6)


def rows():
    return torch.randn(4, 6), torch.randn(6)


@case(vec)
def cond_data_dependent(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


@case(vec)
def cond_false_branch_then_more_ops(x):
    y = torch.cond(x.abs().sum() > 1e6, lambda x: x * 2, lambda x: x - 3, (x,))
    return y.relu() + 1


@case(two)
def cond_two_operands_tuple_result(x, y):
    return torch.cond(x.mean() > y.mean(), lambda a, b: (a + b, a * b),
                      lambda a, b: (a - b, a / (b.abs() + 1)), (x, y))  # fmt: skip


@case(vec)
def cond_closure_over_global_tensor(x):
    return torch.cond(x[0] > 0, lambda a: a * SCALE, lambda a: a + SCALE, (x,))


@case(two)
def cond_closure_over_local_tensor(x, y):
    z = y * 2

    def yes(a):
        return a + z

    def no(a):
        return a - z

    return torch.cond(x.max() > 0, yes, no, (x,))


@case(vec)
def cond_python_predicate(x):
    return torch.cond(x.dim() == 1, lambda a: a.exp(), lambda a: a.log(), (x,))


@case(two)
def cond_nested(x, y):
    def outer(a, b):
        return torch.cond(b.sum() > 0, lambda p, q: p + q, lambda p, q: p - q, (a, b))

    return torch.cond(x.sum() > 0, outer, lambda a, b: a * b, (x, y))


@case(vec)
def while_loop_counter(x):
    def cond_fn(i, a):
        return i < 4

    def body_fn(i, a):
        return i + 1, a * 0.5 + 1

    return torch.while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


@case(vec)
def while_loop_until_value(x):
    limit = x.abs().sum() + 10
    return torch.while_loop(lambda a: a.sum() < limit, lambda a: (a.abs() + 1,), (x,))


@case(rows)
def map_rows(xs, b):
    return control_flow.map(lambda x, b: (x * b).sum(), xs, b)


@module_case(lambda: (torch.randn(3, 4),))
class CondModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.down = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.mean() > 0, self.up, self.down, (x,)).tanh()
