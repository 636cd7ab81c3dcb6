"""Lowering: a prim-level fx graph becomes a program of loop-IR buffers.

Each prim has a lowering in `LOWERINGS`, keyed by its vocabulary name ("prims.add"). Values during
lowering are `View`s (a realized buffer seen through sizes/strides/offset: views stay views) or
`Lazy`s (an unrealized pointwise body, inlined into whoever reads it). A value is realized into a
buffer when a reduction, an extern or the graph output needs it, or when recomputing it in each
reader would cost too much. A prim without a lowering runs its reference implementation as an
extern call (one warning per prim).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Callable

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta, contiguous_strides, lookup, target_name
from ember.ir.symbols import free_symbols_of
from ember.primtorch.prims.extern import ARG_STRIDES
from ember.primtorch.prims.movement import device_put
from ember.primtorch.utils import (
    is_non_overlapping_and_dense,
    known_le,
    make_channels_last_strides_for,
    strides_from_perm,
)

from . import metrics
from .config import config
from .graph_reads import readers, reads_disjoint_parts
from .index_simplify import linear_parts, strided_index
from .input_updates import SAME_LAYOUT_VIEW_META
from .loop_ir import (
    BINARY_OPS,
    COMPARE_OPS,
    UNARY_OPS,
    AliasBuffer,
    Buffer,
    ComputedBuffer,
    ExternBuffer,
    InputBuffer,
    Layout,
    MultiOutput,
    Pointwise,
    Reduction,
    SketchHandler,
    TextHandler,
    compute_dtype,
    loop_vars,
    ops,
    set_handler,
)  # fmt: skip
from .read_layouts import voted_strides

log = logging.getLogger("ember.inductor")
_LOADED = re.compile(r"= load\((\w+),")  # a buffer read, in a body's sketch
# Recomputing these in every reader costs more than storing and re-reading a (cached) row.
TRANSCENDENTAL = ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sin", "cos", "expm1", "log1p")
LOWERINGS: dict[str, Callable] = {}
_warned: set = set()


def register(*names):
    """Register a lowering under one or more prim names (with or without the "prims." prefix)."""

    def deco(fn):
        for n in names:
            LOWERINGS[n if "." in n else f"prims.{n}"] = fn
        return fn

    return deco


# --- values ------------------------------------------------------------------------------------


class View:
    """A realized buffer read through `sizes`, `strides` and `offset` (no copy)."""

    def __init__(self, buffer: Buffer, sizes, strides, offset=sympy.S.Zero):
        self.buffer, self.sizes, self.strides = buffer, tuple(sizes), tuple(strides)
        self.offset, self.dtype, self.device = (
            sympy.sympify(offset),
            buffer.dtype,
            buffer.layout.device,
        )

    @classmethod
    def of(cls, buf: Buffer) -> View:
        lay = buf.layout
        return cls(buf, lay.sizes, lay.strides, lay.offset)

    def index(self, idx) -> sympy.Expr:
        return strided_index(self.offset, self.strides, idx)

    def load(self, idx):
        return ops.load(self.buffer.name, self.index(idx))

    def is_whole(self) -> bool:
        lay = self.buffer.layout
        return (self.sizes, self.strides, self.offset) == (lay.sizes, lay.strides, lay.offset)


class Lazy:
    """An unrealized pointwise value: `fn(idx)` computes the element at `idx`."""

    def __init__(self, sizes, dtype, device, fn):
        self.sizes, self.dtype, self.device, self.fn = tuple(sizes), dtype, device, fn
        self._cost = None
        self.realized: dict = {}  # strides -> the View of the buffer it was computed into

    def load(self, idx):
        return self.fn(list(idx))

    def cost(self) -> tuple[int, int, bool]:
        """(ops, loads, uses a transcendental) of one element, from a dry run of the body."""
        if self._cost is None:
            with set_handler(SketchHandler()) as h:
                self.fn(loop_vars("i", len(self.sizes)))
            loads = sum(" = load(" in line for line in h.lines)
            text = "\n".join(h.lines)  # (one search per op, not one per op and line)
            pricey = any(f" = {op}(" in text for op in TRANSCENDENTAL)
            self._cost = (len(h.lines), loads, pricey)
            self._loaded = frozenset(_LOADED.findall(text))
        return self._cost

    def loaded(self) -> frozenset:
        """Names of the buffers the body reads."""
        self.cost()
        return self._loaded


def is_tensor(v) -> bool:
    return isinstance(v, (View, Lazy))


def remap_view(x, out_sizes, remap: Callable):
    """A view of `x` whose element `idx` is x's element `remap(idx)`: a View when affine."""
    out_sizes = tuple(sympy.sympify(s) for s in out_sizes)
    if isinstance(x, View):
        vs = loop_vars("v", len(out_sizes))
        lin = linear_parts(x.index(remap(vs)), vs)
        if lin is not None and all(c.is_nonnegative is not False for c in lin[0]):
            strides = [c if s != 1 else sympy.S.Zero for c, s in zip(lin[0], out_sizes)]
            return View(x.buffer, out_sizes, strides, lin[1])
    return Lazy(out_sizes, x.dtype, x.device, lambda idx: x.load(remap(idx)))


