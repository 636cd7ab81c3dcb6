"""Ember's Triton flash-attention kernel (ember.inductor.triton_attention), with no GPU: its values
in Triton's CPU interpreter against eager (causal, additive masks, GQA/MQA, head dims 64 and 80,
float32 and bfloat16), its cubin for sm_90, and the C++ wrapper's launch of it in a CUDA package's
model library; which graphs the switch sends to it.

Cross-component: primtorch records the attention extern, inductor lowers it to the template
(CPU graphs rendered as Triton stand in for CUDA ones here), cpp_wrapper generates the launch.
"""

import dataclasses
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process
pytest.importorskip("triton")

from ember.inductor import compile_prims, config, triton_aot, triton_attention  # noqa: E402
from ember.inductor.config import for_package  # noqa: E402
from ember.ir import TensorMeta  # noqa: E402
from ember.primtorch.trace import trace_to_prims  # noqa: E402

FP32 = dict(atol=2e-5, rtol=1e-4)
# the interpreter rounds float32 to bfloat16 toward zero (the GPU to nearest): a few ulps
BF16 = dict(atol=4e-2, rtol=4e-2)


@pytest.fixture
def triton_graphs(monkeypatch):
    """CPU graphs rendered as Triton and run by Triton's interpreter, with the kernel on."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(config, "triton_flash_attention", True)


def _qkv(b, h, length, source, e, hkv=None, dtype=torch.float32, ev=None):
    gen = torch.Generator().manual_seed(length * 31 + source)
    q = torch.randn(b, h, length, e, generator=gen)
    k = torch.randn(b, hkv or h, source, e, generator=gen)
    v = torch.randn(b, hkv or h, source, ev or e, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _compile(fn, *args):
    compiled = compile_prims(trace_to_prims(fn, *args), list(args))
    flash = [k for k in compiled.artifact.kernels if k.name.startswith("flash_attention_")]
    externs = [s.target for s in compiled.artifact.steps if s.kind == "extern"]
    return compiled, flash, externs


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _check(fn, *args, tol=FP32, kernels=1):
    compiled, flash, externs = _compile(fn, *args)
    assert len(flash) == kernels and all(k.language == "triton" for k in flash), compiled.source
    assert not [t for t in externs if "sdpa" in t], externs
    got = _first(compiled(*args))
    want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **tol)
    return compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("e", [64, 80])
def test_causal_and_masked(triton_graphs, dtype, e):
    tol = FP32 if dtype == torch.float32 else BF16
    q, k, v = _qkv(2, 2, 37, 37, e, dtype=dtype)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v,
           tol=tol)  # fmt: skip
    q, k, v = _qkv(1, 2, 21, 70, e, dtype=dtype)  # more keys than one block, fewer queries
    mask = torch.randn(1, 1, 21, 70).to(dtype)  # broadcast over heads
    _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v,
           mask, tol=tol)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_grouped_and_multi_query(triton_graphs, dtype):
    tol = FP32 if dtype == torch.float32 else BF16
    q, k, v = _qkv(2, 4, 19, 19, 80, hkv=2, dtype=dtype)
    mask = torch.randn(19, 19).to(dtype)  # 2-d: broadcast over batch and heads

    def gqa(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    _check(gqa, q, k, v, mask, tol=tol)
    q, k, v = _qkv(1, 4, 33, 33, 64, hkv=1, dtype=dtype)

    def mqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    _check(mqa, q, k, v, tol=tol)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("h,hkv,length", [(8, 2, 1), (8, 2, 4), (8, 2, 16), (4, 1, 20),
                                          (2, 2, 1)])  # fmt: skip
def test_decode_shapes_packed_rows(h, hkv, length, dynamic):
    """Few query rows: the GROUP heads of a key/value head stacked into one program's rows (16,
    32 or 64 of them; 64 or 128+ for the dynamic kernel's run-time variants), keys in several
    blocks, with an additive mask per head and one broadcast over heads, against eager."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    q, k, v = _qkv(2, h, length, 150, 32, hkv=hkv)  # 3 key blocks of 64 (fp32, head dim 32)
    gen = torch.Generator().manual_seed(length)
    for mask in (None, torch.randn(2, h, length, 150, generator=gen),
                 torch.randn(length, 150, generator=gen)):  # fmt: skip
        got = triton_attention.run(q, k, v, mask, dynamic=dynamic)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(got, want, **FP32)
    if dynamic:  # the prefill blocks run where the row count passes 64
        cfg = triton_attention.launch_config(32, torch.float32, None)
        assert cfg["DECODE"] and cfg["BLOCK_M"] == 64
    else:
        rows = length * h // hkv  # above 64: the prefill block (64 rows in float32)
        cfg = triton_attention.launch_config(32, torch.float32, rows)
        assert cfg["BLOCK_M"] == {1: 16, 4: 16, 16: 16, 64: 64, 80: 64}[rows], rows


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_packed_rows_causal_bf16_and_a_fully_masked_row(dynamic):
    """Causal attention over packed rows (each row's own query position), bfloat16, and a row
    whose keys are all masked giving zeros in the packed layout."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    q, k, v = _qkv(1, 8, 9, 9, 64, hkv=2, dtype=torch.bfloat16)
    got = triton_attention.run(q, k, v, causal=True, dynamic=dynamic)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.float(), want.float(), **BF16)
    q, k, v = _qkv(1, 4, 3, 20, 16, hkv=2)
    mask = torch.zeros(1, 4, 3, 20)
    mask[0, 3, 1] = float("-inf")  # head 3 (second of its group), query 1
    got = triton_attention.run(q, k, v, mask, dynamic=dynamic)
    assert got[0, 3, 1].eq(0).all(), got[0, 3, 1]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    keep = torch.ones(4, 3, dtype=torch.bool)
    keep[3, 1] = False
    torch.testing.assert_close(got[0][keep], want[0][keep], **FP32)


@pytest.mark.parametrize("e,dtype", [(64, torch.bfloat16), (128, torch.float16)])
def test_sm90_cubin_of_the_dynamic_length_kernel(e, dtype):
    """The kernel for a run-time L (prefill blocks plus its 16- and 64-row variants) compiles
    for sm_90 within shared memory, with the key loop pipelined (STAGES buffers)."""
    params = dict(H=32, GROUP=4, E=e, EV=e, E_PAD=e, EV_PAD=e, QS3=1, KS3=1, VS3=1, OS3=1, MS3=1,
                  HAS_MASK=True, CAUSAL=False, SCALE=0.125)  # fmt: skip
    cfg = triton_attention.kernel_config(params, dtype, None)
    assert cfg["DECODE"] and cfg["STAGES"] >= 2
    ty = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    job = ("flash_dyn", triton_attention.render_source("flash_dyn"), [ty] * 5 + ["i64"] * 18, cfg)
    # in a fresh process (the interpreter's patches of triton.language break the compiler in
    # this one), into the cubin cache that compile_kernel then reads
    assert triton_aot.check_jobs([job], 90) == []
    cubin = triton_aot.compile_kernel(job[1], job[0], tuple(job[2]), cfg, arch=90)
    assert pathlib.Path(cubin.path).read_bytes()[:4] == b"\x7fELF"
    assert 0 < cubin.shared_mem <= 227 * 1024, cubin.shared_mem
    assert cubin.num_warps == cfg["num_warps"]


def test_a_small_head_dim_and_a_scale(triton_graphs):
    q, k, v = _qkv(1, 2, 9, 24, 24)  # padded to 32

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.3)

    _check(fn, q, k, v)


def test_a_fully_masked_row_gives_zeros(triton_graphs):
    q, k, v = _qkv(1, 1, 4, 8, 16)
    mask = torch.zeros(1, 1, 4, 8)
    mask[0, 0, 2] = float("-inf")
    compiled, flash, _ = _compile(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)
    assert flash
    got = _first(compiled(q, k, v, mask))
    assert got[0, 0, 2].eq(0).all(), got
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got[0, 0, [0, 1, 3]], want[0, 0, [0, 1, 3]], **FP32)


def test_unsupported_calls_keep_torch_s_kernel(triton_graphs, monkeypatch):
    q, k, v = _qkv(1, 2, 8, 8, 272)  # head dim above 256
    _, flash, externs = _compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert not flash and "extern.sdpa_flash_cpu" in externs
    monkeypatch.setattr(config, "triton_flash_attention", "auto")  # in process: torch's
    q, k, v = _qkv(1, 2, 8, 8, 32)
    _, flash, externs = _compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert not flash and "extern.sdpa_flash_cpu" in externs


def test_switch_is_for_packages_on_cuda(monkeypatch):
    monkeypatch.setattr(config, "triton_flash_attention", "auto")
    assert not triton_attention.enabled("cuda:0")  # in-process CUDA compiles keep torch's
    with for_package():
        assert triton_attention.enabled("cuda:0")
        assert not triton_attention.enabled("cpu")  # CPU packages get the C++ flash kernel
    assert not config.packaging
    monkeypatch.setattr(config, "triton_flash_attention", False)
    with for_package():
        assert not triton_attention.enabled("cuda:0")


@pytest.mark.parametrize("e,dtype,length", [(80, torch.bfloat16, 19), (256, torch.float32, 19),
                                            (128, torch.float16, 19), (64, torch.bfloat16, 1),
                                            (64, torch.bfloat16, 200)])  # fmt: skip
def test_sm90_cubin_and_the_wrapper_s_launch(triton_graphs, e, dtype, length):
    """The kernel compiles for sm_90 within shared memory, and the C++ wrapper of a CUDA
    artifact holding it launches it (the CPU graph's artifact, moved to CUDA) with every
    parameter of its signature and the flat grid of (row blocks x batch x key/value heads);
    the model library builds. Decode-shaped (L * GROUP <= 64 packed rows) and prefill calls."""
    from ember.cpp_wrapper.codegen import generate_wrapper
    from ember.cpp_wrapper.model import _kernel_builds, build_model_library

    q, k, v = _qkv(2, 4, length, 19, e, hkv=2, dtype=dtype)
    mask = torch.randn(2, 1, length, 19).to(dtype)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    compiled, flash, _ = _compile(fn, q, k, v, mask)
    art = triton_aot.attach_cubins(compiled, arch=90)
    (kernel,) = [k for k in art.kernels if k.name == flash[0].name]
    assert pathlib.Path(kernel.binary).read_bytes()[:4] == b"\x7fELF"
    assert 0 < kernel.shared_mem <= 227 * 1024, kernel.shared_mem  # sm_90's opt-in maximum
    assert len(kernel.arg_types) == 5 + 18
    pad = triton_attention.pad(e)
    cfg = triton_attention.kernel_config(dict(E_PAD=pad, EV_PAD=pad), dtype, length * 2)
    assert kernel.num_warps == cfg["num_warps"]
    assert cfg["BLOCK_M"] == (64 if length == 19 else 16 if length == 1 else 128)
    blocks = -(-length * 2 // cfg["BLOCK_M"]) * 2 * 2

    def on_cuda(meta):
        return dataclasses.replace(meta, device="cuda:0") if isinstance(meta, TensorMeta) else meta

    art = dataclasses.replace(art, device="cuda:0", buffers=tuple(
        dataclasses.replace(b, meta=on_cuda(b.meta)) for b in art.buffers))  # fmt: skip
    source = generate_wrapper(art, kernels=_kernel_builds(art, True))
    launch = source[source.index("void* scratch0"):].split("\n")[:4]
    index = [k.name for k in art.kernels].index(kernel.name)
    want = (f"h->launch(c, {index}, static_cast<uint32_t>({blocks}), static_cast<uint32_t>(1), "
            "static_cast<uint32_t>(1), args)")  # fmt: skip
    assert any(want in line and kernel.name in line for line in launch), launch
    assert f"int64_t p{5 + 17} = static_cast<int64_t>(19);" in source  # the mask's row stride
    assert "&p22, &scratch0, &scratch1}" in source
    assert build_model_library(art, standalone=True).exists()


def _extern_graph(prim, tensors, args, kwargs, index):
    """A prim graph calling the extern `prim` on `tensors` (placeholders) and `args`, returning
    its result's element `index` (None: the result itself). CUDA's attention externs have no CPU
    kernel to trace through, so the graph is built as the tracer records it."""
    import operator

    from torch import fx

    from ember.ir import NODE_META_KEY

    graph = fx.Graph()
    nodes = []
    for i, t in enumerate(tensors):
        nodes.append(graph.placeholder(f"t{i}"))
        nodes[-1].meta[NODE_META_KEY] = TensorMeta.from_tensor(t)
    call = graph.call_function(prim, (*nodes, *args), kwargs)
    call.meta[NODE_META_KEY] = prim.meta(*tensors, *args, **kwargs)
    out = call
    if index is not None:
        out = graph.call_function(operator.getitem, (call, index))
        out.meta[NODE_META_KEY] = call.meta[NODE_META_KEY][index]
    graph.output((out,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_flash_extern_s_bottom_right_causal_mask_stays_an_extern(triton_graphs):
    """CUDA's flash op aligns its causal mask bottom-right when query and key lengths differ
    (torch.nn.attention.bias.causal_lower_right calls it so); the kernel's is top-left, so
    such a call keeps the extern (a package then refuses it, saying why)."""
    from ember.primtorch.prims.extern import sdpa_flash

    q, k, v = _qkv(1, 2, 5, 12, 32)
    gm = _extern_graph(sdpa_flash, (q, k, v), (0.0, True, False), {}, 0)
    compiled = compile_prims(gm, [q, k, v])
    assert not [k for k in compiled.artifact.kernels if k.name.startswith("flash_attention_")]
    assert [s.target for s in compiled.artifact.steps if s.kind == "extern"] == ["extern.sdpa_flash"]


@pytest.mark.parametrize("op", ["flash", "efficient", "cudnn"])
def test_cuda_attention_externs_lower_to_the_kernel(triton_graphs, op):
    """How CUDA's three externs bind their arguments and lay out their output (the efficient
    kernel's (B, L, H, E) layout, cuDNN's single output), lowered here in a CPU graph rendered
    as Triton: the kernel's values against eager."""
    from ember.primtorch.prims.extern import sdpa_cudnn, sdpa_efficient, sdpa_flash

    q, k, v = _qkv(2, 4, 21, 30, 64, hkv=2, dtype=torch.bfloat16)
    mask = torch.randn(2, 1, 21, 30).to(torch.bfloat16)
    if op == "flash":  # causal (equal lengths: see the bottom-right test), no mask
        q, k, v = _qkv(2, 4, 21, 21, 64, hkv=2, dtype=torch.bfloat16)
        gm = _extern_graph(sdpa_flash, (q, k, v), (0.0, True, False), {"scale": 0.2}, 0)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2,
                                              enable_gqa=True)  # fmt: skip
        inputs = [q, k, v]
    else:
        prim, args = (sdpa_efficient, (False,)) if op == "efficient" else (sdpa_cudnn, ())
        gm = _extern_graph(prim, (q, k, v, mask), args, {},
                           0 if op == "efficient" else None)  # fmt: skip
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        inputs = [q, k, v, mask]
    compiled = compile_prims(gm, inputs)
    assert [k.name for k in compiled.artifact.kernels if k.name.startswith("flash_attention_")]
    assert not [s for s in compiled.artifact.steps if s.kind == "extern"], compiled.source
    got = _first(compiled(*inputs))
    meta = gm.graph.output_node().args[0][0].meta["ember_meta"]
    assert got.stride() == tuple(int(s) for s in meta.strides)
    torch.testing.assert_close(got.float(), want.float(), **BF16)


