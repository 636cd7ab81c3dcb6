"""The torch-level compile cache: a warm compile_fx skips tracing and lowering, runs like eager,
and never trusts a bad entry."""

import json

import ember.aot_autograd.api as aot_api
import pytest
import torch
import torch.nn.functional as F
from ember.inductor import compile_fx, config, fx_cache, metrics, pipeline
from torch import fx


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setattr(fx_cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(pipeline.cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(config, "cache", True)
    monkeypatch.setattr(config, "fx_cache", True)
    return tmp_path


def block(x, w1, b1, w2, b2, g, b):
    """A functional MLP block: parameters are inputs, as in the graphs dynamo hands a backend."""
    h = F.gelu(F.linear(x, w1, b1))
    return F.layer_norm(F.linear(h, w2, b2) + x, (x.shape[-1],), g, b).relu().sum(-1)


def _inputs(requires_grad: bool):
    torch.manual_seed(0)
    params = [torch.randn(32, 16) * 0.2, torch.randn(32) * 0.1, torch.randn(16, 32) * 0.2,
              torch.randn(16) * 0.1, 1 + torch.randn(16) * 0.1, torch.randn(16) * 0.1]  # fmt: skip
    return [torch.randn(8, 16)] + [p.requires_grad_(requires_grad) for p in params]


class Counted:
    """Counts calls of aot_autograd's tracer and inductor's lowering (the cold path)."""

    def __init__(self, monkeypatch):
        self.traces = self.lowerings = 0
        trace, lower = aot_api.trace, pipeline.lower_graph

        def counted_trace(*a, **k):
            self.traces += 1
            return trace(*a, **k)

        def counted_lower(*a, **k):
            self.lowerings += 1
            return lower(*a, **k)

        monkeypatch.setattr(aot_api, "trace", counted_trace)
        monkeypatch.setattr(pipeline, "lower_graph", counted_lower)


def _compile(inputs):
    """A fresh compile, as a new process would make it: a new graph module, a new runtime."""
    return compile_fx(fx.symbolic_trace(block), inputs)


def test_warm_inference_skips_tracing_and_matches_eager(cache_on, monkeypatch):
    inputs = _inputs(requires_grad=False)
    with torch.no_grad():
        expected = block(*inputs)
        torch.testing.assert_close(_compile(inputs)(*inputs), expected, rtol=1e-4, atol=1e-5)
        assert (metrics.fx_cache_hits, metrics.fx_cache_misses) == (0, 1)
        counted = Counted(monkeypatch)
        warm = _compile(inputs)(*inputs)
    assert (counted.traces, counted.lowerings) == (0, 0)
    assert metrics.fx_cache_hits == 1
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)


def _train_step(fn, inputs):
    out = fn(*inputs)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [p.grad.clone() for p in inputs[1:]]
    for p in inputs[1:]:
        p.grad = None
    return out.detach(), grads


def test_warm_training_step_skips_tracing_and_matches_eager(cache_on, monkeypatch):
    inputs = _inputs(requires_grad=True)
    expected = _train_step(block, inputs)
    torch.testing.assert_close(_train_step(_compile(inputs), inputs), expected, rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    counted = Counted(monkeypatch)
    warm = _train_step(_compile(inputs), inputs)
    assert (counted.traces, counted.lowerings) == (0, 0)
    assert (metrics.fx_cache_hits, metrics.fx_cache_misses) == (1, 1)
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)


def test_inference_entry_does_not_serve_training(cache_on, monkeypatch):
    with torch.no_grad():
        _compile(_inputs(False))(*_inputs(False))
    inputs = _inputs(requires_grad=True)
    counted = Counted(monkeypatch)
    got = _train_step(_compile(inputs), inputs)
    assert counted.traces == 1 and metrics.fx_cache_hits == 0
    torch.testing.assert_close(got, _train_step(block, inputs), rtol=1e-4, atol=1e-5)


def _damage(path, how):
    text = path.read_text()
    head, _, body = text.partition("\n")
    header, payload = json.loads(head), json.loads(body)
    if how == "truncate":
        path.write_text(text[: len(text) // 2])
        return
    if how == "checksum":  # a payload edited behind the checksum's back
        payload["programs"][0]["source"] += "\nraise SystemExit\n"
    elif how == "plan":  # a well-formed entry whose plan cannot be read: still not trusted
        payload["plan"]["format"] = -1
        body = json.dumps(payload, sort_keys=True)
        header["checksum"] = fx_cache.hashlib.sha256(body.encode()).hexdigest()
    elif how == "version":
        header["versions"] = "ir=0 inductor=0"
    else:
        header["key"] = "0" * 64
    path.write_text(json.dumps(header) + "\n" + json.dumps(payload, sort_keys=True))


@pytest.mark.parametrize("how", ["truncate", "checksum", "plan", "version", "foreign_key"])
def test_bad_entry_is_recompiled(cache_on, monkeypatch, how):
    inputs = _inputs(requires_grad=False)
    with torch.no_grad():
        _compile(inputs)(*inputs)
        (path,) = (cache_on / "fx").glob("*.json")
        _damage(path, how)
        metrics.reset()
        counted = Counted(monkeypatch)
        again = _compile(inputs)(*inputs)
        assert counted.traces == 1 and (metrics.fx_cache_hits, metrics.fx_cache_misses) == (0, 1)
        torch.testing.assert_close(again, block(*inputs), rtol=1e-4, atol=1e-5)
        _compile(inputs)(*inputs)  # the recompile rewrote a good entry
    assert metrics.fx_cache_hits == 1 and counted.traces == 1


def test_key_covers_inputs_and_modes(cache_on):
    gm = fx.symbolic_trace(block)
    entry = fx_cache.FxGraphCache(gm, "", pipeline._program_python)
    inputs = _inputs(requires_grad=False)
    spec = torch.utils._pytree.tree_flatten(inputs)[1]
    base = entry.key(inputs, spec)
    grad = _inputs(requires_grad=True)
    wide = [inputs[0].repeat(1, 2)[:, :16]] + inputs[1:]  # same sizes, other strides
    assert len({base, entry.key(grad, spec), entry.key(wide, spec),
                entry.key([i.double() for i in inputs], spec)}) == 4  # fmt: skip
    with torch.no_grad():
        assert entry.key(inputs, spec) != base
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert entry.key(inputs, spec) != base
    inputs[0].mul_(2)  # values are not part of the key
    assert entry.key(inputs, spec) == base


def test_key_covers_the_attention_kernel_choices(cache_on, monkeypatch):
    # which attention kernel the tracer records depends on primtorch's config and torch's SDPA
    # switches: a program traced under other ones is not served
    from ember.primtorch.config import config as primtorch_config

    gm = fx.symbolic_trace(block)
    entry = fx_cache.FxGraphCache(gm, "", pipeline._program_python)
    inputs = _inputs(requires_grad=False)
    spec = torch.utils._pytree.tree_flatten(inputs)[1]
    base = entry.key(inputs, spec)
    on = primtorch_config.cudnn_attention
    monkeypatch.setattr(primtorch_config, "cudnn_attention", not on)
    assert entry.key(inputs, spec) != base
    monkeypatch.setattr(primtorch_config, "cudnn_attention", on)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(not was)
        assert entry.key(inputs, spec) != base
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    assert entry.key(inputs, spec) == base


def test_graphs_that_cannot_be_keyed_compile_normally(cache_on):
    graph = fx.Graph()
    graph.output(graph.call_function(lambda x: x * 2, (graph.placeholder("x"),)))
    assert fx_cache.runtime_cache_for(fx.GraphModule({}, graph), "", None) is None
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())  # call_module nodes
    assert fx_cache.runtime_cache_for(fx.symbolic_trace(module), "", None) is None
    graph = fx.Graph()  # a tensor held in a node's arguments: its value is not in the key
    graph.output(graph.call_function(torch.add, (graph.placeholder("x"), torch.tensor(3.0))))
    with pytest.raises(fx_cache.Uncacheable):
        fx_cache.fx_graph_text(fx.GraphModule({}, graph))
    graph = fx.Graph()  # an operator outside aten: a library may define it differently
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.quantized.add.default, (x, x, 1.0, 0)))
    with pytest.raises(fx_cache.Uncacheable, match="outside aten"):
        fx_cache.fx_graph_text(fx.GraphModule({}, graph))
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compile_fx(fx.symbolic_trace(module), [x])(x), module(x))
    assert metrics.fx_cache_hits == metrics.fx_cache_misses == 0