def broadcast_to(x, sizes):
    """`x` read at the index of a value of shape `sizes` (right-aligned broadcasting)."""
    if tuple(x.sizes) == tuple(sizes):
        return x
    lead = len(sizes) - len(x.sizes)

    def remap(idx):
        return [sympy.S.Zero if s == 1 and sizes[lead + k] != 1 else idx[lead + k]
                for k, s in enumerate(x.sizes)]  # fmt: skip

    return remap_view(x, sizes, remap)


def load_as(x, idx, dtype):
    """Element `idx` of tensor or scalar `x`, converted to `dtype`'s compute type."""
    if not is_tensor(x):
        if isinstance(x, sympy.Basic) and free_symbols_of(x):  # a size used as a number
            return ops.index_expr(x, dtype)
        return ops.constant(x, dtype)
    v = x.load(idx)
    if compute_dtype(x.dtype) != compute_dtype(dtype):
        v = ops.to_dtype(v, dtype)
    return v


# --- the lowerer ---------------------------------------------------------------------------------


class Lowerer(fx.Interpreter):
    """Walks a prim graph, producing `self.buffers` (program order) and `self.outputs`."""

    def __init__(self, gm: fx.GraphModule, example_inputs):
        super().__init__(gm)
        self.example_inputs = list(example_inputs)
        self.buffers: list[Buffer] = []
        self.inputs: list[InputBuffer] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.outputs: list = []
        self._ids = itertools.count()
        self.current: fx.Node | None = None
        self._reductions: dict = {}
        # Convolutions and the pointwise kernels between them in NHWC (config.conv_channels_last).
        self.channels_last = wants_channels_last(gm)
        # Buffers laid out unlike eager's outside NHWC mode (a padded matmul's product, read
        # through the view of its first columns): a graph output or as_strided of one is copied
        # into eager's strides.
        self.relaid: set[str] = set()
        # The device the generated kernels run on: a GPU when any value of the graph is on one.
        # Work on another device inside such a graph (a CPU scalar that a model draws with
        # torch.rand([]), an extern's CPU outputs) runs eagerly, and a CPU value a kernel reads
        # is copied over first: a kernel can only address its own device's memory.
        self.device = graph_device(gm)
        # Dynamic sizes: symbol -> (input index, dim) of the first input dimension of that size.
        self.size_symbols: dict = {}
        for i, p in enumerate(gm.graph.find_nodes(op="placeholder")):
            meta = p.meta.get(NODE_META_KEY)
            if isinstance(meta, TensorMeta):
                for d, size in enumerate(meta.sizes):
                    if size.is_Symbol:
                        self.size_symbols.setdefault(size, (i, d))

    def new_name(self) -> str:
        return f"buf{next(self._ids)}"

    def meta(self):
        return self.current.meta.get(NODE_META_KEY) if self.current is not None else None

    def run_node(self, n: fx.Node):
        self.current = n
        for m in pytree.tree_leaves(n.meta.get(NODE_META_KEY)):
            if isinstance(m, TensorMeta) and (m.dtype.is_complex or not self._bound(m)):
                raise NotImplementedError(
                    f"ember.inductor: {n.format_node()} produces a {m.dtype} tensor of sizes "
                    f"{m.sizes}; complex dtypes and sizes that no input's size gives (data-dependent "
                    "sizes) are not supported"
                )
        value = super().run_node(n)
        if isinstance(value, Lazy):
            ops_count, loads, pricey = value.cost()
            heavy = (pricey or ops_count > config.realize_ops_threshold
                     or loads > config.realize_reads_threshold)  # fmt: skip
            if ops_count > config.max_inline_ops or (
                readers(n) > 1
                and ((heavy and not reads_disjoint_parts(n)) or self._holds_inputs(value))
            ):
                strides = self.preferred_strides(value) or self._meta_strides(value)
                narrow = self._widened(n)
                if narrow is not None:  # the narrow value, in the layout the wide one would have
                    self.env[narrow] = self.realize(self.env[narrow], strides)
                    return super().run_node(n)  # readers widen it as they load it
                value = self.realize(value, strides)
        return value

    def _widened(self, n: fx.Node):
        """The input of `n` where `n` only widens it exactly (a bfloat16 or float16 value cast to
        float32, float32 to float64), the input is not stored yet and every reader of `n` is a
        kernel that can widen as it loads (pointwise, reduction): stored at its own width, the
        value costs half the bytes to write and to read (a bf16 activation that float32
        reductions read twice: split attention's radix sums). None otherwise: a wide value an
        extern reads, or the graph returns, would be stored besides."""
        if target_name(n.target) != "prims.convert_element_type" or not n.args:
            return None
        for user in n.users:
            if user.op != "call_function" or not _reads_in_kernel(user):
                return None
        src = n.args[0]
        if not isinstance(src, fx.Node) or not isinstance(self.env.get(src), Lazy):
            return None
        a, b = src.meta.get(NODE_META_KEY), n.meta.get(NODE_META_KEY)
        if not (isinstance(a, TensorMeta) and isinstance(b, TensorMeta)):
            return None
        return src if (a.dtype, b.dtype) in _EXACT_WIDENINGS else None

    def _holds_inputs(self, value: Lazy) -> bool:
        """Whether `value` reads two or more buffers as large as itself, together at least its
        own bytes: inlined into each of its readers, it would keep them all alive until its last
        reader, where one buffer of its own would do (a backward's gradient sums: each branch's
        gradient held to the end; an fp32 sum of two bf16 gradients weighs the same as both)."""
        numel = sympy.Mul(*value.sizes)
        by_name = {b.name: b for b in (*self.inputs, *self.buffers) if b is not None}
        held = []
        for name in value.loaded():
            buf = by_name.get(name)
            if buf is not None and sympy.sympify(buf.layout.numel() - numel).is_nonnegative:
                held.append(buf.layout.dtype.itemsize)
        return len(held) >= 2 and sum(held) >= value.dtype.itemsize

    def _bound(self, meta: TensorMeta) -> bool:
        if meta.is_static():
            return True
        free = set()
        for e in (*meta.sizes, *meta.strides, meta.storage_offset):
            free |= free_symbols_of(e)
        return free <= set(self.size_symbols)

    def placeholder(self, target, args, kwargs):
        i = len(self.inputs)
        meta = self.meta() or TensorMeta.from_tensor(self.example_inputs[i])
        if not isinstance(meta, TensorMeta):  # a symbolic or Python scalar input
            self.inputs.append(None)
            return self.example_inputs[i]
        # offset 0: kernels get data pointers, which already point at the first element
        buf = InputBuffer(f"arg{i}", Layout(meta.dtype, meta.device, meta.sizes, meta.strides))
        self.inputs.append(buf)
        return View.of(buf)

    def get_attr(self, target, args, kwargs):
        t = getattr(self.module, target)
        if not isinstance(t, torch.Tensor):
            return t
        name = f"const{len(self.constants)}"
        self.constants[name] = t
        buf = InputBuffer(name, Layout(t.dtype, str(t.device), tuple(t.shape), t.stride()))
        self.buffers.append(buf)
        return View.of(buf)

    def call_function(self, target, args, kwargs):
        if target.__module__ == "_operator" and target.__name__ == "getitem":
            return args[0][args[1]]
        name = target_name(target)
        args, kwonly = normalize_args(name, args, kwargs)
        if name == "prims.device_put":  # a copy between devices: torch's own
            return self.extern(name, target.ref, args, kwonly)
        if self.device != "cpu":
            out = _first_meta(self.meta())
            if out is not None and str(out.device) != self.device:
                return self.extern(name, getattr(target, "ref", None) or target, args, kwonly)
            # An ATen kernel called as it is takes stored tensors where they are, as in eager (the
            # efficient attention's backward reads its CPU philox seed on the host: a segfault)
            lower = LOWERINGS.get(name)
            stored = getattr(lower, "aten_call", lower is None and name.startswith("extern."))
            args = self._on_device(args, stored)
            kwonly = {k: self._on_device(v, stored) for k, v in kwonly.items()}
        fn = LOWERINGS.get(name)
        if fn is not None:
            try:
                return fn(self, *args, **kwonly)
            except NotImplementedError as e:
                reason = str(e)
        else:
            reason = "no lowering"
        return self.fallback(name, target, args, kwonly, reason)

    def call_module(self, target, args, kwargs):
        raise NotImplementedError(f"call_module {target} in a prim graph (expected prims only)")

    def call_method(self, target, args, kwargs):
        raise NotImplementedError(f"call_method {target} in a prim graph (expected prims only)")

    def output(self, target, args, kwargs):
        outs = args[0]
        seq, self.out_spec = pytree.tree_flatten(outs)
        node_seq = pytree.tree_leaves(self.current.args[0])
        for v, node in zip(seq, node_seq):
            meta = node.meta.get(NODE_META_KEY) if isinstance(node, fx.Node) else None
            if isinstance(v, Lazy):
                v = self.realize(v, meta.strides if isinstance(meta, TensorMeta) else None)
            elif self.own_layout(v) and isinstance(meta, TensorMeta):
                # a buffer this lowering laid out in NHWC or padded: the caller sees eager's layout
                if not _same_strides(v.sizes, v.strides, meta.strides):
                    v = self.with_strides(v, meta.strides)
            self.outputs.append(self.realize_as_buffer(v) if is_tensor(v) else v)
        return outs

    # --- helpers used by the lowerings --------------------------------------------------------

    def own_layout(self, v) -> bool:
        """Whether `v` may be a buffer that this lowering laid out unlike eager (NHWC, padded)."""
        if not isinstance(v, View) or isinstance(v.buffer, InputBuffer):
            return False
        return self.channels_last or v.buffer.name in self.relaid

    def _meta_strides(self, value):
        meta = self.meta()
        if isinstance(meta, TensorMeta) and tuple(meta.sizes) == tuple(value.sizes):
            return meta.strides
        return None

    def realize(self, x, strides=None, padded: bool = False) -> View:
        """Compute `x` into a buffer (dense, with `strides` when they are a dense permutation;
        with none given, in the layout of what it reads when that is channels-last). `padded`:
        `strides` as they are, gaps between rows included (a matmul operand's padded rows)."""
        if isinstance(x, View):
            return x
        if strides is None:
            strides = self.preferred_strides(x)
        if strides is None or not (padded or _is_dense(x.sizes, strides)):
            strides = contiguous_strides(x.sizes)
        # A value of several buffers that two externs take (the joined q/k/v gradient into both
        # matmuls of a Linear's backward) is computed once. So is one of a single buffer no
        # smaller than itself (a ReLU of a conv output that four branch convolutions read, a
        # downcast): holding it in between costs no more than holding its source would, where
        # computing it again writes it again (HRNet's and Inception's branches wrote one copy per
        # branch). A value larger than its one source (a broadcast) is computed again for each
        # reader: that keeps only the smaller source alive in between.
        done = x.realized.get(tuple(strides))
        if done is not None:
            return done
        buf = ComputedBuffer(self.new_name(), Layout(x.dtype, x.device, x.sizes, tuple(strides)),
                             Pointwise(x.sizes, x.fn, x.dtype))  # fmt: skip
        self.buffers.append(buf)
        view = View.of(buf)
        if len(x.loaded()) > 1 or self._no_larger_than_source(x):
            x.realized[tuple(strides)] = view
        return view

    def _no_larger_than_source(self, x: Lazy) -> bool:
        """Whether `x` reads one buffer whose bytes are at least `x`'s."""
        names = x.loaded()
        if len(names) != 1:
            return False
        (name,) = names
        src = next((b for b in (*self.buffers, *self.inputs) if b is not None and b.name == name),
                   None)  # fmt: skip
        if src is None:
            return False
        own = sympy.Mul(*x.sizes) * x.dtype.itemsize
        return known_le(own, src.layout.numel() * src.layout.dtype.itemsize)

    def preferred_strides(self, x) -> tuple | None:
        """In channels-last mode, a Lazy's strides in the order most of its loads walk memory,
        not eager's: the convolutions' NHWC outputs change the layouts eager's strides were
        derived from (a vision MLP's residual stream, (B, N, C) out of an NHWC patch
        embedding, is (B, C, N) in eager's NCHW; a 5-D view of an NHWC activation split into
        groups stays in its source's order). A 4-D value takes NHWC or row-major order only
        (as torch's elementwise ops keep the memory format), by a majority. None outside that
        mode, or when the reads tie (other values: without row-major among the tied) or say
        nothing: eager's strides then."""
        if not (self.channels_last and isinstance(x, Lazy) and len(x.sizes) >= 2):
            return None
        four = len(x.sizes) == 4
        strides = voted_strides(x, row_major_wins_ties=not four)
        if strides is not None and four and not any(
            _same_strides(x.sizes, strides, kept)
            for kept in (make_channels_last_strides_for(x.sizes), contiguous_strides(x.sizes))
        ):
            return None
        return strides

    def with_strides(self, x, strides) -> View:
        """`x` as a View with exactly `strides` (a copy when it has other ones)."""
        strides = tuple(sympy.sympify(s) for s in strides)
        if isinstance(x, View) and _same_strides(x.sizes, x.strides, strides):
            return x
        if _is_dense(x.sizes, strides):  # a Lazy as itself: its realizations are remembered
            lazy = x if isinstance(x, Lazy) else Lazy(x.sizes, x.dtype, x.device, x.load)
            return self.realize(lazy, strides)
        padded = _padded_rows(x.sizes, strides)
        if padded is not None:
            # Rows padded for alignment, as whole rows with zeros after the elements: a kernel
            # reading aligned rows (the memory-efficient attention's bias) reads the last row's
            # padding too, which a buffer ending at the last element would not hold.
            whole = self.realize(pad_last_dim(x, padded[-1]), contiguous_strides(padded))
            return View(whole.buffer, list(x.sizes), list(strides), whole.offset)
        # rows padded for alignment: a buffer larger than its elements
        buf = ComputedBuffer(self.new_name(), Layout(x.dtype, x.device, x.sizes, strides),
                             Pointwise(x.sizes, x.load, x.dtype))  # fmt: skip
        self.buffers.append(buf)
        return View.of(buf)

    def realize_as_buffer(self, x) -> Buffer:
        """A Buffer whose layout is exactly `x` (an AliasBuffer for a strided view)."""
        v = self.realize(x)
        if v.is_whole():
            return v.buffer
        alias = AliasBuffer(self.new_name(), Layout(v.dtype, v.device, v.sizes, v.strides, v.offset),
                            source=v.buffer)  # fmt: skip
        self.buffers.append(alias)
        return alias

    def reduction(self, x, dims, rtype, out_dtype, fn=None):
        """A reduction buffer over `dims` of `x` (`fn(idx)` overrides the element read)."""
        nd = len(x.sizes)
        dims = sorted({d % nd for d in dims}) if nd else []
        kept = [d for d in range(nd) if d not in dims]
        ranges = [x.sizes[d] for d in kept]
        rranges = [x.sizes[d] for d in dims]
        read = fn or (lambda idx: load_as(x, idx, out_dtype))

        def inner(index, rindex):
            full = [None] * nd
            for d, v in zip(kept, index):
                full[d] = v
            for d, v in zip(dims, rindex):
                full[d] = v
            return read(full)

        if _across_outer_dims(x.sizes, dims):
            unrolled = _unrolled(inner, ranges, rranges, rtype, out_dtype, x.device)
            if unrolled is not None:
                return unrolled
        src = compute_dtype(out_dtype) if rtype not in ("argmax", "argmin") else x.dtype
        data = Reduction(tuple(ranges), tuple(rranges), rtype, inner, out_dtype, src)
        with set_handler(TextHandler()) as h:  # the same reduction twice (mean and var) is one
            inner(loop_vars("i", len(ranges)), loop_vars("r", len(rranges)))
        key = (tuple(ranges), tuple(rranges), rtype, out_dtype, tuple(h.lines))
        if key in self._reductions:
            return self._reductions[key]
        buf = ComputedBuffer(
            self.new_name(),
            Layout(out_dtype, x.device, tuple(ranges), contiguous_strides(ranges)),
            data,
        )
        self.buffers.append(buf)
        self._reductions[key] = View.of(buf)
        return self._reductions[key]

    def _on_device(self, a, keep_stored: bool = False):
        """`a` with each tensor on another device than the kernels' copied to theirs (eager
        lets a CUDA op read a CPU scalar tensor; a Triton kernel cannot). `keep_stored`: a
        stored tensor (a View: an input, an extern's output) stays where it is."""
        if isinstance(a, (list, tuple)):
            return type(a)(self._on_device(x, keep_stored) for x in a)
        if not is_tensor(a) or str(a.device) == self.device:
            return a
        if keep_stored and isinstance(a, View):
            return a
        meta = TensorMeta(a.dtype, tuple(a.sizes), contiguous_strides(a.sizes), 0, self.device)
        return self.extern("prims.device_put", device_put.ref, (a, self.device), meta=meta)

    def fallback(self, name, target, args, kwargs, reason):
        """Run the prim's reference implementation as an extern call (logged once per prim)."""
        if name not in _warned and not name.startswith("extern."):
            _warned.add(name)
            log.warning(
                "ember.inductor: %s has no lowering (%s); running its reference", name, reason
            )
        if not name.startswith("extern."):
            metrics.fallbacks.append(name)
        fn = getattr(target, "ref", None) or target
        return self.extern(name, fn, args, kwargs)

    def extern(self, name, fn, args, kwargs=None, meta=None):
        """An extern kernel call: tensor arguments are realized; outputs get the node's meta."""
        meta = meta if meta is not None else self.meta()
        required = ARG_STRIDES.get(name, {})

        def arg(a, pos=None):
            if is_tensor(a):
                if pos in required:
                    return self.realize_as_buffer(self.with_strides(a, required[pos](a.sizes, getattr(a, "strides", None))))
                return self.realize_as_buffer(a)
            if isinstance(a, (list, tuple)) and any(is_tensor(x) for x in pytree.tree_leaves(a)):
                return type(a)(arg(x) for x in a)  # nested: extern.custom_op's argument list
            return a

        call_args = tuple(arg(a, i) for i, a in enumerate(args))
        metas = meta if isinstance(meta, (list, tuple)) else (meta,)
        first = next((m for m in metas if isinstance(m, TensorMeta)), None)
        if first is None:
            raise NotImplementedError(f"{name}: an extern needs a TensorMeta output on its node")
        call_kwargs = {k: arg(v) for k, v in (kwargs or {}).items()}  # attn_mask=, say
        ext = ExternBuffer(self.new_name(), _layout(first), op=name, fn=fn, args=call_args,
                           kwargs=call_kwargs)  # fmt: skip
        self.buffers.append(ext)
        if not isinstance(meta, (list, tuple)):
            return View.of(ext)
        outs = []
        for i, m in enumerate(metas):
            if not isinstance(m, TensorMeta):
                outs.append(None)  # a None or non-tensor output: read it from the call's result
                continue
            mo = MultiOutput(self.new_name(), _layout(m), source=ext, index=i)
            self.buffers.append(mo)
            outs.append(View.of(mo))
        ext.outputs = tuple(o.buffer.name for o in outs if o is not None)
        return tuple(outs)


