"""The Triton renderer, run on CPU through Triton's interpreter (small shapes: it is slow)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest
import torch
import torch.nn.functional as F
from ember.inductor import config
from ember.inductor.codegen_triton import TritonRenderer
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import Kernel, schedule
from ember.primtorch.trace import trace_to_prims
from inductor_helpers import check


@pytest.fixture(autouse=True)
def triton_backend():
    config.cpu_backend = "triton"


def test_pointwise_chain():
    check(
        lambda a, b: torch.sigmoid(a * b + 1.0).tanh(), torch.randn(5, 7), torch.randn(7), kernels=1
    )


@pytest.mark.parametrize("persistent_max", [1024, 8])
def test_softmax_persistent_and_looped(persistent_max, monkeypatch):
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)
    check(lambda a: torch.softmax(a, -1), torch.randn(3, 20), kernels=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_4096_column_softmax_reads_its_row_once(dtype, monkeypatch):
    """Rows up to 4096 are persistent: a softmax keeps exp(x - max) in registers instead of
    storing it in float32 between loops (which halved its bandwidth on an H100), and writes
    nothing but its output (a float32 copy of the exponentials, never read, cost as much)."""
    monkeypatch.setattr(config, "cpu_backend", "triton")
    x = torch.randn(2, 4096, dtype=dtype)
    (rendered,) = _kernel_sources(lambda a: torch.softmax(a, -1), x)
    src = rendered.source
    assert "for roffset" not in src and src.count("tl.load(") == 1
    assert src.count("tl.store(") == 1, src
    check(lambda a: torch.softmax(a, -1), x, kernels=1, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("persistent_max", [4096, 4])
def test_values_read_again_after_their_row_reduction(persistent_max, monkeypatch):
    """exp(x - max) divided by its sum, a layer norm's centred values scaled by their variance,
    and a row value added back to every element: persistent rows keep the per-element values in
    registers across the reduction, looped ones store or recompute them; all match eager."""
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)

    def fn(a, w):
        e = (a - a.amax(-1, keepdim=True)).exp()
        c = a - a.mean(-1, keepdim=True)
        n = c * torch.rsqrt(c.square().mean(-1, keepdim=True) + 1e-5) * w
        return e / e.sum(-1, keepdim=True), n + n.sum(-1, keepdim=True)

    check(fn, torch.randn(6, 40), torch.randn(40), atol=1e-4, rtol=1e-4)


def test_layer_norm_and_reductions():
    x, w, b = torch.randn(4, 12), torch.randn(12), torch.randn(12)
    check(lambda x, w, b: F.layer_norm(x, (12,), w, b), x, w, b, kernels=1, atol=1e-5, rtol=1e-4)
    check(lambda a: (a.sum(0), a.amax(1), a.argmax(1)), torch.randn(5, 6))


@pytest.mark.parametrize("persistent_max", [1024, 1])
def test_reduction_copied_by_its_epilogue_is_stored(persistent_max, monkeypatch):
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)
    check(lambda g: g.sum(2).permute(0, 2, 1, 3).contiguous(), torch.randn(2, 2, 3, 4, 5),
          kernels=1)  # fmt: skip


def test_a_single_row_residual_add_fused_into_its_norm():
    """At one row (a decoding step at batch 1) the add joins the norm's kernel (the fusion
    test's case), rendered for Triton: the add's sum is stored and normalised in one program."""
    def fn(x, y, w):
        h = x + y
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w, h

    check(fn, torch.randn(1, 1, 64), torch.randn(1, 1, 64), torch.randn(64), kernels=1,
          atol=1e-5, rtol=1e-4)  # fmt: skip


def test_half_masked_and_indirect_loads():
    h = torch.randn(4, 6, dtype=torch.float16)
    check(lambda a: (a.float().exp() * 2).half(), h, atol=1e-2, rtol=1e-2)
    check(lambda a, b: torch.cat([a, b * 2], 0), torch.randn(2, 3), torch.randn(3, 3))
    check(lambda a, i: torch.gather(a, 1, i), torch.randn(3, 4), torch.randint(0, 4, (3, 2)))


def test_64_bit_indexing_when_sizes_need_it():
    x = torch.empty_strided((2**16, 2**15 + 1), (1, 2**16), dtype=torch.float32, device="meta")
    gm = trace_to_prims(lambda a: a * 2, torch.randn(2, 3))  # the graph shape does not matter here
    low = lower_graph(gm, [torch.randn(2, 3)])
    steps = schedule(low.buffers, [o.name for o in low.outputs])
    kernel = next(s for s in steps if isinstance(s, Kernel))
    buffers = {b.name: b for b in [*low.inputs, *low.buffers] if b is not None}
    for b in buffers.values():  # pretend the buffers are huge: only the text is checked
        object.__setattr__(b.layout, "sizes", tuple(x.shape))
        object.__setattr__(b.layout, "strides", tuple(x.stride()))
    kernel.xsizes = tuple(x.shape)
    src = TritonRenderer(kernel, buffers, "k").render().source
    assert "tl.program_id(0).to(tl.int64)" in src


@pytest.mark.parametrize("w_shape, stride, padding, groups", [
    ((4, 3, 3, 3), [2, 1], [1, 1], 1),  # im2col gather + bmm
    ((3, 1, 3, 3), [1, 1], [1, 0], 3),  # depthwise: one reduction kernel
    ((4, 3, 1, 1), [2, 2], [0, 0], 1),  # 1x1 stride 2: a strided read + bmm
])  # fmt: skip
def test_convolution_as_matmul(w_shape, stride, padding, groups):
    """The decomposition CUDA packages use for convolution (see primtorch decomp/conv.py)."""
    from ember.primtorch.decomp.conv import convolution_as_matmul

    def conv(x, w, b):
        return convolution_as_matmul(x, w, b, stride, padding, [1, 1], False, [0, 0], groups)

    x, w, b = torch.randn(2, 3, 6, 5), torch.randn(w_shape), torch.randn(w_shape[0])
    check(conv, x, w, b, atol=1e-5, rtol=1e-5)
    want = torch.convolution(x, w, b, stride, padding, [1, 1], False, [0, 0], groups)
    torch.testing.assert_close(conv(x, w, b), want, atol=1e-5, rtol=1e-5)


def test_the_same_kernel_in_two_layers_is_one_function():
    # Layers of a model render the same kernel under other names: named by content, they load
    # as one Triton function, compiled (and autotuned) once.
    from ember.inductor.runtime import TritonLauncher

    body = '''import triton
import triton.language as tl

@triton.jit
def {name}(in_ptr0, out_ptr1, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr1 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2.0, xmask)
'''
    cfgs = [{"XBLOCK": 64, "num_warps": 1}]
    a = TritonLauncher("kernel3", body.format(name="kernel3"), cfgs, 100, None)
    b = TritonLauncher("kernel17", body.format(name="kernel17"), cfgs, 100, None)
    c = TritonLauncher("kernel5", body.format(name="kernel5").replace("2.0", "3.0"), cfgs, 100, None)
    assert a.fn is b.fn and a.key == b.key
    assert c.fn is not a.fn
    x, out = torch.arange(100.0), torch.empty(100)
    b(x, out)
    assert torch.equal(out, x * 2)


def _kernel_sources(fn, *args):
    gm = trace_to_prims(fn, *args)
    low = lower_graph(gm, list(args))
    steps = schedule(low.buffers, [o.name for o in low.outputs])
    buffers = {b.name: b for b in [*low.inputs, *low.buffers] if b is not None}
    return [TritonRenderer(s, buffers, f"k{i}").render() for i, s in enumerate(steps)
            if isinstance(s, Kernel)]  # fmt: skip


@pytest.mark.parametrize("case", ["transpose", "nchw_to_nhwc", "gated_transpose", "broadcast_rows"])
def test_transposing_pointwise_kernels_are_tiled(case):
    """A kernel that reads along an outer dim and writes along the innermost (a transposing
    copy, NCHW to NHWC, gMLP's gate reading a token-mixed value transposed) runs in
    [XBLOCK, YBLOCK] tiles over a 2-D grid, so both sides move whole memory sectors; one that
    walks memory along the innermost dim everywhere (a row broadcast) stays flat."""
    a, b = torch.randn(3, 40, 24), torch.randn(3, 24, 40)
    fn, args = {
        "transpose": (lambda x: (x.transpose(1, 2) * 2).contiguous(), (a,)),
        "nchw_to_nhwc": (lambda x: x.contiguous(memory_format=torch.channels_last) + 1,
                         (torch.randn(2, 24, 5, 7),)),  # fmt: skip
        "gated_transpose": (lambda u, v: u * v.transpose(1, 2), (a, b)),
        "broadcast_rows": (lambda x, r: x * r, (a, torch.randn(24))),
    }[case]
    (src,) = _kernel_sources(fn, *args)
    tiled = dict(src.meta).get("tiled") == 1
    assert tiled == (case != "broadcast_rows"), src.source
    if tiled:
        assert "YBLOCK" in src.source and "tl.program_id(1)" in src.source
    check(fn, *args, kernels=1)


def test_short_persistent_rows_get_wide_block_candidates():
    """A persistent reduction over rows of 4 (a thin product's K) is offered blocks of many rows:
    8 rows a program made millions of programs of 32 elements (CaiT's head mixing, 3x slower
    than the GEMM it replaced); long rows keep their candidates."""
    from ember.inductor.codegen_common import KernelSource
    from ember.inductor.codegen_triton import launch_configs

    def configs(x, r):
        meta = (("xnumel", x), ("rnumel", r), ("persistent", 1), ("reduction", 1), ("tiled", 0))
        return launch_configs(KernelSource("k", "triton", "", (), (), meta=meta))

    assert max(c["XBLOCK"] for c in configs(5_000_000, 4)) == 256
    assert [c["XBLOCK"] for c in configs(4096, 2048)] == [2, 2]
    assert all(c["XBLOCK"] <= 16 for c in configs(10, 4))


@pytest.mark.parametrize("case", ["nhwc_mean", "column_sum", "column_softmax", "row_sum"])
def test_reductions_that_walk_columns_loop_over_blocks_of_columns(case):
    """A reduction whose reads step by 1 along x and by more along r (a mean over H*W of NHWC
    data, a sum or softmax down the columns of a matrix) loops over [columns, rows] blocks
    instead of holding whole rows (one element per memory sector); a row reduction stays
    persistent. Values match eager either way."""
    nhwc = torch.randn(2, 300, 6, 7).contiguous(memory_format=torch.channels_last)
    fn, x = {
        "nhwc_mean": (lambda a: a.mean((2, 3)), nhwc),
        "column_sum": (lambda a: a.sum(0), torch.randn(50, 300)),
        "column_softmax": (lambda a: torch.softmax(a, 0), torch.randn(50, 300)),
        "row_sum": (lambda a: a.sum(1), torch.randn(300, 50)),
    }[case]
    srcs = [s for s in _kernel_sources(fn, x) if dict(s.meta)["reduction"]]
    assert srcs, case
    columns = {dict(s.meta)["columns"] for s in srcs}
    assert columns == ({0} if case == "row_sum" else {1}), [s.source for s in srcs]
    if case != "row_sum":
        assert all("for roffset" in s.source for s in srcs)
    check(fn, x, atol=1e-5, rtol=1e-5)
