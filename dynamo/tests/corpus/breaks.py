"""Graph breaks: the unsupported instruction runs in Python and a resume function continues."""

import time

import torch

from . import case


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(3, 4),)


def log(*args):
    print(*args)


def _plain(t):
    return t * 2


@case(one, graphs=2, breaks=1)
def print_in_middle(x):
    y = x * 2
    print("y computed")
    return y + 1


@case(one, graphs=1, breaks=1)
def print_at_start(x):
    print("start")
    return x.relu()


@case(one, graphs=1, breaks=1)
def print_at_end(x):
    y = x.sin()
    print("done")
    return y


@case(one, graphs=2, breaks=1)
def item_break(x):
    s = x.sum().item()
    return x * s


@case(lambda: (torch.ones(3, 4),), graphs=2, breaks=1)
def data_dependent_branch_true(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@case(lambda: (-torch.ones(3, 4),), graphs=2, breaks=1)
def data_dependent_branch_false(x):
    y = x * 3
    if y.mean() > 0:
        return y + 1
    return y - 1


@case(one, graphs=3, breaks=2)
def two_prints(x):
    a = x + 1
    print("a")
    b = a * 2
    print("b")
    return b - 1


@case(one, graphs=2, breaks=2)
def break_in_helper(x):
    y = x * 2
    log("in helper")
    return y + 1


def helper_with_print(t):
    t = t + 1
    print("inside")
    return t * 2


@case(one, graphs=4, breaks=2)
def break_inside_inlined(x):
    y = x - 1
    z = helper_with_print(y)
    return z / 2


@case(one, graphs=2, breaks=1)
def live_locals_across_break(x):
    a = x + 1
    b = [a, a * 2]
    d = {"k": a}
    n = 3
    print("break")
    return b[1] + d["k"] + n + a


@case(one, graphs=3, breaks=3)
def break_in_loop(x):
    for i in range(3):
        x = x + i
        print(i)
    return x


@case(one, graphs=2, breaks=1)
def break_with_stack_values(x):
    return x + torch.tensor(x.sum().item())


@case(one, graphs=2, breaks=1)
def tolist_break(x):
    vals = x[0].tolist()
    return x * len(vals)


@case(one, graphs=2, breaks=1)
def nonzero_break(x):
    idx = torch.nonzero(x > 0)
    return idx.shape[0] * x.sum()


@case(one, graphs=1, breaks=1)
def disabled_function_call(x):
    return DISABLED(x) + 1


@case(one, graphs=1, breaks=1)
def kwargs_at_break(x):
    y = x * 2
    print("value", sep="=", end="\n")
    return y


# The print would run outside the try block's handler: the frame runs eagerly instead.
@case(one, eager_fallback=True)
def try_block_break(x):
    try:
        y = x * 2
        print("in try")
        y = y + 1
    except RuntimeError:
        y = x
    return y


@case(one, graphs=2, breaks=1)
def unknown_c_function(x):
    y = x + 1
    # hash of an object the tracer cannot hold as a constant: a break, resumed with the hash on
    # the stack. The object is the same at every call (hash(object()) was not: a new object's
    # address, and so the resume function's guard, changed whenever the allocator moved it).
    n = hash(time.get_clock_info) % 1
    return y * (n + 1)


@case(one)  # Tensor.numpy() is traced as an ndarray value (numpy_values.py): no break
def numpy_break(x):
    arr = x.numpy()
    return x * float(arr.shape[0])


@case(one, graphs=1, breaks=1)
def bool_mask_index(x):
    y = x * 2
    return y[y > 0].sum() if False else y[y > 0]


@case(one, graphs=2, breaks=1)
def closure_over_global_break(x):
    y = x.cos()
    print(y.shape)
    return y.sin()


# 3.11 calls a comprehension function, 3.12 inlines it: the graph counts differ.
@case(one, graphs=None, breaks=None)
def break_in_comprehension_helper(x):
    vals = [helper_with_print(t) for t in [x]]
    return vals[0] + 1


@case(lambda: (torch.ones(3, 4),), graphs=2, breaks=2)
def data_dependent_while(x):
    n = 0
    while x.sum() > 10:
        x = x * 0.5
        n += 1
    return x, n


@case(one, graphs=2, breaks=1)
def method_call_break(x):
    y = x + 1
    s = y.max().item()
    return y / (abs(s) + 1)


@case(one, graphs=2, breaks=1)
def inplace_then_break(x):
    y = x.clone()
    y.add_(1)
    print("after inplace")
    return y * 2


import ember  # noqa: E402

DISABLED = ember.disable(_plain)


@case(one, graphs=2, breaks=1)
def break_with_cell_variables(x):
    scale = 3
    y = (lambda t: t * scale)(x)
    print("break")
    scale = scale + 1
    return y + scale, [y * scale for _ in range(2)]


# A closure still alive at the break cannot share its cells with the resume function: eager.
@case(lambda: (r(3, 4), 5), eager_fallback=True)
def break_with_live_closure(x, n):
    def inner(t):
        return t * n

    y = inner(x)
    print("break")
    return inner(y)


@case(one, graphs=2, breaks=1)
def break_inside_loop_with_iterator_state(x):
    out = []
    for i, row in enumerate(x):
        out.append(row * i)
        if i == 1:
            print("half way")
    return torch.stack(out)


@case(one, graphs=1, breaks=1)
def try_finally_break_outside(x):
    try:
        y = x * 2
    finally:
        y = y + 1
    print("after the try block")
    return y


@case(one, eager_fallback=True)
def break_caught_by_except(x):
    try:
        v = x.sum().item()  # a break inside try/except
    except RuntimeError:
        v = 0.0
    return x * v