def pad_last_dim(x, n_pad) -> Lazy:
    """`x` (..., N) as a Lazy (..., n_pad) whose elements from N on are zero."""
    n = sympy.sympify(x.sizes[-1])

    def fn(idx):
        inside = ops.lt(ops.index_expr(idx[-1], torch.int64), ops.index_expr(n, torch.int64))
        return ops.masked(inside, lambda: x.load(idx), 0)

    return Lazy((*x.sizes[:-1], sympy.sympify(n_pad)), x.dtype, x.device, fn)


# Casts that lose nothing: a value stored at the first width is read back at the second exactly.
_EXACT_WIDENINGS = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                    (torch.bfloat16, torch.float64), (torch.float16, torch.float64),
                    (torch.float32, torch.float64)}  # fmt: skip


def _reads_in_kernel(node: fx.Node) -> bool:
    """Whether `node` is an op of the vocabulary that a generated kernel computes, loading its
    inputs (pointwise, reduction), not an extern, a view or a movement."""
    try:
        tags = lookup(target_name(node.target)).tags
    except KeyError:
        return False
    return "pointwise" in tags or "reduction" in tags


_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or"}


def _across_outer_dims(sizes, dims) -> bool:
    """Whether a reduction over `dims` reduces across some dimension that a kept one (larger
    than 1) follows: a sum over radix branches, heads or a stacked axis, whose loop over the
    kept dims a reduction kernel would run across the source's rows. A reduction along the
    rows (the last dims: softmax, norms) is left to the reduction kernel, which fuses its
    row-wise readers."""
    big = [d for d, n in enumerate(sizes) if n != 1]
    reduced = [d for d in big if d in dims]
    return bool(reduced) and any(d > reduced[0] for d in big if d not in dims)