def test_dynamic_batch_and_lengths(triton_graphs, monkeypatch):
    # the second size makes batch and lengths symbolic: the kernel takes them (and the strides
    # built from them) as run-time arguments, and its grid is an expression over them
    import ember
    import ember.dynamo

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    ember.dynamo.reset()
    sources = []
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr("builtins.print", lambda *a, **k: sources.append(" ".join(map(str, a))))
    compiled = ember.compile(fn)
    with torch.no_grad():
        for b, length, source in ((2, 33, 40), (3, 70, 21), (4, 5, 130)):
            q, k, v = _qkv(b, 4, length, source, 32, hkv=2)
            m = torch.randn(b, 1, length, source, generator=torch.Generator().manual_seed(b))
            torch.testing.assert_close(compiled(q, k, v, m), fn(q, k, v, m), **FP32)
    assert len(sources) == 2, sources
    assert all("flash_attention_" in s and "extern_sdpa" not in s for s in sources), sources
    assert " // 64)" in sources[1]  # the grid: query blocks of a symbolic length


def test_a_template_is_not_precompiled_with_the_generated_kernels(monkeypatch):
    """On a GPU a program's generated Triton kernels compile in the background when it loads;
    a template's launcher has no block-size configs to precompile, and compiles at its first
    call (this ran only on a GPU, where the template would have broken every package compile)."""
    from ember.inductor import runtime

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    launcher = runtime.triton_template("k", triton_attention.render_source("k"), {"num_warps": 4})
    with runtime.collect_builds() as builds:
        runtime.precompile_triton("k", launcher, ("*fp32",) * 5 + ("i64",) * 18)
    assert not builds.pending()
