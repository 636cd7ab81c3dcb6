"""A seeded random walk over everything a compiled frame's result may depend on (sizes, strides,
dtypes, requires_grad, grad mode, autocast, the default dtype, a global, a closure cell, a module
attribute, the training flag): after every change the compiled result must equal eager's, and a
configuration seen before must not compile again. Shared by dynamo's walk (cheap backends) and the
cross-component one under inductor (tests/test_guard_soundness_inductor.py)."""

from __future__ import annotations

import random

import torch
import torch.nn as nn

import ember
from ember.dynamo import config, convert

G_SCALE = 1.0  # a global read by the compiled function; the walk rebinds it

# Each factor and the values the walk moves between. Sizes include 1 (always specialised) and
# several others (automatic dynamic makes them a symbol under a backend that takes symbols).
FACTORS: dict[str, tuple] = {
    "rows": (1, 3, 4),
    "layout": ("contiguous", "transposed", "sliced", "offset"),
    "dtype": (torch.float32, torch.float64),
    "requires_grad": (False, True),
    "grad_mode": (True, False),
    "autocast": (None, torch.bfloat16, torch.float16),
    "default_dtype": (torch.float32, torch.float64),
    "global": (1.0, 2.0),
    "cell": (0.5, -1.0),
    "attr": (1.0, 3.0),
    "training": (True, False),
}
# What each compiled object's guards cover: the function reads everything; the module neither
# the global nor the cell, but the default dtype is process state every frame is guarded on.
MODULE_FACTORS = ("rows", "layout", "dtype", "requires_grad", "grad_mode", "autocast",
                  "default_dtype", "attr", "training")  # fmt: skip


class Net(nn.Module):
    """A module whose result depends on an attribute (`scale`) and on `self.training`."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.0)  # p=0: training changes nothing here, the branch below does
        self.scale = 1.0

    def forward(self, x):
        y = self.drop(self.lin(x.to(self.lin.weight.dtype))) * self.scale
        if self.training:
            return y + 1.0
        return y - 1.0


def make_function(net):
    """A closure over `bias` (a cell the walk rewrites) and `net` (a module in a cell)."""
    bias = 0.5

    def fn(x):
        y = net(x) * G_SCALE + bias
        if torch.is_grad_enabled():
            y = y * 2
        # a factory with no dtype: its result follows torch.get_default_dtype()
        y = y + torch.ones(y.shape[-1]) + x
        return torch.relu(y).sum(0) + torch.arange(y.shape[-1])

    def set_bias(value):
        nonlocal bias
        bias = value

    return fn, set_bias


def make_input(cfg: dict, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """A tensor of `rows` x 6 with the configuration's dtype and memory layout."""
    n, layout = cfg["rows"], cfg["layout"]
    shape = {"contiguous": (n, 6), "transposed": (6, n), "sliced": (n, 12), "offset": (n + 1, 6)}
    base = torch.randn(shape[layout], generator=gen, dtype=torch.float32).to(cfg["dtype"])
    base = base.to(device)
    x = {"contiguous": base, "transposed": base.t(), "sliced": base[:, ::2],
         "offset": base[1:]}[layout]  # fmt: skip
    return x


class Counting:
    """Wraps a backend and counts the graphs it compiled."""

    def __init__(self, backend):
        self.backend = ember.dynamo.lookup_backend(backend)
        self.count = 0
        self.ember_supports_dynamic = convert.supports_dynamic(self.backend)

    def __call__(self, gm, example_inputs):
        self.count += 1
        return self.backend(gm, example_inputs)


def _tolerance(out: torch.Tensor, cfg: dict) -> dict:
    # compiled graphs may round reduced-precision intermediates in another order than eager
    if cfg["autocast"] is not None or out.dtype in (torch.bfloat16, torch.float16):
        return {"atol": 0.1, "rtol": 0.03}
    return {"atol": 1e-5, "rtol": 1e-5}


