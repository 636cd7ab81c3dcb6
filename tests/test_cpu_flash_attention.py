"""scaled_dot_product_attention on the CPU as inductor's generated flash-attention kernel
(ember.inductor.cpu_attention): values against eager, which kernel runs, and that no (L, S)
buffer is allocated; through the Python wrapper, the C++ wrapper and a package.

Cross-component: primtorch's tracer records torch's CPU flash call, inductor lowers it.
"""

import pytest
import torch
import torch.nn.functional as F

import ember
import ember.dynamo
from ember.inductor import compile_prims, config
from ember.primtorch.trace import trace_to_prims

@pytest.fixture(autouse=True)
def _the_generated_kernel(monkeypatch):
    """These tests are of Ember's kernel: "auto" would leave bf16 to torch on a CPU with AMX."""
    monkeypatch.setattr(config, "cpu_flash_attention", True)


FP32 = dict(atol=2e-5, rtol=1e-4)
BF16 = dict(atol=2e-2, rtol=2e-2)


def _compile(fn, *args):
    gm = trace_to_prims(fn, *args)
    return compile_prims(gm, list(args))


def _attention_kernels(compiled):
    return [k for k in compiled.artifact.kernels if k.name.startswith("flash_attention_")]


def _run(compiled, *args):
    out = compiled(*args)
    return out[0] if isinstance(out, (tuple, list)) else out


def _check(fn, *args, tol=FP32):
    compiled = _compile(fn, *args)
    assert len(_attention_kernels(compiled)) == 1, compiled.source
    assert not [s for s in compiled.artifact.steps if s.kind == "extern"], compiled.source
    got, want = _run(compiled, *args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **tol)
    return compiled


def _qkv(b, h, length, source, e, dtype=torch.float32, hkv=None, ev=None):
    g = torch.Generator().manual_seed(length * 1000 + source + e)
    q = torch.randn(b, h, length, e, generator=g).to(dtype)
    k = torch.randn(b, hkv or h, source, e, generator=g).to(dtype)
    v = torch.randn(b, hkv or h, source, ev or e, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("e", [32, 80, 256])  # 64 and 128: the GQA and bfloat16 tests
def test_head_dims_with_odd_lengths(e):
    # 67 queries and 75 keys: neither a multiple of the query nor of the key block
    q, k, v = _qkv(2, 3, 67, 75, e)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)


@pytest.mark.parametrize("length, source", [(37, 90), (90, 37)])
def test_causal(length, source):
    # top-left aligned as eager's is_causal, including L > S (every row still sees key 0)
    q, k, v = _qkv(1, 4, length, source, 64)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


def test_scale():
    q, k, v = _qkv(2, 2, 33, 40, 48)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.37), q, k, v)


@pytest.mark.parametrize("shape", [(33, 40), (2, 1, 33, 40), (1, 4, 1, 40), (2, 1, 1, 40),
                                   (2, 4, 33, 40)])  # fmt: skip
def test_additive_masks_broadcast_over_batch_and_heads(shape):
    q, k, v = _qkv(2, 4, 33, 40, 32)
    mask = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    _check(fn, q, k, v, mask)


def test_boolean_mask_with_a_row_that_allows_nothing():
    # eager gives zeros for a row whose every key is masked; so does the kernel
    q, k, v = _qkv(2, 2, 33, 40, 32)
    mask = torch.rand(2, 1, 33, 40, generator=torch.Generator().manual_seed(2)) > 0.4
    mask[:, :, 5] = False
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    _check(fn, q, k, v, mask)


@pytest.mark.parametrize("expanded", [False, True])
def test_grouped_query_attention(expanded):
    q, k, v = _qkv(2, 8, 33, 40, 64, hkv=2)
    if expanded:  # K/V repeated to the query's heads by the program itself
        def fn(q, k, v):
            k, v = (t.repeat_interleave(4, dim=1) for t in (k, v))
            return F.scaled_dot_product_attention(q, k, v)
    else:
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    _check(fn, q, k, v)


