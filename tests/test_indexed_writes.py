"""KV-cache rows written by a kernel of the program (loop_ir.IndexedWrite): an in-place index
write into a graph input, lowered as the kernel that computes the new rows storing them at the
positions, instead of that kernel storing them and an extern index_put_ copying them over.
Triton kernels only (on the CPU through Triton's interpreter); C++ kernels and packages keep
the extern (test_input_updates.py). Every case matches eager step after step."""

import copy
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest  # noqa: E402
import torch  # noqa: E402

import ember  # noqa: E402
from decode_model import LAYERS, Decoder, zero_caches  # noqa: E402
from ember.inductor import config  # noqa: E402
from input_updates_model import Cache, _steps  # noqa: E402
from input_updates_model import in_place_calls  # noqa: E402,F401  (a fixture)
from rendered_kernels import rendered_kernels  # noqa: E402,F401  (a fixture)


@pytest.fixture(autouse=True)
def triton_kernels(monkeypatch):
    monkeypatch.setattr(config, "cpu_backend", "triton")


def test_the_rows_are_stored_by_a_kernel_with_no_extern_and_no_copy(in_place_calls):
    copies, kept = _steps(Cache())
    assert kept and copies == 0
    assert in_place_calls == []  # both caches' rows stored by the program's kernel


def test_a_cache_whose_old_value_is_read_keeps_its_extern_the_other_is_written(in_place_calls):
    copies, kept = _steps(Cache(read_old=True))
    assert kept and copies >= 1  # k: the functional write, copied back
    assert in_place_calls and not any(in_place_calls)  # only k's reference runs, v's is a kernel


def test_the_switch_gives_the_extern_back(in_place_calls, monkeypatch):
    monkeypatch.setattr(config, "indexed_writes", False)
    copies, _ = _steps(Cache())
    assert copies == 0 and in_place_calls and all(in_place_calls)


def test_a_row_outside_the_cache_writes_nothing_and_negative_rows_count_from_the_end():
    """Eager raises on the CPU and stops the process with a device-side assert on CUDA; a
    Triton kernel cannot raise, so the row is skipped (as the packages' copy kernel does)."""
    model = Cache()
    compiled = ember.compile(model)
    new = torch.randn(1, 2, 1, 4)
    with torch.no_grad():
        compiled(new, torch.tensor([0]))  # (the first call's trace runs eager's ops)
        before = model.k.clone(), model.v.clone()
        compiled(new + 1, torch.tensor([8]))
        assert torch.equal(model.k, before[0]) and torch.equal(model.v, before[1])
        compiled(new, torch.tensor([-1]))
    torch.testing.assert_close(model.k[:, :, 7:], new)
    torch.testing.assert_close(model.v[:, :, 7:], new * 2)
    assert not model.k[:, :, 1:7].any()


class _Held(torch.nn.Module):
    """decode_model's step with its caches held as buffers (as in-process decoding holds them)."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        for i, c in enumerate(zero_caches()):
            self.register_buffer(f"c{i}", c)

    def forward(self, tokens, positions):
        return self.step(tokens, positions, *(getattr(self, f"c{i}") for i in range(2 * LAYERS)))


def test_a_decoder_step_matches_eager_token_after_token(in_place_calls, rendered_kernels,
                                                        monkeypatch, tmp_path):  # fmt: skip
    """The rotary keys and the values stored into the caches by the kernels computing them;
    the kernels compile with Triton's real compiler (for sm_90) too."""
    from ember.inductor import triton_aot
    from ember.ir import toolchain

    monkeypatch.setattr(toolchain.config, "cache_dir", str(tmp_path))  # compiled, not loaded
    torch.manual_seed(0)
    model = _Held(Decoder().eval())
    ref = copy.deepcopy(model)
    compiled = ember.compile(model)
    tok = torch.tensor([[3]] * zero_caches()[0].shape[0])
    with torch.no_grad():
        for i in range(4):
            pos = torch.tensor([i])
            got, want = compiled(tok, pos), ref(tok, pos)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for j in range(2 * LAYERS):
                torch.testing.assert_close(getattr(model, f"c{j}"), getattr(ref, f"c{j}"),
                                           rtol=1e-4, atol=1e-4)  # fmt: skip
            tok = want[:, -1:].argmax(-1)
    assert in_place_calls == []
    stores = [src for src in rendered_kernels if "tl.store" in src and ") & (" in src]
    assert stores, "no kernel stores rows under the positions' mask"
    assert triton_aot.check_kernels(rendered_kernels.values()) == []


class _SlicedPositions(Cache):
    """The positions sliced inside the program (a view at a storage offset: once double-counted,
    every row written one slot too far)."""

    def forward(self, new, positions):
        return super().forward(new, positions[0, 1:])


def test_positions_read_through_a_view_at_an_offset(in_place_calls):
    model = _SlicedPositions()
    ref, compiled = copy.deepcopy(model), ember.compile(model)
    with torch.no_grad():
        for i in range(4):
            new, positions = torch.randn(1, 2, 1, 4), torch.tensor([[7, i]])
            torch.testing.assert_close(compiled(new, positions), ref(new, positions))
            torch.testing.assert_close(model.k, ref.k)
            torch.testing.assert_close(model.v, ref.v)
    assert in_place_calls == []


def test_a_decode_step_package_writes_its_caches_from_its_kernels(in_place_calls):
    """Packaged (the artifact a CUDA package gets; here its kernels are Triton's on the CPU):
    the updates are the kernels' IndexedWrites, no index_put step is left for the runtime, the
    caches are donated (dropped from the outputs) with their lengths, and each layer's two
    caches are written by one kernel."""
    from ember.cpp_wrapper.decode import decode_step_artifact

    torch.manual_seed(0)
    model = Decoder().eval()
    caches = zero_caches()
    example = (torch.tensor([[1]] * caches[0].shape[0]), torch.tensor([0]), *caches)
    art, _, spec = decode_step_artifact(model, example, tokens=0, positions=1,
                                        caches=range(2, 2 + 2 * LAYERS), max_new_tokens=8)
    assert not [s for s in art.steps if s.target == "prims.index_put"]
    assert spec["max_positions"] == caches[0].shape[2]
    assert len(art.outputs) == 1  # the logits; the caches are written in place
    donated = {art.inputs[i] for i in range(2, 2 + 2 * LAYERS)}
    views = [s for s in art.steps if s.kind == "view" and s.args[0] in donated]
    assert len(views) == 2 * LAYERS  # one view of each cache: the rows its kernel writes
    rows = {v.outputs[0] for v in views}
    writers = {}
    for s in art.steps:
        if s.kind == "kernel":
            written = {a for a in s.args if isinstance(a, str) and a in rows}
            if written:
                writers[s.target] = written
    assert len(writers) == LAYERS and all(len(w) == 2 for w in writers.values())
