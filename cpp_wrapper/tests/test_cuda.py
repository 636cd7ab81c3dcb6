"""The CUDA path: a Triton cubin launched through the driver API and cuBLAS externs, in process and
from a package. Skipped without a GPU (CI has none); run on the GPU machine."""

import dataclasses
import subprocess
import threading

import cppw_artifacts as A
import numpy as np
import pytest
import torch
from ember.ir import BufferIR, CeilDiv, KernelIR, StepIR, SymbolSpec, new_artifact, sym

from ember.cpp_wrapper import install_run_package, load_artifact, load_package, package

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BLOCK = 256


def _cubin(tmp_path):
    """Compile a Triton add+relu kernel (by launching it once) and keep its cubin."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def add_relu(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=mask)

    n = 1000  # not a multiple of 16: the cubin must not assume divisibility of n
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    compiled = add_relu[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)
    torch.testing.assert_close(out, torch.relu(x + y))
    path = tmp_path / "add_relu.cubin"
    path.write_bytes(compiled.asm["cubin"])
    return KernelIR(
        "k_add_relu",
        "triton",
        "",
        compiled.name,
        ("*fp32", "*fp32", "*fp32", "i32"),
        grid=(CeilDiv(sym("s0") * 64, BLOCK),),
        num_warps=compiled.metadata.num_warps,
        shared_mem=compiled.metadata.shared,
        binary=str(path),
    )


def _artifact(kernel):
    """h = relu(x + y) (Triton), out = h @ w + b (cuBLAS addmm), rows dynamic."""
    s0 = sym("s0")
    m = cuda_meta
    return new_artifact(
        device="cuda",
        symbols=(SymbolSpec("s0", 2, None),),
        guards=(),
        buffers=(
            BufferIR("x", "input", m((s0, 64))),
            BufferIR("y", "input", m((s0, 64))),
            BufferIR("w", "constant", m((64, 32))),
            BufferIR("b", "constant", m((32,))),
            BufferIR("h", "intermediate", m((s0, 64))),
            BufferIR("out", "output", m((s0, 32))),
        ),
        kernels=(kernel,),
        steps=(
            A.alloc("h"),
            StepIR(
                "kernel",
                "k_add_relu",
                ["x", "y", "h", {"expr": ["mul", {"sym": "s0"}, 64]}],
                {},
                (),
            ),
            A.alloc("out"),
            A.extern("extern.addmm", [A.node("b"), A.node("h"), A.node("w")], "out"),
        ),
        inputs=("x", "y"),
        outputs=("out",),
    )


def cuda_meta(shape):
    return dataclasses.replace(A.meta(shape), device="cuda")


def on_cuda(art):
    buffers = tuple(
        dataclasses.replace(b, meta=dataclasses.replace(b.meta, device="cuda")) for b in art.buffers
    )
    return dataclasses.replace(art, device="cuda", buffers=buffers)


def _eager(x, y, c):
    return torch.relu(x + y) @ c["w"] + c["b"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuda")
    art = _artifact(_cubin(tmp))
    consts = {"w": torch.randn(64, 32, device="cuda"), "b": torch.randn(32, device="cuda")}
    return art, consts, tmp


def test_triton_and_cublas_in_process(setup):
    art, consts, _ = setup
    model = load_artifact(art, consts)
    for rows in (3, 17, 1000):
        x, y = torch.randn(rows, 64, device="cuda"), torch.randn(rows, 64, device="cuda")
        out = model(x, y)[0]
        assert out.device.type == "cuda"
        torch.testing.assert_close(out, _eager(x, y, consts), atol=1e-3, rtol=1e-3)


def test_a_misaligned_input_runs_from_an_aligned_copy(setup):
    """The cubin, compiled by Triton's JIT for 16-byte aligned pointers, gets an input view 4 bytes
    off (element 1 of a float32 tensor): the runtime runs it from an aligned copy (a misaligned
    vector load would fault) and leaves the caller's tensor as it was."""
    art, consts, _ = setup
    model = load_artifact(art, consts)
    base, y = torch.randn(17 * 64 + 1, device="cuda"), torch.randn(17, 64, device="cuda")
    saved = base.clone()
    x = base[1:].view(17, 64)
    assert x.data_ptr() % 16 != 0
    torch.testing.assert_close(model(x, y)[0], _eager(x, y, consts), atol=1e-3, rtol=1e-3)
    torch.cuda.synchronize()
    assert torch.equal(base, saved)


