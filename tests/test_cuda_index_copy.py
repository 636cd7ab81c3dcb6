"""A decode step's cache updates in a CUDA package: launches of `ember_index_copy` (a Triton
kernel that reads the positions on the GPU) instead of the runtime's host-indexed copies, which
synchronise the stream once per cache.

Without a GPU: the kernel runs in Triton's CPU interpreter (rows at positions, negative ones
from the end, positions outside the cache skipped, broadcast values), and a CPU decode step's
artifact, moved to CUDA, gets one kernel launch per cache whose arguments describe each
update's layout at every new-token count, compiles to an sm_90 cubin, and its C++ wrapper
builds. The GPU run is in test_decode_package_cuda.py.
"""

import dataclasses
import os
import pathlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process
pytest.importorskip("triton")

import ember.cpp_wrapper as cw  # noqa: E402
from decode_model import BATCH, HEAD_DIM, KV_HEADS, LAYERS, zero_caches  # noqa: E402
from decode_model import model  # noqa: E402,F401  (a fixture)
from ember.cpp_wrapper import cuda_index_copy  # noqa: E402
from ember.cpp_wrapper.codegen_values import parse_expr  # noqa: E402
from ember.inductor.runtime import _load_module  # noqa: E402
from ember.ir import TensorMeta  # noqa: E402


def _kernel():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    return _load_module(cuda_index_copy.SOURCE).ember_index_copy


def _launch(dst, index, values):
    """dst[index[j]] = values[j] along dim 0, as index_copy_step's arguments describe it."""
    shape = [index.shape[0], *dst.shape[1:]]
    values = values.expand(shape)
    sizes = shape + [1] * (4 - len(shape))
    pad = [0] * (4 - len(shape))
    n = int(torch.tensor(sizes).prod())
    _kernel()[(-(-n // 256),)](dst, index, values, n, *sizes[1:], dst.shape[0],
                               *dst.stride(), *pad, *values.stride(), *pad, index.stride(0),
                               BLOCK=256)  # fmt: skip


def test_the_kernel_writes_rows_at_the_positions():
    cache = torch.zeros(2, 3, 10, 4)  # (B, KV, S, D), updated along S
    new = torch.randn(2, 3, 3, 4)
    pos = torch.tensor([7, 2, -1])
    want = cache.clone()
    want.index_copy_(2, pos % 10, new)
    _launch(cache.permute(2, 0, 1, 3), pos, new.permute(2, 0, 1, 3))  # S first, as a view
    assert torch.equal(cache, want)


def test_positions_outside_the_cache_are_skipped_and_values_broadcast():
    cache = torch.zeros(6, 5, dtype=torch.bfloat16)
    rows = torch.tensor([1, 6, -7, 4], dtype=torch.int32)[::2]  # strided index: 1 and -7
    _launch(cache, rows, torch.arange(5.0).to(torch.bfloat16))
    want = torch.zeros(6, 5, dtype=torch.bfloat16)
    want[1] = torch.arange(5.0)
    assert torch.equal(cache, want)


@pytest.fixture(scope="module")
def artifact(model):
    """The CPU decode step's artifact (prefill-capable: T dynamic), before and after."""
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    art, _, _ = cw.decode.decode_step_artifact(model, example, tokens=0, positions=1,
                                               caches=range(2, 2 + 2 * LAYERS),
                                               max_new_tokens=8)  # fmt: skip
    return art, cuda_index_copy.launch_index_copies(art, arch=90)


def test_each_cache_update_becomes_a_kernel_launch(artifact):
    before, after = artifact
    extern = [s for s in before.steps if s.target == "prims.index_put"]
    launches = [s for s in after.steps if s.kind == "kernel" and s.target.startswith(
        cuda_index_copy.NAME)]  # fmt: skip
    assert len(extern) == len(launches) == 2 * LAYERS
    assert not [s for s in after.steps if s.target == "prims.index_put"]
    (kernel,) = [k for k in after.kernels if k.name.startswith(cuda_index_copy.NAME)]
    assert kernel.name == "ember_index_copy_fp32_i64_fp32"
    assert pathlib.Path(kernel.binary).read_bytes()[:4] == b"\x7fELF"  # an sm_90 cubin
    (sym,) = after.symbols
    for step in launches:  # the update's elements: T new tokens x (B, KV heads, head dim)
        n = parse_expr(step.args[3])
        for t in (1, 5, 8):
            assert n.subs(sym.symbol, t) == t * BATCH * KV_HEADS * HEAD_DIM
        grid = parse_expr(step.kwargs["grid"][0]).subs(sym.symbol, 8)
        assert grid == -(-8 * BATCH * KV_HEADS * HEAD_DIM // cuda_index_copy.BLOCK)
        rows = parse_expr(step.args[7])
        assert rows == zero_caches()[0].shape[2]  # the cache's length: positions past it skip


def test_the_cuda_wrapper_launches_it_and_builds(artifact):
    from ember.cpp_wrapper.codegen import generate_wrapper
    from ember.cpp_wrapper.model import _kernel_builds, build_model_library

    _, art = artifact

    def on_cuda(meta):
        return dataclasses.replace(meta, device="cuda:0") if isinstance(meta, TensorMeta) else meta

    art = dataclasses.replace(art, device="cuda:0", buffers=tuple(
        dataclasses.replace(b, meta=on_cuda(b.meta)) for b in art.buffers))  # fmt: skip
    source = generate_wrapper(art, kernels=_kernel_builds(art, True))
    assert source.count("// ember_index_copy_fp32_i64_fp32") == 2 * LAYERS
    assert "OP_INDEX_COPY" not in source and "index = ..." not in source
    assert build_model_library(art, standalone=True).exists()
