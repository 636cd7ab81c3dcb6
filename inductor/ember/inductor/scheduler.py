"""Scheduling: dead-code removal, fusion of buffers into kernels, phases and kernel-local buffers.

A kernel iterates `xsizes` (parallel) and, for reductions, `rsizes` (reduced). Each member buffer
has a role: "red" (a reduction over x by r), "x" (a pointwise value per x: an epilogue such as
mean = sum / n) or "xr" (a pointwise value per (x, r), e.g. softmax's output). A node joins a
kernel when its iteration space matches (up to a permutation of its own dimensions) and every
value it reads from that kernel is read at exactly the index where it was stored, so fusion never
needs a value from another iteration. Members are grouped into phases: one r-loop each, followed
by its x-level epilogues; a member that needs a reduction of the current phase opens a new one.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import weakref
from typing import Optional

import sympy

from ember.ir.symbols import expand_index

from .config import config
from .index_simplify import simplify_index
from .loop_ir import (
    AliasBuffer,
    Buffer,
    ComputedBuffer,
    ExternBuffer,
    extern_buffers,
    IndexedWrite,
    MultiOutput,
    SketchHandler,
    loop_vars,
    set_handler,
)  # fmt: skip


class _Recorder(SketchHandler):
    """Records the (buffer, index) of every load and store of a body (indices expanded, unless
    only the names are wanted)."""

    def __init__(self, expand: bool = True):
        super().__init__()
        # (expanding a deep index, views of views in a backward, is the expensive part of a
        # record, and the same indices recur: expand_index remembers them)
        self.expand = expand_index if expand else (lambda e: e)
        self.loads: list[tuple[str, sympy.Expr]] = []
        self.stores: list[tuple[str, sympy.Expr]] = []
        self.index_exprs: list[sympy.Expr] = []

    def load(self, name, index):
        self.loads.append((name, self.expand(index)))
        return super().load(name, index)

    def store(self, name, index, value, mask=None):
        self.stores.append((name, self.expand(index)))

    def index_expr(self, expr, dtype):
        self.index_exprs.append(self.expand(expr))
        return super().index_expr(expr, dtype)


def record(buf: ComputedBuffer, index, rindex=(), expand: bool = True) -> _Recorder:
    """The loads and stores of `buf`'s body at (index, rindex): read, never changed, by callers.

    A body is a pure function of its indices, and the scheduler, wrapper and renderers ask for the
    same member at the same kernel variables many times (each fusion tried, each phase planned,
    each argument collected); running the body again re-derives every view's index with sympy.
    So it is remembered by the buffer (weakly: it goes with the buffer) and the indices."""
    key = (tuple(index), tuple(rindex), expand)
    seen = _RECORDS.get(buf)
    if seen is None:
        seen = _RECORDS[buf] = {}
    rec = seen.get(key)
    if rec is None:
        with set_handler(_Recorder(expand)) as rec:
            buf.body(index, rindex)
        seen[key] = rec
    return rec


_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reads_of(buf: Buffer) -> set:
    """Names of the buffers `buf` reads."""
    if isinstance(buf, ComputedBuffer):
        rec = record(buf, loop_vars("i", len(buf.ranges)),
                     loop_vars("r", len(buf.reduction_ranges)), expand=False)  # fmt: skip
        return {name for name, _ in rec.loads}
    if isinstance(buf, AliasBuffer):
        return {buf.source.name}
    if isinstance(buf, MultiOutput):
        return {buf.source.name}
    if isinstance(buf, ExternBuffer):
        return {x.name for x in extern_buffers((buf.args, buf.kwargs))}
    return set()


def remove_dead(buffers, output_names) -> list:
    """Buffers that the outputs need, in program order."""
    live = set(output_names)
    keep = []
    for b in reversed(buffers):
        if b.name in live or (isinstance(b, ExternBuffer) and set(b.outputs) & live):
            keep.append(b)
            live |= reads_of(b)
    return keep[::-1]


@dataclasses.dataclass
class Member:
    node: ComputedBuffer
    role: str  # "red", "x" or "xr"
    # kernel dimension k feeds the node's dimension perm[k]; consecutive kernel dimensions that
    # feed one node dimension make it up row-major (a node over (16, 64) in a (4, 4, 64) loop)
    perm: tuple


@dataclasses.dataclass(eq=False)
class Kernel:
    """A fused loop nest over (xsizes, rsizes) computing several buffers."""

    name: str
    xsizes: tuple
    rsizes: tuple
    members: list = dataclasses.field(default_factory=list)
    stores: dict = dataclasses.field(default_factory=dict)  # buffer -> store index (kernel vars)
    roles: dict = dataclasses.field(default_factory=dict)
    phases: list = dataclasses.field(default_factory=list)  # [(loop members, x members)]
    local: set = dataclasses.field(default_factory=set)  # buffers never written to memory

    @property
    def names(self) -> list:
        return [m.node.name for m in self.members]

    def vars(self):
        return loop_vars("x", len(self.xsizes)), loop_vars("r", len(self.rsizes))

    def member_index(self, m: Member, xs, rs):
        """The (index, rindex) to run member `m`'s body with, from kernel variables xs, rs."""
        if m.role == "red":
            return list(xs), list(rs)
        xr = m.role == "xr"
        idx = _member_index(tuple(m.perm), len(m.node.ranges), tuple(self.xsizes) + (
            tuple(self.rsizes) if xr else ()), tuple(xs) + (tuple(rs) if xr else ()))  # fmt: skip
        return list(idx), []

    def record(self, m: Member) -> _Recorder:
        xs, rs = self.vars()
        return record(m.node, *self.member_index(m, xs, rs))

    def produced(self) -> set:
        """The buffers this kernel writes or keeps (a template's product too: GemmKernel)."""
        return set(self.names)

    def reads(self) -> set:
        """The buffers this kernel reads."""
        return set().union(*(reads_of(m.node) for m in self.members))