def test_cuda_extern_matmuls():
    for op in ("mm", "addmm", "bmm"):
        art, shapes = A.matmul(op)
        art = on_cuda(art)
        xs = [torch.randn(s, device="cuda") for s in shapes]
        torch.testing.assert_close(
            load_artifact(art)(*xs)[0], A.matmul_eager(op, *xs), atol=1e-3, rtol=1e-3
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_linear_adds_its_bias_in_the_gemm_epilogue(dtype):
    """addmm with beta 1 and a bias row (a Linear) runs as one cuBLASLt GEMM whose epilogue adds
    the bias: no ones vector set, no second GEMM. Odd sizes (no 16-byte alignment of the rows)
    and a bias 2 or 4 bytes off alignment run too, through the epilogue or the plain path."""
    from torch.profiler import ProfilerActivity, profile

    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for m, k, n in ((256, 512, 768), (37, 129, 67), (1, 64, 8)):
        model = load_artifact(on_cuda(A.linear_view(m, k, n, dtype)))
        w, x = (torch.randn(s, device="cuda", dtype=dtype) for s in ((n, k), (m, k)))
        b = torch.randn(n + 1, device="cuda", dtype=dtype)
        for bias in (b[:n], b[1:]):
            want = torch.nn.functional.linear(x.float(), w.float(), bias.float())
            torch.testing.assert_close(model(w, bias, x)[0].float(), want, atol=tol * k**0.5,
                                       rtol=tol)  # fmt: skip
    model = load_artifact(on_cuda(A.linear_view(256, 512, 768, dtype)))
    w, b, x = (torch.randn(s, device="cuda", dtype=dtype) for s in ((768, 512), (768,), (256, 512)))
    model(w, b, x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(w, b, x)
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # one GEMM (float32 may split K: its reduction is a second kernel); the plain path sets a
    # ones vector (a Memset) and runs two GEMMs
    gemms = [n for n in gpu if "splitK" not in n and "split_k" not in n]
    assert len(gemms) == 1 and not any("Memset" in n for n in gpu), gpu


def test_cpu_tensor_into_a_cuda_model_is_rejected(setup):
    from ember.cpp_wrapper import EmberRuntimeError

    art, consts, _ = setup
    with pytest.raises(EmberRuntimeError, match="EMBER_ERR_DEVICE"):
        load_artifact(art, consts)(torch.randn(4, 64), torch.randn(4, 64))


def test_cuda_package_in_process_and_run_package(setup):
    art, consts, tmp = setup
    path = package(art, tmp / "pkg", device="cuda", constants=consts)
    x, y = torch.randn(9, 64, device="cuda"), torch.randn(9, 64, device="cuda")
    want = _eager(x, y, consts)
    torch.testing.assert_close(load_package(path)(x, y)[0], want, atol=1e-3, rtol=1e-3)
    exe = install_run_package(tmp)
    np.save(tmp / "x.npy", x.cpu().numpy())
    np.save(tmp / "y.npy", y.cpu().numpy())
    r = subprocess.run(
        [str(exe), str(path), str(tmp / "x.npy"), str(tmp / "y.npy"), str(tmp / "o.npy")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(
        torch.from_numpy(np.load(tmp / "o.npy")), want.cpu(), atol=1e-3, rtol=1e-3
    )


def test_cuda_model_from_eight_threads(setup):
    art, consts, _ = setup
    model = load_artifact(art, consts)
    errors = []

    def worker(tid):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(10):
                    x = torch.randn(5 + tid, 64, device="cuda")
                    y = torch.randn(5 + tid, 64, device="cuda")
                    out = model(x, y)[0]
                    torch.testing.assert_close(out, _eager(x, y, consts), atol=1e-3, rtol=1e-3)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