def _unrolled(inner, ranges, rranges, rtype, out_dtype, device) -> Lazy | None:
    """A reduction of at most config.unroll_reduction_max elements per output as a pointwise
    Lazy combining them one by one, in the reduction's accumulation type (None otherwise):
    it then fuses with what reads it and what it reads as any elementwise op does."""
    combine = _COMBINE.get(rtype)
    try:
        counts = [int(n) for n in rranges]
    except TypeError:  # a symbolic size
        return None
    # (an empty reduction is the reduction kernel's: its identity, a mean's 0/0)
    if combine is None or not 0 < math.prod(counts) <= config.unroll_reduction_max:
        return None

    def fn(idx):
        acc = None
        for r in itertools.product(*(range(n) for n in counts)):
            v = inner(list(idx), [sympy.Integer(i) for i in r])
            acc = v if acc is None else getattr(ops, combine)(acc, v)
        return ops.to_dtype(acc, out_dtype) if compute_dtype(out_dtype) != out_dtype else acc

    return Lazy(tuple(ranges), out_dtype, device, fn)


def wants_channels_last(gm: fx.GraphModule) -> bool:
    """Whether config.conv_channels_last puts this graph's 2-D convolutions in NHWC."""
    mode = config.conv_channels_last
    if mode is False or mode in ("0", "off", "false"):
        return False
    forced = mode is True or mode in ("1", "on", "true")
    if not forced and gm.meta.get("ember_training"):
        # "auto" is for inference: in training, the saved activations cross between forward and
        # backward in eager's layout, so NHWC would cost a copy each way per convolution.
        return False
    for n in gm.graph.nodes:
        if n.op != "call_function" or target_name(n.target) not in CONVOLUTIONS:
            continue
        first = n.args[0].meta.get(NODE_META_KEY) if isinstance(n.args[0], fx.Node) else None
        if not isinstance(first, TensorMeta) or len(first.sizes) != 4:
            continue
        # "auto" on the CPU: in process, where the convolution is torch's (oneDNN, which runs
        # NHWC at up to twice NCHW's speed at small widths), not the C++ runtime's of a package
        if forced or str(first.device).startswith("cuda") or not config.packaging:
            return True
    return False


