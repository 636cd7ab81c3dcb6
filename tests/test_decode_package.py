"""Decode-step packages: a tiny Llama-style decoder whose KV caches are inputs written in place
(index_copy_ at the positions), packaged once, then `ember_generate` in C++ against an eager
greedy loop over the same model and caches; top-k sampling by seed; refusals.

Cross-component: dynamo exports the step, inductor compiles it, cpp_wrapper rewrites each cache
update into an in-place write of the caller's buffer and runs `generate` (standalone, by
`run_package --generate`, and in process through the binding).
"""

import json
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import ember.cpp_wrapper as cw
from decode_model import (BATCH, HEAD_DIM, KV_HEADS, LAYERS, MAX_LEN, VOCAB,
                          eager_greedy, zero_caches)  # fmt: skip
from decode_model import builds, edited_copy, model  # noqa: F401  (fixtures: builds, model)
from ember.cpp_wrapper import UnsupportedArtifactError


@pytest.fixture(scope="module")
def pkg(model, tmp_path_factory, builds):
    """One package for every test (building it compiles C++)."""
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    path = tmp_path_factory.mktemp("decode") / "pkg"
    caches = range(2, 2 + 2 * LAYERS)
    path = cw.package_decode_step(model, example, path, tokens=0, positions=1, caches=caches)
    builds[1].result()
    return path


@pytest.fixture(scope="module")
def run_package(builds):
    return builds[0].result()


