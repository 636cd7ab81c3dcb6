"""Matmul operands and outputs in the layouts cuBLAS runs fast on.

A matrix computed in the graph (a weight cast under autocast) is stored in the order it reads its
source, so a transposed weight's cast is a straight copy and the GEMM gets a transposed operand.
An mm/addmm whose output rows are unaligned (a vocabulary of 50257) multiplies a zero-padded
operand and reads the first columns of the aligned product (config.pad_mm). There is no GPU
here, so padding is forced on (True) for CPU graphs.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from ember.inductor import config
from ember.inductor.lowering import lower_graph
from ember.inductor.lowering_matmul import PAD_MM_MIN_WORK
from ember.inductor.loop_ir import ComputedBuffer, ExternBuffer
from ember.primtorch.trace import trace_to_prims
from inductor_helpers import check

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
N, K, M = 1001, 512, 64  # M * N * K is above PAD_MM_MIN_WORK; 1001 columns are unaligned


@pytest.fixture
def pad_on(monkeypatch):
    monkeypatch.setattr(config, "pad_mm", True)


def _weights(dtype):
    torch.manual_seed(0)
    return torch.randn(N, K, dtype=dtype) / K**0.5, torch.randn(N, dtype=dtype)


def _extern_shapes(source: str, op: str) -> list:
    """The (sizes) each call of extern `op` in a wrapper's text is restrided to."""
    pat = rf"restride\(extern_{op}\(.*\), \(([\d, ]+)\), \(([\d, ]+)\)\)"
    return [tuple(int(v) for v in m.group(1).split(",")) for m in re.finditer(pat, source)]


def test_threshold_admits_the_test_sizes():
    assert M * N * K >= PAD_MM_MIN_WORK


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_linear_with_odd_out_features_multiplies_padded_columns(pad_on, dtype, bias):
    w, b = _weights(dtype)
    x = torch.randn(4, M // 4, K, dtype=dtype)
    fn = (lambda x, w, b: F.linear(x, w, b)) if bias else (lambda x, w: F.linear(x, w))
    args = (x, w, b) if bias else (x, w)
    compiled = check(fn, *args, **TOL[dtype])  # values and (contiguous) strides match eager
    n_pad = 1008 if dtype == torch.bfloat16 else 1004  # 16-byte rows
    assert _extern_shapes(compiled.source, "addmm" if bias else "mm") == [(M, n_pad)], (
        compiled.source
    )
    assert compiled(*args).is_contiguous()


def test_padded_product_read_by_a_pointwise_and_another_matmul(pad_on):
    # The padded view feeds a fused epilogue and, as a strided view, another extern.
    w, _ = _weights(torch.float32)
    w2 = torch.randn(N, 8)
    x = torch.randn(M, K)

    def fn(x, w, w2):
        h = F.linear(x, w)
        return torch.relu(h) * 2, h @ w2

    compiled = check(fn, x, w, w2, atol=1e-3, rtol=1e-3)
    assert _extern_shapes(compiled.source, "mm")[0] == (M, 1004), compiled.source


def test_addmm_with_a_full_bias_and_scalars(pad_on):
    w, _ = _weights(torch.float32)
    x, bias = torch.randn(M, K), torch.randn(M, N)

    def fn(bias, x, w):
        return torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0)

    compiled = check(fn, bias, x, w, atol=1e-3, rtol=1e-3)
    assert _extern_shapes(compiled.source, "addmm") == [(M, 1004)], compiled.source


@pytest.mark.parametrize("mode", [False, "auto"])
def test_padding_off_or_auto_on_cpu_keeps_the_product_as_is(monkeypatch, mode):
    monkeypatch.setattr(config, "pad_mm", mode)
    w, _ = _weights(torch.bfloat16)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    compiled = check(lambda x, w: F.linear(x, w), x, w, **TOL[torch.bfloat16])
    assert _extern_shapes(compiled.source, "mm") == [(M, N)], compiled.source


def test_small_or_aligned_products_are_not_padded(pad_on):
    w, _ = _weights(torch.float32)
    small = check(lambda x, w: F.linear(x, w), torch.randn(4, K), w, atol=1e-4, rtol=1e-4)
    assert _extern_shapes(small.source, "mm") == [(4, N)], small.source
    aligned = torch.randn(1024, K)
    out = check(lambda x, w: F.linear(x, w), torch.randn(M, K), aligned, atol=1e-4, rtol=1e-4)
    assert _extern_shapes(out.source, "mm") == [(M, 1024)], out.source


# --- operands stored in the order they read ------------------------------------------------------