CONVOLUTIONS = ("extern.convolution", "extern.convolution_backward")


def _padded_rows(sizes, strides):
    """The shape (..., P) whose contiguous strides `strides` are, when they lay `sizes` out in
    rows of P elements, P > sizes[-1] (with symbolic sizes: P >= sizes[-1] for every size and
    P != sizes[-1] as expressions, a row rounded up to a multiple); else None."""
    if len(sizes) < 2:
        return None
    sizes, strides = [sympy.sympify(v) for v in sizes], [sympy.sympify(v) for v in strides]
    row, last = strides[-2], sizes[-1]
    if sympy.simplify(row - last) == 0 or not known_le(last, row):
        return None
    shape = (*sizes[:-1], row)
    return shape if _same_strides(sizes, strides, contiguous_strides(shape)) else None


def _layout(meta: TensorMeta) -> Layout:
    return Layout(meta.dtype, meta.device, meta.sizes, meta.strides)  # data pointers: offset 0


def _same_strides(sizes, a, b) -> bool:
    """Whether strides `a` and `b` address a tensor of `sizes` alike (size-1 dims don't count)."""
    return all(s == 1 or sympy.simplify(x - y) == 0 for s, x, y in zip(sizes, a, b))


def _is_dense(sizes, strides) -> bool:
    """Whether `strides` lay `sizes` out densely in some dimension order."""
    return is_non_overlapping_and_dense(tuple(sizes), tuple(strides))


