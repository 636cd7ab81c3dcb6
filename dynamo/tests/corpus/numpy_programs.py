"""NumPy programs: ndarray inputs, NumPy functions and operators traced as tensor ops (one graph
each, NumPy's dtypes and NumPy scalars in the results), and NumPy functions with no mapping
breaking the graph."""

import numpy as np
import torch

from . import case


def _rng(seed=0):
    return np.random.default_rng(seed)


def mat32():
    return (_rng().standard_normal((4, 5)).astype(np.float32),)


def two64():
    g = _rng()
    return (g.standard_normal((3, 4)), g.standard_normal((4, 2)))


def ints():
    return (_rng().integers(-9, 10, (3, 4)),)


@case(mat32)
def sum_exp_sin(x):
    return np.sum(np.exp(np.sin(x)), axis=1)


@case(mat32)
def softmax_rows(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@case(two64)
def linear_relu(x, w):
    return np.maximum(x @ w + 0.5, 0.0)


@case(ints)
def int_promotion(a):
    return a + 1.5, a // 2, a / 4, np.mean(a), a.sum(), (a > 0).sum(axis=0)


@case(mat32)
def normalise_columns(x):
    mu = x.mean(axis=0)
    sd = x.std(axis=0) + 1e-5
    return (x - mu) / sd, float(x.shape[0])


@case(mat32)
def inplace_update(x):
    x += 1
    x[:, 0] = 0.0
    x *= 2
    return x.sum()


@case(mat32)
def creation_float64(x):
    grid = np.linspace(0.0, 1.0, x.shape[1])
    ramp = np.arange(x.shape[0]).reshape(-1, 1)
    return x * grid + ramp, np.zeros_like(x) + np.ones(x.shape[1])


@case(mat32)
def indexing(x):
    return x[1:, ::2], x[:, -1], x[0, 0], x[np.array([2, 0])], x[..., None].shape


@case(two64)
def joins_and_shapes(x, w):
    y = np.concatenate([x, w.T], axis=0)
    z = np.stack([x.ravel(), x.T.reshape(-1)], axis=1)
    return y.reshape(2, -1), np.transpose(z), np.expand_dims(y, 0).ndim


@case(mat32)
def where_clip_argmax(x):
    y = np.where(x > 0, x, 0.1 * x)
    return np.clip(y, -0.5, 0.5), np.argmax(y, axis=1), np.argmin(y), y.dtype == np.float32


@case(mat32)
def loop_over_rows(x):
    acc = np.zeros(x.shape[1], dtype=x.dtype)
    for i, row in enumerate(x):
        acc = acc + row * (i + 1)
    return acc


@case(mat32)
def torch_interop(x):
    t = torch.from_numpy(x).relu()
    return np.tanh(t.numpy()) + 1, t * 2


@case(mat32, graphs=2, breaks=1)
def unsupported_function_breaks(x):
    y = np.sin(x)
    z = np.unique(y)  # no mapping: a graph break that names np.unique
    return z * 2


@case(mat32, graphs=2, breaks=1)
def data_dependent_branch(x):
    s = np.sum(x)
    if s > 1000:  # a Python decision on array data
        return x * 0
    return x * 2
