"""Lowerings of view, layout, reduction and extern prims (pointwise ones live in lowering.py, the
matrix products in lowering_matmul.py)."""

from __future__ import annotations

import sympy
import torch

from ember.ir import NODE_META_KEY, FloorDiv, ModularIndexing, TensorMeta, contiguous_strides
from ember.primtorch.utils import (broadcast_shapes, compute_view_strides, known,
                                  make_channels_last_strides_for)  # fmt: skip

from .config import config, on_for
from .input_updates import IN_PLACE_META
from .loop_ir import IndexedWrite, InputBuffer, Layout, Pointwise, compute_dtype, ops
from .runtime import index_put as runtime_index_put
from .lowering import (
    Lazy,
    View,
    _same_strides,
    broadcast_to,
    is_tensor,
    load_as,
    make_pointwise,
    out_meta,
    register,
    remap_view,
)  # fmt: skip

S = sympy.sympify


@register("broadcast_in_dim")
def _broadcast_in_dim(L, a, shape, broadcast_dimensions):
    shape = tuple(S(s) for s in shape)
    if (
        isinstance(a, Lazy)
        and a.cost()[0] > a.cost()[1] + 1
        and sympy.Mul(*shape) != sympy.Mul(*a.sizes)
        and _reads_computed(L, a)
    ):
        # computing a row statistic (rsqrt(var + eps)) once per row, not once per element: in
        # the kernel of the reduction it reads, as that kernel's row-level epilogue. One of the
        # graph's inputs alone (an inference batch norm's rsqrt(running_var + eps)) would be a
        # kernel of its own for every norm (densenet121: 120 launches); each element computes
        # it again instead, from two loads of one cached row.
        a = L.realize(a)

    def remap(idx):
        return [sympy.S.Zero if a.sizes[j] == 1 and shape[d] != 1 else idx[d]
                for j, d in enumerate(broadcast_dimensions)]  # fmt: skip

    return remap_view(a, shape, remap)


def _reads_computed(L, a: Lazy) -> bool:
    """Whether `a` reads a buffer this graph computes (not only inputs and constants)."""
    names = a.loaded()
    return any(not isinstance(b, InputBuffer) for b in L.buffers if b.name in names)


@register("expand")
def _expand(L, a, shape):
    return broadcast_to(a, tuple(S(s) for s in shape))


