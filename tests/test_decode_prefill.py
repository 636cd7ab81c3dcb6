"""Prefill in one call: a decode step packaged with a dynamic number of new tokens (T in
[1, max_new_tokens]) runs a whole prompt in one `ember_generate` step (a longer one in chunks of
max_new_tokens), then one token per step; tokens and logits against eager, step counts against
the token-by-token package, refusals.

Cross-component: dynamo exports the step with a Dim on the tokens' length, inductor compiles it
once for every T, cpp_wrapper donates the caches and `ember_generate` (standalone through
`run_package --generate`, and in process) picks the prefill path from the manifest.
"""

import json
import subprocess

import numpy as np
import pytest
import torch

import ember.cpp_wrapper as cw
from ember.dynamo import SpecializationError
from decode_model import BATCH, LAYERS, MAX_LEN, VOCAB, eager_greedy, zero_caches
from decode_model import builds, edited_copy, model  # noqa: F401  (fixtures: builds, model)

MOST = 32  # the package's max_new_tokens: prompts up to this long go in one step
TOL = dict(atol=2e-5, rtol=1e-4)  # as test_decode_package.py


def _package(model, path, **kw):
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    caches = range(2, 2 + 2 * LAYERS)
    return cw.package_decode_step(model, example, path, tokens=0, positions=1, caches=caches, **kw)


@pytest.fixture(scope="module")
def prefill_pkg(model, tmp_path_factory, builds):
    path = _package(model, tmp_path_factory.mktemp("prefill") / "pkg", max_new_tokens=MOST)
    builds[1].result()
    return path


@pytest.fixture(scope="module")
def static_pkg(model, tmp_path_factory, builds):
    """The old convention: a static one-token step, its prompts fed token by token."""
    path = _package(model, tmp_path_factory.mktemp("static") / "pkg")
    builds[1].result()
    return path


def _prompt(length, seed=0):
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))


def _standalone(run_package, pkg, prompt, n, tmp_path):
    np.save(tmp_path / "prompt.npy", prompt.numpy())
    return subprocess.run([str(run_package), "--generate", str(n), str(pkg),
                           str(tmp_path / "prompt.npy"), str(tmp_path / "out.npy")],
                          capture_output=True, text=True)  # fmt: skip


def test_the_manifest_records_the_dynamic_new_tokens(prefill_pkg, static_pkg):
    decode = json.loads((prefill_pkg / "manifest.json").read_text())
    assert decode["decode"]["max_new_tokens"] == MOST
    (sym,) = decode["symbols"]
    assert (sym["lower"], sym["upper"]) == (1, MOST)
    assert decode["inputs"][0]["shape"] == [BATCH, sym["name"]]
    assert decode["inputs"][1]["shape"] == [sym["name"]]
    old = json.loads((static_pkg / "manifest.json").read_text())
    assert "max_new_tokens" not in old["decode"] and old["symbols"] == []


@pytest.mark.parametrize("length", [1, 5, 17])
def test_greedy_tokens_equal_eager_from_one_package(prefill_pkg, model, length, builds,
                                                    tmp_path):  # fmt: skip
    prompt = _prompt(length, seed=length)
    want, _ = eager_greedy(model, prompt, 16)
    loaded = cw.load_package(prefill_pkg)
    got = cw.generate(loaded, prompt, 16)
    assert got.tolist() == want.tolist()
    assert cw.run_count(loaded) == 16  # the prompt in one step, then 15 single tokens
    run = _standalone(builds[0].result(), prefill_pkg, prompt, 16, tmp_path)
    assert run.returncode == 0, run.stderr
    assert np.load(tmp_path / "out.npy").tolist() == want.tolist()


def test_the_prefill_call_gives_eager_last_position_logits(prefill_pkg, model):
    loaded = cw.load_package(prefill_pkg)
    prompt = _prompt(17, seed=3)
    caches, eager_caches = zero_caches(), zero_caches()
    (got,) = loaded(prompt, torch.arange(17), *caches)
    assert got.shape == (BATCH, 17, VOCAB)
    with torch.no_grad():
        want = model(prompt, torch.arange(17), *eager_caches)
    torch.testing.assert_close(got[:, -1], want[:, -1], **TOL)
    torch.testing.assert_close(got, want, **TOL)  # every position is causal, as eager's
    _, step_logits = eager_greedy(model, prompt, 1)  # token by token through the prompt
    torch.testing.assert_close(got[:, -1], step_logits[:, 0], **TOL)
    for c, e in zip(caches, eager_caches):
        torch.testing.assert_close(c, e, **TOL)
    (one,) = loaded(torch.tensor([[4], [9]]), torch.tensor([17]), *caches)  # then T = 1
    with torch.no_grad():
        torch.testing.assert_close(one, model(torch.tensor([[4], [9]]), torch.tensor([17]),
                                              *eager_caches), **TOL)  # fmt: skip


def test_prefill_is_one_step_call_and_the_old_package_goes_token_by_token(
        prefill_pkg, static_pkg, model):  # fmt: skip
    prompt, n = _prompt(17, seed=7), 4
    want, _ = eager_greedy(model, prompt, n)
    new, old = cw.load_package(prefill_pkg), cw.load_package(static_pkg)
    assert cw.generate(new, prompt, n).tolist() == want.tolist()
    assert cw.generate(old, prompt, n).tolist() == want.tolist()  # an old package still works
    assert cw.run_count(new) == n  # 1 prefill step + n - 1 single tokens
    assert cw.run_count(old) == 17 + n - 1  # one step per prompt token, then n - 1
    sampled = dict(top_k=5, temperature=1.5, seed=99)  # the same draws on both paths
    assert cw.generate(new, prompt, 8, **sampled).equal(cw.generate(old, prompt, 8, **sampled))