def normalize_args(name: str, args, kwargs) -> tuple[list, dict]:
    """(positional arguments in schema order with defaults filled in, keyword-only arguments)."""
    try:
        schema = lookup(name)
    except KeyError:
        return list(args), dict(kwargs)
    pos, kwonly = list(args), {}
    for spec in schema.args[len(args) :]:
        if spec.name not in kwargs and not spec.has_default:
            raise TypeError(f"{name}: missing argument {spec.name!r}")
        value = kwargs.get(spec.name, spec.default)
        if spec.kwarg_only:
            kwonly[spec.name] = value
        else:
            pos.append(value)
    return pos, kwonly


def _first_meta(meta) -> TensorMeta | None:
    return next((m for m in pytree.tree_leaves(meta) if isinstance(m, TensorMeta)), None)


def graph_device(gm: fx.GraphModule) -> str:
    """The device of a graph's kernels: the first GPU any of its values is on, else the CPU."""
    for n in gm.graph.nodes:
        for m in pytree.tree_leaves(n.meta.get(NODE_META_KEY)):
            if isinstance(m, TensorMeta) and str(m.device) != "cpu":
                return str(m.device)
    return "cpu"


def lower_graph(gm: fx.GraphModule, example_inputs) -> Lowerer:
    """Lower a prim graph; the result holds buffers, inputs, constants and outputs."""
    lowerer = Lowerer(gm, example_inputs)
    lowerer.run(*example_inputs)
    return lowerer


