"""Remembered Triton autotuning choices: read from disk once per change of the file, not once
per kernel (a warm compile looks every kernel's choice up, twice)."""

import json
import types

import pytest
import torch
from ember.inductor import config, runtime
from ember.inductor.config import Config, _from_env
from ember.ir import toolchain

CFGS = [{"XBLOCK": 64, "num_warps": 1}, {"XBLOCK": 256, "num_warps": 4}]


@pytest.fixture
def choices(tmp_path, monkeypatch):
    """An empty cache dir, autotuning on, and a count of the times autotune.json is parsed."""
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "autotune", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    parses = []
    real = json.loads

    def counting(text, *a, **k):
        parses.append(len(text))
        return real(text, *a, **k)

    monkeypatch.setattr(runtime.json, "loads", counting)
    return parses


def _launcher(key):
    return types.SimpleNamespace(key=key, sizes=(1024,), configs=CFGS, source="", fn_name="k")


def _write(known):
    runtime.atomic_write(runtime._autotune_path(), json.dumps(known))


def test_many_lookups_parse_the_file_once(choices):
    _write({f"k{i}:(1024,)": CFGS[i % 2] for i in range(200)})
    found = [runtime._remembered_config(_launcher(f"k{i}")) for i in range(200)]
    assert found == [CFGS[i % 2] for i in range(200)]
    assert runtime._remembered_config(_launcher("unknown")) is None
    assert len(choices) == 1


def test_a_rewritten_file_is_read_again(choices):
    _write({"k1:(1024,)": CFGS[0]})
    assert runtime._remembered_config(_launcher("k1")) == CFGS[0]
    # another process tunes again: same size of file, replaced atomically
    _write({"k1:(1024,)": CFGS[1]})
    assert runtime._remembered_config(_launcher("k1")) == CFGS[1]
    assert runtime._remembered_config(_launcher("k1")) == CFGS[1]
    assert len(choices) == 2


def test_missing_corrupt_or_foreign_files_remember_nothing(choices):
    assert runtime._remembered_config(_launcher("k1")) is None
    runtime.atomic_write(runtime._autotune_path(), "{not json")
    assert runtime._remembered_config(_launcher("k1")) is None
    runtime.atomic_write(runtime._autotune_path(), "[1, 2]")
    assert runtime._remembered_config(_launcher("k1")) is None
    _write({"k1:(1024,)": {"XBLOCK": 8, "num_warps": 1}})  # a config no longer offered
    assert runtime._remembered_config(_launcher("k1")) is None


def test_recording_a_choice_keeps_the_others_and_the_shared_copy(choices, monkeypatch):
    _write({"k1:(1024,)": CFGS[0]})
    before = runtime._known_choices()
    shared = dict(before)

    # k2's configs time as [2.0, 1.0]: the second wins
    _fake_timing(monkeypatch, [2.0, 1.0])
    k2 = _launcher("k2")
    assert runtime.autotune(k2, []) == CFGS[1]
    assert before == shared  # the cached dict was not changed in place
    on_disk = json.loads(runtime._autotune_path().read_text())
    assert on_disk == {"k1:(1024,)": CFGS[0], "k2:(1024,)": CFGS[1]}
    assert runtime._remembered_config(_launcher("k2")) == CFGS[1]


@pytest.mark.parametrize("view", [
    lambda base: base[:, :49],  # a row-padded buffer viewed back to its length (a gap per row)
    lambda base: base[:1, :5].expand(3, 5),  # broadcast: stride 0
    lambda base: base[1:, 3:][:, ::2],  # an offset and a step
    lambda base: base[:0],  # empty
])  # fmt: skip
def test_trial_launches_get_copies_laid_out_as_the_arguments(view):
    """Autotuning launches each config on copies; the kernel indexes them with the strides it was
    generated for, so a copy has the argument's strides, values, and memory of its own."""
    from ember.inductor.runtime import scratch_copy

    arg = view(torch.randn(4, 64))
    copy = scratch_copy(arg)
    assert copy.shape == arg.shape and copy.stride() == arg.stride()
    assert torch.equal(copy, arg)
    if arg.numel():
        assert copy.untyped_storage().data_ptr() != arg.untyped_storage().data_ptr()