def _matmul_operands(fn, *args):
    """{extern op: [the strides of each matrix a kernel of this graph computes for it]}."""
    gm = trace_to_prims(fn, *args)
    low = lower_graph(gm, list(args))
    out = {}
    for b in low.buffers:
        if isinstance(b, ExternBuffer):
            mats = b.args[1:3] if b.op in ("extern.addmm", "extern.baddbmm") else b.args[:2]
            out.setdefault(b.op, []).extend(
                tuple(int(s) for s in m.layout.strides) for m in mats
                if isinstance(m, ComputedBuffer)
            )  # fmt: skip
    return out


def test_a_cast_transposed_weight_is_stored_in_the_weights_order(monkeypatch):
    monkeypatch.setattr(config, "pad_mm", False)
    w = torch.randn(300, 64)  # (N, K) fp32
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    # the (64, 300) operand keeps w's (300, 64) row-major storage: a straight copy
    assert _matmul_operands(lambda x, w: x @ w.to(torch.bfloat16).T, x, w) == {
        "extern.mm": [(1, 64)]
    }

    def autocast_linear(x, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x, w, b)

    ops = _matmul_operands(autocast_linear, torch.randn(8, 64), w, torch.randn(300))
    assert ops == {"extern.addmm": [(64, 1), (1, 64)]}  # x cast row-major, w cast as stored
    check(lambda x, w: x @ w.to(torch.bfloat16).T, x, w, atol=1e-2, rtol=1e-2)


def test_a_padded_transposed_weight_is_stored_as_padded_rows(pad_on):
    w, _ = _weights(torch.float32)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    fn = lambda x, w: x @ w.to(torch.bfloat16).T  # noqa: E731
    assert _matmul_operands(fn, x, w) == {"extern.mm": [(1, K)]}  # a (1008, K) row-major buffer
    check(fn, x, w, **TOL[torch.bfloat16])


def test_operands_whose_reads_disagree_or_go_row_major_stay_contiguous():
    a = torch.randn(64, 64)
    # a + a.T reads a both ways: no single order, so row-major
    assert _matmul_operands(lambda a, b: (a + a.T) @ b, a, torch.randn(64, 8)) == {
        "extern.mm": [(64, 1)]
    }
    assert _matmul_operands(lambda a, b: torch.relu(a) @ b, a, torch.randn(64, 8)) == {
        "extern.mm": [(64, 1)]
    }


def test_a_batched_transposed_operand_follows_its_source():
    q, k = torch.randn(3, 16, 8), torch.randn(3, 16, 8)
    fn = lambda q, k: q @ (k * 2).transpose(1, 2)  # noqa: E731
    # (3, 8, 16) read from k's (3, 16, 8) storage: batch outermost, then k's rows
    assert _matmul_operands(fn, q, k) == {"extern.bmm": [(128, 1, 8)]}
    check(fn, q, k)


class _Head(torch.nn.Module):
    """A linear layer whose weight is cast in the graph (as autocast casts it) or used as is."""

    def __init__(self, cast):
        super().__init__()
        self.cast, self.linear = cast, torch.nn.Linear(K, N)

    def forward(self, x):
        w, b = self.linear.weight, self.linear.bias
        if self.cast:
            return F.linear(x, w.to(torch.bfloat16), b.to(torch.bfloat16))
        return F.linear(x, w, b)


@pytest.mark.parametrize("cast", [True, False], ids=["cast-weight", "plain-weight"])
def test_rows_that_vary_multiply_padded_columns_when_the_operand_is_computed(pad_on, cast, capsys,
                                                                           monkeypatch):  # fmt: skip
    """With symbolic rows (batch x sequence), an unaligned product is padded where its operand
    is computed in the graph anyway (the weight's cast under autocast), and left as it is where
    the operand is the parameter itself (a copy at every call could cost what padding saves)."""
    from ember.inductor import compile_fx
    from inductor_helpers import dynamic_gm

    monkeypatch.setattr(config, "output_code", True)
    torch.manual_seed(0)
    model = _Head(cast).eval()
    dtype = torch.bfloat16 if cast else torch.float32
    make = lambda rows: (torch.randn(2, rows, K, dtype=dtype),)  # noqa: E731
    example = make(40)
    with torch.no_grad():
        compiled = compile_fx(dynamic_gm(model, example, [{0: "s0", 1: "s1"}]), example)
        for rows in (40, 64, 77):
            x = make(rows)
            torch.testing.assert_close(compiled(*x), model(*x), **TOL[dtype])
    code, columns = capsys.readouterr().out, 1008 if cast else 1001
    assert code.count("def call(") == 1, code
    assert re.search(rf"extern_addmm\(.*\), \(s\d+ \* s\d+, {columns}\)", code), code


