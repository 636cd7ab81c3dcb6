"""Every Triton kernel the suite's architectures generate compiles with the real Triton compiler.

The CPU interpreter (TRITON_INTERPRET=1) runs programs that the compiler rejects (a block mask on
a scalar pointer, say), so kernels are also compiled for sm_90 here, with no GPU: TTIR to cubin
through ptxas. Inference and a training step, float32 and bfloat16 autocast.
"""

import contextlib
import importlib.util
import os
import pathlib
import uuid

import pytest
import torch

pytest.importorskip("triton")

from ember.aot_autograd import aot_module  # noqa: E402
from ember.inductor import pipeline, triton_aot  # noqa: E402
from ember.inductor.config import config  # noqa: E402
from ember.primtorch import trace_to_prims  # noqa: E402
from rendered_kernels import rendered_kernels  # noqa: E402,F401  (a fixture)

_spec = importlib.util.spec_from_file_location(
    "ember_triton_compile_models",
    pathlib.Path(__file__).parents[2] / "aot_autograd" / "tests" / "models.py",
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


@pytest.fixture
def triton_kernels(monkeypatch, rendered_kernels):
    """Render Triton kernels on the CPU and collect every one rendered."""
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return rendered_kernels


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", models.ARCHITECTURES)
def test_kernels_compile_for_sm90(name, autocast, triton_kernels):
    model, inputs, loss_fn = models.make(name)
    compiler = pipeline.compile_prims
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        loss = loss_fn(aot_module(model, compiler, compiler)(*inputs))
    loss.backward()
    model.eval()
    with torch.no_grad(), ctx:
        aot_module(model, compiler, compiler)(*inputs)
    assert triton_kernels, "no Triton kernel was generated"
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, f"{len(failures)} of {len(triton_kernels)} kernels fail:\n" + "\n\n".join(
        failures[:3]
    )


class _ScalarReads(torch.nn.Module):
    """Loads and stores whose address depends on no block index: a one-element input read
    under a mask (concatenation), and a full reduction stored to a single element."""

    def forward(self, x, y):
        return torch.cat([x[:1] * 2, y]) + 1, y.sum() * x[0]


def test_scalar_address_kernels_compile(triton_kernels):
    x, y = torch.randn(4), torch.randn(700)
    out = aot_module(_ScalarReads(), pipeline.compile_prims)(x, y)
    torch.testing.assert_close(out[0], torch.cat([x[:1] * 2, y]) + 1)
    torch.testing.assert_close(out[1], y.sum() * x[0])
    assert triton_kernels
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, "\n\n".join(failures[:2])


def test_looped_any_and_safe_softmax_compile(triton_kernels, monkeypatch):
    """Rows longer than a persistent reduction takes: an `any` accumulated over a loop (as
    _safe_softmax checks for fully masked rows) keeps one type across the loop."""
    monkeypatch.setattr(config, "persistent_reduction_max", 8)
    x = torch.randn(6, 40)
    x[1] = float("-inf")
    mask = torch.rand(6, 40) > 0.3

    def f(x, mask):
        return (x > 1).any(-1), torch.ops.aten._safe_softmax(x.masked_fill(mask, -torch.inf), -1)

    from ember.primtorch import trace_to_prims

    prims = trace_to_prims(f, x, mask)
    out = pipeline.compile_prims(prims, [x, mask])(x, mask)
    for got, want in zip(out, f(x, mask)):
        torch.testing.assert_close(got, want)
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, "\n\n".join(failures[:2])



def test_a_column_written_through_a_select_compiles(triton_kernels):
    """x[:, 0] = v: select_scatter's mask is a padded constant True, a masked bool whose value
    Triton would take as an int32 (a where's condition must be int1: an error on sm_90)."""
    from ember.primtorch import trace_to_prims

    def f(x):
        return torch.select_scatter(x, torch.full((4,), -1.0), 1, 0) * 2

    x = torch.randn(4, 6)
    out = pipeline.compile_prims(trace_to_prims(f, x), [x])(x)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, f(x))
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, "\n\n".join(failures[:2])


@pytest.mark.parametrize("persistent_max", [4096, 8], ids=["persistent", "looped"])
def test_products_signbits_and_constant_stores(triton_kernels, monkeypatch, persistent_max):
    """Found by op_db through the interpreter: a product reduction (Triton has none: tl.reduce
    over a multiply the kernel's module defines), the sign bit of -0.0 and NaNs, a 0-d tensor
    filled with a constant (a scalar address under a block mask), and 64-bit values cast to
    bfloat16 (arange). They match eager and compile for sm_90."""
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)
    x = torch.rand(6, 40) + 0.5
    n = torch.randint(-2, 3, (6, 40))
    z = torch.tensor([-0.0, 0.0, -1.0, float("nan"), -float("nan"), -float("inf")])

    def f(x, n, z):
        return (x.prod(-1), n.prod(-1), x.prod(), torch.signbit(z), torch.zeros_like(x[0, 0]),
                torch.arange(-3, 5, 2, dtype=torch.bfloat16))  # fmt: skip

    from ember.primtorch import trace_to_prims

    prims = trace_to_prims(f, x, n, z)
    out = pipeline.compile_prims(prims, [x, n, z])(x, n, z)
    for got, want in zip(out, f(x, n, z)):
        torch.testing.assert_close(got, want)
    assert any("tl.reduce(" in src for src in triton_kernels)
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, "\n\n".join(failures[:2])