# --- pointwise lowerings -------------------------------------------------------------------------


def out_meta(L) -> TensorMeta:
    meta = L.meta()
    if not isinstance(meta, TensorMeta):
        raise NotImplementedError("pointwise lowering needs a TensorMeta on the node")
    return meta


def make_pointwise(L, op: Callable, args, dtype=None, compute=None):
    """A Lazy computing `op(*values)` elementwise over the broadcast of tensor `args`."""
    meta = L.meta()
    tensors = [a for a in args if is_tensor(a)]
    if isinstance(meta, TensorMeta):
        sizes, dtype, device = meta.sizes, dtype or meta.dtype, meta.device
    else:
        sizes = torch.broadcast_shapes(*(tuple(int(s) for s in t.sizes) for t in tensors))
        dtype, device = dtype or tensors[0].dtype, tensors[0].device
    compute = compute or dtype
    loaders = [broadcast_to(a, sizes) if is_tensor(a) else a for a in args]

    def fn(idx):
        return op(*(load_as(a, idx, compute) for a in loaders))

    return Lazy(sizes, dtype, device, fn)


def _simple(opname):
    def lower(L, *args):
        tensors = [a for a in args if is_tensor(a)]
        compute = tensors[0].dtype if opname in COMPARE_OPS and tensors else None
        return make_pointwise(L, lambda *v: getattr(ops, opname)(*v), args, compute=compute)

    return lower


