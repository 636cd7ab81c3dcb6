"""Fusion: whole patterns become one kernel each, and match eager."""

import re

import torch
import torch.nn.functional as F
from ember.inductor import compile_prims, metrics
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import Kernel, schedule
from ember.primtorch import prims, trace_to_prims
from inductor_helpers import PrimGraph, check, layer_norm_graph, softmax_graph


def test_pointwise_chain_is_one_kernel():
    x, y = torch.randn(33, 17), torch.randn(17)
    check(lambda a, b: torch.tanh(torch.exp(a * 0.5 + b) - 1.0).sigmoid() * a, x, y, kernels=1)


def test_softmax_is_one_kernel():
    check(lambda a: torch.softmax(a, -1), torch.randn(16, 100), kernels=1)
    check(lambda a: torch.softmax(a, 1), torch.randn(4, 9, 5), kernels=1)


def test_log_softmax_is_one_kernel():
    check(lambda a: F.log_softmax(a, -1), torch.randn(7, 30), kernels=1)


def test_layer_norm_is_one_kernel():
    x, w, b = torch.randn(6, 3, 40), torch.randn(40), torch.randn(40)
    check(lambda x, w, b: F.layer_norm(x, (40,), w, b), x, w, b, kernels=1, atol=1e-5, rtol=1e-4)


def test_handwritten_softmax_and_layer_norm_graphs():
    for g in (
        softmax_graph(torch.randn(5, 64)),
        layer_norm_graph(torch.randn(3, 20), torch.randn(20), torch.randn(20)),
    ):
        gm = g.module()
        metrics.reset()
        out = compile_prims(gm, g.inputs)(*g.inputs)[0]
        torch.testing.assert_close(out, gm(*g.inputs)[0], atol=1e-5, rtol=1e-4)
        assert metrics.generated_kernel_count == 1


def test_independent_loops_over_same_ranges_fuse():
    check(
        lambda a, b: (a.sum(-1), b.amax(-1), (a * b).sum(-1)),
        torch.randn(8, 32),
        torch.randn(8, 32),
        kernels=1,
    )


def test_reduction_with_epilogue_is_one_kernel():
    check(
        lambda a: (a - a.mean(-1, keepdim=True)) / (a.std(-1, keepdim=True) + 1.0),
        torch.randn(10, 24),
        kernels=1,
    )


def test_an_epilogue_over_a_reshape_of_the_reduction_loop_joins_it():
    # Attention's softmax runs over (b, h, s, s), and its normalisation is laid out as the
    # (b*h, s, s) operand of the next batched matmul: one kernel, not a reduction kernel plus a
    # kernel that reads the exps back. So does a layer norm whose output feeds a matmul over
    # (b*s, d) after statistics over (b, s).
    q, k, v = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    check(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v, q, k, v,
          kernels=1, atol=1e-5, rtol=1e-5)  # fmt: skip
    x, w, b, m = torch.randn(2, 16, 24), torch.randn(24), torch.randn(24), torch.randn(24, 5)
    check(lambda x, w, b, m: F.layer_norm(x, (24,), w, b).reshape(32, 24) @ m, x, w, b, m,
          kernels=1, atol=1e-5, rtol=1e-4)  # fmt: skip


def test_reduction_copied_by_its_epilogue_is_stored():
    # GQA's value gradient: a sum over the head group, then a plain copy into [B, S, KV, D]
    # order. The kernel-local sum is the copy's value as is, and the copy must still be stored.
    check(lambda g: g.sum(2).permute(0, 2, 1, 3).contiguous(), torch.randn(2, 2, 2, 16, 32),
          kernels=1)  # fmt: skip


def _steps(g):
    low = lower_graph(g.module(), g.inputs)
    return low, schedule(low.buffers, [o.name for o in low.outputs])


def test_dead_code_is_removed():
    g = PrimGraph()
    x = g.input(torch.randn(4, 4))
    g(prims.exp, x)  # unused
    g.output(g(prims.neg, x))
    low, steps = _steps(g)
    kernels = [s for s in steps if isinstance(s, Kernel)]
    assert len(kernels) == 1 and [m.node.name for m in kernels[0].members] == [low.outputs[0].name]


