"""Python data structures and builtins around tensors: lists, tuples, dicts, sets, unpacking,
slicing, comprehensions, f-strings and the builtins the interpreter models."""

import torch

from . import case


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(4, 3),)


def two():
    return (r(4, 3), r(4, 3))


@case(one)
def list_build_index(x):
    items = [x, x * 2, x * 3]
    return items[1] + items[-1]


@case(one)
def list_append_loop(x):
    out = []
    for i in range(3):
        out.append(x + i)
    return torch.stack(out)


@case(one)
def list_comprehension(x):
    return sum([x * i for i in range(4)])


@case(one)
def nested_comprehension(x):
    rows = [[x[i, j] for j in range(2)] for i in range(2)]
    return torch.stack([torch.stack(r) for r in rows])


@case(one)
def comprehension_with_if(x):
    return [x + i for i in range(6) if i % 2 == 0]


@case(one)
def dict_comprehension(x):
    d = {f"k{i}": x * i for i in range(3)}
    return d["k2"] - d["k1"]


@case(one)
def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x * len(s)


@case(one)
def generator_expression_sum(x):
    return sum(x * i for i in range(3)) if False else sum([x * i for i in range(3)])


@case(one)
def tuple_unpack(x):
    a, b = x * 2, x + 1
    (c, d), e = (a, b), a
    return c + d + e


@case(one)
def star_unpack(x):
    first, *middle, last = [x, x + 1, x + 2, x + 3]
    return first + last + sum(middle)


