"""A user operator with a C++ kernel (ember.register_cpp_kernel) in the C++ wrapper and packages.

The graph keeps the op opaque (extern.custom_op); the Python wrapper calls the torch op, while the
C++ wrapper and a standalone package (no Python, no libtorch) call the registered C++ kernel with
the op's tensors, its scalars and outputs laid out by its fake kernel. A mutating op writes a
private copy that becomes the mutated tensor's new value."""

import subprocess

import numpy as np
import pytest
import torch

import ember
from ember.cpp_wrapper import (EmberRuntimeError, UnsupportedArtifactError, install_run_package,
                               load_package, package)  # fmt: skip


@torch.library.custom_op("ember_cppk::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float, times: int) -> torch.Tensor:
    return (x * alpha + y) * times


@scale_add.register_fake
def _(x, y, alpha, times):
    return torch.empty_like(x)


@torch.library.custom_op("ember_cppk::accumulate", mutates_args=("acc",))
def accumulate(acc: torch.Tensor, x: torch.Tensor) -> None:
    acc.add_(x)


@accumulate.register_fake
def _(acc, x):
    return None


@torch.library.custom_op("ember_cppk::no_kernel", mutates_args=())
def no_kernel(x: torch.Tensor) -> torch.Tensor:
    return x.cos()


@no_kernel.register_fake
def _(x):
    return torch.empty_like(x)


# Any strides: the kernels index through DLTensor strides (a transposed input works as well).
SOURCE = r"""
#include "ember_runtime.h"

static float* at(const DLTensor& t, int64_t i, int64_t j) {
  return static_cast<float*>(t.data) + i * t.strides[0] + j * t.strides[1];
}

extern "C" int32_t cppk_scale_add(const EmberKernelArgs* a) {
  if (a->num_inputs != 2 || a->num_outputs != 1 || a->num_floats != 1 || a->num_ints != 1) return 2;
  const DLTensor &x = a->inputs[0], &y = a->inputs[1], &out = a->outputs[0];
  if (x.ndim != 2 || x.dtype.code != kDLFloat || x.dtype.bits != 32) return 3;
  for (int64_t i = 0; i < x.shape[0]; ++i)
    for (int64_t j = 0; j < x.shape[1]; ++j)
      *at(out, i, j) = float((*at(x, i, j) * a->floats[0] + *at(y, i, j)) * a->ints[0]);
  return 0;
}

extern "C" int32_t cppk_accumulate(const EmberKernelArgs* a) {
  const DLTensor &acc = a->inputs[0], &x = a->inputs[1];
  for (int64_t i = 0; i < x.shape[0]; ++i)
    for (int64_t j = 0; j < x.shape[1]; ++j) *at(acc, i, j) += *at(x, i, j);
  return 0;
}
"""


@pytest.fixture(scope="module", autouse=True)
def kernels():
    ember.register_cpp_kernel("ember_cppk::scale_add", SOURCE, "cppk_scale_add")
    ember.register_cpp_kernel(accumulate, SOURCE, "cppk_accumulate")
    yield


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = scale_add(self.lin(x), x.t().t(), 0.5, 3)
        acc = torch.ones_like(h)
        accumulate(acc, h.relu())  # the op writes acc: its new value is read below
        return acc * 2 + h


def test_packaged_custom_op_runs_its_cpp_kernel_standalone(tmp_path):
    torch.manual_seed(0)
    model = Model().eval()
    path = package(ember.export(model, (torch.randn(5, 6),)), tmp_path / "pkg", device="cpu")
    x = torch.randn(5, 6)  # not the export's example
    want = model(x).detach()
    torch.testing.assert_close(load_package(path)(x)[0], want)
    exe = install_run_package(tmp_path / "bin")
    np.save(tmp_path / "x.npy", x.numpy())
    r = subprocess.run([str(exe), str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), want)


def test_cpp_wrapper_option_calls_the_cpp_kernel():
    def f(x, y):
        out = scale_add(x.sin(), y, -2.0, 2)
        accumulate(x, out)  # a mutated graph input: written back after the graph
        return out + 1

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    x_eager = x.clone()
    want = f(x_eager, y)
    ember.reset()
    got = ember.compile(f, options={"cpp_wrapper": True})(x, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, x_eager)


def test_a_kernel_that_fails_fails_the_run_naming_it(tmp_path):
    def f(x):
        return scale_add(x, x, 1.0, 1)

    path = package(ember.export(f, (torch.randn(3, 2, 2),)), tmp_path / "pkg", device="cpu")
    with pytest.raises(EmberRuntimeError, match="cppk_scale_add returned a non-zero status"):
        load_package(path)(torch.randn(3, 2, 2))  # a 3-D input: the kernel returns 3


def test_an_op_without_a_cpp_kernel_is_refused_naming_it(tmp_path):
    ep = ember.export(lambda x: no_kernel(x) + 1, (torch.randn(4),))
    with pytest.raises(UnsupportedArtifactError,
                       match=r"ember_cppk::no_kernel.default .*ember.register_cpp_kernel"):
        package(ep, tmp_path / "pkg", device="cpu")
