"""Divisibility hints for ahead-of-time Triton cubins (ember.inductor.triton_hints): which kernel
parameters a launch plan proves 16-byte aligned or a multiple of 16 at every launch, that the
cubins of a package are compiled with them (vector loads in the PTX), and that constants are laid
out aligned in a package's weights.

Cross-component: inductor computes the hints from the artifact; cpp_wrapper's runtime keeps them
sound for inputs (misaligned inputs run from aligned copies: csrc/tests/formats_test.cc checks the
rule, ember_runtime.h documents it) and lays out the weights.
"""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import sympy
import torch

from ember.inductor import triton_aot
from ember.inductor.triton_hints import divisible_args, multiple_of
from ember.ir import BufferIR, KernelIR, StepIR, SymbolSpec, TensorMeta, new_artifact, sym
from ember.ir.symbols import expr_to_json

S = sym("s")


def test_multiple_of():
    assert multiple_of(0) and multiple_of(48) and not multiple_of(40)
    assert multiple_of(16 * S) and multiple_of(32 * S * S + 16 * S + 64)
    assert not multiple_of(S) and not multiple_of(8 * S) and not multiple_of(16 * S + 8)
    assert not multiple_of(sympy.floor(S / 2) * 16 + 1)
    assert multiple_of(8 * S, 8) and multiple_of(sympy.Integer(2) * 8)


def _meta(sizes, offset=0, dtype=torch.bfloat16):
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return TensorMeta(dtype=dtype, sizes=tuple(sizes), strides=tuple(strides),
                      storage_offset=offset, device="cuda:0")  # fmt: skip


def _view(src, out, offset):
    off = expr_to_json(offset) if isinstance(offset, sympy.Expr) else offset
    return StepIR("view", "", [src, [[4], [1], off]], {}, (out,))


def _artifact():
    """A plan over views of a pool buffer, an input at storage offset 3, a constant and a size
    symbol s, launching kernels k (twice) and m."""
    bufs = [BufferIR("x", "input", _meta([64], offset=3)),
            BufferIR("w", "constant", _meta([64])),
            BufferIR("buf0", "intermediate", _meta([S * 16 + 64]))]  # fmt: skip
    bufs += [BufferIR(f"v{i}", "intermediate", _meta([4])) for i in range(7)]
    kernels = (KernelIR("k", "triton", "", "k", ("*bf16", "*bf16", "i64", "i32")),
               KernelIR("m", "triton", "", "m", ("*bf16", "*bf16", "*bf16", "i64", "fp32")))
    steps = [StepIR("alloc", "", [], {}, ("buf0",)),
             _view("buf0", "v0", 8),  # 16 bytes in: aligned
             _view("buf0", "v1", 1),  # 2 bytes in: not
             _view("x", "v2", 3 + 16),  # 16 elements past the input's own pointer: aligned
             _view("x", "v3", 3 + 4),  # 8 bytes past it: not
             _view("v0", "v4", 16 * S),  # a view of a view, at a symbolic multiple of 16
             _view("w", "v5", 2),  # into the constant, 4 bytes in: not
             _view("buf0", "v6", 8 * S),  # 16 * s bytes in: aligned
             StepIR("kernel", "k", ["v0", "v2", {"expr": expr_to_json(32 * S)}, 48], {}, ()),
             StepIR("kernel", "k", ["v4", "v3", 64, 16], {}, ()),  # v3 spoils parameter 1
             StepIR("kernel", "m", ["x", "w", "v1", {"expr": {"sym": "s"}}, 16.0], {}, ()),
             StepIR("kernel", "m", ["v6", "v5", "v1", 64, 2.0], {}, ())]  # fmt: skip
    return new_artifact(device="cuda:0", symbols=(SymbolSpec("s"),), guards=(),
                        buffers=tuple(bufs), kernels=kernels, steps=tuple(steps),
                        inputs=("x",), outputs=())  # fmt: skip


def test_hints_of_a_hand_built_plan():
    hints = divisible_args(_artifact())
    # k: v0 / v4 aligned at both launches; v2 then v3 (8 bytes off the input's pointer) not;
    # 32*s and 64, 48 and 16 are multiples of 16
    assert hints["k"] == (0, 2, 3)
    # m: the input and v6 aligned; the constant then v5 (4 bytes in) not; v1 (bf16 element 1)
    # never; s is not a multiple of 16; a float never gets the hint
    assert hints["m"] == (0,)


def test_an_unaligned_view_alone_gets_no_hint():
    art = _artifact()
    steps = [s for s in art.steps if not (s.kind == "kernel" and s.args[0] == "v4")]
    hints = divisible_args(_replace(art, steps=tuple(steps)))
    assert hints["k"] == (0, 1, 2, 3)  # without the launch on v3 the input view is aligned


def _replace(art, **kw):
    import dataclasses

    return dataclasses.replace(art, **kw)


