"""The in-place cache update of decode-step packages (runtime op kIndexCopy, emitted for a
`prims.index_put` step marked in_place by decode.donate_index_puts) on hand-built artifacts: rows
written into a caller's strided tensor, int32/negative indices, broadcast values, errors."""

import dataclasses

import pytest
import torch

import ember.cpp_wrapper as cw
from ember.ir import BufferIR, StepIR, new_artifact

from cppw_artifacts import meta, node


def _update_artifact(index_dtype=torch.int64):
    """cache (6, 3, 4) stored as (3, 6, 4) transposed, written at `index` with `values` (2, 3, 4)
    that broadcast over their first dimension; no outputs: the update is the result."""
    cache = meta((6, 3, 4), strides=(4, 24, 1))
    buffers = (
        BufferIR("cache", "input", cache),
        BufferIR("index", "input", meta((2,), index_dtype)),
        BufferIR("values", "input", meta((2, 3, 4), strides=(0, 4, 1))),
        BufferIR("new", "intermediate", cache),
    )
    steps = (
        StepIR("view", "", ["cache", [[6, 3, 4], [4, 24, 1], 0]], {}, ("new",)),
        StepIR("extern", "prims.index_put",
               [node("new"), [node("index")], node("values"), False], {"in_place": True},
               ("new",)),  # fmt: skip
    )
    return new_artifact(device="cpu", symbols=(), guards=(), buffers=buffers, kernels=(),
                        steps=steps, inputs=("cache", "index", "values"), outputs=())  # fmt: skip


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_rows_are_written_in_place_into_a_strided_cache(index_dtype):
    model = cw.load_artifact(_update_artifact(index_dtype))
    cache = torch.randn(3, 6, 4).transpose(0, 1)  # the compiled strides: no restride copy
    before = cache.clone()
    values = torch.randn(1, 3, 4).expand(2, 3, 4)
    assert model(cache, torch.tensor([4, -6], dtype=index_dtype), values) == []
    want = before.clone()
    want[4], want[0] = values[0], values[1]  # -6 counts from the end, as index_put's
    torch.testing.assert_close(cache, want, rtol=0, atol=0)


def test_an_index_out_of_bounds_is_an_error_not_a_write():
    model = cw.load_artifact(_update_artifact())
    cache = torch.zeros(3, 6, 4).transpose(0, 1)
    with pytest.raises(cw.EmberRuntimeError, match="out of bounds") as e:
        model(cache, torch.tensor([1, 6]), torch.ones(1, 3, 4).expand(2, 3, 4))
    assert e.value.name == "EMBER_ERR_RUNTIME"


def test_an_index_put_that_is_not_marked_in_place_stays_unsupported():
    art = _update_artifact()
    args = [node("cache"), [node("index")], node("values"), False]
    plain = StepIR("extern", "prims.index_put", args, {}, ("new",))
    art = dataclasses.replace(art, steps=(plain,))
    with pytest.raises(cw.UnsupportedArtifactError, match="prims.index_put"):
        cw.generate_wrapper(art)
