"""User Triton kernels in CUDA artifacts, with no GPU: a captured launch is compiled ahead of time
for sm_90 (ember.inductor.user_triton) and the C++ wrapper launches its cubin.

The kernel is captured on the CPU (TRITON_INTERPRET=1), its artifact moved to CUDA as a CUDA
compile would write it (inductor's kernels in Triton too), then every kernel gets a cubin and
the package builds; running it is the GPU test in test_capture_cuda.py."""

import dataclasses
import os
import struct
from pathlib import Path

import pytest
import torch

# The capture runs the kernel on CPU tensors, through Triton's interpreter; on a GPU machine the
# same path (captured on CUDA, run from a package) is test_capture_cuda.py's.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU capture of a GPU path")
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel below is decorated

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import ember  # noqa: E402
from ember.cpp_wrapper import UnsupportedArtifactError, generate_wrapper, package  # noqa: E402
from ember.cpp_wrapper.model import _kernel_builds  # noqa: E402
from ember.inductor import compile_prims, triton_aot  # noqa: E402
from ember.inductor.config import config  # noqa: E402
from ember.inductor.user_triton import attach_user_kernels, launch_plan, module_source  # noqa: E402
from ember.ir import native_kernels as nk  # noqa: E402

SCALE = 3  # a global the kernel reads: carried into its module as a constexpr


@triton.jit
def _times_scale(v):
    return v * SCALE


@triton.jit
def shift_scale(x_ptr, out_ptr, n, shift, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 0.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) + shift + EXTRA
    tl.store(out_ptr + offs, _times_scale(v), mask=mask)


def _second_config_wins():
    calls = []

    def do_bench(fn, quantiles=None):  # the interpreter has no timer: config 1 "runs faster"
        fn()
        calls.append(1)
        return [2.0 if len(calls) % 2 else 1.0] * 3

    return do_bench


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=4),
                          triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"],
                 do_bench=_second_config_wins())  # fmt: skip
@triton.jit
def tuned_negate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=mask), mask=mask)


def f(x):
    y = x.exp()
    out = torch.empty_like(y)
    n = y.numel()
    shift_scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](y, out, n, 1.5, BLOCK=32)
    return out + 1


def on_cuda(art):
    buffers = tuple(dataclasses.replace(b, meta=dataclasses.replace(b.meta, device="cuda"))
                    for b in art.buffers)  # fmt: skip
    return dataclasses.replace(art, device="cuda", buffers=buffers)


@pytest.fixture(scope="module")
def cuda_artifact():
    x = torch.randn(100)
    ep = ember.export(f, (x,))
    torch.testing.assert_close(ep(x), f(x))
    saved = config.cpu_backend
    config.cpu_backend = "triton"  # inductor's own kernels in Triton, as on CUDA
    try:
        compiled = compile_prims(ep.graph_module, ep.example_inputs())
    finally:
        config.cpu_backend = saved
    art = on_cuda(triton_aot.attach_cubins(compiled, arch=90))
    return attach_user_kernels(art, arch=90)


def test_user_kernel_is_compiled_for_sm90_and_launched_with_its_grid(cuda_artifact):
    art = cuda_artifact
    user = [k for k in art.kernels if k.name.startswith("user_shift_scale")]
    assert len(user) == 1 and user[0].language == "triton"
    k = user[0]
    cubin = Path(k.binary).read_bytes()
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<I", cubin, 0x30)[0] & 0xFF == 90
    assert k.arg_types == ("*fp32", "*fp32", "i32", "fp32") and [int(g) for g in k.grid] == [4]
    assert "SCALE = tl.constexpr(3)" in k.source and "def _times_scale(" in k.source
    (step,) = [s for s in art.steps if s.kind == "kernel" and s.target == k.name]
    assert step.args[2:] == [100, 1.5] and step.kwargs["copy_in"]
    assert not any(s.kind == "extern" for s in art.steps)  # nothing left for Python

    source = generate_wrapper(art, kernels=_kernel_builds(art, True))
    index = [i.name for i in art.kernels].index(k.name)
    launch = (f"h->launch(c, {index}, static_cast<uint32_t>(4), static_cast<uint32_t>(1), "
              f"static_cast<uint32_t>(1), args))) return st;  // {k.name}")  # fmt: skip
    assert launch in source
    assert "float p3 = 1.5;" in source
    dst, src = step.kwargs["copy_in"][-1]
    assert f"// {dst} = {src}" in source  # the kernel writes a private copy, filled first


def test_cuda_package_with_a_user_kernel_builds_without_a_gpu(cuda_artifact, tmp_path):
    path = package(cuda_artifact, tmp_path / "pkg", device="cuda")
    assert (path / "model.so").stat().st_size > 0
    assert '"device": "cuda' in (path / "manifest.json").read_text()


def test_autotuning_s_pick_is_the_config_compiled():
    def g(x):
        out = torch.empty_like(x)
        n = x.numel()
        tuned_negate[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
        return out

    x = torch.randn(100)
    ep = ember.export(g, (x,))
    torch.testing.assert_close(ep(x), -x)
    assert tuned_negate.best_config is tuned_negate.configs[1]
    art = attach_user_kernels(on_cuda(compile_prims(ep.graph_module, ep.example_inputs()).artifact),
                              arch=90)  # fmt: skip
    (k,) = [k for k in art.kernels if k.name.startswith("user_tuned_negate")]
    assert ([int(g) for g in k.grid], k.num_warps) == ([2], 2)  # BLOCK=64: ceil(100 / 64) blocks


def test_the_chosen_autotuning_config_sets_the_constexprs_and_the_grid():
    launch = nk.TritonLaunch(
        "shift_scale", shift_scale.fn,
        (("x_ptr", nk.TENSOR(0)), ("out_ptr", nk.TENSOR(1)), ("n", 3_000_000_000), ("shift", 2)),
        (nk.TritonConfig({"BLOCK": 64}, 4, 3, (7,)), nk.TritonConfig({"BLOCK": 128}, 8, 2, (5,))),
        chosen=lambda: 1,
    )  # fmt: skip
    arg_types, args, consts, cfg = launch_plan(launch, [torch.float16, torch.bfloat16], ["a", "b"])
    assert arg_types == ["*fp16", "*bf16", "i64", "i32"] and args == ["a", "b", 3_000_000_000, 2]
    assert consts == {"BLOCK": 128, "EXTRA": 0.0} and (cfg.num_warps, cfg.grid) == (8, (5,))


def test_a_global_the_compile_cannot_carry_is_named():
    table = torch.ones(4)

    @triton.jit
    def reads_a_tensor(x_ptr):
        tl.store(x_ptr, table)

    with pytest.raises(NotImplementedError, match="reads the global 'table'"):
        module_source(reads_a_tensor.fn)


def test_a_cpu_package_with_a_user_kernel_is_refused_naming_it(tmp_path):
    ep = ember.export(f, (torch.randn(10),))
    with pytest.raises(UnsupportedArtifactError, match="user Triton kernel shift_scale .*CUDA"):
        package(ep, tmp_path / "pkg", device="cpu")