@functools.lru_cache(maxsize=1 << 14)  # asked again at each record of a member (sympy arithmetic)
def _member_index(perm: tuple, ndim: int, sizes: tuple, kvars: tuple) -> tuple:
    idx = [sympy.S.Zero] * ndim
    for k, d in enumerate(perm):
        if d is not None:  # several kernel dims feeding one node dim: row-major, in order
            idx[d] = idx[d] * sizes[k] + kvars[k]
    return tuple(idx)


def _perms(sizes, target) -> list:
    """Ways to read the dimensions of `sizes` as `target`: for each target dim, the node dim that
    feeds it (None for a size-1 target dim); the node's size-1 dims are left at index 0."""
    sizes, target = list(sizes), list(target)
    dims = [d for d, s in enumerate(sizes) if s != 1]
    slots = [k for k, t in enumerate(target) if t != 1]
    if len(dims) != len(slots) or len(dims) > 5:
        return []
    out = []
    for p in itertools.permutations(dims):
        if all(sizes[d] == target[k] for d, k in zip(p, slots)):
            perm = [None] * len(target)
            for d, k in zip(p, slots):
                perm[k] = d
            out.append(tuple(perm))
    return out


def _merges(sizes, target) -> tuple | None:
    """A way to read `sizes` as `target` when each of its dimensions (size-1 ones aside) is the
    product of consecutive dimensions of `target`, in order: a consumer computed over a reshaped
    view of its producer's loop (a softmax's normalisation laid out as the (b*h, s, s) operand of
    the next batched matmul, after a max and a sum over (b, h, s, s)). For each target
    dimension, the node dimension it feeds, as in `_perms`; None if there is no such way."""
    if not all(sympy.sympify(n).is_Integer for n in (*sizes, *target)):
        return None
    sizes, target = [int(n) for n in sizes], [int(n) for n in target]
    perm, k = [None] * len(target), 0
    for d in (d for d, n in enumerate(sizes) if n != 1):
        product = 1
        while k < len(target) and product < sizes[d]:
            product *= target[k]
            perm[k] = d
            k += 1
        if product != sizes[d]:
            return None
    fed = [d for d in perm if d is not None]
    if any(n != 1 for n in target[k:]) or len(set(fed)) == len(fed):
        return None  # target dims left over; or nothing merged (`_perms` covers that)
    return tuple(perm)


def _interleaved(sizes, target) -> tuple | None:
    """A way to read `sizes` as `target` when a node dimension is the product, row-major, of
    target dimensions that are not consecutive: a split reduction's partial kernel runs
    (part, column | row within the part), and a pointwise node over (row, column) beside it is
    row = part * rows_per_part + row within the part. For each target dimension, the node
    dimension it feeds, as in `_perms`; None if there is no such way (or more than one)."""
    if not all(sympy.sympify(n).is_Integer for n in (*sizes, *target)):
        return None
    sizes, target = [int(n) for n in sizes], [int(n) for n in target]
    dims = [d for d, n in enumerate(sizes) if n != 1]
    slots = [k for k, n in enumerate(target) if n != 1]
    if math.prod(sizes) != math.prod(target) or len(slots) > 4 or len(dims) >= len(slots):
        return None
    found = None
    for choice in itertools.product(dims, repeat=len(slots)):
        product = dict.fromkeys(dims, 1)
        for d, k in zip(choice, slots):
            product[d] *= target[k]
        if all(product[d] == sizes[d] for d in dims):
            if found is not None:
                return None  # ambiguous: leave the node to a kernel of its own
            found = choice
    if found is None:
        return None
    perm = [None] * len(target)
    for d, k in zip(found, slots):
        perm[k] = d
    return tuple(perm)


