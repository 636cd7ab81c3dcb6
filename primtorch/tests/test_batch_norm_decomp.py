"""cuDNN's batch norm (what ATen picks for CUDA tensors outside autograd's inference path)
decomposes like batch norm; only its prims run while tracing, so no GPU is needed."""

import torch

from ember.primtorch import trace_to_prims


def test_cudnn_batch_norm_inference_decomposes_like_batch_norm():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5

    def f(x, w, b, rm, rv):
        return torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)[0]

    out = trace_to_prims(f, x, w, b, rm, rv)(x, w, b, rm, rv)
    out = out[0] if isinstance(out, (tuple, list)) else out
    want = torch.nn.functional.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)
    torch.testing.assert_close(out, want)


def test_cudnn_batch_norm_backward_decomposes_like_batch_norms():
    torch.manual_seed(0)
    x, w, b, g = torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3), torch.randn(4, 3, 5, 5)
    mean = x.mean((0, 2, 3))
    invstd = (x.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()
    reserve = torch.empty(0, dtype=torch.uint8)

    def f(x, g, w, mean, invstd, reserve):
        return torch.ops.aten.cudnn_batch_norm_backward(x, g, w, None, None, mean, invstd, 1e-5,
                                                        reserve)  # fmt: skip

    args = (x, g, w, mean, invstd, reserve)
    got = trace_to_prims(f, *args)(*args)
    want = torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd, True,
                                                     1e-5, [True, True, True])  # fmt: skip
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
