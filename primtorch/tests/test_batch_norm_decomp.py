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
