"""CUDA-only extern ops and layouts: metas against the real kernels (run on the GPU machine)."""

import pytest
import torch
import torch.nn.functional as F

from ember.primtorch import prims

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
aten = torch.ops.aten


def _check(p, args, kwargs=None):
    kwargs = kwargs or {}
    out = p(*args, **kwargs)
    meta = p.meta(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    metas = meta if isinstance(meta, (tuple, list)) else (meta,)
    for i, (m, t) in enumerate(zip(metas, outs)):
        if not isinstance(t, torch.Tensor) or m is None or not hasattr(m, "sizes"):
            continue
        if t.numel() == 0 and m.numel() == 0:
            continue
        got = (m.dtype, tuple(int(s) for s in m.sizes), tuple(int(s) for s in m.strides))
        assert got == (t.dtype, tuple(t.shape), t.stride()), f"{p} output {i}"
        assert str(t.device).startswith(m.device.split(":")[0])
    return out


def _qkv(dtype, b=2, h=3, lq=128, lk=96, e=64):
    kw = dict(device="cuda", dtype=dtype)
    return (
        torch.randn(b, h, lq, e, **kw),
        torch.randn(b, h, lk, e, **kw),
        torch.randn(b, h, lk, e, **kw),
    )


@pytest.mark.parametrize("blhe", [False, True])
def test_flash_attention_metas(blhe):
    q, k, v = _qkv(torch.float16)
    if blhe:  # (B, L, H, E) storage, as attention after a head split usually has
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out = _check(prims.extern.sdpa_flash, (q, k, v, 0.0, True))
    o, lse, cq, ck, mq, mk, seed, offset, _ = out
    grads = (torch.randn_like(o), q, k, v, o, lse, cq, ck, mq, mk, 0.0, True, seed, offset)
    _check(prims.extern.sdpa_flash_backward, grads)


def test_efficient_attention_metas():
    q, k, v = _qkv(torch.float32, lq=40, lk=24)
    bias = torch.randn(2, 3, 40, 24, device="cuda")
    o, lse, seed, offset = _check(prims.extern.sdpa_efficient, (q, k, v, bias, True, 0.0, False))
    args = (torch.randn_like(o), q, k, v, bias, o, lse, seed, offset, 0.0, [True, True, True, True])
    _check(prims.extern.sdpa_efficient_backward, args)


def test_matmul_and_conv_layouts_on_cuda():
    a = torch.randn(16, 8, device="cuda").t()
    _check(prims.extern.mm, (a, torch.randn(16, 4, device="cuda")))
    x = torch.randn(2, 3, 8, 8, device="cuda")
    w = torch.randn(4, 3, 3, 3, device="cuda")
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    for xx, ww in ((x, w), (x.to(memory_format=torch.channels_last), w)):
        out = _check(prims.extern.convolution, (xx, ww, None, *conv))
        _check(prims.extern.convolution_backward,
               (torch.randn_like(out), xx, ww, [4], *conv, [True, True, True]))  # fmt: skip


def test_pointwise_strides_and_random_on_cuda():
    x = torch.randn(2, 3, 4, 5, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randn(2, 4, 3, 5, device="cuda").transpose(1, 2)
    _check(prims.add, (x, y))
    _check(prims.where, (x > 0, y, x))
    gpu = prims.philox_rand((1000,), 5, 7, torch.float32, "cuda")
    cpu = prims.philox_rand((1000,), 5, 7, torch.float32, "cpu")
    assert torch.equal(gpu.cpu(), cpu)


def _cudnn_or_skip(q, k, v, bias=None):
    try:
        return aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, False, False)
    except RuntimeError as e:  # no cuDNN attention on this GPU / build
        pytest.skip(f"cuDNN attention unavailable: {e}")


@pytest.mark.parametrize("blhe", [False, True])
@pytest.mark.parametrize("bias_kind", [None, "bool", "float"])
def test_cudnn_attention_meta_and_layout(blhe, bias_kind):
    from ember.primtorch.attention import cudnn_bias
    from ember.primtorch.prims.extern import in_cudnn_layout

    q, k, v = _qkv(torch.bfloat16, lq=128, lk=96)
    if blhe:
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    bias = None
    if bias_kind is not None:
        keep = torch.rand(2, 1, 128, 96, device="cuda") > 0.3
        keep[..., 0] = True
        bias = cudnn_bias(keep if bias_kind == "bool" else torch.where(keep, 0.0, -1e4), q.dtype)
    raw = _cudnn_or_skip(q, k, v, bias)[0]
    # what this torch + cuDNN writes (reported; the extern copies where it differs)
    print(f"cuDNN output strides {raw.stride()} for a query of strides {q.stride()}")
    out = _check(prims.extern.sdpa_cudnn, (q, k, v, bias, False), {"scale": 0.125})
    fixed = in_cudnn_layout(raw, q)
    assert fixed.stride() == out.stride() and torch.equal(fixed, raw)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                          attn_mask=None if bias is None else bias.float(),
                                          scale=0.125)  # fmt: skip
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