@pytest.fixture(scope="module")
def chunked_pkg(model, tmp_path_factory, builds):
    """A prefill step taking at most CHUNK new tokens: longer prompts go in chunks."""
    path = _package(model, tmp_path_factory.mktemp("chunked") / "pkg", max_new_tokens=CHUNK)
    builds[1].result()
    return path


CHUNK = 8


@pytest.mark.parametrize("length", [20, 16])  # 2.5 chunks (the last one short), 2 full chunks
def test_a_prompt_longer_than_max_new_tokens_runs_in_chunks(chunked_pkg, static_pkg, model,
                                                           builds, length, tmp_path):  # fmt: skip
    prompt, n = _prompt(length, seed=length), 6
    want, _ = eager_greedy(model, prompt, n)
    loaded = cw.load_package(chunked_pkg)
    assert cw.generate(loaded, prompt, n).tolist() == want.tolist()
    assert cw.run_count(loaded) == -(-length // CHUNK) + n - 1  # the chunks, then n - 1 tokens
    sampled = dict(top_k=5, temperature=1.5, seed=5)  # the same draws as token by token
    old = cw.load_package(static_pkg)
    assert cw.generate(loaded, prompt, n, **sampled).equal(cw.generate(old, prompt, n, **sampled))
    run = _standalone(builds[0].result(), chunked_pkg, prompt, n, tmp_path)
    assert run.returncode == 0, run.stderr
    assert np.load(tmp_path / "out.npy").tolist() == want.tolist()


def test_prompts_longer_than_the_cache_are_refused(prefill_pkg, model, builds, tmp_path):
    loaded = cw.load_package(prefill_pkg)
    with pytest.raises(cw.EmberRuntimeError, match=f"caches hold {MAX_LEN} positions") as e:
        cw.generate(loaded, _prompt(MOST), MAX_LEN - MOST + 2)  # 32 + 18 - 1 > 48
    assert e.value.name == "EMBER_ERR_INVALID_ARGUMENT"
    assert cw.run_count(loaded) == 0  # refused before any step
    assert cw.generate(loaded, _prompt(MOST), MAX_LEN - MOST + 1).shape == (BATCH, 17)
    assert cw.generate(loaded, _prompt(MAX_LEN), 1).shape == (BATCH, 1)  # chunks of 32 and 16
    with pytest.raises(cw.EmberRuntimeError, match="outside its range"):  # a direct run too
        loaded(_prompt(MOST + 1), torch.arange(MOST + 1), *zero_caches())
    run = _standalone(builds[0].result(), prefill_pkg, _prompt(MAX_LEN), 2, tmp_path)
    assert run.returncode == 1 and f"caches hold {MAX_LEN} positions" in run.stderr, run.stderr
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    with pytest.raises(ValueError, match="exceeds the caches' length"):
        cw.decode_step_artifact(model, example, tokens=0, positions=1, caches=[2, 3, 4, 5],
                                max_new_tokens=MAX_LEN + 1)  # fmt: skip


@pytest.mark.parametrize("which, entry, words", [
    ("static", {"max_new_tokens": 8}, "sharing a dynamic size"),  # a static step claims prefill
    ("prefill", {"max_new_tokens": 8}, "must be [1, 8]"),  # another range than the library's
    ("prefill", {"max_new_tokens": MAX_LEN + 1}, "max_new_tokens"),  # beyond the caches
])  # fmt: skip
def test_the_loader_checks_the_prefill_convention(prefill_pkg, static_pkg, tmp_path, which,
                                                  entry, words):  # fmt: skip
    pkg = prefill_pkg if which == "prefill" else static_pkg
    bad = edited_copy(pkg, tmp_path, lambda m: m["decode"].update(entry))
    with pytest.raises(cw.EmberRuntimeError) as e:
        cw.load_package(bad)
    assert e.value.name == "EMBER_ERR_PACKAGE" and words in e.value.message, e.value.message


def test_a_prefill_package_without_its_entry_is_refused_by_generate(prefill_pkg, tmp_path):
    """Without max_new_tokens the manifest says one token per step: the dynamic step is not."""
    bad = edited_copy(prefill_pkg, tmp_path, lambda m: m["decode"].pop("max_new_tokens"))
    with pytest.raises(cw.EmberRuntimeError, match="one token per step"):
        cw.generate(cw.load_package(bad), _prompt(3), 2)


def test_a_step_that_is_another_program_at_one_new_token_is_refused(model):
    """export checks the prefill step at T = 1 (the Dim starts at 1): a branch on T == 1 is
    refused when packaging, naming the Dim and the line."""

    class OneTokenBranch(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, tokens, positions, *caches):
            out = self.inner(tokens, positions, *caches)
            return out * 2 if tokens.shape[1] == 1 else out

    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    with pytest.raises(SpecializationError, match="Dim 'new_tokens' has min=1.*test_decode_pre"):
        cw.decode_step_artifact(OneTokenBranch(model), example, tokens=0, positions=1,
                                caches=[2, 3, 4, 5], max_new_tokens=8)  # fmt: skip