@pytest.mark.parametrize("persistent_max", [4096, 8], ids=["persistent", "looped"])
def test_argmax_and_argmin_over_long_rows(triton_kernels, monkeypatch, persistent_max):
    """Rows longer than one block (a vocabulary's logits): each lane keeps its best value and
    where, then the lanes agree on the smallest index of the best. Ties take the first
    occurrence and NaN ranks above every number, as in eager."""
    monkeypatch.setattr(config, "persistent_reduction_max", persistent_max)
    x = torch.randn(5, 37)
    x[1, 3] = x[1, 30] = 100.0
    x[2, 20] = x[2, 33] = float("nan")
    x[3] = 1.0
    x[4, 36] = -100.0

    def f(x):
        return x.argmax(-1), x.argmin(-1), x.argmax(), x.double().argmin(0)

    from ember.primtorch import trace_to_prims

    out = pipeline.compile_prims(trace_to_prims(f, x), [x])(x)
    for got, want in zip(out, f(x)):
        assert got.equal(want), (got, want)
    failures = triton_aot.check_kernels(triton_kernels.values())
    assert not failures, "\n\n".join(failures[:2])

def test_attach_cubins_from_a_fresh_and_a_cached_program(triton_kernels, tmp_path, monkeypatch):
    """A CUDA artifact for the C++ wrapper: each Triton kernel gets a cubin, and each kernel step
    passes every parameter of the kernel's signature (the numels too), also when the program
    comes from the on-disk cache."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "cache", True)  # the conftest turns the graph cache off
    from ember.inductor import metrics
    from ember.primtorch import trace_to_prims

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    # A scale no earlier run used keeps the first compile a miss in a shared cache directory.
    scale = 1.0 + uuid.uuid4().int % 10**6 / 10**6
    prims = trace_to_prims(lambda x, w: torch.relu(x @ w).sum(1) * scale, x, w)
    for attempt in ("fresh", "cached"):
        hits = metrics.cache_hits
        compiled = pipeline.compile_prims(prims, [x, w])
        assert (metrics.cache_hits > hits) == (attempt == "cached")
        art = triton_aot.attach_cubins(compiled)
        kernels = {k.name: k for k in art.kernels if k.language == "triton"}
        assert kernels, attempt
        for k in kernels.values():
            assert k.binary and pathlib.Path(k.binary).read_bytes()[:4] == b"\x7fELF", attempt
        for step in art.steps:
            if step.kind == "kernel" and step.target in kernels:
                assert len(step.args) == len(kernels[step.target].arg_types), attempt


_PTX_STORES = """
import collections, json, re, sys
from ember.inductor import triton_aot
job = json.loads(sys.argv[1])
k = triton_aot._compile(job["source"], job["name"], tuple(job["types"]), job["cfg"], 90,
                        tuple(job["divisible"]))
print(json.dumps(collections.Counter(re.findall(r"st\\.global[.a-z0-9]*", k.asm["ptx"]))))
"""


def test_a_transposing_kernel_over_an_odd_width_stores_vectors(triton_kernels):
    """A static size that is no multiple of 16 (196 patches) is a constant of the kernel, so
    Triton knows its masks' runs: a kernel transposing (B, C, 196) into (B, 196, C) stores four
    elements at a time, not one (ResMLP's residual kernel ran at twice a copy's time)."""
    import json
    import subprocess
    import sys

    a, b = torch.randn(2, 64, 196), torch.randn(2, 196, 64)
    pipeline.compile_prims(trace_to_prims(lambda a, b: a * 2 + b.transpose(1, 2), a, b), [a, b])
    (src,) = [s for _, s in triton_kernels.values() if dict(s.meta).get("tiled")]
    assert "ynumel = 196" in src.source, src.source
    job = {"source": src.source, "name": src.name, "types": list(src.arg_types),
           "cfg": triton_aot._config(src),
           "divisible": [i for i, t in enumerate(src.arg_types) if t.startswith("*")]}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", _PTX_STORES, json.dumps(job)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    stores = json.loads(out.stdout.strip().splitlines()[-1])
    assert stores and all(".v" in op for op in stores), stores
