"""Threads: one compiled module called from 8 threads at once, 8 threads each compiling its own
function (and 8 racing to compile the same one) on first call, and ember.reset() while other
threads call compiled code: results equal eager's, nothing crashes or deadlocks."""

import sys
import threading

import pytest
import torch
import torch.nn as nn

import ember
from ember.dynamo import CompileCounter

TIMEOUT_S = 120  # a deadlock fails the test instead of hanging the run


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def run_threads(n, target):
    """Run target(i) in n threads started together; re-raise the first failure."""
    errors: list = []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001  (reported below, with its thread)
            errors.append((i, e))

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "threads deadlocked or hung"
    if errors:
        raise AssertionError(f"thread {errors[0][0]} failed") from errors[0][1]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(16, 32)
        self.lin2 = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(x + self.lin2(torch.relu(self.lin1(x))))


def _module_calls(device, backend):
    torch.manual_seed(0)
    model = Block().to(device).eval()
    cnt = CompileCounter(dynamic=True) if backend == "counter" else None
    compiled = ember.compile(model, backend=cnt or backend)
    with torch.no_grad():
        compiled(torch.randn(4, 16, device=device))  # warm
        compiled(torch.randn(5, 16, device=device))  # and dynamic in the batch size

        def call(i):
            gen = torch.Generator(device=device).manual_seed(i)
            with torch.no_grad():  # grad mode is per thread
                for step in range(30):
                    x = torch.randn(2 + (i + step) % 6, 16, device=device, generator=gen)
                    torch.testing.assert_close(compiled(x), model(x))

        run_threads(8, call)
    if cnt is not None:
        assert cnt.frame_count == 2  # the threads only hit the cache


def test_eight_threads_call_one_compiled_module():
    _module_calls("cpu", "counter")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eight_threads_call_one_compiled_module_cuda():
    _module_calls("cuda", "counter")


def _make_function(k):
    """A distinct function (its own code object) per k."""
    src = f"def f_{k}(x, y):\n    z = x * {k + 1} + y.sin()\n    return (z @ y.t()).relu() - {k}\n"
    env = {"torch": torch}
    exec(compile(src, f"<thread function {k}>", "exec"), env)
    return env[f"f_{k}"]


def test_eight_threads_compile_different_functions_at_once():
    fns = [_make_function(k) for k in range(8)]
    counters = [CompileCounter() for _ in range(8)]
    compiled = [ember.compile(f, backend=c) for f, c in zip(fns, counters)]

    def call(i):
        gen = torch.Generator().manual_seed(i)
        for _ in range(5):
            x, y = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
            torch.testing.assert_close(compiled[i](x, y), fns[i](x, y))

    run_threads(8, call)
    assert [c.frame_count for c in counters] == [1] * 8


def test_eight_threads_race_to_compile_one_function():
    f = _make_function(0)
    cnt = CompileCounter()
    cf = ember.compile(f, backend=cnt)

    def call(i):
        gen = torch.Generator().manual_seed(i)
        for step in range(10):
            n = 2 + (i + step) % 3  # three sizes: recompiles race with hits
            x, y = torch.randn(n, 4, generator=gen), torch.randn(n, 4, generator=gen)
            torch.testing.assert_close(cf(x, y), f(x, y))

    run_threads(8, call)
    # one compile per size: a thread that waited for another's compile of the same frame uses it
    assert cnt.frame_count == 3


class _Config:
    """Read through a Python property: the guard on it runs Python, where threads switch."""

    @property
    def scale(self):
        return 2.0


def test_reset_while_other_threads_call_compiled_code():
    """reset() from one thread while others are inside the guard check of an entry it frees: the
    hook held entries through the vector, which reset emptied under it (use after free)."""
    cfg = _Config()

    def f(x, y):
        return x * cfg.scale + y

    cf = ember.compile(f, backend="eager")
    stop = threading.Event()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, mid-guard included

    def call(i):
        gen = torch.Generator().manual_seed(i)
        if i == 0:
            for _ in range(200):
                ember.reset()
            stop.set()
            return
        while not stop.is_set():
            x, y = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
            torch.testing.assert_close(cf(x, y), f(x, y))

    try:
        run_threads(8, call)
    finally:
        sys.setswitchinterval(interval)