for _op in UNARY_OPS + BINARY_OPS:
    register(_op)(_simple(_op))
register("div")(_simple("truediv"))
register("shift_right_arithmetic")(_simple("shift_right"))
register("sgn")(_simple("sign"))


@register("floor_div", "trunc_div")
def _int_div(L, a, b):
    name = "floordiv" if L.current.target.name == "floor_div" else "truncdiv"
    if out_meta(L).dtype.is_floating_point:  # floor(a / b) / trunc(a / b) on floats
        rnd = "floor" if name == "floordiv" else "trunc"
        return make_pointwise(L, lambda x, y: getattr(ops, rnd)(ops.truediv(x, y)), (a, b))
    return make_pointwise(L, lambda x, y: getattr(ops, name)(x, y), (a, b))


@register("frac")
def _frac(L, a):
    return make_pointwise(L, lambda x: ops.sub(x, ops.trunc(x)), (a,))


@register("where")
def _where(L, pred, a, b):
    meta = out_meta(L)
    if not is_tensor(pred):
        return make_pointwise(L, lambda x, y: x if pred else y, (a, b))
    p, a, b = (broadcast_to(v, meta.sizes) if is_tensor(v) else v for v in (pred, a, b))
    return Lazy(
        meta.sizes,
        meta.dtype,
        meta.device,
        lambda idx: ops.where(
            load_as(p, idx, torch.bool), load_as(a, idx, meta.dtype), load_as(b, idx, meta.dtype)
        ),
    )


@register("convert_element_type")
def _convert(L, a, dtype):
    if not is_tensor(a):
        return make_pointwise(L, lambda: ops.constant(a, dtype), (), dtype=dtype)
    return Lazy(a.sizes, dtype, a.device, lambda idx: ops.to_dtype(a.load(idx), dtype))


@register("clone", "view_of", "copy")
def _clone(L, a, *rest):
    if isinstance(a, View):
        return Lazy(a.sizes, a.dtype, a.device, a.load)
    return a


@register("copy_strided")
def _copy_strided(L, a, stride):
    if (L.current.meta.get(SAME_LAYOUT_VIEW_META) and isinstance(a, View)
            and _same_strides(a.sizes, a.strides, stride)):  # fmt: skip
        return a  # an input's new value written in place (input_updates.py): no copy of it
    return L.realize(Lazy(a.sizes, a.dtype, a.device, a.load), stride)


@register("full")
def _full(L, shape, fill_value, *rest):  # (shape, fill_value, dtype, device)
    meta = out_meta(L)
    return Lazy(
        meta.sizes, meta.dtype, meta.device, lambda idx: ops.constant(fill_value, meta.dtype)
    )


@register("scalar_tensor")
def _scalar_tensor(L, value, *rest):
    meta = out_meta(L)
    return Lazy((), meta.dtype, meta.device, lambda idx: ops.constant(value, meta.dtype))


@register("empty_strided", "empty_permuted", "empty")
def _empty(L, *args):
    meta = out_meta(L)  # any contents are right for an empty tensor; zeros keep runs reproducible
    return L.realize(Lazy(meta.sizes, meta.dtype, meta.device,
                          lambda idx: ops.constant(0, meta.dtype)), meta.strides)  # fmt: skip


@register("iota")
def _iota(L, length, start=0, step=1, *rest):
    meta = out_meta(L)
    return Lazy(meta.sizes, meta.dtype, meta.device,
                lambda idx: ops.index_expr(start + idx[0] * step, meta.dtype))  # fmt: skip