@case(one)
def swap_vars(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b


@case(one)
def list_slicing(x):
    items = [x + i for i in range(5)]
    return sum(items[1:4]) + sum(items[::2]) + items[-2]


@case(one)
def list_slice_assign(x):
    items = [x, x, x]
    items[1:2] = [x * 5, x * 6]
    return torch.stack(items)


@case(one)
def list_methods(x):
    items = [x]
    items.extend([x + 1, x + 2])
    items.insert(0, x - 1)
    last = items.pop()
    items.reverse()
    return last + items[0] + len(items)


@case(one)
def list_concat_repeat(x):
    a = [x] * 2 + [x * 3]
    return torch.cat(a, dim=0)


@case(one)
def dict_ops(x):
    d = {"a": x, "b": x * 2}
    d["c"] = d["a"] + d["b"]
    d.update(e=x * 5)
    total = 0
    for k, v in d.items():
        total = total + v
    return total, list(d.keys()), d.get("missing", 3)


@case(one)
def dict_iteration_order(x):
    d = dict(z=x, a=x + 1)
    return [d[k] for k in d]


@case(one)
def dict_pop_setdefault(x):
    d = {"a": x}
    d.setdefault("b", x * 2)
    v = d.pop("a")
    return v + d["b"], "a" in d, len(d)


@case(one)
def dict_merge_ops(x):
    a = {"a": x}
    b = {"b": x + 1}
    c = {**a, **b}
    return c["a"] + c["b"], (a | b)["b"]


@case(one)
def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    t = s | {5}
    return x * len(t), 3 in s, sorted(s & {1, 2, 9})


@case(one)
def fstring_format(x):
    name = f"layer_{x.shape[0]}_{x.dtype}"
    return x * len(name), name


@case(one)
def string_methods(x):
    s = "a,b,c".split(",")
    return x * len(s), "-".join(s).upper(), "abc".startswith("a")


@case(one)
def builtin_len_range(x):
    return sum(x[i] for i in range(len(x))) if False else torch.stack([x[i] for i in range(len(x))])


@case(one)
def builtin_enumerate(x):
    out = 0
    for i, row in enumerate(x):
        out = out + row * i
    return out


@case(two)
def builtin_zip(x, y):
    return [a * b for a, b in zip(x, y)]


@case(one)
def builtin_reversed_sorted(x):
    idx = sorted([3, 1, 2], reverse=True)
    return [x[i] for i in reversed(idx)]


@case(one)
def builtin_min_max_consts(x):
    return x * min(3, 5) + max([1, 7, 2]) + abs(-2)


@case(one)
def builtin_any_all(x):
    flags = [x.shape[0] > 1, x.dim() == 2]
    return x * 2 if all(flags) and any(flags) else x


@case(one)
def builtin_isinstance(x):
    if isinstance(x, torch.Tensor) and not isinstance(x, (list, dict)):
        return x + 1
    return x


@case(one)
def builtin_getattr_hasattr(x):
    f = getattr(torch, "relu")
    return f(x) if hasattr(torch, "relu") else x


@case(one)
def builtin_int_float_bool(x):
    n = int("3") + int(2.5) + round(1.6)
    return x * float(n) * bool(n)


@case(one)
def builtin_type_checks(x):
    return x + (1 if type(x) is torch.Tensor else 0)


@case(one)
def builtin_map_filter(x):
    vals = list(map(lambda i: x * i, range(3)))
    keep = list(filter(lambda i: i > 0, [0, 1, 2]))
    return sum(vals) + len(keep)


@case(one)
def builtin_iter_next(x):
    it = iter([x, x * 2, x * 3])
    a = next(it)
    b = next(it)
    return a + b + next(it, x)


@case(one)
def builtin_divmod_pow(x):
    q, rem = divmod(17, 5)
    return x * q + pow(2, rem)


@case(one)
def tuple_ops(x):
    t = (1, 2) + (3,)
    return x * len(t), t.index(2), t.count(1), t[::-1]


@case(one)
def none_checks(x, bias=None):
    y = x * 2
    if bias is not None:
        y = y + bias
    return y if y is not None else x


@case(one)
def chained_comparison(x):
    n = x.shape[0]
    return x * 2 if 0 < n <= 10 else x


@case(one)
def ternary_and_or(x):
    a = 0 or 5
    b = 3 and 4
    return x * a + b


@case(one)
def augmented_assign(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    y /= 3
    n = 1
    n += 2
    return y, n


@case(one)
def list_of_tuples_return(x):
    return [(x, 1), (x + 1, 2)]


@case(one)
def nested_containers(x):
    data = {"a": [x, (x * 2, {"b": x * 3})]}
    return data["a"][1][1]["b"] + data["a"][0]


@case(one)
def while_loop_counter(x):
    i = 0
    while i < 3:
        x = x + i
        i += 1
    return x


@case(one)
def for_else_break(x):
    for i in range(5):
        if i == 3:
            break
        x = x * 1.5
    else:
        x = x * 0
    return x


@case(one)
def continue_in_loop(x):
    for i in range(4):
        if i % 2:
            continue
        x = x + i
    return x


@case(one)
def try_finally_no_exception(x):
    try:
        y = x + 1
    finally:
        z = 2
    return y * z


@case(one)
def try_except_not_taken(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    return y


@case(one)
def assert_statement(x):
    assert x.dim() == 2, "expects a matrix"
    return x.sum(0)


@case(one)
def global_constant(x):
    return x * SCALE + OFFSETS[1]


SCALE = 3.0
OFFSETS = (1, 2, 3)


@case(one)
def slice_objects(x):
    s = slice(1, 3)
    return x[s], x[slice(None, None, 2)]


@case(one)
def ellipsis_index(x):
    return x[..., 0], x[...]


@case(one)
def range_attributes(x):
    rg = range(2, 10, 3)
    return x * rg.start + len(rg) + rg[-1]


@case(one)
def conditional_on_shape(x):
    if x.shape[0] > 2:
        return x[:2]
    return x


@case(one)
def lambda_inline(x):
    f = lambda t, k=2: t * k  # noqa: E731
    return f(x) + f(x, k=3)


@case(one)
def import_inside(x):
    import math

    return x * math.pi


@case(one)
def bytes_and_complex_consts(x):
    return x * len(b"abc") + (1 + 2j).real
