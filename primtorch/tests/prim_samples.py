"""Sample calls for every prim: inputs of several layouts, and what torch eager computes for them.

`SAMPLES[name]()` yields (args, kwargs, expected) where expected is a callable giving torch's own
answer (or None when the reference is torch's own op called directly).
"""

from __future__ import annotations

import torch

from ember.primtorch import prims

cl = torch.channels_last
SHAPE = (2, 3, 4, 5)


def _values(dtype, shape, low=0.1, high=0.9):
    g = torch.Generator().manual_seed(hash((str(dtype), shape)) % 2**31)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.rand(shape, generator=g), torch.rand(shape, generator=g)).to(
            dtype
        )
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)
    return torch.randint(1, 7, shape, generator=g).to(dtype)


def layouts(dtype, shape=SHAPE):
    """The same logical shape as contiguous, channels-last, permuted, sliced and expanded."""
    n, c, h, w = shape
    return {
        "contiguous": _values(dtype, shape),
        "channels_last": _values(dtype, shape).to(memory_format=cl),
        "permuted": _values(dtype, (n, h, c, w)).transpose(1, 2),
        "sliced": _values(dtype, (n, c, 2 * h, w))[:, :, ::2],
        "expanded": _values(dtype, (1, c, 1, w)).expand(shape),
    }


# dtype used to exercise each dtype class of the elementwise prims
CLASS_DTYPE = {
    "any": torch.float32, "no_bool": torch.float32, "float": torch.float32,
    "real_float": torch.float32, "real": torch.float32, "real_no_bool": torch.float32,
    "int": torch.int64, "int_only": torch.int64, "complex": torch.complex64,
}  # fmt: skip

POINTWISE_DTYPE = {
    "bitwise_not": torch.int64, "bitwise_and": torch.int64, "bitwise_or": torch.int64,
    "bitwise_xor": torch.int64, "shift_left": torch.int64, "shift_right_arithmetic": torch.int64,
    "gcd": torch.int64, "lcm": torch.int64, "sgn": torch.complex64, "real": torch.complex64,
    "imag": torch.complex64, "conj_physical": torch.complex64,
}  # fmt: skip

# Layout pairs a binary prim is checked on (first operand, second operand).
PAIRS = [
    ("contiguous", "contiguous"), ("channels_last", "channels_last"),
    ("channels_last", "contiguous"), ("contiguous", "channels_last"), ("permuted", "contiguous"),
    ("sliced", "sliced"), ("expanded", "channels_last"), ("sliced", "permuted"),
]  # fmt: skip


def pointwise_samples(p):
    """(args, kwargs) for a pointwise prim over every layout (pairs for binary prims)."""
    name = p.name
    dtype = POINTWISE_DTYPE.get(name, torch.float32)
    n_tensors = sum(a.type == "Tensor" for a in p.schema.args)
    lay = layouts(dtype)
    if name == "where":
        for x, y in PAIRS:
            yield (lay[x] > 0.5, lay[x], lay[y]), {}
        yield (lay["channels_last"] > 0.5, lay["channels_last"], 0.0), {}
        return
    if name == "convert_element_type":
        for t in lay.values():
            yield (t, torch.float64), {}
            yield (t, torch.int32), {}
        return
    if name == "polygamma":
        for t in lay.values():
            yield (t, 1), {}
        return
    if n_tensors == 1:
        for t in lay.values():
            yield (t,), {}
        return
    for x, y in PAIRS:
        yield (lay[x], lay[y]), {}
    number = 2 if not (dtype.is_floating_point or dtype.is_complex) else 0.5
    yield (lay["channels_last"], number), {}
    yield (number, lay["permuted"]), {}


def _f(*shape, dtype=torch.float32):
    return _values(dtype, shape)