def _stride_order(node: ComputedBuffer) -> tuple:
    """The node's dimensions outermost first, by decreasing stride of its layout."""
    strides = node.layout.strides
    try:
        return tuple(sorted(range(len(strides)), key=lambda d: -int(strides[d])))
    except TypeError:  # symbolic strides: keep the logical order
        return tuple(range(len(strides)))


def _candidates(kernel: Kernel, node: ComputedBuffer) -> list:
    """Ways `node` could join `kernel`: (role, perm, new xsizes, new rsizes).

    Remembered by what they are computed from, the group key of both (sizes, and the node's
    strides for its loop order): the scheduler tries each node against every kernel back to the
    last one it reads, and a model's layers offer the same shapes again and again."""
    key = (kernel.xsizes, kernel.rsizes, node.is_reduction(), node.ranges,
           node.reduction_ranges, node.layout.strides, config.persistent_reduction_max)  # fmt: skip
    got = _CANDIDATES.get(key)
    if got is None:
        if len(_CANDIDATES) >= 1 << 14:
            _CANDIDATES.clear()
        # kept as which sizes each way takes (the kernel's or the node's), not the sizes: an
        # equal key may hold ints where this kernel holds sympy Integers
        got = _CANDIDATES[key] = [
            (role, perm, (xsizes, rsizes) == (kernel.xsizes, kernel.rsizes), *order)
            for role, perm, xsizes, rsizes, *order in _candidates_of(kernel, node)
        ]  # fmt: skip
    mine, its = (kernel.xsizes, kernel.rsizes), (node.ranges, node.reduction_ranges)
    return [(role, perm, *(mine if kernels else its), *order)
            for role, perm, kernels, *order in got]  # fmt: skip


_CANDIDATES: dict = {}


def _candidates_of(kernel: Kernel, node: ComputedBuffer) -> list:
    out = []
    if node.is_reduction():
        ident = tuple(range(len(node.ranges)))
        if kernel.rsizes and (node.ranges, node.reduction_ranges) == (kernel.xsizes, kernel.rsizes):
            out.append(("red", ident, kernel.xsizes, kernel.rsizes))
        if not kernel.rsizes and kernel.xsizes == node.ranges:
            out.append(("red", ident, node.ranges, node.reduction_ranges))
        full = node.ranges + node.reduction_ranges
        if not kernel.rsizes and kernel.xsizes == full:
            out.append(("red", ident, node.ranges, node.reduction_ranges))  # x members become xr
        one_row = all(n == 1 for n in node.ranges)
        if not kernel.rsizes and kernel.xsizes != full and (
            not one_row or whole_rows(node.reduction_ranges)
        ):
            # A pointwise kernel over the same elements, its size-1 loops dropped (batch 1: a
            # decoding step's or a single image's residual add before its norm): given them
            # back, it takes the reduction as above. One row only if a block holds it: that
            # kernel is one program, which a long row's separate pointwise pass would beat.
            order = _unit_loops(kernel.xsizes, full)
            if order is not None:
                out.append(("red", ident, node.ranges, node.reduction_ranges, order))
        if not kernel.rsizes and _norm_like(node):
            # A pointwise kernel whose loops run in another order than the reduction's (a residual
            # add stored as (B, C, L), then a LayerNorm over C: SqueezeBERT, ConvNeXt's NCHW
            # norms; at batch 1 too, its size-1 loops dropped): its loops reordered as the
            # reduction's, its members' values are the same and it takes the reduction as a
            # prologue. try_fuse checks every value read.
            out += [("red", ident, node.ranges, node.reduction_ranges, order)
                    for order in _loop_orders(kernel.xsizes, full)]  # fmt: skip
        return out
    full = kernel.xsizes + kernel.rsizes
    order = _stride_order(node)
    for role, target in (("xr", full), ("x", kernel.xsizes)) if kernel.rsizes else (("x", full),):
        perms = sorted(
            _perms(node.ranges, target),
            key=lambda p: (
                [d for d in p if d is not None] != [d for d in order if node.ranges[d] != 1]
            ),
        )
        out += [(role, p, kernel.xsizes, kernel.rsizes) for p in perms]
        if not perms:
            merged = _merges(node.ranges, target)
            if merged is None and role == "xr":
                merged = _interleaved(node.ranges, target)
            if merged is not None:
                out.append((role, merged, kernel.xsizes, kernel.rsizes))
    return out


