"""Nodes a frontend tags RECOMPUTE_META_KEY (torch.utils.checkpoint): their prims carry the tag
into the joint graph and the min-cut partitioner recomputes them, matmuls included."""

import torch
import torch.fx as fx

from ember.aot_autograd import aot_module_simplified, min_cut_partition, run_as_fx, saved_bytes
from ember.ir import RECOMPUTE_META_KEY


def _program(x, w):
    h = torch.tanh(torch.tanh(x @ w) @ w)
    return (h @ w).sum()


def _run(tag_from: str):
    """aot over an fx graph of _program whose nodes from `tag_from` on are tagged ("" = none)."""
    gm = fx.symbolic_trace(_program)
    tagging = False
    for n in gm.graph.nodes:
        tagging = tagging or (tag_from and n.name == tag_from)
        if tagging and n.op == "call_function":
            n.meta[RECOMPUTE_META_KEY] = True
    graphs = {}

    def partition(joint, *, num_fwd_outputs):
        fw, bw = min_cut_partition(joint, num_fwd_outputs=num_fwd_outputs)
        graphs.update(joint=joint, fw=fw, n=num_fwd_outputs)
        return fw, bw

    torch.manual_seed(0)
    x, w = torch.randn(32, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    run = aot_module_simplified(gm, [x, w], fw_compiler=run_as_fx, partition_fn=partition)
    out = run(x, w)
    out.backward()
    return graphs, out, x.grad, w.grad


def test_tagged_prims_are_recomputed_and_gradients_unchanged():
    plain, out0, gx0, gw0 = _run("")
    tagged, out1, gx1, gw1 = _run("matmul")
    assert not any(n.meta.get(RECOMPUTE_META_KEY) for n in plain["joint"].graph.nodes)
    marked = [n for n in tagged["joint"].graph.nodes if n.meta.get(RECOMPUTE_META_KEY)]
    targets = [str(n.target) for n in marked]
    assert any("mm" in t for t in targets) and any("tanh" in t for t in targets)
    # untagged: the tanh activations are saved; tagged: only x and w (inputs) are
    assert saved_bytes(plain["fw"], plain["n"]) > saved_bytes(tagged["fw"], tagged["n"])
    assert saved_bytes(tagged["fw"], tagged["n"]) <= (32 * 16 + 16 * 16) * 4
    torch.testing.assert_close(out1, out0)
    torch.testing.assert_close(gx1, gx0)
    torch.testing.assert_close(gw1, gw0)
