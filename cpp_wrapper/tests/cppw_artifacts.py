"""Hand-built CompiledArtifacts (IR v1) with small C++ kernels, for the cpp_wrapper tests."""

from __future__ import annotations

import torch
from ember.ir import (
    BufferIR,
    KernelIR,
    StepIR,
    SymbolSpec,
    TensorMeta,
    contiguous_strides,
    new_artifact,
    sym,
)


def meta(shape, dtype=torch.float32, strides=None, offset=0) -> TensorMeta:
    return TensorMeta(
        dtype, shape, strides if strides is not None else contiguous_strides(shape), offset
    )


def alloc(name):
    return StepIR("alloc", "", [], {}, (name,))


def kernel(name, *args):
    return StepIR("kernel", name, list(args), {}, ())


def extern(op, args, out, **kwargs):
    return StepIR("extern", op, list(args), kwargs, (out,))


def node(name):
    return {"node": name}


# A pointwise kernel with typed parameters and a reduction kernel in the packed `void**` form
# that ember.inductor emits: both conventions are exercised.
ADD_RELU = r"""
#include <cstdint>
EMBER_EXPORT void add_relu(const float* x, const float* w, float* out, int64_t rows, int64_t cols) {
  #pragma omp parallel for if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = x[r * cols + c] + w[c];
      out[r * cols + c] = v > 0.f ? v : 0.f;
    }
}
"""

ROW_SUM = r"""
#include <cstdint>
EMBER_EXPORT void row_sum(void** args) {
  const float* x = static_cast<const float*>(args[0]);
  float* out = static_cast<float*>(args[1]);
  const int64_t rows = *static_cast<const int64_t*>(args[2]);
  const int64_t cols = *static_cast<const int64_t*>(args[3]);
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.f;
    for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c];
    out[r] = s;
  }
}
"""


def elementwise_reduction(cols: int = 8):
    """act = relu(x + w) (w a constant), out = act.sum(1), x of dynamic size (s0, cols)."""
    s0 = sym("s0")
    return new_artifact(
        device="cpu",
        symbols=(SymbolSpec("s0", 2, 4096),),
        guards=(),
        buffers=(
            BufferIR("x", "input", meta((s0, cols))),
            BufferIR("w", "constant", meta((cols,))),
            BufferIR("act", "output", meta((s0, cols))),
            BufferIR("out", "output", meta((s0,))),
        ),
        kernels=(
            KernelIR(
                "k_add_relu", "cpp", ADD_RELU, "add_relu", ("*fp32", "*fp32", "*fp32", "i64", "i64")
            ),
            KernelIR("k_row_sum", "cpp", ROW_SUM, "row_sum", ("*fp32", "*fp32", "i64", "i64")),
        ),
        steps=(
            alloc("act"),
            kernel("k_add_relu", "x", "w", "act", {"sym": "s0"}, cols),
            alloc("out"),
            kernel("k_row_sum", "act", "out", {"sym": "s0"}, cols),
        ),
        inputs=("x",),
        outputs=("act", "out"),
    )


def elementwise_reduction_eager(x, w):
    act = torch.relu(x + w)
    return [act, act.sum(1)]


def matmul(op: str, dtype=torch.float32, m=5, k=7, n=6, batch=3):
    """One extern matmul: mm, addmm (1-D bias), bmm or baddbmm (broadcast bias)."""
    if op in ("mm", "addmm"):
        a_shape, b_shape, o_shape, bias_shape = (m, k), (k, n), (m, n), (n,)
    else:
        a_shape, b_shape, o_shape, bias_shape = (batch, m, k), (batch, k, n), (batch, m, n), (1, n)
    buffers = [
        BufferIR("a", "input", meta(a_shape, dtype)),
        BufferIR("b", "input", meta(b_shape, dtype)),
    ]
    inputs = ["a", "b"]
    if op in ("addmm", "baddbmm"):
        buffers.insert(0, BufferIR("c", "input", meta(bias_shape, dtype)))
        inputs.insert(0, "c")
        step = extern(f"extern.{op}", [node("c"), node("a"), node("b")], "out", beta=0.5, alpha=2)
    else:
        step = extern(f"extern.{op}", [node("a"), node("b")], "out")
    buffers.append(BufferIR("out", "output", meta(o_shape, dtype)))
    shapes = {"a": a_shape, "b": b_shape, "c": bias_shape}
    return new_artifact(
        device="cpu",
        symbols=(),
        guards=(),
        buffers=tuple(buffers),
        kernels=(),
        steps=(step,),
        inputs=tuple(inputs),
        outputs=("out",),
    ), [shapes[i] for i in inputs]


def matmul_eager(op, *xs):
    fn = {"mm": torch.mm, "bmm": torch.bmm}.get(op)
    if fn is not None:
        return fn(*xs)
    return getattr(torch, op)(*xs, beta=0.5, alpha=2)