def _retarget(kernel: Kernel, xsizes, rsizes) -> Kernel:
    """A copy of `kernel` over new sizes (its x members become xr when x splits into x+r)."""
    k = Kernel(kernel.name, tuple(xsizes), tuple(rsizes))
    split = not kernel.rsizes and rsizes and len(kernel.xsizes) > len(xsizes)
    for m in kernel.members:
        k.members.append(Member(m.node, "xr" if split and m.role == "x" else m.role, m.perm))
    for m in k.members:
        k.roles[m.node.name] = m.role
        for name, index in k.record(m).stores:
            k.stores[name] = index
    return k


def _norm_like(node: ComputedBuffer) -> bool:
    """A reduction of many short rows, each within one block (a LayerNorm's): a pointwise kernel
    reordered to run it keeps its parallelism. Not one of a few long rows (a batch norm's
    statistics over (B, H, W) per channel), which would leave the reordered kernel a handful of
    rows, and its outputs alive across the whole reduction (a training step's peak rose)."""
    try:
        rows, row = int(sympy.Mul(*node.ranges)), int(sympy.Mul(*node.reduction_ranges))
    except TypeError:
        return False
    return row <= config.persistent_reduction_max and rows >= row


def _reordered(kernel: Kernel, order) -> Kernel:
    """A pointwise kernel whose loop j is the old loop order[j] (a new size-1 loop where that is
    None): each member reads and stores the same elements, visited in another order."""
    k = Kernel(kernel.name, tuple(1 if o is None else kernel.xsizes[o] for o in order), ())
    for m in kernel.members:
        perm = tuple(None if o is None else m.perm[o] for o in order)
        k.members.append(Member(m.node, m.role, perm))
    return _retarget(k, k.xsizes, k.rsizes)


def _loop_orders(sizes, target) -> list:
    """Orders for `_reordered` that run loops of `sizes` as `target` in another order than
    their own (the non-1 sizes permuted; size-1 loops dropped or added), at most five loops:
    `_perms`' readings of one as the other, less the one in their own order."""
    plain = _unit_loops(sizes, target)
    return [order for order in _perms(sizes, target) if order != plain]


def _unit_loops(sizes, target) -> tuple | None:
    """An order for `_reordered` that runs loops of `sizes` as `target` when the two differ only
    in size-1 loops (the non-1 sizes equal, in order); None otherwise."""
    kept = [d for d, n in enumerate(sizes) if n != 1]
    if [sizes[d] for d in kept] != [n for n in target if n != 1]:
        return None
    feed = iter(kept)
    return tuple(None if n == 1 else next(feed) for n in target)


# Random draws (ops.philox, ten rounds of 32-bit multiplies each) one kernel computes at most.
# A backward recomputes the forward's residual stream, a chain of dropouts that fuses into one
# kernel: GPT-2's 25 draws over 4096 x 768 in one persistent kernel took ptxas 104 s to compile.
MAX_RANDOM_DRAWS = 4


def random_draws(node: ComputedBuffer) -> int:
    """How many ops.philox calls one element of `node` makes (counted once per node)."""
    n = node.__dict__.get("_random_draws")
    if n is None:
        xs, rs = loop_vars("i", len(node.ranges)), loop_vars("r", len(node.reduction_ranges))
        with set_handler(SketchHandler()) as h:
            node.body(xs, rs)
        n = node.__dict__["_random_draws"] = sum(" = philox(" in line for line in h.lines)
    return n