def _fake_timing(monkeypatch, times, calls=None):
    """Configs that take `times` ms at every launch; `calls` collects measure's arguments."""
    monkeypatch.setattr(runtime, "_trial_launch", lambda launcher, cfg, copies: None)

    def cuda_measure(launches):
        def measure(indices, rounds, warm):
            if calls is not None:
                calls.append((list(indices), rounds, warm))
            return [[times[i]] * rounds for i in indices]

        return measure

    monkeypatch.setattr(runtime.trial_timing, "cuda_measure", cuda_measure)


def test_the_timing_budget_sets_warm_up_and_rounds(choices, monkeypatch):
    """EMBER_AUTOTUNE_MS=W,R: about W ms of warm-up and R ms of timed launches for the fastest
    config (1 ms a launch here); a config clearly slower is dropped after the first rounds."""
    from ember.inductor import trial_timing

    calls = []
    _fake_timing(monkeypatch, [1.0, 3.0], calls)
    monkeypatch.setenv("EMBER_AUTOTUNE_MS", "3,8")
    monkeypatch.setattr(config, "autotune_ms", _from_env(Config()).autotune_ms)
    k3 = _launcher("k3")
    assert runtime.autotune(k3, []) == CFGS[0]
    first = trial_timing.FIRST_ROUNDS
    # the estimate, then every config for the first phase; only the fastest was close enough
    # to go on, and being alone it needed no more rounds
    assert calls == [([0, 1], 1, 1), ([0, 1], first, 3)]


@pytest.mark.parametrize("value", ["5", "a,b", "-1,3", "5,20,1", "0,10", "3,", "inf,10"])
def test_a_malformed_timing_budget_names_the_variable_and_its_form(monkeypatch, value):
    monkeypatch.setenv("EMBER_AUTOTUNE_MS", value)
    expected = f"EMBER_AUTOTUNE_MS must be two positive numbers 'W,R' in milliseconds .*'{value}'"
    with pytest.raises(ValueError, match=expected):
        _from_env(Config())


def test_a_timing_budget_takes_fractions_and_spaces(monkeypatch):
    monkeypatch.setenv("EMBER_AUTOTUNE_MS", "0.5, 12")
    assert _from_env(Config()).autotune_ms == (0.5, 12.0)


KERNEL = """
import triton
import triton.language as tl


@triton.jit
def kname(in_ptr0, in_ptr1, out_ptr2, out_ptr3, xnumel, XBLOCK: tl.constexpr):
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = x0 < xnumel
    tmp0 = tl.load(in_ptr0 + x0, xmask)
    tmp1 = tl.load(in_ptr1 + x0, xmask)
    tl.store(in_ptr1 + x0, tmp1 + tmp0, xmask)
    tl.store(out_ptr2 + x0, tmp0 * 2, xmask)
    tl.atomic_add(out_ptr3 + x0 % 4, tmp0, xmask)
"""


def test_trial_launches_copy_only_what_repeating_them_would_change():
    """Read-only inputs and outputs written whole are the real tensors; an argument both read
    and written (in place), or accumulated into, is a copy; so is an output sharing memory
    with another argument."""
    launcher = runtime.TritonLauncher("kname", KERNEL, CFGS, 64, None)
    big, inplace, out, acc = (torch.zeros(64) for _ in range(4))
    trial = runtime.trial_arguments(launcher, [big, inplace, out, acc])
    assert trial[0] is big and trial[2] is out
    for real, copy in ((inplace, trial[1]), (acc, trial[3])):
        assert copy is not real and torch.equal(copy, real)
        assert copy.untyped_storage().data_ptr() != real.untyped_storage().data_ptr()
    # the output viewing the input's memory: written by the trials, so a copy
    base = torch.zeros(128)
    trial = runtime.trial_arguments(launcher, [base[:64], inplace, base[64:], acc])
    where = base.untyped_storage().data_ptr()
    assert trial[2].untyped_storage().data_ptr() != where  # the written one is a copy
    assert trial[0].untyped_storage().data_ptr() == where  # the read-only one is not
