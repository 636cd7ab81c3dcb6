"""Calls of user functions (inlined): closures, defaults, *args/**kwargs, methods, super(),
recursion, decorators, functools.partial."""

import functools

import torch

from . import case


def r(*shape):
    return torch.randn(*shape)


def one():
    return (r(3, 4),)


def helper_scale(t, k=2.0):
    return t * k


def helper_multi(a, b, *rest, scale=1.0, **extra):
    out = a + b
    for t in rest:
        out = out + t
    for v in extra.values():
        out = out + v
    return out * scale


@case(one)
def call_helper(x):
    return helper_scale(x) + helper_scale(x, 3.0) + helper_scale(t=x, k=0.5)


@case(one)
def call_varargs(x):
    return helper_multi(x, x, x, x, scale=2.0, bias=x)


@case(one)
def call_star_args(x):
    args = (x, x * 2)
    kwargs = {"scale": 3.0}
    return helper_multi(*args, **kwargs)


def make_adder(n):
    def add(t):
        return t + n

    return add


ADD3 = make_adder(3)


@case(one)
def global_closure(x):
    return ADD3(x)


@case(one)
def nested_closure(x):
    scale = 4

    def inner(t):
        return t * scale

    return inner(x) + inner(x + 1)


@case(one)
def closure_over_tensor(x):
    y = x * 2

    def inner(t):
        return t + y

    return inner(x)


@case(one)
def nonlocal_counter(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count

    a = bump(x)
    b = bump(x)
    return a + b, count


@case(one)
def recursion_fixed_depth(x):
    def rec(t, n):
        return t if n == 0 else rec(t * 2, n - 1)

    return rec(x, 3)


def decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return wrapper


@decorated
def inner_decorated(t):
    return t * 3


@case(one)
def call_decorated(x):
    return inner_decorated(x)


@case(one)
def functools_partial(x):
    f = PARTIAL
    return f(x)


PARTIAL = functools.partial(helper_scale, k=5.0)


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        return t * self.k

    @property
    def double(self):
        return self.k * 2

    @staticmethod
    def static_add(t):
        return t + 1

    @classmethod
    def make(cls, k):
        return cls(k)


SCALER = Scaler(3.0)


@case(one)
def method_of_global_object(x):
    return SCALER.apply(x) + SCALER.double


@case(one)
def staticmethod_classmethod(x):
    return Scaler.static_add(x) + SCALER.static_add(x)


@case(one)
def object_created_inside(x):
    s = Scaler(2.0)
    return s.apply(x) + s.k


@case(one)
def classmethod_constructor(x):
    s = Scaler.make(4.0)
    return s.apply(x)


class Base:
    def f(self, t):
        return t + 1


class Child(Base):
    def f(self, t):
        return super().f(t) * 2


@case(one)
def super_method(x):
    return Child().f(x)


class TwoArgSuper(Base):
    def f(self, t):
        return super(TwoArgSuper, self).f(t) - 1


@case(one)
def super_two_args(x):
    return TwoArgSuper().f(x)


@case(one)
def lambda_closure_list(x):
    fns = [lambda t, i=i: t * i for i in range(3)]
    return sum(f(x) for f in fns) if False else fns[0](x) + fns[1](x) + fns[2](x)


@case(one)
def keyword_only(x):
    def f(t, *, a, b=2):
        return t * a + b

    return f(x, a=3) + f(x, b=1, a=1)


@case(one)
def positional_only(x):
    def f(t, k, /):
        return t - k

    return f(x, 1)


@case(one)
def default_mutable_read(x, opts={"k": 2}):  # noqa: B006
    return x * opts["k"]


class Mul:
    def __call__(self, t):
        return t * 7


@case(one)
def callable_object(x):
    return Mul()(x)


@case(one, eager_fallback=True)
def class_defined_inside(x):
    class Local:
        pass

    return x * 2


@case(one)
def deep_call_chain(x):
    def a(t):
        return b(t) + 1

    def b(t):
        return c(t) * 2

    def c(t):
        return t - 3

    return a(x)


@case(one)
def function_attributes(x):
    return x * len(helper_scale.__name__)


@case(one)
def return_function_result_tuple(x):
    def two(t):
        return t + 1, t - 1

    a, b = two(x)
    return a * b


@case(one)
def generator_function_call(x):
    def gen(t):
        yield t
        yield t * 2

    return sum(gen(x)) if False else torch.stack(list(gen(x)))