def try_fuse(kernel: Kernel, node: ComputedBuffer) -> Kernel | None:
    """The kernel with `node` added, when legal; else None."""
    draws = random_draws(node)
    if draws and draws + sum(random_draws(m.node) for m in kernel.members) > MAX_RANDOM_DRAWS:
        return None
    # rows an IndexedWrite stores are not the ones its readers read: none joins its kernel
    if any(isinstance(m.node, IndexedWrite) and m.node.name in reads_of(node)
           for m in kernel.members):  # fmt: skip
        return None
    for role, perm, xsizes, rsizes, *order in _candidates(kernel, node):
        base = _reordered(kernel, order[0]) if order else kernel
        k = (
            _retarget(base, xsizes, rsizes)
            if (xsizes, rsizes) != (base.xsizes, base.rsizes)
            else base
        )
        m = Member(node, role, perm)
        rec = k.record(m)
        ok = True
        from .codegen_common import simplify_index  # (codegen_common imports this module)

        # Compared within the loop ranges: a size-1 loop runs at 0 only, and a reshape's
        # div/mod of a variable by its own range is the variable.
        xs, rs = k.vars()
        ranges = dict(zip((*xs, *rs), (*k.xsizes, *k.rsizes)))
        unit = {v: 0 for v, n in ranges.items() if n == 1}
        for name, index in rec.loads:
            if name in k.stores:
                prod_role = k.roles[name]
                # a row-level value ("x") cannot need a per-element value of its own row
                diff = simplify_index(index, ranges) - simplify_index(k.stores[name], ranges)
                same = expand_index(sympy.sympify(diff).subs(unit)) == 0
                if not same or (prod_role == "xr" and role == "x"):
                    ok = False
                    break
        if ok:
            k = k if k is not kernel else _retarget(kernel, xsizes, rsizes)
            k.members.append(m)
            k.roles[node.name] = role
            for name, index in rec.stores:
                k.stores[name] = index
            return k
    return None


def new_kernel(name: str, node: ComputedBuffer) -> Kernel:
    if node.is_reduction():
        k = Kernel(name, node.ranges, node.reduction_ranges)
        k.members.append(Member(node, "red", tuple(range(len(node.ranges)))))
    else:
        perm = tuple(d for d in _stride_order(node) if node.ranges[d] != 1)  # size-1 dims: no loop
        k = Kernel(name, tuple(node.ranges[d] for d in perm), ())
        k.members.append(Member(node, "x", perm))
    return _retarget(k, k.xsizes, k.rsizes)


def _is_large(b: ComputedBuffer) -> bool:
    """Whether moving `b` ahead of an extern call would raise the peak: joining an earlier
    kernel allocates its output earlier, alive across the extern's own allocations (a recomputed
    activation hoisted over a backward's convolutions holds memory eager does not)."""
    n = sympy.sympify(b.layout.storage_size())
    return not n.is_Integer or int(n) * b.layout.dtype.itemsize > config.hoist_max_bytes


def _produces(step) -> set:
    if isinstance(step, Kernel):
        return step.produced()
    if isinstance(step, ExternBuffer):
        return {step.name, *step.outputs}
    return {step.name}


def schedule(buffers, output_names) -> list:
    """The program as a list of steps: Kernels, ExternBuffers, MultiOutputs and AliasBuffers."""
    buffers = remove_dead(buffers, output_names)
    steps: list = []
    counter = itertools.count()
    for b in buffers:
        if not isinstance(b, ComputedBuffer):
            steps.append(b)
            continue
        reads = reads_of(b)
        placed = False
        large = _is_large(b)
        for j in range(len(steps) - 1, -1, -1) if config.fuse else ():
            s = steps[j]
            if isinstance(s, Kernel):
                fused = try_fuse(s, b)
                if fused is not None:
                    steps[j] = fused
                    placed = True
                    break
            if _produces(s) & reads or (large and isinstance(s, ExternBuffer)):
                break
        if not placed:
            steps.append(new_kernel(f"kernel{next(counter)}", b))
    readers: dict[str, set] = {}
    for s in steps:
        for name in _step_reads(s):
            readers.setdefault(name, set()).add(id(s))
    for s in steps:
        if isinstance(s, Kernel):
            plan_phases(s)
            plan_locals(s, readers, set(output_names))
    return steps


def _step_reads(step) -> set:
    if isinstance(step, Kernel):
        return step.reads()
    return reads_of(step)


def plan_phases(k: Kernel) -> None:
    """Group members into r-loops: a member needing a reduction of the open loop starts a new one."""
    k.phases = [([], [])]
    placed_in: dict[str, tuple[int, str]] = {}
    for m in k.members:
        rec = k.record(m)
        deps = [placed_in[n] for n, _ in rec.loads if n in placed_in]
        cur = len(k.phases) - 1
        if m.role == "x" or not k.rsizes:
            k.phases[cur][1 if k.rsizes else 0].append(m)
            placed_in[m.node.name] = (cur, "post")
            continue
        if any(p == cur and (where == "post" or k.roles[n] == "red")
               for (p, where), n in zip(deps, [n for n, _ in rec.loads if n in placed_in])):  # fmt: skip
            k.phases.append(([], []))
            cur += 1
        k.phases[cur][0].append(m)
        placed_in[m.node.name] = (cur, "loop")


