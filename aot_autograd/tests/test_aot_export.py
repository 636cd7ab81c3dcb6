"""export_inference_graph with symbolic sizes: what ember.export lowers when Dims are declared."""

import pytest
import torch
import torch.fx as fx

from ember.aot_autograd.dynamic import runnable_graph
from ember.aot_autograd.export import export_inference_graph
from ember.ir import NODE_META_KEY, SymbolSpec, TensorMeta, contiguous_strides
from ember.ir.symbols import sym


def _symbolic(fn, shapes, symbols):
    """fx.symbolic_trace(fn) with placeholder i of symbolic sizes shapes[i] (ints or symbols)."""
    gm = fx.symbolic_trace(fn)
    for p, sizes in zip(gm.graph.find_nodes(op="placeholder"), shapes):
        p.meta[NODE_META_KEY] = TensorMeta(torch.float32, sizes, contiguous_strides(sizes))
    gm.meta["ember_symbols"] = tuple(SymbolSpec(s, 2, 64) for s in symbols)
    return gm


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def forward(self, x):
        return torch.softmax(self.norm(self.lin(x)), -1) * x.shape[1]


def test_a_graph_with_symbolic_sizes_lowers_to_one_prim_graph_for_every_size():
    torch.manual_seed(0)
    model = Block().eval()
    b, t = sym("s0"), sym("s1")
    gm = _symbolic(model, [(b, t, 8)], ["s0", "s1"])
    prim_gm, consts = export_inference_graph(gm, [torch.randn(3, 5, 8)], {}, ["x"])
    assert [s.name for s in prim_gm.meta["ember_symbols"]] == ["s0", "s1"]
    x_meta = next(iter(prim_gm.graph.find_nodes(op="placeholder"))).meta[NODE_META_KEY]
    assert x_meta.sizes == (b, t, 8)
    run = runnable_graph(prim_gm)  # sizes computed from the input's at each call
    for n, m in ((2, 2), (4, 9), (7, 33)):
        x = torch.randn(n, m, 8)
        with torch.no_grad():
            torch.testing.assert_close(run(x, *consts.values())[0], model(x), atol=1e-5,
                                       rtol=1e-5)  # fmt: skip


def test_a_guard_the_lowering_needs_is_an_error_naming_it():
    """Two sizes that a broadcast needs equal but whose Dims differ: the program would be wrong
    for unequal sizes in range, so the export lowering refuses it (dynamo catches most such
    cases first; this is the backstop)."""
    gm = _symbolic(lambda x, y: x + y, [(sym("s0"), 4), (sym("s1"), 4)], ["s0", "s1"])
    with pytest.raises(NotImplementedError, match="Eq"):
        export_inference_graph(gm, [torch.randn(3, 4), torch.randn(3, 4)], {}, ["x", "y"])