def test_buffer_reuse_and_inplace():
    # mm forces its inputs into buffers; the chain between the two matmuls then reuses memory
    def f(a, w):
        h = torch.mm(a, w).exp()
        h = torch.mm(h, w).sin()
        return torch.mm(h, w)

    compiled = check(f, torch.randn(8, 8), torch.randn(8, 8) * 0.1, atol=1e-4, rtol=1e-4)
    assert "# reuses" in compiled.source
    assert any(s.kind == "view" for s in compiled.artifact.steps)


def test_inplace_donor_is_not_read_after_it_is_overwritten():
    # The second kernel computes mm(d) * 2 first, then d + 1 from softmax's stored exp and sum.
    # Handed the exp's memory, the product overwrote it before d + 1 read it: only a member
    # emitted no earlier than every reader of a buffer may write over it (static sizes too; a
    # dynamic ResNet-BN's backward got wrong gradients from it).
    def f(x, w):
        d = x.softmax(-1)
        return torch.mm(d, w) * 2, d + 1

    compiled = check(f, torch.randn(8, 8), torch.randn(8, 8))
    assert "# reuses" in compiled.source  # d + 1, the exp's last reader, takes its memory


def test_a_matmul_result_is_overwritten_by_its_pointwise_reader():
    """A matmul's fresh result, read element for element by the kernel that adds its bias and
    views it in another shape (an LM head's (B*S, V) as (B, S, V)), or applies GELU to it, is
    stored over in place: no second buffer of its size each call."""

    def head(x, w, b, v):
        h = torch.nn.functional.gelu(x @ v)
        return (h.reshape(-1, 6) @ w.t()).reshape(2, 4, 10) + b

    compiled = check(head, torch.randn(2, 4, 6), torch.randn(10, 6), torch.randn(10),
                     torch.randn(6, 6), atol=1e-5, rtol=1e-5)  # fmt: skip
    assert compiled.source.count("empty_strided(") == 0, compiled.source
    assert compiled.source.count("# reuses") == 2


def test_memory_reused_in_the_same_layout_is_the_same_tensor():
    """A buffer stored over another of its own sizes and strides takes the donor's tensor as it
    is: no view is made at each call (torch's as_strided costs about a microsecond)."""

    def f(a, w):
        h = torch.mm(a, w).exp()
        return torch.mm(h, w).sin() + 1

    compiled = check(f, torch.randn(8, 8), torch.randn(8, 8) * 0.1, atol=1e-4, rtol=1e-4)
    assert re.search(r"^    buf\d+ = buf\d+  # reuses buf\d+$", compiled.source, re.M), (
        compiled.source
    )


def test_kernel_local_buffers_are_not_allocated():
    compiled = check(lambda a: torch.softmax(a, -1), torch.randn(4, 8))
    assert compiled.source.count("empty_strided(") == 1  # only the output


def test_compiled_artifact_round_trips():
    from ember.ir import CompiledArtifact, dumps, loads

    compiled = check(lambda a, w: torch.mm(a, w).softmax(-1), torch.randn(4, 6), torch.randn(6, 5))
    art = compiled.artifact
    assert loads(CompiledArtifact, dumps(art)) == art
    kinds = [s.kind for s in art.steps]
    assert "extern" in kinds and "kernel" in kinds and "alloc" in kinds
    assert [k.language for k in art.kernels] == ["cpp"] and "EMBER_EXPORT" in art.kernels[0].source
    assert {b.kind for b in art.buffers} >= {"input", "output"}


def test_a_value_two_externs_take_is_computed_once():
    # A Linear's backward feeds one gradient (joined from several) to two matmuls: one buffer.
    from ember.inductor.loop_ir import ComputedBuffer
    from ember.primtorch.trace import trace_to_prims

    x, y, w1, w2 = torch.randn(4, 8), torch.randn(4, 8), torch.randn(16, 16), torch.randn(16, 16)

    def f(x, y, w1, w2):
        a = torch.cat([x, y * 2], 1)
        return a @ w1, a @ w2

    gm = trace_to_prims(f, x, y, w1, w2)
    low = lower_graph(gm, [x, y, w1, w2])
    assert sum(isinstance(b, ComputedBuffer) for b in low.buffers) == 1
    check(f, x, y, w1, w2, kernels=1)


