"""Lowerings of the matrix products (mm, bmm, addmm, baddbmm): the operand layouts cuBLAS is
fastest with (a matrix computed here is stored in the order it reads; a weight the same in every
batch is one matrix), rows padded for alignment (config.pad_mm), and an addmm's bias left to the
kernel that reads the product."""

from __future__ import annotations

import math
import weakref

import sympy
import torch

from ember.ir import TensorMeta, contiguous_strides
from ember.primtorch.prims.extern import ARG_STRIDES

from .config import config, on_for
from .graph_reads import read_elementwise
from .index_simplify import simplify_index
from .loop_ir import loop_vars, ops, set_handler
from .lowering import Lazy, View, is_tensor, make_pointwise, out_meta, pad_last_dim, register
from .lowering_views import EXTERN_KERNELS
from .read_layouts import LoadRecorder, read_order_strides

S = sympy.sympify

# mm(a, b) with M*N*K below this is not padded: the padded copy of b would cost about as much as
# the unaligned product loses. Nor is one of fewer rows than PAD_MM_MIN_ROWS whose b is a buffer
# already (a weight in the product's dtype): so few rows read b about as fast as a copy writes it.
PAD_MM_MIN_WORK = 2**24
PAD_MM_MIN_ROWS = 64
# the argument positions of the two matrices
_MATRICES = {"extern.mm": (0, 1), "extern.bmm": (0, 1), "extern.addmm": (1, 2),
             "extern.baddbmm": (1, 2)}  # fmt: skip


def _matmul(name):
    def lower(L, *args, **kwargs):
        """A matrix computed here (a cast weight) is stored in the order it reads its source: a
        transposed weight's cast is a straight copy, and cuBLAS gets a transposed operand. An
        mm with unaligned output rows multiplies a padded operand (config.pad_mm)."""
        args = list(args)
        if name == "extern.addmm" and _bias_joins_the_epilogue(L, args, kwargs):
            # mm, then the bias added by the pointwise kernel that reads the product anyway:
            # the bias (a cast under autocast, a kernel of its own per Linear) is read there
            product = _MATMUL_LOWERINGS["extern.mm"](L, args[1], args[2])
            return make_pointwise(L, lambda p, b: ops.add(p, b), (product, args[0]))
        k_pad = _padded_inner(name, args)
        if k_pad:
            args = _pad_inner(L, name, args, k_pad)
        n_pad = _padded_columns(name, args)
        if n_pad:
            n = args[_MATRICES[name][1]].sizes[1]
            args = _pad_operands(L, name, args, n_pad)
        required = ARG_STRIDES.get(name, {})
        for pos, a in enumerate(args):  # in argument order, as L.extern would realize them
            if isinstance(a, Lazy) and pos not in required:
                matrix = pos in _MATRICES[name] and len(a.sizes) in (2, 3)
                if matrix and len(a.sizes) == 3 and _same_in_every_batch(a):
                    args[pos] = _one_matrix_for_all_batches(L, a)
                    continue
                if not matrix:
                    args[pos] = L.realize(a)
                    continue
                strides = read_order_strides(a)
                aligned = _aligned_rows(a, strides)
                args[pos] = L.realize(a, aligned or strides, padded=aligned is not None)
            elif isinstance(a, View) and pos in _MATRICES[name] and pos not in required:
                args[pos] = _aligned_copy(L, name, args, pos)
        if not n_pad:
            return L.extern(name, EXTERN_KERNELS[name], args, kwargs)
        m, dtype, device = args[_MATRICES[name][0]].sizes[0], out_meta(L).dtype, args[0].device
        meta = TensorMeta(dtype, (m, S(n_pad)), contiguous_strides((m, S(n_pad))), 0, device)
        out = L.extern(name, EXTERN_KERNELS[name], args, kwargs, meta=meta)
        L.relaid.add(out.buffer.name)  # read through the view of its first N columns
        return View(out.buffer, (m, n), (S(n_pad), sympy.S.One))

    return lower


