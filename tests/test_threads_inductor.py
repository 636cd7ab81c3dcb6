"""Threads through inductor: 8 threads compile 8 different functions at once on first call, then
call one compiled module concurrently; results equal eager's (CUDA variant on the device).

The race is widened on purpose: the inductor caches are off (a cache hit skips tracing and
lowering, where the shared state was) and the interpreter switches threads every 10 us instead of
every 5 ms. Before the fix (inductor's `ops` handler stack was one list for the process, and
aot_autograd's lazy compile ran outside any lock) this failed 20 runs in 20 on CPU."""

import sys
import threading
import time

import pytest
import torch

import ember
from ember.inductor.config import config

_DEADLINE_S = 120  # all threads together; a hang fails the test instead of stalling the suite


def _run_threads(n, target):
    errors: list = []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + _DEADLINE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads deadlocked or hung"
    if errors:
        raise errors[0]


def _function(k):
    src = f"def g_{k}(x, y):\n    return (x * {k + 1} + y.cos()).relu().sum(-1) - {k}\n"
    env = {"torch": torch}
    exec(compile(src, f"<inductor thread function {k}>", "exec"), env)
    return env[f"g_{k}"]


@pytest.fixture
def racy(monkeypatch):
    monkeypatch.setattr(config, "cache", False)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    ember.reset()
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        ember.reset()


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")]),
])  # fmt: skip
def test_eight_threads_compile_and_call_under_inductor(device, racy):
    fns = [_function(k) for k in range(8)]
    compiled = [ember.compile(f, backend="inductor") for f in fns]

    def call(i):
        gen = torch.Generator(device=device).manual_seed(i)
        for _ in range(4):
            x = torch.randn(4, 8, device=device, generator=gen)
            y = torch.randn(4, 8, device=device, generator=gen)
            torch.testing.assert_close(compiled[i](x, y), fns[i](x, y))
            torch.testing.assert_close(compiled[0](x, y), fns[0](x, y))  # shared, concurrently

    _run_threads(8, call)


def test_concurrent_traces_restore_the_cudnn_sdp_switch(racy):
    # Every trace turns cuDNN attention off and restores what it found on exit. Two traces
    # overlapping on different threads restored in the wrong order: the second saved the first's
    # "off" and put it back last, leaving cuDNN attention off for the rest of the process.
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        fns = [_function(k) for k in range(8)]
        compiled = [ember.compile(f, backend="inductor") for f in fns]
        _run_threads(8, lambda i: compiled[i](torch.randn(4, 8), torch.randn(4, 8)))
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