def test_a_computation_repeated_by_the_program_is_computed_once():
    """Each layer of a transformer builds the same additive bias from the same mask: merged into
    one computation (pipeline.merge_common_subexpressions), the values unchanged. Random draws
    with their own seeds and offsets stay apart."""
    from ember.inductor.pipeline import merge_common_subexpressions
    from ember.primtorch import trace_to_prims

    def bias(mask):
        return torch.zeros(mask.shape).masked_fill(mask.logical_not(), float("-inf"))

    def layers(x, mask):
        for _ in range(3):
            x = torch.softmax(x @ x.transpose(-1, -2) / 8 + bias(mask), -1) @ x
        return x

    x, mask = torch.randn(2, 6, 8), torch.rand(2, 6, 6) > 0.3
    mask[..., 0] = True
    gm = trace_to_prims(layers, x, mask)
    merged = merge_common_subexpressions(gm)
    calls = lambda g: sum(n.op == "call_function" for n in g.graph.nodes)  # noqa: E731
    per_bias = calls(trace_to_prims(bias, mask))
    assert per_bias >= 2 and calls(gm) - calls(merged) >= 2 * per_bias, merged.graph
    check(layers, x, mask, atol=1e-5, rtol=1e-5)
    twice = trace_to_prims(lambda x: (torch.rand(x.shape), torch.rand(x.shape)), x)
    assert merge_common_subexpressions(twice) is twice  # two draws: different offsets
    same = check(lambda m: (bias(m), bias(m)), mask)
    a, b = same(mask)
    assert a.data_ptr() != b.data_ptr()  # outputs stay distinct tensors
    signed = trace_to_prims(lambda x: (x * 0.0 + 1, x * -0.0 + 1), x)
    assert merge_common_subexpressions(signed) is signed  # 0.0 and -0.0 are different scalars


def test_zeros_accumulation_folds_into_its_addend():
    """add(x, index_put(zeros, idx, v, accumulate=True)) (a tied embedding's two gradients)
    becomes index_put(x, idx, v, True): no zeros buffer, the same values; not where the addend's
    layout differs from the sum's or the accumulation has another reader."""
    from ember.inductor.pipeline import accumulate_into_addend
    from ember.primtorch import trace_to_prims

    def names(gm):
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    def summed(a, idx, v):
        return a + torch.zeros(6, 3).index_put((idx,), v, accumulate=True)

    a, idx, v = torch.randn(6, 3), torch.tensor([0, 2, 2, 5]), torch.randn(4, 3)
    gm = trace_to_prims(summed, a, idx, v)
    folded = accumulate_into_addend(gm)
    assert folded is not gm
    assert not any("add" in n or "full" in n for n in names(folded)), names(folded)
    torch.testing.assert_close(folded(a, idx, v), gm(a, idx, v))
    compiled = compile_prims(gm, [a, idx, v])
    torch.testing.assert_close(compiled(a, idx, v), summed(a, idx, v))

    at = a.t().contiguous()
    for order in (lambda x, p: x + p, lambda x, p: p + x):  # the sum's layout: either operand's

        def transposed(at, idx, v, order=order):
            return order(at.t(), torch.zeros(6, 3).index_put((idx,), v, accumulate=True))

        gm = trace_to_prims(transposed, at, idx, v)
        want, got = gm(at, idx, v), accumulate_into_addend(gm)(at, idx, v)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()

    def also_read(a, idx, v):
        put = torch.zeros(6, 3).index_put((idx,), v, accumulate=True)
        return a + put, put * 2

    twice = trace_to_prims(also_read, a, idx, v)
    assert accumulate_into_addend(twice) is twice


def _residual_norm_over_channels(a, r, w, b):
    """SqueezeBERT's residual + LayerNorm on (B, C, L): the sum is stored in the order eager
    lays it out, the norm reduces over C through a permute (ConvNeXt's NCHW norms alike)."""
    x = a + r
    return F.layer_norm(x.permute(0, 2, 1), (a.shape[1],), w, b), x