_MATMUL_LOWERINGS = {_name: _matmul(_name) for _name in _MATRICES}
for _name, _lower in _MATMUL_LOWERINGS.items():
    register(_name)(_lower)

def _bias_joins_the_epilogue(L, args, kwargs) -> bool:
    """Whether an addmm's bias is better added by its readers: a plain addmm (beta = alpha = 1)
    whose product only elementwise ops read, through views (a Linear's activation, a residual
    add), and whose bias is computed in the graph (a cast under autocast: it then costs no
    kernel of its own; PyTorch's own compiler splits addmm so too) or is on the CPU, where
    torch's addmm copies the bias into the output before the product, a pass over it that the
    reader does for free (mm is 5-20% faster than addmm at a BERT layer's shapes)."""
    bias = args[0]
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1 or not is_tensor(bias):
        return False
    if not (isinstance(bias, Lazy) or str(args[1].device).startswith("cpu")):
        return False
    return read_elementwise(L.current)


def _same_in_every_batch(a: Lazy) -> bool:
    """Whether a batched operand's elements do not depend on the batch index: a weight that
    matmul broadcast over the batch (a Linear over `x.transpose(1, 2)`, MLP-Mixer's token MLP,
    is a bmm with the weight expanded), under autocast computed by a cast."""
    if S(a.sizes[0]) == 1:
        return False
    vs = loop_vars("i", 3)
    with set_handler(_IndexRecorder()) as rec:
        a.fn(list(vs))
    # within the loop ranges: an expand reshaped over (B, H) reads ModularIndexing(4096*i0 +
    # 128*i1 + i2, 128, 32), which is i1
    ranges = dict(zip(vs, a.sizes))
    return bool(rec.indices) and all(
        vs[0] not in S(simplify_index(e, ranges)).free_symbols for e in rec.indices
    )


def _one_matrix_for_all_batches(L, a: Lazy) -> View:
    """`a` computed once as one matrix (in the order it reads its source) and read by every
    batch through a batch stride of 0, as eager's matmul passes an expanded weight to bmm;
    computed per batch it was written batch-size times."""
    matrix = Lazy(a.sizes[1:], a.dtype, a.device, lambda idx: a.fn([sympy.S.Zero, *idx]))
    one = L.realize(matrix, read_order_strides(matrix))
    return View(one.buffer, a.sizes, (sympy.S.Zero, *one.strides), one.offset)


class _IndexRecorder(LoadRecorder):
    """Every load index and index expression of a body."""

    def index_expr(self, expr, dtype):
        self.indices.append(expr)
        return super().index_expr(expr, dtype)