def test_multi_query_attention_causal():
    q, k, v = _qkv(1, 4, 45, 45, 64, hkv=1)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                        enable_gqa=True)  # fmt: skip
    _check(fn, q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16(causal):
    q, k, v = _qkv(2, 4, 67, 75, 128, dtype=torch.bfloat16)
    mask = torch.randn(67, 75, generator=torch.Generator().manual_seed(4)).bfloat16()
    if causal:
        def fn(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        def fn(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    _check(fn, q, k, v, mask, tol=BF16)


def test_float16_with_a_mask():
    q, k, v = _qkv(1, 2, 40, 50, 64, dtype=torch.float16)
    mask = torch.randn(40, 50, generator=torch.Generator().manual_seed(7)).half()
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    _check(fn, q, k, v, mask, tol=dict(atol=2e-3, rtol=2e-3))


def test_strided_inputs_from_a_projection():
    # q, k, v as (B, L, H, E) views transposed to (B, H, L, E), as a Linear's output is read
    x = torch.randn(2, 37, 3 * 4 * 32, generator=torch.Generator().manual_seed(5))

    def fn(x):
        q, k, v = (t.view(2, 37, 4, 32).transpose(1, 2) for t in x.split(128, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    _check(fn, x)


def test_avx2_build(monkeypatch):
    monkeypatch.setattr(config, "isa", "avx2")
    q, k, v = _qkv(1, 2, 40, 50, 80)
    mask = torch.randn(40, 50, generator=torch.Generator().manual_seed(6))
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    compiled = _check(fn, q, k, v, mask)
    assert "ember::flash::attention" in _attention_kernels(compiled)[0].source


@pytest.mark.parametrize("isa", ["avx2", "generic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(45, 77), (3, 1, 1, 77), (3, 2, 45, 77)])
def test_masks_by_isa(monkeypatch, isa, dtype, shape):
    # the mask is copied into the scores' transposed layout in 8 x 8 register tiles (AVX2, every
    # mask dtype; 45 x 77 leaves partial tiles), one value per key when it is broadcast over
    # queries, and 8 queries at a time in the generic build
    monkeypatch.setattr(config, "isa", isa)
    q, k, v = _qkv(3, 2, 45, 77, 32, dtype=dtype)
    mask = torch.randn(shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    tol = FP32 if dtype == torch.float32 else BF16
    _check(fn, q, k, v, mask, tol=tol)


def test_no_buffer_holds_the_scores():
    # 256 x 320 scores per head: the largest buffer is an input or the output, never (L, S)
    q, k, v = _qkv(1, 2, 256, 320, 16)
    compiled = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      q, k, v)  # fmt: skip
    largest = max(b.meta.numel() for b in compiled.artifact.buffers)
    sizes = [(b.name, b.meta.sizes) for b in compiled.artifact.buffers]
    assert largest == 2 * 320 * 16 < 256 * 320, sizes


def test_switched_off_and_unsupported_calls_keep_torch_s_kernel(monkeypatch):
    q, k, v = _qkv(1, 2, 33, 40, 32)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    monkeypatch.setattr(config, "cpu_flash_attention", False)
    off = _compile(fn, q, k, v)
    assert not _attention_kernels(off)
    assert [s.target for s in off.artifact.steps if s.kind == "extern"] == ["extern.sdpa_flash_cpu"]
    torch.testing.assert_close(_run(off, q, k, v), fn(q, k, v))
    monkeypatch.setattr(config, "cpu_flash_attention", "auto")
    q64, k64, v64 = (t.double() for t in (q, k, v))  # float64: not a dtype the kernel takes
    kept = _compile(fn, q64, k64, v64)
    assert not _attention_kernels(kept)
    torch.testing.assert_close(_run(kept, q64, k64, v64), fn(q64, k64, v64))


class Attention(torch.nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=-1))  # fmt: skip
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(att.transpose(1, 2).reshape(b, t, d))


def test_cpp_wrapper_runs_the_kernel():
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 37, 64)
    ember.dynamo.reset()
    with torch.no_grad():
        got = ember.compile(model, options={"cpp_wrapper": True})(x)
        want = model(x)
    torch.testing.assert_close(got, want, **FP32)


def test_package_runs_the_kernel_without_torch(tmp_path):
    from ember.cpp_wrapper import load_package, package
    from ember.cpp_wrapper.exported import compile_exported

    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 37, 64)
    exported = ember.export(model, (x,))
    artifact, _ = compile_exported(exported, "cpu")
    assert any(k.name.startswith("flash_attention_") for k in artifact.kernels)
    assert not [s.target for s in artifact.steps if s.kind == "extern" and "sdpa" in s.target]
    path = package(exported, tmp_path / "pkg", device="cpu")
    y = torch.randn_like(x)
    with torch.no_grad():
        want = model(y)
    torch.testing.assert_close(load_package(path)(y)[0], want, **FP32)


def test_dynamic_batch_and_lengths(monkeypatch):
    # sizes that change between calls become symbolic (dynamo's automatic dynamic): the kernel
    # reads them, and the strides built from them, at run time, so the program compiled for the
    # second size runs every later one; heads and head dims stay compile-time constants
    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    ember.dynamo.reset()
    sources = []
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr("builtins.print", lambda *a, **k: sources.append(" ".join(map(str, a))))
    compiled = ember.compile(fn)
    with torch.no_grad():
        for b, length, source in ((2, 33, 40), (3, 70, 21), (4, 5, 130), (2, 64, 64)):
            q, k, v = _qkv(b, 4, length, source, 32, hkv=2)
            m = torch.randn(b, 1, length, source, generator=torch.Generator().manual_seed(b))
            torch.testing.assert_close(compiled(q, k, v, m), fn(q, k, v, m), **FP32)
    assert len(sources) == 2, sources
    assert all("flash_attention_" in s and "extern_sdpa" not in s for s in sources), sources
    assert "const int64_t s0 = " in sources[1]
    assert "must be equal" in sources[1]  # key batch and length are symbols of their own
    q, k, v = _qkv(3, 4, 9, 50, 32, hkv=2)
    with pytest.raises(RuntimeError):  # as eager: batch sizes that differ
        compiled(q, k[:2], v[:2], torch.zeros(3, 1, 9, 50))


@pytest.mark.parametrize("flags, packaging, dtype, generated", [
    ({"avx2"}, False, torch.bfloat16, True),  # no 16-bit hardware: Ember's kernel
    ({"amx_bf16"}, False, torch.bfloat16, False),  # AMX: torch's bf16 kernel
    ({"amx_bf16"}, False, torch.float32, True),
    ({"amx_bf16"}, True, torch.bfloat16, True),  # a package cannot call torch
])
def test_auto_leaves_16_bit_floats_to_torch_where_the_cpu_multiplies_them(
        monkeypatch, flags, packaging, dtype, generated):  # fmt: skip
    from ember.ir import toolchain

    monkeypatch.setattr(config, "cpu_flash_attention", "auto")
    monkeypatch.setattr(config, "packaging", packaging)
    monkeypatch.setattr(toolchain, "cpu_flags", lambda: frozenset(flags))  # (and the cache key)
    q, k, v = _qkv(1, 2, 40, 40, 32, dtype)
    compiled = _compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert bool(_attention_kernels(compiled)) == generated, compiled.source