def _standalone(run_package, pkg, prompt, n, tmp_path, *flags):
    np.save(tmp_path / "prompt.npy", prompt.numpy())
    out = tmp_path / "out.npy"
    run = subprocess.run([str(run_package), "--generate", str(n), *flags, str(pkg),
                          str(tmp_path / "prompt.npy"), str(out)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return torch.from_numpy(np.load(out))


PROMPT = torch.tensor([[5, 17, 99, 3], [42, 0, 7, 127]])


def test_the_package_updates_caches_in_place_and_returns_only_logits(pkg, model):
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["decode"] == {"tokens": 0, "positions": 1, "caches": [2, 3, 4, 5],
                                  "logits": 0, "max_positions": MAX_LEN}  # fmt: skip
    assert [o["shape"] for o in manifest["outputs"]] == [[BATCH, 1, VOCAB]]
    loaded = cw.load_package(pkg)
    caches, eager_caches = zero_caches(), zero_caches()
    for s, tok in enumerate([7, 8, 9]):
        args = (torch.tensor([[tok], [tok + 1]]), torch.tensor([s]))
        (got,) = loaded(*args, *caches)
        with torch.no_grad():
            want = model(*args, *eager_caches)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        for c, e in zip(caches, eager_caches):  # the caller's buffers hold the new rows
            torch.testing.assert_close(c, e, atol=2e-5, rtol=1e-4)
    assert all(c[:, :, 3:].abs().sum() == 0 for c in caches)  # nothing past the positions


def test_the_cache_update_writes_only_the_new_rows(model):
    """No step copies a cache: the only cache-sized buffers are the inputs themselves (and views
    of them), each written by one in-place update of the new rows."""
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    artifact, _, spec = cw.decode_step_artifact(model, example, tokens=0, positions=1,
                                                caches=[2, 3, 4, 5])  # fmt: skip
    assert spec["max_positions"] == MAX_LEN and len(artifact.outputs) == 1
    in_place = [s for s in artifact.steps if (s.kwargs or {}).get("in_place")]
    assert len(in_place) == 2 * LAYERS
    cache_numel = KV_HEADS * MAX_LEN * HEAD_DIM
    viewed = {s.outputs[0] for s in artifact.steps if s.kind == "view"}
    big = [b.name for b in artifact.buffers if b.kind in ("intermediate", "output")
           and b.meta.numel() >= cache_numel and b.name not in viewed]  # fmt: skip
    assert not big, f"cache-sized buffers written by the step: {big}"
    src = cw.generate_wrapper(artifact, artifact_hash="x", isa="generic")
    assert src.count("h->extern_op(c, 14,") == 2 * LAYERS  # kIndexCopy, O(new rows)


def test_standalone_greedy_generate_matcheseager_greedy(pkg, model, run_package, tmp_path):
    want, _ = eager_greedy(model, PROMPT, 16)
    got = _standalone(run_package, pkg, PROMPT, 16, tmp_path)
    assert got.dtype == torch.int64 and got.shape == (BATCH, 16)
    assert not got[0].equal(got[1])  # the rows decode independently
    assert got.tolist() == want.tolist()
    in_process = cw.generate(cw.load_package(pkg), PROMPT, 16)
    assert in_process.tolist() == want.tolist()


def test_top_k_sampling_is_seeded_and_stays_in_the_top_k(pkg, model, run_package, tmp_path):
    loaded = cw.load_package(pkg)
    a = cw.generate(loaded, PROMPT, 16, top_k=5, temperature=1.5, seed=1234)
    assert cw.generate(loaded, PROMPT, 16, top_k=5, temperature=1.5, seed=1234).equal(a)
    flags = ("--top-k", "5", "--temperature", "1.5", "--seed", "1234")
    assert _standalone(run_package, pkg, PROMPT, 16, tmp_path, *flags).equal(a)
    others = [cw.generate(loaded, PROMPT, 16, top_k=5, temperature=1.5, seed=s) for s in (1, 2)]
    assert any(not o.equal(a) for o in others)  # the seed matters
    # Teacher-forced on the sampled tokens: each one is among the 5 largest eager logits.
    prompt = torch.cat([PROMPT, a[:, :-1]], 1)
    caches = zero_caches()
    with torch.no_grad():
        for s in range(prompt.shape[1]):
            logits = model(prompt[:, s : s + 1], torch.tensor([s]), *caches)[:, -1]
            if s >= PROMPT.shape[1] - 1:
                for row in range(BATCH):
                    chosen = a[row, s - PROMPT.shape[1] + 1].item()
                    assert chosen in logits[row].topk(5).indices.tolist(), (s, row, chosen)
    assert len(set(a[0].tolist())) > 1


def test_generate_refuses_bad_requests(pkg, run_package, tmp_path):
    loaded = cw.load_package(pkg)
    with pytest.raises(cw.EmberRuntimeError, match="positions"):
        cw.generate(loaded, PROMPT, MAX_LEN)  # 4 + 48 - 1 positions > 48
    with pytest.raises(cw.EmberRuntimeError, match="vocabulary"):
        cw.generate(loaded, torch.tensor([[1], [VOCAB]]), 2)
    with pytest.raises(cw.EmberRuntimeError, match="batch"):
        cw.generate(loaded, torch.zeros(BATCH + 1, 3, dtype=torch.int64), 2)
    np.save(tmp_path / "prompt.npy", PROMPT.numpy())
    run = subprocess.run([str(run_package), "--generate", str(MAX_LEN), str(pkg),
                          str(tmp_path / "prompt.npy"), str(tmp_path / "out.npy")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and "positions" in run.stderr


class NoCacheWrite(nn.Module):
    """Takes a 'cache' but never writes it: not a decode step."""

    def forward(self, tokens, positions, cache):
        return cache.sum() + tokens.float().unsqueeze(-1).expand(-1, -1, 8)


class ReadsBeforeAndAfter(nn.Module):
    """Reads the cache's old value after writing it (through a copy made before the write)."""

    def forward(self, tokens, positions, cache):
        old = cache * 2
        cache.index_copy_(0, positions, tokens.float().view(-1, 1).expand(-1, 8))
        return (old + cache).sum(0, keepdim=True)[None]


def test_packages_without_the_convention_are_refused(tmp_path):
    example = (torch.tensor([[1]]), torch.tensor([0]), torch.zeros(6, 8))
    with pytest.raises(UnsupportedArtifactError, match="not updated by an index_copy_"):
        cw.package_decode_step(NoCacheWrite(), example, tmp_path / "a", tokens=0, positions=1,
                               caches=[2])  # fmt: skip
    with pytest.raises(ValueError, match="each of the 3 inputs once"):
        cw.package_decode_step(NoCacheWrite(), example, tmp_path / "b", tokens=0, positions=1,
                               caches=[])  # fmt: skip
    with pytest.raises(UnsupportedArtifactError, match="old value"):
        cw.package_decode_step(ReadsBeforeAndAfter(), example, tmp_path / "c", tokens=0,
                               positions=1, caches=[2])  # fmt: skip


def test_generate_refuses_a_package_that_is_not_a_decode_step(pkg, tmp_path, run_package):
    path = edited_copy(pkg, tmp_path, lambda m: m.pop("decode"))  # a plain package of the same step
    loaded = cw.load_package(path)
    (logits,) = loaded(torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    assert logits.shape == (BATCH, 1, VOCAB)  # it still runs; it only lacks the convention
    with pytest.raises(cw.EmberRuntimeError, match="not a decode-step package") as e:
        cw.generate(loaded, PROMPT, 2)
    assert e.value.name == "EMBER_ERR_UNSUPPORTED"
    np.save(tmp_path / "prompt.npy", PROMPT.numpy())
    run = subprocess.run([str(run_package), "--generate", "2", str(path),
                          str(tmp_path / "prompt.npy"), str(tmp_path / "out.npy")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 9 and "package_decode_step" in run.stderr


@pytest.mark.parametrize("entry", [
    {"tokens": 9},  # out of range
    {"tokens": 1},  # the same input as positions
    {"caches": [2, 3, 4]},  # an input without a role
    {"caches": [2, 2, 4, 5]},  # a cache twice
    {"tokens": 2, "caches": [0, 3, 4, 5]},  # float tokens, an integer cache
    {"logits": 1},  # the package has one output
    {"max_positions": 0},
    {"positions": "1"},
    {"caches": 2},
    {"greedy_kernel": "ember_greedy_nope"},  # no such kernel in the library
    {"greedy_kernel": 3},
], ids=lambda e: json.dumps(e))  # fmt: skip
def test_a_hostile_decode_entry_is_a_package_error(pkg, tmp_path, entry):
    bad = edited_copy(pkg, tmp_path, lambda m: m["decode"].update(entry))
    with pytest.raises(cw.EmberRuntimeError) as e:
        cw.load_package(bad)
    assert e.value.name == "EMBER_ERR_PACKAGE" and "decode" in e.value.message


def test_a_cache_with_other_strides_is_refused_not_copied(pkg):
    loaded = cw.load_package(pkg)
    caches = zero_caches()
    caches[0] = torch.zeros(BATCH, KV_HEADS, HEAD_DIM, MAX_LEN).transpose(2, 3)  # same shape
    with pytest.raises(cw.EmberRuntimeError, match="stride"):
        loaded(torch.tensor([[1]] * BATCH), torch.tensor([0]), *caches)
