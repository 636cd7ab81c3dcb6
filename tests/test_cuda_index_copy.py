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


def _launch(dst, index, values, kernel=None):
    """dst[index[j]] = values[j] along dim 0, as index_copy_step's arguments describe it."""
    shape = [index.shape[0], *dst.shape[1:]]
    values = values.expand(shape)
    sizes = shape + [1] * (4 - len(shape))
    pad = [0] * (4 - len(shape))
    n = int(torch.tensor(sizes).prod())
    (kernel or _kernel())[(-(-n // 256),)](dst, index, values, n, *sizes[1:], dst.shape[0],
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


def test_the_64_bit_element_split_writes_the_same_rows():
    """The kernel splits an element's number in 32 bits below 2**31 elements, in 64 above: the
    64-bit branch, run here by lowering the threshold to 1 in a copy of the source."""
    _kernel()  # skipped without the interpreter
    source = cuda_index_copy.SOURCE.replace("N < 2147483648", "N < 1")
    assert source != cuda_index_copy.SOURCE
    wide = _load_module(source).ember_index_copy
    cache, new = torch.zeros(2, 3, 10, 4), torch.randn(2, 3, 3, 4)
    pos = torch.tensor([7, 2, -1])
    want = cache.clone()
    want.index_copy_(2, pos % 10, new)
    _launch(cache.permute(2, 0, 1, 3), pos, new.permute(2, 0, 1, 3), kernel=wide)
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


def test_each_layers_two_cache_updates_become_one_kernel_launch(artifact):
    before, after = artifact
    extern = [s for s in before.steps if s.target == "prims.index_put"]
    launches = [s for s in after.steps if s.kind == "kernel" and s.target.startswith(
        cuda_index_copy.NAME)]  # fmt: skip
    assert len(extern) == 2 * LAYERS and len(launches) == LAYERS
    assert not [s for s in after.steps if s.target == "prims.index_put"]
    (kernel,) = [k for k in after.kernels if k.name.startswith(cuda_index_copy.NAME)]
    assert kernel.name == "ember_index_copy2_fp32_i64_fp32"
    assert pathlib.Path(kernel.binary).read_bytes()[:4] == b"\x7fELF"  # an sm_90 cubin
    (sym,) = after.symbols
    caches = {s.outputs[0] for s in extern}
    for step in launches:  # the update's elements: T new tokens x (B, KV heads, head dim)
        assert set(step.outputs) <= caches and len(step.outputs) == 2
        n = parse_expr(step.args[5])
        for t in (1, 5, 8):
            assert n.subs(sym.symbol, t) == t * BATCH * KV_HEADS * HEAD_DIM
        grid = [parse_expr(g) for g in step.kwargs["grid"]]
        assert grid[0].subs(sym.symbol, 8) == -(-8 * BATCH * KV_HEADS * HEAD_DIM //
                                                cuda_index_copy.BLOCK) and grid[1] == 2
        rows = parse_expr(step.args[9])
        assert rows == zero_caches()[0].shape[2]  # the cache's length: positions past it skip


def _step(target, out, index, values, shape):
    from ember.ir import StepIR

    return StepIR("kernel", target, [{"node": out}, {"node": index}, {"node": values}, *shape,
                                     *range(9)], {"grid": [1]}, (out,))  # fmt: skip


def test_only_same_shaped_updates_at_the_same_positions_pair_and_nothing_moves_past_a_read():
    from ember.ir import StepIR

    k = "ember_index_copy_bf16_i64_bf16"
    kinds = {k: ("*bf16", "*i64", "*bf16", *("i64",) * 14)}
    shape = [8, 2, 1, 64, 256]
    a, b = _step(k, "c0", "pos", "k0", shape), _step(k, "c1", "pos", "v0", shape)
    other_pos, other_shape = _step(k, "c2", "pos2", "k1", shape), _step(k, "c3", "pos", "v1",
                                                                        [8, 4, 1, 64, 256])
    view, free_mine = StepIR("view", "", ["x", None], None, ("y",)), StepIR("free", "", ["k0"], None, ())
    alloc = StepIR("alloc", "", [], None, ("w",))
    read = StepIR("kernel", "kernel7", [{"node": "c0"}], {"grid": [1]}, ("z",))
    # the first's values freed after both (never moved past an allocation: it may reuse them)
    paired, _ = cuda_index_copy.pair_index_copies([a, alloc, view, free_mine, b], kinds)
    assert [s.kind for s in paired] == ["alloc", "view", "kernel", "free"]
    assert paired[3].args == ["k0"]
    assert paired[2].target == "ember_index_copy2_bf16_i64_bf16"
    assert paired[2].outputs == ("c0", "c1") and len(paired[2].args) == 27
    for middle in ([read], [free_mine, alloc]):  # a reader of the first; a free, then an alloc
        steps, used = cuda_index_copy.pair_index_copies([a, *middle, b], kinds)
        assert steps == [a, *middle, b] and list(used) == [k]
    for second in (other_pos, other_shape):
        steps, _ = cuda_index_copy.pair_index_copies([a, second], kinds)
        assert steps == [a, second]
    # copies that must stay ordered: the second's values are a view of the first's cache, or
    # both write one cache (through views)
    of_first = StepIR("view", "", ["c0", None], None, ("c0_rows",))
    from_first = _step(k, "c1", "pos", "c0_rows", shape)
    into_first = _step(k, "c0_rows", "pos", "v0", shape)
    for second in (from_first, into_first):
        steps, _ = cuda_index_copy.pair_index_copies([a, of_first, second], kinds)
        assert steps == [a, of_first, second]


def test_the_pair_kernel_writes_both_caches():
    _kernel()  # skipped without the interpreter
    kernel = _load_module(cuda_index_copy.SOURCE).ember_index_copy2
    k_cache, v_cache = torch.zeros(10, 3, 4), torch.zeros(3, 10, 4).transpose(0, 1)
    k_new, v_new = torch.randn(2, 3, 4), torch.randn(2, 4, 3).transpose(1, 2)  # strided values
    pos = torch.tensor([7, -1])
    n = 2 * 3 * 4
    kernel[(1, 2)](k_cache, v_cache, pos, k_new, v_new, n, 3, 4, 1, 10,
                   *k_cache.stride(), 0, *k_new.stride(), 0, *v_cache.stride(), 0,
                   *v_new.stride(), 0, pos.stride(0), BLOCK=256)  # fmt: skip
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        want = torch.zeros(10, 3, 4)
        want[[7, 9]] = new
        assert torch.equal(cache, want)


def test_the_cuda_wrapper_launches_it_and_builds(artifact):
    from ember.cpp_wrapper.codegen import generate_wrapper
    from ember.cpp_wrapper.model import _kernel_builds, build_model_library

    _, art = artifact

    def on_cuda(meta):
        return dataclasses.replace(meta, device="cuda:0") if isinstance(meta, TensorMeta) else meta

    art = dataclasses.replace(art, device="cuda:0", buffers=tuple(
        dataclasses.replace(b, meta=on_cuda(b.meta)) for b in art.buffers))  # fmt: skip
    source = generate_wrapper(art, kernels=_kernel_builds(art, True))
    assert source.count("// ember_index_copy2_fp32_i64_fp32") == LAYERS
    assert "OP_INDEX_COPY" not in source and "index = ..." not in source
    assert build_model_library(art, standalone=True).exists()