def _traced(monkeypatch, n):
    """A CPU-traced bf16 pointwise graph rendered as Triton (standing in for a CUDA one): one
    kernel over two inputs of n elements, another over a slice at element 1 of an input."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ember.inductor import compile_prims, config
    from ember.primtorch.trace import trace_to_prims

    monkeypatch.setattr(config, "cpu_backend", "triton")

    def fn(x, y):
        return (x.float().exp().to(torch.bfloat16) * y), x[:, 1:] + 1

    x, y = torch.randn(8, n // 8, dtype=torch.bfloat16), torch.randn(8, n // 8).bfloat16()
    return compile_prims(trace_to_prims(fn, x, y), [x, y])


def test_hints_of_a_traced_graph(monkeypatch):
    compiled = _traced(monkeypatch, 512)
    art = compiled.artifact
    hints = divisible_args(art)
    launches = {s.target: s.args for s in art.steps if s.kind == "kernel"}
    assert len(launches) == 2, launches
    for name, args in launches.items():
        numel = args[-1]
        want = {i for i, a in enumerate(args) if isinstance(a, str)}  # every pointer
        if numel % 16 == 0:
            want.add(len(args) - 1)
        assert set(hints[name]) == want, (name, args, hints)
    # the slice at element 1 is indexed inside the kernel: 8 * 63 = 504 elements, no hint
    assert any(a[-1] == 504 for a in launches.values())


def test_attach_cubins_compiles_with_the_hints(monkeypatch):
    compiled = _traced(monkeypatch, 512)
    seen = {}

    def fake_compile(source, name, arg_types, cfg, arch=None, divisible=()):
        seen[name] = tuple(divisible)
        return triton_aot.Cubin("/nonexistent.cubin", name, 4, 0)

    monkeypatch.setattr(triton_aot, "compile_kernel", fake_compile)
    monkeypatch.setattr(triton_aot, "_cached", lambda job, arch: True)
    triton_aot.attach_cubins(compiled, arch=90)
    assert seen == divisible_args(compiled.artifact) and any(seen.values())
    # and the hints are part of a cubin's cache key
    key = triton_aot._cubin_entry("src", "k", ["*fp32"], {"X": 1}, 90)[1]
    assert key != triton_aot._cubin_entry("src", "k", ["*fp32"], {"X": 1}, 90, (0,))[1]


_PTX = """
import json, re, sys
from ember.inductor.triton_aot import kernel_ptx
source, name, types, cfg, hints = json.loads(sys.stdin.read())
out = {}
for d in ((), tuple(hints)):
    ptx = kernel_ptx(source, name, types, cfg, 90, d)
    out[str(bool(d))] = re.findall(r"(?:ld|st)\\.global[.\\w]*", ptx)
print(json.dumps(out))
"""


def test_ptx_of_a_bf16_pointwise_kernel_has_vector_loads_with_hints(monkeypatch):
    compiled = _traced(monkeypatch, 512)
    (name,) = [k.name for k in compiled.artifact.kernels
               if divisible_args(compiled.artifact)[k.name] == (0, 1, 2, 3)]  # fmt: skip
    src = {k.name: k for k in compiled.program.kernels}[name]
    job = [src.source, name, list(src.arg_types), triton_aot._config(src), [0, 1, 2, 3]]
    # in a fresh process: once Triton's interpreter has run here, the compiler breaks
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-c", _PTX], input=json.dumps(job), env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    ops = json.loads(r.stdout.strip().splitlines()[-1])
    plain, hinted = ops["False"], ops["True"]
    assert not any(re.match(r"ld\.global.*\.v\d", op) for op in plain), plain
    assert any(re.match(r"ld\.global.*\.v\d", op) for op in hinted), hinted
    assert len([op for op in hinted if op.startswith("ld")]) < len(
        [op for op in plain if op.startswith("ld")])  # fmt: skip


def test_package_constants_are_16_byte_aligned(tmp_path):
    """Each constant's storage starts on a 64-byte boundary of weights.bin, which the runtime maps
    (page-aligned) or copies to cuMemAlloc memory (256-byte aligned): what the kernels' pointer
    hints for constants take for granted (package.cc checks the offsets on load)."""
    package = importlib.import_module("ember.cpp_wrapper.package")  # the module, not the function

    shapes = {"a": ([3], torch.int8), "b": ([5], torch.bfloat16), "c": ([7], torch.float32),
              "d": ([1], torch.float64)}  # fmt: skip
    bufs = tuple(BufferIR(n, "constant", _meta(sz, dtype=dt)) for n, (sz, dt) in shapes.items())
    art = new_artifact(device="cuda:0", symbols=(), guards=(), buffers=bufs, kernels=(),
                       steps=(), inputs=(), outputs=())  # fmt: skip
    consts = {n: torch.ones(sz, dtype=dt) for n, (sz, dt) in shapes.items()}
    entries = package._write_weights(art, consts, tmp_path / "weights.bin")
    offsets = [e["offset"] for e in entries]
    assert len(offsets) == 4 and offsets[1] > 0, entries
    assert all(o % 16 == 0 for o in offsets), offsets


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_cpp_wrapper_runs_a_misaligned_input_from_an_aligned_copy():
    """On a GPU: cubins compiled with the hints give eager's values for an aligned input and for
    a view at element 1 (2 bytes off), which the runtime copies; the caller's tensor is intact."""
    import ember

    def fn(x, y):
        return (x.float().exp() * y.float()).to(torch.bfloat16) + x

    compiled = ember.compile(fn, options={"cpp_wrapper": True})
    base = torch.randn(4097, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    saved = base.clone()
    for x in (base[:4096], base[1:]):
        torch.testing.assert_close(compiled(x, y), fn(x, y), atol=2e-2, rtol=2e-2)
    torch.cuda.synchronize()
    assert torch.equal(base, saved)
