"""Guards never lie: a seeded random walk over sizes, strides, dtypes, requires_grad, grad mode,
autocast, the default dtype, a global, a closure cell, a module attribute and the training flag
(guard_walk.py) must match eager after every change and never recompile a configuration seen
before; plus regression tests for the guards the walk found missing."""

import pytest
import torch

import ember
from ember.dynamo import CompileCounter

from guard_walk import run_walk


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def test_walk_with_the_eager_backend_and_automatic_dynamic_sizes():
    walk = run_walk("eager", steps=200, seed=0)
    # revisits (30% of steps) hit the cache: far fewer compiles than steps
    assert walk.fn_counter.count < 200 and walk.net_counter.count < 200


def test_default_dtype_is_guarded():
    """torch.ones(3) takes the default dtype, and the graph is traced with it (its example values
    are float32): after torch.set_default_dtype(torch.float64) the frame is traced again (a
    backend that bakes dtypes in, aot_eager, returned float32 where eager gave float64:
    tests/test_guard_soundness_backends.py)."""
    cnt = CompileCounter()
    seen = []

    def backend(gm, example_inputs):
        out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0][0]
        seen.append(out.meta["example_value"].dtype)
        return cnt(gm, example_inputs)

    def f(x):
        return x + torch.ones(3)

    cf = ember.compile(f, backend=backend)
    x = torch.ones(3)
    default = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32, torch.float64):
            torch.set_default_dtype(dtype)
            assert cf(x).dtype == f(x).dtype == dtype
    finally:
        torch.set_default_dtype(default)
    assert cnt.frame_count == 2 and seen == [torch.float32, torch.float64]


def test_autocast_dtype_is_guarded():
    """The graph handed to a backend is traced under autocast's dtype (its example values are
    bfloat16): under float16 autocast it must be traced again, not reused."""
    cnt = CompileCounter()
    lin = torch.nn.Linear(4, 4)

    def f(x):
        return lin(x)

    cf = ember.compile(f, backend=cnt)
    x = torch.randn(2, 4)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            assert cf(x).dtype == dtype
    assert cnt.frame_count == 2


def test_device_change_recompiles_and_matches():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    cnt = CompileCounter()

    def f(x):
        return torch.sin(x) * 2 + torch.ones(x.shape, device=x.device)

    cf = ember.compile(f, backend=cnt)
    for device in devices * 2:
        x = torch.randn(5, device=device)
        torch.testing.assert_close(cf(x), f(x))
    assert cnt.frame_count == len(devices)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_walk_moving_between_cpu_and_cuda():
    cnt = CompileCounter()

    def f(x, y):
        return (x @ y).relu() + x.sum()

    cf = ember.compile(f, backend=cnt)
    gen = torch.Generator().manual_seed(0)
    import random

    rng = random.Random(0)
    seen = set()
    for _ in range(40):
        device = rng.choice(("cpu", "cuda"))
        dtype = rng.choice((torch.float32, torch.float16))
        n = rng.choice((2, 3))
        x = torch.randn(n, n, generator=gen).to(device, dtype)
        y = torch.randn(n, n, generator=gen).to(device, dtype)
        before = cnt.frame_count
        torch.testing.assert_close(cf(x, y), f(x, y))
        if (device, dtype, n) in seen:
            assert cnt.frame_count == before
        seen.add((device, dtype, n))
    assert cnt.frame_count <= len(seen)


@pytest.mark.parametrize("base", [torch.nn.Module, object])
def test_a_class_constant_is_guarded_as_the_instance_reads_it(base):
    """A trace that read the class's value (no instance value) kept returning it after the
    instance set its own, or the class changed its."""

    class M(base):
        scale = 2.0

        def forward(self, x):
            return x * self.scale

    m, x = M(), torch.ones(3)
    f = (lambda x: m.forward(x)) if base is object else m
    compiled = ember.compile(f, backend="eager")  # the traced graph holds the constant
    for change in (None, lambda: setattr(m, "scale", 7.0), lambda: delattr(m, "scale"),
                   lambda: setattr(M, "scale", 5.0)):
        if change is not None:
            change()
        torch.testing.assert_close(compiled(x), x * m.scale)