def other_samples():
    """name -> list of (args, kwargs, eager) for the non-pointwise prims (eager may be None)."""
    x = _f(2, 3, 4, 5)
    xcl = x.to(memory_format=cl)
    xt = _f(5, 4).t()
    sl = _f(4, 10)[:, ::2]
    idx = torch.tensor([[0, 1, 0], [1, 0, 1]])
    return {
        "sum": [
            ((x, (1, 3)), {}, lambda: x.sum((1, 3))),
            ((xcl, (0, 1, 2, 3)), {}, lambda: x.sum()),
            ((sl, ()), {}, lambda: sl),
            ((xt, (0,)), {"output_dtype": torch.float64}, lambda: xt.sum(0, dtype=torch.float64)),
        ],
        "prod": [((x, (2,)), {}, lambda: x.prod(2)), ((xt, (0, 1)), {}, lambda: xt.prod())],
        "amax": [((xcl, (1,)), {}, lambda: x.amax(1)), ((sl, (0, 1)), {}, lambda: sl.amax())],
        "amin": [((xcl, (2, 3)), {}, lambda: x.amin((2, 3))), ((xt, ()), {}, lambda: xt)],
        "var": [
            ((x, (1, 2), 1.0), {}, lambda: x.var((1, 2))),
            ((xt, (0,), 0.0), {}, lambda: xt.var(0, correction=0)),
        ],
        "any": [((x > 0.5, (1,)), {}, lambda: (x > 0.5).any(1))],
        "all": [((x > 0.2, (0, 3)), {}, lambda: (x > 0.2).all(0).all(-1))],
        "xor_sum": [((_f(3, 4, dtype=torch.int64), (1,)), {}, None)],
        "argmax": [((x, 1), {}, lambda: x.argmax(1)), ((xt, None), {}, lambda: xt.argmax())],
        "argmin": [((xcl, 2), {}, lambda: x.argmin(2)), ((sl, None), {}, lambda: sl.argmin())],
        "broadcast_in_dim": [
            ((_f(3, 1), (2, 3, 4), (1, 2)), {}, None),
            ((xt, (4, 2, 5), (0, 2)), {}, None),
        ],
        "reshape": [
            ((x, (6, 20)), {}, lambda: x.reshape(6, 20)),
            ((xcl, (6, -1)), {}, lambda: x.reshape(6, 20)),
            ((xt, (20,)), {}, lambda: xt.reshape(20)),
        ],
        "split_dim": [
            ((x, 3, 5), {}, lambda: x.reshape(2, 3, 4, 5, 1)),
            ((xt, 0, 2), {}, lambda: xt.reshape(2, 2, 5)),
        ],
        "collapse_view": [
            ((x, 1, 3), {}, lambda: x.reshape(2, 12, 5)),
            ((xcl, 2, 4), {}, lambda: x.reshape(2, 3, 20)),
        ],
        "squeeze": [((_f(2, 1, 3, 1), (1, 3)), {}, None), ((_f(1, 4).t(), (-1,)), {}, None)],
        "expand_dims": [((xt, (0, 2)), {}, None), ((xcl, (4,)), {}, None)],
        "permute": [((x, (3, 0, 2, 1)), {}, None), ((xcl, (0, 2, 3, 1)), {}, None)],
        "slice": [
            ((x, (0, 1, 1, 0), (2, 3, 4, 5), (1, 1, 2, 3)), {}, lambda: x[:, 1:, 1::2, ::3]),
            ((xt, (1, 0), (4, 5)), {}, lambda: xt[1:4]),
        ],
        "slice_in_dim": [((xcl, 1, 4, 2, 2), {}, lambda: x[:, :, 1:4:2])],
        "as_strided": [((x, (3, 4), (1, 3), 2), {}, None)],
        "view_of": [((xt,), {}, lambda: xt)],
        "view_element_type": [((x, torch.int32), {}, None)],
        "cat": [(([x, x], 1), {}, None), (([xcl, xcl], 0), {}, None), (([xcl, x], 2), {}, None)],
        "pad": [
            ((x, 0.0, (0, 1, -1, 2), (1, 0, 0, -1), (0, 0, 1, 0)), {}, None),
            (
                (xcl, 1.5, (0, 0, 1, 1), (0, 0, 1, 1), (0, 0, 0, 0)),
                {},
                lambda: torch.nn.functional.pad(x, (1, 1, 1, 1), value=1.5),
            ),
        ],
        "gather": [
            ((xt, 1, idx), {}, None),
            ((xcl, 1, torch.zeros(2, 2, 4, 5, dtype=torch.int64)), {}, None),
        ],
        "scatter": [
            ((xt, 1, idx, _f(2, 3)), {}, None),
            ((xcl, 1, torch.zeros(2, 1, 4, 5, dtype=torch.int64), 2.0), {}, None),
        ],
        "scatter_add": [((xt, 1, idx, _f(2, 3)), {}, None)],
        "scatter_reduce": [
            ((xt, 1, idx, _f(2, 3), "amax"), {}, None),
            ((xt, 0, idx, _f(2, 3), "mean", False), {}, None),
        ],
        "index": [
            ((xcl, [None, torch.tensor([0, 2])]), {}, lambda: x[:, [0, 2]]),
            ((xcl, [torch.tensor([1, 0])]), {}, lambda: x[[1, 0]]),
            ((xcl, [None, None, None, torch.tensor([0, 2])]), {}, lambda: x[..., [0, 2]]),
            (
                (xcl, [None, torch.tensor([0, 2]), None, torch.tensor([1, 3])]),
                {},
                lambda: x[:, [0, 2], :, [1, 3]],
            ),
            ((xt, [torch.tensor([[0], [1]]), torch.tensor([1, 2, 3])]), {}, None),
        ],
        "index_put": [
            ((xcl, [torch.tensor([1, 0])], _f(3, 4, 5)), {}, None),
            ((xt, [None, torch.tensor([0, 0])], _f(4, 2), True), {}, None),
        ],
        "clone": [((xt,), {}, None), ((sl,), {}, None), ((xcl,), {}, None)],
        "copy_strided": [((x, (1, 2, 6, 24)), {}, None)],
        "device_put": [((xcl, "cpu"), {}, None)],
        "rev": [((xcl, (1, 3)), {}, lambda: torch.flip(x, (1, 3))), ((sl, (0,)), {}, None)],
        "full": [(((2, 3), 1.5, torch.float32, "cpu"), {}, lambda: torch.full((2, 3), 1.5))],
        "iota": [
            ((5, 2, 3, torch.int64, "cpu"), {}, lambda: torch.arange(2, 17, 3)),
            ((4, 0.5, 0.25, torch.float32, "cpu"), {}, lambda: torch.arange(4) * 0.25 + 0.5),
        ],
        "empty_strided": [(((2, 3), (1, 2), torch.float32, "cpu"), {}, None)],
        "empty_permuted": [(((2, 3, 4, 5), (0, 2, 3, 1), torch.float16, "cpu"), {}, None)],
        "scalar_tensor": [
            ((2.5, torch.float64, "cpu"), {}, lambda: torch.tensor(2.5, dtype=torch.float64))
        ],
        "philox_rand": [
            (((3, 5), 0, 0, torch.float32, "cpu"), {}, None),
            (((4,), torch.tensor(7), torch.tensor(3), torch.bfloat16, "cpu"), {}, None),
        ],
        "philox_bits": [(((2, 2), 1, 2, "cpu"), {}, None)],
    }