class Walk:
    """The compiled function and module, their eager twins, and the factors' current values."""

    def __init__(self, backend, seed: int, factors: dict = FACTORS):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.factors = factors
        torch.manual_seed(seed)
        self.net = Net()
        self.fn, self.set_bias = make_function(self.net)
        self.fn_counter, self.net_counter = Counting(backend), Counting(backend)
        self.fn_c = ember.compile(self.fn, backend=self.fn_counter)
        self.net_c = ember.compile(self.net, backend=self.net_counter)
        self.cfg = {k: v[0] for k, v in factors.items()}
        self.seen_fn: set = set()
        self.seen_net: set = set()
        self.history: list = []

    def apply(self, cfg: dict) -> None:
        """Make the process state (global, cell, attribute, flag, default dtype) match cfg."""
        globals()["G_SCALE"] = cfg["global"]
        self.set_bias(cfg["cell"])
        self.net_c.scale = cfg["attr"]  # through the wrapper: it forwards to the module
        self.net_c.train(cfg["training"])
        torch.set_default_dtype(cfg["default_dtype"])

    def step(self) -> None:
        """Change one or two factors (or go back to a configuration seen before), then check."""
        if self.history and self.rng.random() < 0.3:
            self.cfg = dict(self.rng.choice(self.history))
        else:
            for name in self.rng.sample(sorted(self.factors), self.rng.choice((1, 2))):  # noqa
                choices = [v for v in self.factors[name] if v != self.cfg[name]]
                self.cfg[name] = self.rng.choice(choices)
        self.check(self.cfg)
        self.history.append(dict(self.cfg))

    def check(self, cfg: dict) -> None:
        self.apply(cfg)
        x = make_input(cfg, self.gen)
        key_fn = tuple(_key(v) for v in cfg.values())
        key_net = tuple(_key(cfg[k]) for k in MODULE_FACTORS)
        before = (self.fn_counter.count, self.net_counter.count)
        for compiled, eager, counter, key, seen in (
            (self.fn_c, self.fn, self.fn_counter, key_fn, self.seen_fn),
            (self.net_c, self.net, self.net_counter, key_net, self.seen_net),
        ):
            n = counter.count
            _compare(compiled, eager, x, cfg)
            if key in seen:
                assert counter.count == n, f"{compiled}: a configuration seen before recompiled: {cfg}"
            seen.add(key)
        assert self.fn_counter.count <= len(self.seen_fn), (before, cfg)
        assert self.net_counter.count <= len(self.seen_net), (before, cfg)


def _key(v):
    return str(v) if isinstance(v, torch.dtype) else v


def _compare(compiled, eager, x, cfg):
    results, grads = [], []
    for f in (eager, compiled):
        leaf = x.detach().requires_grad_(cfg["requires_grad"])  # same strides, its own .grad
        with torch.set_grad_enabled(cfg["grad_mode"]), _autocast(cfg["autocast"]):
            out = f(leaf)
        if out.requires_grad:
            out.float().sum().backward()
        results.append(out)
        grads.append(leaf.grad)
    expected, actual = results
    where = f"configuration {cfg}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype} at {where}"
    assert actual.requires_grad == expected.requires_grad, where
    torch.testing.assert_close(actual, expected, **_tolerance(expected, cfg), msg=lambda m: f"{m}\n{where}")
    assert (grads[0] is None) == (grads[1] is None), where
    if grads[0] is not None:
        torch.testing.assert_close(grads[1], grads[0], **_tolerance(grads[0], cfg))


def _autocast(dtype):
    if dtype is None:
        return torch.autocast("cpu", enabled=False)
    return torch.autocast("cpu", dtype=dtype)


def run_walk(backend, steps: int, seed: int, factors: dict = FACTORS) -> Walk:
    """Run `steps` random steps from a fresh cache (cache limit lifted so every configuration
    gets its own entry); restores the default dtype and the cache limit."""
    limit, default = config.cache_size_limit, torch.get_default_dtype()
    config.cache_size_limit = 10_000
    ember.reset()
    try:
        walk = Walk(backend, seed, factors)
        walk.check(walk.cfg)
        walk.history.append(dict(walk.cfg))
        for _ in range(steps):
            walk.step()
        assert not convert.stats.breaks and not convert.stats.failures
        return walk
    finally:
        config.cache_size_limit = limit
        torch.set_default_dtype(default)
        ember.reset()
