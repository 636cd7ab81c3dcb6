"""Partitioners on real joint graphs: bytes saved, validity, metadata, no extern recompute."""

import importlib.util
import pathlib

import pytest
import torch
import torch.fx as fx

from ember.aot_autograd import aot_function, default_partition, min_cut_partition, run_as_fx
from ember.aot_autograd.partition import is_tangent, op_tags, saved_bytes
from ember.ir import NODE_META_KEY, TensorMeta

_spec = importlib.util.spec_from_file_location(
    "ember_aot_test_models", pathlib.Path(__file__).with_name("models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


def _joint_of(fn, *inputs):
    compiled = aot_function(fn, run_as_fx)
    compiled(*inputs)
    joint = compiled.last_graphs["joint"]
    plan = next(iter(compiled.cache.values())).plan
    return joint, plan.num_fw_outputs


@pytest.fixture(scope="module")
def gpt2_block_joint():
    torch.manual_seed(0)
    block = models.GPT2Block(dim=32, heads=4)
    params = dict(block.named_parameters())
    buffers = dict(block.named_buffers())
    # 128 tokens: activations, not the 32-wide weights, dominate what the forward keeps.
    x = torch.randn(4, 32, 32, requires_grad=True)

    def fn(params, x):
        return torch.func.functional_call(block, {**params, **buffers}, (x,))

    return _joint_of(fn, params, x)


def _saved(gm, num_fwd_outputs):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return list(out.args[0])[num_fwd_outputs:]


def test_min_cut_saves_fewer_bytes_on_gpt2_block(gpt2_block_joint):
    joint, n = gpt2_block_joint
    fw_all, _ = default_partition(joint, num_fwd_outputs=n)
    fw_cut, _ = min_cut_partition(joint, num_fwd_outputs=n)
    everything, cut = saved_bytes(fw_all, n), saved_bytes(fw_cut, n)
    # The byte counts come from the saved values' TensorMeta.
    by_meta = sum(int(s.meta[NODE_META_KEY].nbytes()) for s in _saved(fw_cut, n))
    assert by_meta == cut
    print(f"GPT-2 block saved bytes: save-everything {everything}, min-cut {cut}")
    assert cut < everything


@pytest.mark.parametrize("partition", [default_partition, min_cut_partition])
def test_partitioned_graphs_reproduce_joint(gpt2_block_joint, partition):
    joint, n = gpt2_block_joint
    fw, bw = partition(joint, num_fwd_outputs=n)
    for gm in (fw, bw):
        gm.graph.lint()
        for node in gm.graph.nodes:
            if node.op != "output":  # getitem nodes carry their element's meta too
                assert node.meta.get(NODE_META_KEY) is not None, node.format_node()
    placeholders = [p for p in joint.graph.nodes if p.op == "placeholder"]
    torch.manual_seed(1)
    values = [_random_like(p.meta[NODE_META_KEY]) for p in placeholders]
    primals = [v for p, v in zip(placeholders, values) if not is_tangent(p)]
    tangents = [v for p, v in zip(placeholders, values) if is_tangent(p)]
    expected = joint(*values)
    fw_out = fw(*primals)
    grads = bw(*fw_out[n:], *tangents)
    torch.testing.assert_close(list(fw_out[:n]), list(expected[:n]))
    torch.testing.assert_close(list(grads), list(expected[n:]))


def _random_like(meta: TensorMeta):
    sizes = [int(s) for s in meta.sizes]
    if meta.dtype.is_floating_point:
        return torch.randn(sizes, dtype=meta.dtype)
    return torch.ones(sizes, dtype=meta.dtype)  # the causal mask: attend everywhere


def test_min_cut_never_recomputes_extern_ops(gpt2_block_joint):
    joint, n = gpt2_block_joint
    _, bw = min_cut_partition(joint, num_fwd_outputs=n)
    tangents = {p for p in bw.graph.nodes if is_tangent(p)}
    for node in bw.graph.nodes:
        if "extern" in op_tags(node):
            # An extern op in the backward must be real backward work (it reads a tangent).
            assert _reaches(node, tangents), node.format_node()


def _reaches(node: fx.Node, targets: set) -> bool:
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in targets:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def test_min_cut_recomputes_pointwise_chain():
    def fn(x, w):
        h = x @ w
        return (h.sigmoid() * h).tanh().exp()  # a pointwise chain after one matmul

    x, w = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)
    joint, n = _joint_of(fn, x, w)
    fw_all, _ = default_partition(joint, num_fwd_outputs=n)
    fw_cut, bw_cut = min_cut_partition(joint, num_fwd_outputs=n)
    assert saved_bytes(fw_cut, n) < saved_bytes(fw_all, n)
    assert any("pointwise" in op_tags(node) for node in bw_cut.graph.nodes)


def test_partitioned_graphs_serialise_as_ir(gpt2_block_joint):
    from ember.ir import GraphIR, dumps, graph_from_ir, graph_to_ir, loads

    joint, n = gpt2_block_joint
    for gm in min_cut_partition(joint, num_fwd_outputs=n):
        ir = loads(
            GraphIR, dumps(graph_to_ir(gm))
        )  # only placeholders and vocabulary ops cross over
        back = graph_from_ir(ir)
        assert [x.name for x in back.graph.nodes] == [x.name for x in gm.graph.nodes]


def _longest_rebuilt_chain(bw: fx.GraphModule) -> tuple:
    """(ops, reductions) of the longest chain the backward runs from saved values alone."""
    from ember.aot_autograd.partition import is_recomputable

    depth = {}
    for n in bw.graph.nodes:
        if n.op == "placeholder":
            depth[n] = None if is_tangent(n) else (0, 0)
            continue
        ins = [depth.get(a) for a in n.all_input_nodes]
        if n.op != "call_function" or not is_recomputable(n) or None in ins:
            depth[n] = None
            continue
        tags = op_tags(n)
        depth[n] = (max([i[0] for i in ins] + [0]) + ("view" not in tags),
                    max([i[1] for i in ins] + [0]) + ("reduction" in tags))  # fmt: skip
    found = [d for d in depth.values() if d is not None]
    return max(d[0] for d in found), max(d[1] for d in found)


def test_min_cut_rebuilds_no_chain_through_the_whole_network(monkeypatch):
    """A residual stream whose layer norms run in float32 between bfloat16 matmuls (autocast's
    pattern): the cut alone saves the cheaper bf16 products and rebuilds every layer's float32
    stream from them, a chain through all layers run at the backward's start."""
    from ember.aot_autograd.partition import config

    torch.manual_seed(0)
    layers = 8
    ws = [torch.randn(32, 32, requires_grad=True) for _ in range(layers)]
    x = torch.randn(64, 32, requires_grad=True)

    def fn(x, *ws):
        h = x
        for w in ws:
            h = torch.nn.functional.layer_norm(h + (h.bfloat16() @ w.bfloat16()).float(), (32,))
        return h.sum()

    joint, n = _joint_of(fn, x, *ws)
    _, bw = min_cut_partition(joint, num_fwd_outputs=n)
    ops, reductions = _longest_rebuilt_chain(bw)
    assert reductions <= config.max_recompute_reductions
    assert ops <= config.max_recompute_ops + 2  # the count above also counts getitems
    monkeypatch.setattr(config, "max_recompute_ops", 10**6)
    monkeypatch.setattr(config, "max_recompute_reductions", 10**6)
    _, bw = min_cut_partition(joint, num_fwd_outputs=n)
    assert _longest_rebuilt_chain(bw)[1] >= layers  # unbounded: a chain through every layer