def view_strides(old_sizes, old_strides, new_sizes):
    """Strides that view `old` as `new_sizes` without a copy, or None (symbolic sizes: only a
    contiguous `old`)."""
    if not all(S(x).is_Integer for x in (*old_sizes, *old_strides, *new_sizes)):
        # Symbolic sizes: a contiguous tensor views as any shape of the same numel, contiguously.
        want = contiguous_strides(old_sizes)
        if all(S(sz) == 1 or sympy.expand(S(st) - w) == 0
               for sz, st, w in zip(old_sizes, old_strides, want)):  # fmt: skip
            return list(contiguous_strides(new_sizes))
        return _symbolic_view_strides(old_sizes, old_strides, new_sizes)
    old_sizes, old_strides = [int(x) for x in old_sizes], [int(x) for x in old_strides]
    new_sizes = [int(x) for x in new_sizes]
    if 0 in old_sizes or not old_sizes:
        return list(contiguous_strides(new_sizes))
    new_strides, view_d = [0] * len(new_sizes), len(new_sizes) - 1
    base, tensor_numel, view_numel = old_strides[-1], 1, 1
    for d in reversed(range(len(old_sizes))):
        tensor_numel *= old_sizes[d]
        if d == 0 or (old_sizes[d - 1] != 1 and old_strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_sizes[view_d] == 1):
                new_strides[view_d] = view_numel * base
                view_numel *= new_sizes[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = old_strides[d - 1], 1, 1
    return new_strides if view_d == -1 else None


def _symbolic_view_strides(old_sizes, old_strides, new_sizes):
    """view_strides for symbolic sizes: torch's rule as primtorch's meta applies it, where each
    contiguous run of old dims (a column slice of GPT-2's fused q/k/v projection is one per row)
    must be split exactly by new dims, decided by provable equality of products (an unproved one
    is None, never a wrong view)."""
    strides = compute_view_strides(old_sizes, old_strides, new_sizes)
    return None if strides is None else list(strides)


def reshape(a, new_sizes):
    """`a` with new sizes: a View when strides allow, else index rewriting through a flat index."""
    new_sizes = tuple(S(s) for s in new_sizes)
    if tuple(a.sizes) == new_sizes:
        return a
    if isinstance(a, View):
        strides = view_strides(a.sizes, a.strides, new_sizes)
        if strides is not None:
            return View(a.buffer, new_sizes, strides, a.offset)
    out_st, in_st = contiguous_strides(new_sizes), contiguous_strides(a.sizes)

    def remap(idx):
        flat = sum((i * s for i, s in zip(idx, out_st)), sympy.S.Zero)
        return [ModularIndexing(flat, st, sz) if k else FloorDiv(flat, st)
                for k, (st, sz) in enumerate(zip(in_st, a.sizes))]  # fmt: skip

    return Lazy(new_sizes, a.dtype, a.device, lambda idx: a.load(remap(idx)))


@register("reshape", "view")
def _reshape(L, a, shape):
    return reshape(a, shape)


@register("collapse_view", "collapse")
def _collapse(L, a, start, end):
    sizes = list(a.sizes)
    merged = sympy.Mul(*sizes[start:end]) if end > start else sympy.S.One
    return reshape(a, sizes[:start] + [merged] + sizes[end:])


@register("split_dim")
def _split_dim(L, a, dim, outer_length):
    sizes = list(a.sizes)
    inner = sizes[dim] // outer_length
    return reshape(a, sizes[:dim] + [S(outer_length), inner] + sizes[dim + 1 :])


@register("squeeze")
def _squeeze(L, a, dimensions):
    nd = len(a.sizes)
    dims = {d % nd for d in dimensions}
    return reshape(a, [s for d, s in enumerate(a.sizes) if d not in dims])


@register("expand_dims", "unsqueeze")
def _expand_dims(L, a, dimensions, ndim=None):
    out_nd = len(a.sizes) + len(dimensions)
    dims = sorted(d % out_nd for d in dimensions)
    sizes = list(a.sizes)
    for d in dims:
        sizes.insert(d, sympy.S.One)
    return reshape(a, sizes)


@register("transpose", "permute")
def _permute(L, a, permutation):
    perm = [p % max(len(a.sizes), 1) for p in permutation]
    inv = [perm.index(d) for d in range(len(perm))]
    return remap_view(
        a, [a.sizes[p] for p in perm], lambda idx: [idx[inv[d]] for d in range(len(perm))]
    )


@register("slice")
def _slice(L, a, start_indices, limit_indices, strides=None):
    strides = strides or [1] * len(start_indices)
    sizes = [
        CeilDivInt(S(hi) - S(lo), st) for lo, hi, st in zip(start_indices, limit_indices, strides)
    ]
    return remap_view(
        a, sizes, lambda idx: [lo + i * st for i, lo, st in zip(idx, start_indices, strides)]
    )


def CeilDivInt(n, d):
    return (n + d - 1) // d if S(n).is_Integer else FloorDiv(S(n) + d - 1, d)


@register("slice_in_dim")
def _slice_in_dim(L, a, start_index, limit_index, stride=1, axis=0):
    lo, hi, st = [0] * len(a.sizes), list(a.sizes), [1] * len(a.sizes)
    lo[axis], hi[axis], st[axis] = start_index, limit_index, stride
    return _slice(L, a, lo, hi, st)


@register("rev", "flip")
def _rev(L, a, dims):
    nd = len(a.sizes)
    dims = {d % nd for d in dims}
    return remap_view(a, a.sizes, lambda idx: [a.sizes[d] - 1 - i if d in dims else i
                                               for d, i in enumerate(idx)])  # fmt: skip


@register("as_strided")
def _as_strided(L, a, size, stride, storage_offset=0):
    node = L.current.args[0]
    meta = node.meta.get(NODE_META_KEY) if hasattr(node, "meta") else None
    if isinstance(meta, TensorMeta):  # `stride` addresses eager's layout of `a`
        eager = _in_eager_strides(L, a, meta)
        if eager is not a:
            a, storage_offset = eager, S(storage_offset) - meta.storage_offset
    base = L.realize(a)
    return View(base.buffer, [S(s) for s in size], [S(s) for s in stride], S(storage_offset))


@register("cat")
def _cat(L, tensors, dim):
    meta = out_meta(L)
    # torch skips 1-d empty pieces; when every piece is one, the (empty) result reads the first
    tensors = [t for t in tensors if not (len(t.sizes) == 1 and t.sizes[0] == 0)] or tensors[:1]
    dim = dim % len(meta.sizes)
    starts, acc = [], sympy.S.Zero
    for t in tensors:
        starts.append(acc)
        acc = acc + t.sizes[dim]

    def bound(v):
        return ops.constant(int(v), torch.int64) if v.is_number else ops.index_expr(v, torch.int64)

    def fn(idx):
        # Every piece's loads are masked to its own range, the last one's too: a vector lane (a
        # Triton program's row, a SIMD lane) runs all the loads and `where` picks afterwards, so
        # an unmasked last piece would read before its buffer in the earlier pieces' range.
        last = lambda: load_as(tensors[-1], _shift(idx, dim, starts[-1]), meta.dtype)  # noqa: E731
        if len(tensors) == 1:
            value = last()
        else:
            after = ops.ge(ops.index_expr(idx[dim], torch.int64), bound(starts[-1]))
            value = ops.masked(after, last, 0)
        for t, lo in reversed(list(zip(tensors[:-1], starts[:-1]))):
            at = ops.index_expr(idx[dim], torch.int64)
            inside = ops.lt(at, bound(lo + t.sizes[dim]))
            if lo != 0:
                inside = ops.logical_and(ops.ge(at, bound(lo)), inside)
            part = ops.masked(
                inside, lambda t=t, lo=lo: load_as(t, _shift(idx, dim, lo), meta.dtype), 0
            )
            value = ops.where(inside, part, value)
        return value

    return Lazy(meta.sizes, meta.dtype, meta.device, fn)


def _index_value(expr):
    """An int64 value of a size expression: a constant, or computed from the size symbols."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return ops.constant(int(expr), torch.int64)
    return ops.index_expr(expr, torch.int64)


def _count_value(expr, dtype):
    """A count (a number of elements) as a `dtype` value: a constant, or computed from the sizes."""
    expr = sympy.sympify(expr)
    if expr.is_number:
        return ops.constant(float(expr), dtype)
    return ops.index_expr(expr, dtype)


def _maybe_positive(expr) -> bool:
    expr = sympy.sympify(expr)
    return bool(expr > 0) if expr.is_number else True  # a symbolic pad: mask, to be safe


def _shift(idx, dim, by):
    return [i - by if d == dim else i for d, i in enumerate(idx)]


@register("pad")
def _pad(L, a, padding_value, low, high, interior):
    """lax-style pad: `low`/`high` elements before/after each dim (may be negative), `interior`
    elements between neighbours."""
    meta = out_meta(L)

    def fn(idx):
        src, conds = [], []
        for i, lo, hi, step, size in zip(idx, low, high, interior, a.sizes):
            shifted = i - lo
            src.append(FloorDiv(shifted, step + 1) if step else shifted)
            if _maybe_positive(lo) or _maybe_positive(hi) or step:
                conds.append((shifted, step, size))
        mask = None
        for shifted, step, size in conds:
            e = ops.index_expr(shifted, torch.int64)
            ok = ops.logical_and(
                ops.ge(e, ops.constant(0, torch.int64)),
                ops.lt(e, _index_value(size * (step + 1) - step)),
            )
            if step:
                rem = ops.remainder(e, ops.constant(step + 1, torch.int64))
                ok = ops.logical_and(ok, ops.eq(rem, ops.constant(0, torch.int64)))
            mask = ok if mask is None else ops.logical_and(mask, ok)
        if mask is None:
            return load_as(a, src, meta.dtype)
        return ops.masked(mask, lambda: load_as(a, src, meta.dtype), padding_value)

    return Lazy(meta.sizes, meta.dtype, meta.device, fn)


@register("gather")
def _gather(L, a, dim, index):
    meta = out_meta(L)
    dim = dim % max(len(a.sizes), 1)

    def fn(idx):
        pos = ops.indirect_indexing(index.load(idx), a.sizes[dim])
        return load_as(a, [pos if d == dim else i for d, i in enumerate(idx)], meta.dtype)

    return Lazy(meta.sizes, meta.dtype, meta.device, fn)


@register("index_select")
def _index_select(L, a, dim, index):
    meta = out_meta(L)
    dim = dim % max(len(a.sizes), 1)

    def fn(idx):
        pos = ops.indirect_indexing(index.load([idx[dim]]), a.sizes[dim])
        return load_as(a, [pos if d == dim else i for d, i in enumerate(idx)], meta.dtype)

    return Lazy(meta.sizes, meta.dtype, meta.device, fn)


@register("index")
def _index(L, a, indices):
    """Advanced indexing a[i0, :, i2...]: index tensors broadcast together; their dims replace the
    indexed dims in place when those are adjacent, else they lead."""
    meta = out_meta(L)
    indices = list(indices) + [None] * (len(a.sizes) - len(indices))
    pos = [d for d, t in enumerate(indices) if t is not None]
    bshape = broadcast_shapes(*(indices[d].sizes for d in pos))  # sympy: sizes may be symbolic
    nb = len(bshape)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    start = pos[0] if adjacent else 0
    tensors = {d: broadcast_to(indices[d], bshape) for d in pos}

    def fn(idx):
        bidx = idx[start : start + nb]
        rest = iter(idx[:start] + idx[start + nb :])
        src = []
        for d, size in enumerate(a.sizes):
            if d in tensors:
                src.append(ops.indirect_indexing(tensors[d].load(bidx), size))
            else:
                src.append(next(rest))
        return load_as(a, src, meta.dtype)

    return Lazy(meta.sizes, meta.dtype, meta.device, fn)


# --- reductions ----------------------------------------------------------------------------------


def _reduce(rtype):
    def lower(L, inp, dims, output_dtype=None, *rest):
        meta = out_meta(L)
        dims = range(len(inp.sizes)) if dims is None else dims
        out = L.reduction(inp, dims, rtype, meta.dtype)
        return reshape(out, meta.sizes)  # keepdim-style outputs differ only by size-1 dims

    return lower


for _name, _rtype in (("sum", "sum"), ("prod", "prod"), ("amax", "max"), ("amin", "min"),
                      ("any", "any")):  # fmt: skip
    register(_name)(_reduce(_rtype))


@register("all")
def _all(L, a, dims):
    meta = out_meta(L)
    neg = Lazy(
        a.sizes, torch.bool, a.device, lambda idx: ops.logical_not(load_as(a, idx, torch.bool))
    )
    out = L.reduction(neg, dims, "any", torch.bool)
    res = Lazy(out.sizes, torch.bool, out.device, lambda idx: ops.logical_not(out.load(idx)))
    return reshape(res, meta.sizes)


@register("argmax", "argmin")
def _argreduce(L, a, dim=None):
    meta = out_meta(L)
    rtype = L.current.target.name
    if dim is None:
        a = reshape(a, [sympy.Mul(*a.sizes)]) if a.sizes else reshape(a, [1])
        dim = 0
    read = lambda idx: load_as(a, idx, a.dtype)
    out = L.reduction(a, [dim], rtype, torch.int64, fn=read)
    return reshape(out, meta.sizes)


@register("var")
def _var(L, inp, dims, correction=1, output_dtype=None):
    """Two passes over each row (mean, then squared deviations): both fuse into one kernel."""
    meta = out_meta(L)
    nd = len(inp.sizes)
    dims = sorted({d % nd for d in (range(nd) if dims is None else dims)})
    kept = [d for d in range(nd) if d not in dims]
    n = sympy.Mul(*[inp.sizes[d] for d in dims]) if dims else sympy.S.One
    cdt = compute_dtype(meta.dtype)
    total = L.reduction(inp, dims, "sum", cdt)

    def centered_sq(idx):
        mean = ops.truediv(total.load([idx[d] for d in kept]), _count_value(n, cdt))
        d = ops.sub(load_as(inp, idx, cdt), mean)
        return ops.mul(d, d)

    sq = L.reduction(inp, dims, "sum", cdt, fn=centered_sq)
    denom = n - correction
    if denom.is_number or not known(sympy.Ge(denom, 0)):
        denom = sympy.Max(denom, 0)
    out = Lazy(sq.sizes, meta.dtype, sq.device,
               lambda idx: ops.truediv(sq.load(idx), _count_value(denom, cdt)))  # fmt: skip
    return reshape(out, meta.sizes)


# --- extern kernels ------------------------------------------------------------------------------
# Torch's eager kernels, called from the wrapper; the argument order is the vocabulary schema's.

EXTERN_KERNELS = {
    "extern.mm": torch.mm,
    "extern.bmm": torch.bmm,
    "extern.addmm": torch.addmm,
    "extern.baddbmm": torch.baddbmm,
    "extern.convolution": torch.convolution,
    # a prim's reference, where torch's kernel for it is slow (runtime.index_put says when)
    "prims.index_put": runtime_index_put,
}


def _extern(name):
    def lower(L, *args, **kwargs):
        return L.extern(name, EXTERN_KERNELS[name], args, kwargs)

    lower.aten_call = True  # only ever the call: its host tensors may stay on the host
    return lower


for _name in EXTERN_KERNELS:  # the matmuls (lowering_matmul.py) and the convolution (below)
    if _name.startswith("extern."):  # (a prim's call stays its fallback, as before)
        register(_name)(_extern(_name))


@register("extern.custom_op")
def _custom_op(L, op, args, mutated=()):
    """A user operator (torch.library) or user Triton kernel: never fused, called by its name from
    the wrapper (extern.custom_op's reference); its outputs take the fake kernel's layouts."""
    from ember.primtorch.prims.custom import custom_op

    args = [_eager_layout(L, a, n) for a, n in zip(args, L.current.args[1])]
    return L.extern("extern.custom_op", custom_op.ref, (op, args, list(mutated)), {})


def _eager_layout(L, a, node):
    """Argument `a` of a user operator (its node `node`) in the strides eager gives it: a kernel
    of the user's may assume them."""
    if isinstance(a, (list, tuple)) and isinstance(node, (list, tuple)):
        return type(a)(_eager_layout(L, x, n) for x, n in zip(a, node))
    meta = node.meta.get(NODE_META_KEY) if hasattr(node, "meta") else None
    if not (is_tensor(a) and isinstance(meta, TensorMeta)) or tuple(a.sizes) != tuple(meta.sizes):
        return a
    return _in_eager_strides(L, a, meta)


def _in_eager_strides(L, a, meta: TensorMeta):
    """`a` with the strides eager gave it (`meta`'s) where this lowering may have laid it out
    otherwise: NHWC mode, a padded matmul's product, or a value not stored yet (a convolution's
    output with its bias still to add: stored, it would be row-major); else `a` itself."""
    if isinstance(a, View) and (not (L.channels_last or L.own_layout(a))
                                or _same_strides(a.sizes, a.strides, meta.strides)):  # fmt: skip
        return a
    return L.with_strides(a, meta.strides)


@register("prims.index_put")
def _index_put(L, a, indices, values, accumulate=False):
    """An index_put that input_updates.py marked: written into the graph input `a` views (its
    result is that view, so the program's output for the input is the input's own memory).
    Any other stays its reference's call (a copy of `a`, written)."""
    if not L.current.meta.get(IN_PLACE_META):
        raise NotImplementedError("no lowering")
    written = _indexed_write(L, a, indices, values)
    if written is not None:
        return written
    target = L.realize_as_buffer(a)
    lay = target.layout
    meta = TensorMeta(lay.dtype, tuple(lay.sizes), tuple(lay.strides), lay.offset,
                      L.meta().device)  # fmt: skip
    return L.extern("prims.index_put", runtime_index_put, (target, indices, values, False),
                    {"in_place": True}, meta=meta)  # fmt: skip


_index_put.partial = True  # any other index_put still calls its reference (the fallback)


def _indexed_write(L, a, indices, values):
    """The marked index_put as a kernel that stores `values` into rows of the input `a` views
    (loop_ir.IndexedWrite: fused with what computes the values, no extern call), or None where
    it stays an extern: config.indexed_writes off, not one 1-D index tensor, or C++ kernels. A
    Triton kernel skips a row outside the input (eager's CUDA kernel stops the process with a
    device-side assert); on the CPU eager raises, and so does the extern."""
    triton = str(L.device).startswith("cuda") or config.cpu_backend == "triton"
    if not config.indexed_writes or len(indices) != 1 or not triton:
        return None
    index = indices[0]
    if not is_tensor(index) or len(index.sizes) != 1 or index.dtype.is_floating_point or \
            not (isinstance(a, View) and isinstance(a.buffer, InputBuffer)) or not a.sizes:
        return None  # fmt: skip
    target = a.buffer
    shape = (index.sizes[0], *a.sizes[1:])  # rows of `a`'s first dimension, values broadcast
    if is_tensor(values) and len(values.sizes) > len(shape):
        return None
    src = broadcast_to(values, shape) if is_tensor(values) else values
    rows = L.realize(index)  # read through its root buffer (a view's offset counted once)
    dtype = a.dtype
    write = IndexedWrite(L.new_name(), Layout(dtype, a.device, a.sizes, a.strides, a.offset),
                         Pointwise(shape, lambda idx: load_as(src, idx, dtype), dtype),
                         target=target, index=rows.buffer, index_stride=rows.strides[0],
                         index_offset=rows.offset, dim=0)  # fmt: skip
    L.buffers.append(write)
    return View.of(write)


def _nhwc(L, x) -> View:
    return L.with_strides(x, make_channels_last_strides_for(x.sizes))


def _nhwc_ok(L, *tensors) -> bool:
    """Channels-last mode, 4-D operands, and sizes past the batch dim static (NHWC strides of a
    symbolic H or W need Max(., 1) terms that the indexing does not simplify)."""
    return L.channels_last and all(
        len(t.sizes) == 4 and all(S(s).is_Integer for s in t.sizes[1:]) for t in tensors
    )


def _as_meta(v):
    return TensorMeta(v.dtype, v.sizes, v.strides, 0, v.device) if is_tensor(v) else v


@register("extern.convolution")
def _convolution(L, input, weight, bias, *rest):
    """In channels-last mode a 2-D convolution reads NHWC input and weight (a Lazy is computed
    straight into NHWC) and declares the NHWC output the kernel then returns (no restride). A
    bias is left out of the call where config.conv_bias_epilogue says so: the kernels that read
    the output add it (an extern reading it gets it added by the kernel that stores its operand,
    one pass over the output as torch's own bias kernel would make)."""
    split = is_tensor(bias) and on_for(config.conv_bias_epilogue, input.device)
    conv_bias = None if split else bias
    if not _nhwc_ok(L, input, weight):
        out = L.extern("extern.convolution", torch.convolution,
                       (input, weight, conv_bias, *rest))  # fmt: skip
    else:
        x, w = _nhwc(L, input), _nhwc(L, weight)
        if is_tensor(conv_bias):  # a bias computed in the graph (cast to bf16 under autocast)
            conv_bias = L.realize(conv_bias)
        meta = L.current.target.meta(_as_meta(x), _as_meta(w), _as_meta(conv_bias), *rest)
        out = L.extern("extern.convolution", torch.convolution, (x, w, conv_bias, *rest),
                       meta=meta)  # fmt: skip
    if not split:
        return out
    # torch's CUDA convolution adds a bias with a kernel of its own over the whole output (a
    # third of VGG's convolution time in bf16); the kernel that reads the output anyway (the
    # batch norm, the activation, a pooling window, the copy into a matmul's operand layout:
    # SqueezeBERT's 36 query/key/value convolutions) adds it for one more load of C values
    per_channel = reshape(bias, (bias.sizes[0],) + (1,) * (len(out.sizes) - 2))
    return make_pointwise(L, lambda y, b: ops.add(y, b), (out, per_channel))


@register("extern.convolution_backward")
def _convolution_backward(L, grad_output, input, weight, *rest):
    """In channels-last mode the grads of a 2-D convolution are computed from NHWC operands (the
    forward's layout) and come back in it."""
    target = L.current.target
    if not _nhwc_ok(L, grad_output, input, weight):
        return L.extern(target.qualname, target.ref, (grad_output, input, weight, *rest))
    g, x, w = (_nhwc(L, t) for t in (grad_output, input, weight))
    meta = target.meta(_as_meta(g), _as_meta(x), _as_meta(w), *rest)
    return L.extern(target.qualname, target.ref, (g, x, w, *rest), meta=meta)
