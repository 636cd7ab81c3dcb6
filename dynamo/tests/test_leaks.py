"""Compile / call / ember.reset() cycles must not grow host memory: whatever a compile creates
(graphs, guard programs, transformed functions, statistics) is freed by reset()."""

import gc
import os

import pytest
import torch
import torch.nn as nn

import ember


def rss_bytes() -> int:
    """Resident set size, from /proc/self/statm (its second field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        y = self.norm(torch.relu(self.lin(x)))
        if self.training:
            y = y * 2
        return y + x


def compile_reset_cycles(backend, cycles, warmup, device="cpu", make_input=None):
    """[(memory, live objects) after `warmup` cycles, the same after `cycles`], each cycle
    compiling a fresh wrapper of one module, calling it forward and backward, then reset()."""
    torch.manual_seed(0)
    model = Small().to(device)
    x = torch.randn(8, 64, device=device)
    measure = (lambda: torch.cuda.memory_allocated()) if device == "cuda" else rss_bytes
    marks = []
    for i in range(cycles):
        compiled = ember.compile(model, backend=backend)
        out = compiled(x.requires_grad_(i % 2 == 0))
        torch.testing.assert_close(out, model(x))
        if out.requires_grad:
            out.sum().backward()
        del compiled, out
        model.zero_grad(set_to_none=True)
        x.grad = None
        ember.reset()
        if i + 1 in (warmup, cycles):
            gc.collect()
            marks.append((measure(), len(gc.get_objects())))
    return marks


@pytest.mark.parametrize("backend", ["eager"])
def test_two_hundred_compile_reset_cycles_do_not_grow_host_memory(backend):
    ember.reset()
    (base, base_objects), (end, end_objects) = compile_reset_cycles(backend, 200, warmup=20)
    assert end <= base * 1.05, f"RSS grew from {base >> 20} MiB to {end >> 20} MiB"
    # finer than RSS: torch.fx's source cache kept 3 objects (and 1 KiB) per compiled graph
    assert end_objects - base_objects < 90, (base_objects, end_objects)


def test_the_backend_compiles_with_no_activation_of_the_capture_alive():
    """The capture runs the program on example values with grad on (to learn which results
    require grad); the autograd graph that made saved the forward's activations. When the
    backend is called (and traces a whole step of its own) none of that graph is alive."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())
    x = torch.randn(32, 64)
    joined = []

    def with_history() -> set:
        gc.collect()
        return {id(o) for o in gc.get_objects()
                if isinstance(o, torch.Tensor) and o.grad_fn is not None}  # fmt: skip

    def backend(gm, example_inputs):
        joined.extend(with_history() - before)
        return gm.forward

    before = with_history()  # (anything an earlier test left is not the capture's)
    out = ember.compile(model, backend=backend)(x)
    assert joined == []
    assert out.requires_grad  # the program's own result is still joined to autograd
    torch.testing.assert_close(out, model(x))
    ember.reset()


def _saves_before_backend(model, x) -> tuple:
    """(tensors saved for backward before the backend was called, the compiled result)."""
    saved = []
    at_backend = []

    def backend(gm, example_inputs):
        at_backend.append(len(saved))
        return gm.forward

    def pack(t):
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ember.compile(model, backend=backend)(x)
    ember.reset()
    return at_backend[0], out


def test_the_capture_saves_no_activation_for_a_backward_it_never_runs(monkeypatch):
    """Its ops run with grad on (results must say whether they require grad), but what they
    would save for backward is not kept: the capture's peak is an inference forward's."""
    from ember.dynamo.config import config

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())
    x = torch.randn(32, 64)
    saves, out = _saves_before_backend(model, x)
    assert saves == 0
    assert out.requires_grad
    out.sum().backward()  # the compiled code's own graph saved what its backward needs
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, want in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want)
    monkeypatch.setattr(config, "capture_saves_nothing", False)
    saves, _ = _saves_before_backend(model, x)
    assert saves > 0  # the switch works: eager's saves are seen


def test_a_capture_that_reads_a_saved_value_is_redone_saving_it(monkeypatch):
    from ember.dynamo import interpreter

    run_root = interpreter.RootTranslator.run_root
    attempts, reads = [], []

    def reading(self):
        attempts.append(self)
        leaf = torch.ones(3, requires_grad=True)
        reads.append(torch.sin(leaf).grad_fn._saved_self)  # refused while nothing is saved
        return run_root(self)

    monkeypatch.setattr(interpreter.RootTranslator, "run_root", reading)
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    out = ember.compile(model, backend=lambda gm, ex: gm.forward)(x)
    ember.reset()
    torch.testing.assert_close(out, model(x))
    assert len(attempts) == 2 and len(reads) == 1  # the second capture, saving, read it