def _bmm_operands(fn, *args):
    """[(sizes, strides) of each matrix an extern.bmm of this graph reads, and the numel of the
    kernel-computed buffer behind it (None for an input)]."""
    from ember.inductor.loop_ir import AliasBuffer

    low = lower_graph(trace_to_prims(fn, *args), list(args))
    out = []
    for b in low.buffers:
        if isinstance(b, ExternBuffer) and b.op == "extern.bmm":
            for m in b.args[:2]:
                src = m.source if isinstance(m, AliasBuffer) else m
                numel = int(src.layout.numel()) if isinstance(src, ComputedBuffer) else None
                out.append((tuple(int(s) for s in m.layout.sizes),
                            tuple(int(s) for s in m.layout.strides), numel))  # fmt: skip
    return out


def test_a_weight_broadcast_over_a_bmm_batch_is_cast_once():
    """MLP-Mixer's token MLP: a Linear over x.transpose(1, 2) is a bmm with the weight expanded
    over the batch. Under autocast its cast is one (K, N) matrix read with batch stride 0, not
    one copy per batch (it was a (B, K, N) buffer)."""
    x, w, b = torch.randn(4, 16, 24), torch.randn(8, 16), torch.randn(8)

    def token_linear(x, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x.transpose(1, 2), w, b).transpose(1, 2)

    ops = _bmm_operands(token_linear, x, w, b)
    assert len(ops) == 2, ops
    (a_sizes, _, _), (w_sizes, w_strides, w_numel) = ops
    assert a_sizes == (4, 24, 16) and w_sizes == (4, 16, 8)
    assert w_strides == (0, 1, 16) and w_numel == 16 * 8, ops  # w's (8, 16) storage order
    check(token_linear, x, w, b, atol=2e-2, rtol=2e-2)


def test_an_operand_that_varies_with_the_batch_is_computed_per_batch():
    a, b = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    ops = _bmm_operands(lambda a, b: a @ (b * 2), a, b)
    assert ops[1] == ((3, 16, 4), (64, 4, 1), 3 * 16 * 4), ops
    check(lambda a, b: a @ (b * 2), a, b)


def test_a_weight_expanded_over_a_reshaped_batch_is_cast_once():
    """A Linear over a strided 4-D input (B, H, W, C) is a bmm over B*H batches, the weight
    expanded over (B, H) and reshaped: still one matrix, read with batch stride 0."""
    x, w = torch.randn(2, 3, 5, 16), torch.randn(8, 16)

    def linear_4d(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x.transpose(1, 2), w)  # (2, 5, 3, 16), not foldable into rows

    ops = _bmm_operands(linear_4d, x, w)
    assert ops[1][1][0] == 0 and ops[1][2] == 16 * 8, ops
    check(linear_4d, x, w, atol=2e-2, rtol=2e-2)