@torch.library.custom_op("ember_prim_samples::scaled_t", mutates_args=("acc",))
def _scaled_t(x: torch.Tensor, acc: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    acc.add_(x)
    return (x * scale).t().contiguous().t()  # a column-major output, as the fake kernel says


@_scaled_t.register_fake
def _(x, acc, scale=2.0):
    return torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype, device=x.device)


def extern_samples():
    """name -> list of (args, kwargs) for the extern ops testable on CPU."""
    a, b = _f(3, 4), _f(4, 5)
    x = _f(2, 3, 6, 5)
    w = _f(4, 3, 3, 3)
    q, k, v = _f(2, 3, 4, 8), _f(2, 3, 5, 8), _f(2, 3, 5, 8)
    qt = _f(2, 4, 3, 8).transpose(1, 2)
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    go = _f(2, 4, 6, 5)
    return {
        "custom_op": [(("ember_prim_samples::scaled_t.default", [a, _f(3, 4), 3.0], [1]), {})],
        "mm": [((a, b), {}), ((_f(4, 3).t(), b), {})],
        "bmm": [((_f(2, 3, 4), _f(2, 5, 4).transpose(1, 2)), {})],
        "addmm": [((_f(5), a, b), {"beta": 0.5})],
        "baddbmm": [((_f(2, 3, 5), _f(2, 3, 4), _f(2, 4, 5)), {"alpha": 2})],
        "convolution": [
            ((x, w, None, *conv), {}),
            ((x.to(memory_format=cl), w, _f(4), *conv), {}),
            ((x, w, None, [2, 1], [0, 1], [1, 2], False, [0, 0], 1), {}),
            ((_f(2, 4, 3, 3), _f(4, 2, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 0], 2), {}),
        ],
        "convolution_backward": [
            ((go, x, w, [4], *conv, [True, True, True]), {}),
            ((go, x.to(memory_format=cl), w, None, *conv, [True, True, False]), {}),
            ((go, x, w, None, *conv, [False, True, False]), {}),
        ],
        "sdpa_flash_cpu": [((q, k, v), {}), ((qt, k, v, 0.0, True), {"scale": 0.5})],
        "sdpa_flash_cpu_backward": [
            (
                (_f(2, 3, 4, 8), q, k, v)
                + tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v))
                + (0.0, False),
                {},
            )
        ],
        "sort": [((_f(5, 4).t(), 0), {}), ((x.to(memory_format=cl), 1, True), {"stable": True})],
        "topk": [((_f(5, 4).t(), 2, 0), {}), ((x, 3), {"largest": False})],
        "cumsum": [((_f(5, 4).t(), 0), {}), ((_f(3, 4, dtype=torch.int32), 1), {})],
        "cumprod": [((x.to(memory_format=cl), 1), {"dtype": torch.float64})],
        "cummax": [((_f(5, 4).t(), 0), {})],
        "cummin": [((x, 2), {})],
        "logcumsumexp": [((x.to(memory_format=cl), 3), {})],
        "nonzero": [((x > 0.5,), {})],
        "masked_select": [((x, x > 0.5), {})],
    }


CUDA_ONLY_EXTERNS = {
    "sdpa_flash",
    "sdpa_flash_backward",
    "sdpa_efficient",
    "sdpa_efficient_backward",
    "sdpa_cudnn",
}


def all_prims():
    return [p for p in prims.PRIMS.values()]