def _padded_columns(name, args) -> int:
    """The padded column count of an mm/addmm whose output rows cuBLAS would find unaligned
    (config.pad_mm), or 0 to multiply as it is."""
    if name not in ("extern.mm", "extern.addmm"):
        return 0
    a, b = (args[p] for p in _MATRICES[name])
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return 0
    if not on_for(config.pad_mm, a.device):
        return 0
    m, k, n = a.sizes[0], a.sizes[1], b.sizes[1]
    if not (S(k).is_Integer and S(n).is_Integer):
        return 0
    k, n = int(k), int(n)
    align = 16 // a.dtype.itemsize  # cuBLAS's fast kernels want 16-byte aligned rows
    if n % align == 0:
        return 0
    if not S(m).is_Integer:
        # Rows that vary (batch x sequence): pad where the padded copy of b costs nothing, b being
        # computed here anyway (a weight cast under autocast), for PAD_MM_MIN_ROWS rows' work.
        if not isinstance(b, Lazy) or PAD_MM_MIN_ROWS * n * k < PAD_MM_MIN_WORK:
            return 0
        return -(-n // align) * align
    m = int(m)
    if m < 2 or m * n * k < PAD_MM_MIN_WORK:
        return 0  # a single row is a matrix-vector product, whose kernels need no alignment
    if m < PAD_MM_MIN_ROWS and not isinstance(b, Lazy):
        return 0
    return -(-n // align) * align


def _padded_inner(name, args) -> int:
    """The padded length of an mm/addmm's inner dim K when it is unaligned for cuBLAS's fast
    kernels and the product is large on its three sides (config.pad_mm), else 0. Aligned rows
    alone do not do: their kernels also want K a multiple of 16 bytes. H200, GPT-2's output
    layer's backward (bf16, a 4096 x 50257 loss gradient times the 50257 x 768 weight): 2.53 ms
    in a CUTLASS kernel for one-element alignment, where torch's own compiler's padded product took
    0.35 ms."""
    if name not in ("extern.mm", "extern.addmm"):
        return 0
    a, b = (args[p] for p in _MATRICES[name])
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32) or b.dtype != a.dtype:
        return 0
    if not on_for(config.pad_mm, a.device) or len(a.sizes) != 2 or len(b.sizes) != 2:
        return 0
    if not all(S(n).is_Integer for n in (*a.sizes, b.sizes[1])):
        return 0
    (m, k), n = (int(v) for v in a.sizes), int(b.sizes[1])
    align = 16 // a.dtype.itemsize
    if k % align == 0 or min(m, n) < PAD_K_MIN_SIDE or m * n * k < PAD_MM_MIN_WORK:
        return 0
    return -(-k // align) * align


# Neither of an mm's outer sides is padded along K below this: the copies of both operands that
# padding writes would cost about what the unaligned kernel loses.
PAD_K_MIN_SIDE = 256


def _pad_inner(L, name, args, k_pad) -> list:
    """The args with a's columns and b's rows zero-padded to `k_pad` (the products of the padding
    are zeros); each realized in the order it reads its source (a loss gradient row-major, a
    weight as stored)."""
    args = list(args)
    pa, pb = _MATRICES[name]
    a, b = args[pa], args[pb]
    k = S(a.sizes[1])

    def b_rows(idx):
        inside = ops.lt(ops.index_expr(idx[0], torch.int64), ops.index_expr(k, torch.int64))
        return ops.masked(inside, lambda: b.load(idx), 0)

    # a stored gradient shares its zero-gapped copy with the product that reads it transposed
    copy = _zero_padded_copy(L, a) if isinstance(a, View) else None
    if copy is not None and tuple(int(n) for n in copy.sizes) == (int(a.sizes[0]), k_pad):
        args[pa] = copy
    else:
        padded_a = pad_last_dim(a, k_pad)
        args[pa] = L.realize(padded_a, read_order_strides(padded_a))
    padded_b = Lazy((S(k_pad), b.sizes[1]), b.dtype, b.device, b_rows)
    args[pb] = L.realize(padded_b, read_order_strides(padded_b))
    return args


# A matmul operand computed here with fewer elements than this keeps dense rows.
ALIGN_MIN_NUMEL = 2**18


def _aligned_rows(a, strides) -> tuple | None:
    """Strides for a matrix operand computed here whose rows (along its stride-1 dim) cuBLAS
    would find unaligned, the rows padded to a 16-byte length (config.pad_mm): the same order,
    gaps after each row that nothing reads. A loss gradient of 50257 columns then reaches both
    matmuls of the output layer's backward in cuBLAS's fast kernels (row-padded, and read
    transposed); or None to keep `strides`."""
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if not on_for(config.pad_mm, a.device) or not all(S(n).is_Integer for n in a.sizes):
        return None
    sizes = [int(n) for n in a.sizes]
    strides = [int(s) for s in strides]
    align = 16 // a.dtype.itemsize
    inner = [d for d, st in enumerate(strides) if st == 1 and sizes[d] > 1]
    if len(inner) != 1 or math.prod(sizes) < ALIGN_MIN_NUMEL or sizes[inner[0]] % align == 0:
        return None
    order = sorted(range(len(sizes)), key=lambda d: (strides[d], d))  # innermost first
    out, step = [0] * len(sizes), 1
    for d in order:
        out[d] = step
        step *= -(-sizes[d] // align) * align if d == inner[0] else sizes[d]
    return tuple(out)


# A stored operand with unaligned rows is copied into padded rows when it has at least this many
# elements and the product's other side at least COPY_MIN_OTHER rows or columns: the copy reads
# and writes the operand once, where cuBLAS's kernels for unaligned rows ran 4-5 times slower
# than its aligned ones (H100, bf16: a (4096, 50257) loss gradient times the (50257, 768)
# output layer took 2.2 ms, against 0.45 ms aligned and 0.3 ms for the copy).
COPY_MIN_NUMEL = 2**22
COPY_MIN_OTHER = 256


def _aligned_copy(L, name, args, pos):
    """A matrix operand that is a stored buffer (a graph input such as the loss gradient) as it
    is, or copied into row-padded storage (`_aligned_rows`) when that pays."""
    a = args[pos]
    first, second = _MATRICES[name]
    other = args[second].sizes[-1] if pos == first else args[first].sizes[-2]
    try:
        big = int(sympy.Mul(*a.sizes)) >= COPY_MIN_NUMEL and int(other) >= COPY_MIN_OTHER
    except TypeError:  # symbolic sizes
        return a
    padded = _zero_padded_copy(L, a) if big else None
    return a if padded is None else View(padded.buffer, a.sizes, padded.strides, padded.offset)


def _zero_padded_copy(L, a) -> View | None:
    """A stored matrix `a` copied into row-padded storage (`_aligned_rows`) whose gaps hold
    zeros, as a View of the padded sizes (a's own sizes, its stride-1 dim padded); None when its
    rows are aligned already. Read as it is by one product, transposed by another (the loss
    gradient into dX and dW), and with its zero gaps as the padded inner dim of a third
    (`_pad_inner`), one region is copied once: the copy is kept per (buffer, offset, dims by
    stride), and a later reader views it in its own dim order."""
    try:
        strides = tuple(int(st) for st in a.strides)
        sizes = tuple(int(n) for n in a.sizes)
    except TypeError:  # symbolic sizes or strides
        return None
    aligned = _aligned_rows(a, strides)
    if aligned is None:
        return None
    dims = tuple(sorted((st, n) for st, n in zip(strides, sizes) if n != 1))
    key = (S(a.offset), dims)
    copies = _ALIGNED_COPIES.setdefault(a.buffer, {})
    if key in copies and len({st for st, _ in dims}) == len(dims):
        copy, by_stride = copies[key]  # stride -> (padded stride, padded size)
        new = [by_stride[st] if n != 1 else (1, 1) for st, n in zip(strides, sizes)]
        return View(copy.buffer, [n for _, n in new], [st for st, _ in new], copy.offset)
    inner = next(d for d, st in enumerate(strides) if st == 1 and sizes[d] > 1)
    align = 16 // a.dtype.itemsize
    padded_sizes = list(sizes)
    padded_sizes[inner] = -(-sizes[inner] // align) * align

    def fn(idx):
        inside = ops.lt(ops.index_expr(idx[inner], torch.int64), ops.index_expr(S(sizes[inner]),
                                                                                torch.int64))
        return ops.masked(inside, lambda: a.load(idx), 0)

    lazy = Lazy(tuple(S(n) for n in padded_sizes), a.dtype, a.device, fn)
    copy = L.realize(lazy, aligned, padded=True)
    copies[key] = (copy, {st: (pst, pn) for st, pst, pn in zip(strides, aligned, padded_sizes)})
    return copy


# buffer -> its row-padded copies (`_aligned_copy`), for the compile that made the buffer
_ALIGNED_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _pad_operands(L, name, args, n_pad) -> list:
    """The args with `b` (and an addmm's bias of N columns) zero-padded to `n_pad` columns; b
    stored in the order it reads (a transposed weight: (n_pad, K) rows)."""
    args = list(args)
    pos_b = _MATRICES[name][1]
    b, bias = args[pos_b], args[0]
    if name == "extern.addmm" and is_tensor(bias) and bias.sizes and bias.sizes[-1] == b.sizes[1]:
        args[0] = L.realize(pad_last_dim(bias, n_pad))
    padded = pad_last_dim(b, n_pad)
    args[pos_b] = L.realize(padded, read_order_strides(padded))
    return args