def whole_rows(rsizes) -> bool:
    """Whether a Triton reduction over `rsizes` is persistent: one block holds a whole row (a
    static row of at most config.persistent_reduction_max elements)."""
    rnumel = sympy.Mul(*rsizes)
    return bool(rsizes) and rnumel.is_Integer and int(rnumel) <= config.persistent_reduction_max


def persistent(k: Kernel) -> bool:
    """Whether `k` renders as a persistent Triton reduction, so the values of every phase stay
    in registers. A reduction that walks columns (`walks_columns`) loops instead."""
    if not k.members:
        return False
    device = str(k.members[0].node.layout.device)
    triton = device.startswith("cuda") or config.cpu_backend == "triton"
    return triton and whole_rows(k.rsizes) and not walks_columns(k)


def unit_steps(expr, along, variables) -> Optional[list]:
    """How far an address `expr` moves for a step of 1 along each of `along`, every one of
    `variables` at 0 otherwise (at the origin, a reshape's div/mod moves as the affine index
    it is); None when a step is not an integer (an indirect or symbolic address)."""
    origin = {v: 0 for v in variables}
    at_origin = expr.xreplace(origin)
    steps = [sympy.sympify(expr.xreplace({**origin, v: 1}) - at_origin) for v in along]
    return [int(d) for d in steps] if all(d.is_Integer for d in steps) else None


# Fewer output elements than this keep whole rows: blocks of many columns would leave few programs.
COLUMN_MIN_XNUMEL = 256


def walks_columns(k: Kernel) -> bool:
    """Whether a reduction reads memory along x, not along r: every load over both steps by 1
    along the innermost x dim and by more along each r dim. A mean over H*W of NHWC data (a
    global average pool, a squeeze-and-excite) steps C elements per r: a whole-row block reads
    one element per 32-byte sector, where a looped block of many columns reads whole sectors."""
    xsizes = [sympy.sympify(s) for s in k.xsizes]
    if not k.rsizes or not all(s.is_Integer for s in xsizes) or int(sympy.Mul(*xsizes)) < COLUMN_MIN_XNUMEL:
        return False
    xs, rs = k.vars()
    ranges = dict(zip([*xs, *rs], [*k.xsizes, *k.rsizes]))
    loads = [simplify_index(index, ranges) for m in k.members for _, index in k.record(m).loads]
    return loads_walk_columns(loads, xs, k.xsizes, rs)


def loads_walk_columns(loads, xs, xsizes, rs) -> bool:
    """Whether every load index that moves with both the innermost live x variable and some r
    variable steps by 1 along that x and by more along each r it uses (and at least one does);
    False for an indirect or symbolic address (the kernel is left as it was)."""
    live = [v for v, n in zip(xs, xsizes) if n != 1]
    if not live:
        return False
    found = False
    for index in loads:
        e = sympy.sympify(index)
        walked = [v for v in rs if e.has(v)]
        if not walked or not e.has(live[-1]):
            continue
        steps = unit_steps(e, [live[-1], *walked], [*xs, *rs])
        if steps is None or steps[0] != 1 or any(d in (1, -1) for d in steps[1:]):
            return False
        found = True
    return found


def plan_locals(k: Kernel, readers: dict, outputs: set) -> None:
    """Buffers only this kernel reads, each read served from a register, are never stored."""
    phase_of = {}
    for i, (loop, post) in enumerate(k.phases):
        for m in loop + post:
            phase_of[m.node.name] = i
    whole_rows = persistent(k)
    for m in k.members:
        name = m.node.name
        if name in outputs or readers.get(name, set()) - {id(k)}:
            continue
        if isinstance(m.node, IndexedWrite):  # its stores are the point
            continue
        ok = True
        # Per-element values survive only within their own loop, unless the row is persistent
        # (softmax's exponentials, read again after their sum, are then never written).
        if m.role == "xr" and k.rsizes:
            for other in k.members:
                if name not in {n for n, _ in k.record(other).loads}:
                    continue
                if whole_rows:
                    ok = ok and other.role != "x"  # a row-level value reads no single element
                elif phase_of[other.node.name] != phase_of[name] or other.role != "xr":
                    ok = False
        if ok:
            k.local.add(name)