def test_a_pointwise_kernel_in_another_loop_order_takes_the_reduction():
    """The residual sum's kernel runs its loops in (B, C, L) order, the norm's in (B, L) x C: the
    sum's loops are reordered as the norm's and both are one kernel (they were two, the sum
    written in float32 and read back twice). C == L too, where both orders have equal sizes; and
    at batch 1, where the sum's kernel has dropped its size-1 loop."""
    for b, c, l in ((2, 48, 40), (2, 32, 32), (1, 40, 48)):
        args = torch.randn(b, c, l), torch.randn(b, c, l), torch.randn(c), torch.randn(c)
        compiled = compile_prims(trace_to_prims(_residual_norm_over_channels, *args), list(args))
        assert len(compiled.program.kernels) == 1, compiled.source
        # values only: the norm's strides over a permuted input are primtorch's, not eager's
        for got, want in zip(compiled(*args), _residual_norm_over_channels(*args)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def _residual_rms_norm(x, y, w):
    """A pre-norm block's residual add, kept for the next add, and the RMSNorm that reads it."""
    h = x + y
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w, h


def test_the_residual_add_of_a_single_row_joins_its_norm():
    """At batch 1 (a decoding step's one token, or one image's rows) the add's kernel has no
    size-1 loops left, the norm's keeps them: given them back, the add joins the norm (one
    kernel; it was two, the sum written and read back by a second launch). A single row that
    no block holds keeps two kernels: one row's kernel is one program."""
    for shape in ((1, 1, 128), (1, 128), (3, 1, 128), (1, 5, 128), (1, 3, 8192)):
        args = torch.randn(shape), torch.randn(shape), torch.randn(shape[-1])
        compiled = check(_residual_rms_norm, *args, atol=1e-5, rtol=1e-4)
        assert len(compiled.program.kernels) == 1, compiled.source
    args = torch.randn(1, 1, 8192), torch.randn(1, 1, 8192), torch.randn(8192)
    compiled = check(_residual_rms_norm, *args, atol=1e-5, rtol=1e-4)
    assert len(compiled.program.kernels) == 2, compiled.source


def _bn_relu_branches(x, y, m, s, w, b):
    """Two branches' inference batch norms (five loads each), each ReLU'd, concatenated: an
    Inception/HRNet block's output."""
    def bn_relu(t):
        return torch.relu((t - m[:, None, None]) * s[:, None, None] * w[:, None, None]
                          + b[:, None, None])  # fmt: skip

    return torch.cat([bn_relu(x), bn_relu(y)], 1)


def test_an_activation_reading_its_input_twice_does_not_store_a_heavy_producer():
    """ReLU is where(x <= 0, 0, x): two fx users of x, one expression. Each heavy batch norm is
    inlined into the concatenation (one kernel); it was stored first (three kernels)."""
    x, y = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
    m, s, w, b = torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4)
    check(_bn_relu_branches, x, y, m, s, w, b, kernels=1)
    check(lambda x, m, s, w, b: F.gelu(_bn_relu_branches(x, x, m, s, w, b)[:, :4] * 3) + x,
          x, m, s, w, b, kernels=1, atol=1e-5, rtol=1e-4)  # fmt: skip


def test_a_heavy_value_two_separate_consumers_read_is_stored_once():
    """x reaches a sum and a pointwise output by separate paths: stored once, not inlined."""
    a, b, c, d, e = (torch.randn(8, 16) for _ in range(5))

    def fn(a, b, c, d, e):
        x = a * b + c * d + e
        return x.sum(1), torch.exp(x) * 2

    compiled = check(fn, a, b, c, d, e)
    assert len(compiled.program.kernels) == 1, compiled.source  # one kernel, x computed once


def test_a_column_reduction_does_not_reorder_a_pointwise_kernel():
    """Batch-norm statistics (few long rows over (B, H, W)) keep their own kernel: reordered to
    run them, the pointwise kernel would be left a handful of parallel rows."""
    x = torch.randn(4, 3, 10, 10)  # exp(x) is stored first (two readers), then summed
    compiled = check(lambda x: (torch.exp(x).sum((0, 2, 3)), torch.exp(x)), x)
    assert len(compiled.program.kernels) == 2, compiled.source


def test_an_inference_batch_norm_is_one_kernel():
    """rsqrt(running_var + eps) reads only inputs: each element computes it again (two cached
    loads) rather than a kernel of its own per norm (two kernels before). A statistic of a
    computed reduction still is computed once per row, in the reduction's kernel."""
    x, m, v = torch.randn(2, 6, 5, 5), torch.randn(6), torch.rand(6) + 0.1
    w, b = torch.randn(6), torch.randn(6)
    def bn(x, m, v, w, b):
        return torch.relu(F.batch_norm(x, m, v, w, b, False, 0.1, 1e-5))

    check(bn, x, m, v, w, b, kernels=1, atol=1e-5, rtol=1e-4)
    check(lambda x, w, b: F.layer_norm(x, (5,), w[:5], b[:5]), x, w, b, kernels=1, atol=1e-5,
          rtol=1e-4)  # fmt: skip