def test_a_cast_bias_is_added_by_the_kernel_that_reads_the_product():
    """Under autocast a Linear's bias is cast in the graph: an addmm whose product only
    elementwise ops read (GELU; a residual add through a view) becomes mm + the bias added in
    that epilogue, so the bias's cast is no kernel of its own (4 kernels before, now 3)."""
    x, w, b, r = torch.randn(32, 64), torch.randn(48, 64), torch.randn(48), torch.randn(4, 8, 48)

    def linear_gelu(x, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.gelu(F.linear(x, w, b))

    def linear_residual(x, w, b, r):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(x, w, b).view(4, 8, 48) + r

    for fn, args in ((linear_gelu, (x, w, b)), (linear_residual, (x, w, b, r))):
        compiled = check(fn, *args, atol=3e-2, rtol=3e-2)
        assert "extern_addmm(" not in compiled.source and "extern_mm(" in compiled.source
        # the casts of x and of the weight, then the epilogue
        assert len(compiled.program.kernels) == 3, compiled.source


def test_an_addmm_read_by_another_matmul_keeps_its_bias():
    """A product an extern reads (or the graph returns) keeps cuBLAS's own bias epilogue."""
    x, w, b = torch.randn(32, 64), torch.randn(48, 64), torch.randn(48)

    def two_linears(x, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(F.linear(x, w, b), w[:, :48], b)

    compiled = check(two_linears, x, w, b, atol=5e-2, rtol=5e-2)
    assert compiled.source.count("extern_addmm(") == 2, compiled.source


def test_an_operand_with_unaligned_rows_is_computed_into_padded_rows(pad_on):
    # a loss gradient of 1001 columns (fp32: 4-element rows are 16 bytes) into both matmuls of
    # the output layer's backward: rows padded to 1004, read transposed by the second; the
    # first pads its inner dim to 1004 (zeros in a's last columns and w's last rows, 512 wide)
    g, w, x = torch.randn(M * 8, N), torch.randn(N, K), torch.randn(M * 8, 48)
    fn = lambda g, w, x: ((g * 2) @ w, (g * 2).T @ x)  # noqa: E731
    assert _matmul_operands(fn, g, w, x) == {"extern.mm": [(1004, 1), (512, 1), (1, 1004)]}
    check(fn, g, w, x, atol=1e-3, rtol=1e-4)
    small = torch.randn(8, N)  # below ALIGN_MIN_NUMEL: dense rows
    assert _matmul_operands(lambda g, w: (g * 2) @ w, small, w) == {"extern.mm": [(N, 1)]}


def test_a_stored_operand_with_unaligned_rows_is_copied_into_padded_rows(pad_on):
    # the loss gradient as a graph input (4200 x 1001 fp32): both products of the output
    # layer's backward read a row-padded copy, as they are and transposed
    g, w, x = torch.randn(4200, N), torch.randn(N, 256), torch.randn(4200, 256)
    fn = lambda g, w, x: (g @ w, g.T @ x)  # noqa: E731
    # one copy: the first product reads it as it is, the second through a transposed view
    low = lower_graph(trace_to_prims(fn, g, w, x), [g, w, x])
    first, second = [b.args[0] for b in low.buffers if isinstance(b, ExternBuffer)]
    assert isinstance(first, ComputedBuffer) and tuple(first.layout.strides) == (1004, 1)
    assert second.source is first and tuple(second.layout.strides) == (1, 1004)
    check(fn, g, w, x, atol=1e-3, rtol=1e-4)
    # a narrow product (64 columns): cuBLAS's unaligned kernels cost less than the copy
    assert _matmul_operands(lambda g, w: g @ w, g, torch.randn(N, 64)) == {"extern.mm": []}


def _matmul_sizes(fn, *args) -> list:
    """The sizes of each matrix every extern mm of fn's graph multiplies."""
    low = lower_graph(trace_to_prims(fn, *args), list(args))
    return [tuple(tuple(int(n) for n in m.layout.sizes) for m in b.args[:2])
            for b in low.buffers if isinstance(b, ExternBuffer) and b.op == "extern.mm"]  # fmt: skip


def test_an_unaligned_inner_dim_is_zero_padded_in_both_operands(pad_on):
    # the output layer's backward into its input (a loss gradient of 1001 columns times the
    # 1001 x 320 weight): K padded to 1004 with zeros on both sides, so the product is exact
    g, w = torch.randn(512, N), torch.randn(N, 320)
    fn = lambda g, w: g @ w  # noqa: E731
    assert _matmul_sizes(fn, g, w) == [((512, 1004), (1004, 320))]
    check(fn, g, w, atol=1e-3, rtol=1e-4)
    g[:, -1] = float("inf")  # a padded column is never read as data: inf stays in its own rows
    check(fn, g, w, atol=1e-3, rtol=1e-4)
    # one outer side narrow (64 columns), or an aligned K: multiplied as it is
    assert _matmul_sizes(fn, g, torch.randn(N, 64)) == [((512, N), (N, 64))]
    assert _matmul_sizes(fn, torch.randn(512, 1000), torch.randn(1000, 320)) == [
        ((512, 1000), (1000, 320))]


def test_a_cpu_linear_read_elementwise_adds_its_bias_in_the_reader(monkeypatch):
    """On the CPU a Linear whose product only elementwise ops read (GELU, a residual add) is an
    mm with the bias added by the reading kernel: torch's addmm would first copy the bias into
    the output, a pass that the reader makes for free. A product another matmul reads keeps
    addmm (its bias would need a kernel of its own)."""
    monkeypatch.setattr(config, "pad_mm", False)
    x, w, b, w2 = torch.randn(2, 8, 16), torch.randn(24, 16), torch.randn(24), torch.randn(24, 24)

    def mlp(x, w, b, w2):
        h = F.gelu(F.linear(x, w, b))
        return F.linear(h, w2, b) + h

    compiled = check(mlp, x, w, b, w2, atol=1e-5, rtol=1e-5)
    assert "extern_addmm(" not in compiled.source and compiled.source.count("extern_mm(") == 2
    chained = check(lambda x, w, b, w2: F.linear(F.linear(x, w, b), w2), x, w, b, w2,
                    atol=1e-4, rtol=1e-5)  # fmt: skip
    assert "extern_addmm(" in chained.source
