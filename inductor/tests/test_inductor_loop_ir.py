"""The loop IR: text form, reference interpreter, invariant checker, index helpers."""

import pytest
import sympy
import torch
from ember.inductor.codegen_common import merge_dims, print_index, simplify_index
from ember.inductor.loop_ir import (
    ComputedBuffer,
    Layout,
    Pointwise,
    interpret,
    ops,
    program_text,
    verify,
)
from ember.inductor.lowering import lower_graph
from ember.ir import FloorDiv, ModularIndexing
from ember.primtorch import prims
from inductor_helpers import PrimGraph, softmax_graph


def test_text_form_of_softmax():
    g = softmax_graph(torch.randn(4, 8))
    low = lower_graph(g.module(), g.inputs)
    text = program_text(low.buffers)
    assert "reduction max" in text and "reduction sum" in text
    assert "tmp0 = load(arg0, 8*i0 + r0)" in text
    # exp(x - max) has two readers and is costly to recompute: it is a buffer of its own
    assert text.count("= pointwise") == 2 and text.count("exp(") == 1


def test_interpreter_matches_eager_and_verify_passes():
    g = softmax_graph(torch.randn(3, 5, 7), dim=1)
    low = lower_graph(g.module(), g.inputs)
    verify([b for b in low.inputs if b is not None] + low.buffers)
    out = interpret(low.buffers, {"arg0": g.inputs[0]})[low.outputs[0].name]
    torch.testing.assert_close(out, torch.softmax(g.inputs[0], 1))


def test_verify_rejects_bad_programs():
    i0 = sympy.Symbol("i0", integer=True, nonnegative=True)
    lay = Layout(torch.float32, "cpu", (4,), (1,))
    reads_unknown = ComputedBuffer(
        "buf0", lay, Pointwise((4,), lambda idx: ops.load("nope", idx[0]), torch.float32)
    )
    with pytest.raises(AssertionError, match="unknown buffer nope"):
        verify([reads_unknown])
    unbound = ComputedBuffer(
        "buf1", lay, Pointwise((4,), lambda idx: ops.constant(1.0, torch.float32), torch.float32)
    )
    unbound.data.inner_fn = lambda idx: ops.index_expr(idx[0] + sympy.Symbol("zz"), torch.int64)
    with pytest.raises(AssertionError, match="unbound symbols"):
        verify([unbound])
    assert i0.is_integer


def test_index_simplification_and_printing():
    x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    ranges = {x0: sympy.Integer(4), x1: sympy.Integer(16)}
    assert simplify_index(ModularIndexing(16 * x0 + x1, 1, 16), ranges) == x1
    assert simplify_index(FloorDiv(16 * x0 + x1, 16), ranges) == x0
    assert print_index(3 + 30 * FloorDiv(x0, 6)) == "3 + 30 * ((x0) / 6)"
    assert print_index(ModularIndexing(x0, 2, 5), floordiv="//") == "(((x0) // 2) % 5)"


def test_merge_dims_flattens_contiguous_loops():
    xs = sympy.symbols("x0 x1 x2", integer=True, nonnegative=True)
    sizes, _, assign = merge_dims((2, 3, 4), list(xs), [12 * xs[0] + 4 * xs[1] + xs[2]])
    assert sizes == [24] and assign[0] == 0 and assign[1] == 0
    sizes, _, _ = merge_dims((2, 3, 4), list(xs), [12 * xs[0] + 4 * xs[1] + 100 * xs[2]])
    assert sizes == [6, 4]


def test_unknown_prim_graph_node_falls_back(caplog):
    g = PrimGraph()
    x = g.input(torch.rand(5))
    g.output(g(prims.digamma, g(prims.exp, x)))
    from ember.inductor import compile_prims, metrics

    out = compile_prims(g.module(), g.inputs)(*g.inputs)[0]
    torch.testing.assert_close(out, torch.digamma(g.inputs[0].exp()))
    assert metrics.fallbacks == ["prims.digamma"]


@pytest.mark.parametrize("dim, sizes", [(0, [1, 3]), (1, [1, 4, 2]), (1, [2, 1])])
def test_every_cat_piece_reads_only_its_own_range(dim, sizes):
    # A ViT's cls token joined to its patches: each piece's loads are masked to its range, the
    # last piece's too (unmasked, it read before its buffer: an illegal address on a GPU). The
    # interpreter raises on any unmasked read outside a buffer.
    from ember.primtorch.trace import trace_to_prims

    xs = [torch.randn(*((n, 5) if dim == 0 else (3, n))) for n in sizes]
    gm = trace_to_prims(lambda *ts: torch.cat(ts, dim) * 2, *xs)
    low = lower_graph(gm, xs)
    out = interpret(low.buffers, {f"arg{i}": x for i, x in enumerate(xs)})[low.outputs[0].name]
    torch.testing.assert_close(out, torch.cat(xs, dim) * 2)


def test_interpreter_rejects_an_unmasked_read_outside_its_buffer():
    lay = Layout(torch.float32, "cpu", (4,), (1,))
    shifted = ComputedBuffer(
        "buf0", lay, Pointwise((sympy.Integer(4),), lambda idx: ops.load("arg0", idx[0] - 1), torch.float32)
    )
    with pytest.raises(IndexError, match="outside its 4 elements"):
        interpret([shifted], {"arg0": torch.randn(4)})