def linear_view(m=4, k=8, n=3, dtype=torch.float32):
    """y = x @ w.t() + b, with w.t() a view step of the input w (as inductor plans a Linear)."""
    return new_artifact(
        device="cpu",
        symbols=(),
        guards=(),
        buffers=(
            BufferIR("w", "input", meta((n, k), dtype)),
            BufferIR("b", "input", meta((n,), dtype)),
            BufferIR("x", "input", meta((m, k), dtype)),
            BufferIR("wt", "intermediate", meta((k, n), dtype, strides=(1, k))),
            BufferIR("y", "output", meta((m, n), dtype)),
        ),
        kernels=(),
        steps=(
            StepIR("view", "", ["w", [[k, n], [1, k], 0]], {}, ("wt",)),
            extern("extern.addmm", [node("b"), node("x"), node("wt")], "y"),
        ),
        inputs=("w", "b", "x"),
        outputs=("y",),
    )


def convolution(
    n=2, c=4, h=9, w=9, co=6, k=3, stride=1, padding=1, dilation=1, groups=1, bias=True, dim=2,
    channels_last=False,
):
    """One extern.convolution (1-D when dim == 1) with weight and optional bias as inputs; the
    output is planned channels-last (NHWC strides) when asked, as torch plans some convolutions."""
    spatial = (h, w) if dim == 2 else (w,)
    x_shape, w_shape = (n, c, *spatial), (co, c // groups, *(k,) * dim)
    out_spatial = tuple((s + 2 * padding - dilation * (k - 1) - 1) // stride + 1 for s in spatial)
    buffers = [BufferIR("x", "input", meta(x_shape)), BufferIR("wt", "input", meta(w_shape))]
    if bias:
        buffers.append(BufferIR("bias", "input", meta((co,))))
    out_shape = (n, co, *out_spatial)
    out_strides = None
    if channels_last:
        ho, wo = out_spatial
        out_strides = (ho * wo * co, 1, wo * co, co)
    buffers.append(BufferIR("out", "output", meta(out_shape, strides=out_strides)))
    args = [
        node("x"),
        node("wt"),
        node("bias") if bias else None,
        [stride] * dim,
        [padding] * dim,
        [dilation] * dim,
        False,
        [0] * dim,
        groups,
    ]
    inputs = ("x", "wt", "bias") if bias else ("x", "wt")
    art = new_artifact(
        device="cpu",
        symbols=(),
        guards=(),
        buffers=tuple(buffers),
        kernels=(),
        steps=(extern("extern.convolution", args, "out"),),
        inputs=inputs,
        outputs=("out",),
    )
    shapes = [x_shape, w_shape] + ([(co,)] if bias else [])
    return art, shapes


def alias_output():
    """The output is a transposed view of the input: the runtime must copy it out."""
    return new_artifact(
        device="cpu",
        symbols=(),
        guards=(),
        buffers=(
            BufferIR("x", "input", meta((3, 4))),
            BufferIR("y", "output", meta((4, 3), strides=(1, 4))),
        ),
        kernels=(),
        steps=(StepIR("view", "", ["x", [[4, 3], [1, 4], 0]], {}, ("y",)),),
        inputs=("x",),
        outputs=("y",),
    )


def small_mlp(batch=6, d_in=8, d_hidden=16, d_out=4):
    """relu(x @ w1 + b1) @ w2 + b2 with weights as constants, through two addmm and a C++ kernel."""
    relu = r"""
#include <cstdint>
EMBER_EXPORT void relu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
    return new_artifact(
        device="cpu",
        symbols=(),
        guards=(),
        buffers=(
            BufferIR("x", "input", meta((batch, d_in))),
            BufferIR("w1", "constant", meta((d_in, d_hidden))),
            BufferIR("b1", "constant", meta((d_hidden,))),
            BufferIR("w2", "constant", meta((d_hidden, d_out))),
            BufferIR("b2", "constant", meta((d_out,))),
            BufferIR("h", "intermediate", meta((batch, d_hidden))),
            BufferIR("y", "output", meta((batch, d_out))),
        ),
        kernels=(KernelIR("k_relu", "cpp", relu, "relu_inplace", ("*fp32", "i64")),),
        steps=(
            alloc("h"),
            extern("extern.addmm", [node("b1"), node("x"), node("w1")], "h"),
            kernel("k_relu", "h", batch * d_hidden),
            alloc("y"),
            extern("extern.addmm", [node("b2"), node("h"), node("w2")], "y"),
            StepIR("free", "", ["h"], {}, ()),
        ),
        inputs=("x",),
        outputs=("y",),
    )


def small_mlp_constants(d_in=8, d_hidden=16, d_out=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w1": torch.randn(d_in, d_hidden, generator=g),
        "b1": torch.randn(d_hidden, generator=g),
        "w2": torch.randn(d_hidden, d_out, generator=g),
        "b2": torch.randn(d_out, generator=g),
    }


def small_mlp_eager(x, c):
    return torch.relu(x @ c["w1"] + c["b1"]) @ c["w2"] + c["b2"]
