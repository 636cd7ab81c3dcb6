"""ember.export of Dims whose range starts at 1 (`Dim("seq", min=1)`): traced at sizes >= 2, as
every dynamic size, then traced again at 1; the exported range starts at 1 only if the two
programs agree there.

Why a second trace: tracing settles what a size-1 dimension would do (broadcast it, squeeze it,
branch on `size == 1`) by assuming that a dynamic size is never 1, so the program traced for
sizes >= 2 may compute something else at 1 (`x.squeeze(1)` keeps the dimension for sizes >= 2
and drops it at 1). The checks, in order, each naming the Dim and what excludes 1:
1. every relation the trace assumed (its guards) holds with the size at 1 (`if x.shape[1] == 1`);
2. each tensor op of the captured program has at 1 the sizes the size-1 trace gives it (names the
   user's line of a squeeze whose dimension is the Dim);
3. the prim programs are one DAG, the size-1 one with 1 where the other has the Dim's symbol
   (a decomposition that chooses by size; this is the check that makes the range sound). The
   size-1 trace takes the fused attention kernels the main one took: torch chooses among them
   by size (on CUDA another one, or its math decomposition, for one query row). Where none of
   them takes size 1, the attention's outputs are compared by their sizes only: its inputs
   are then checked by checks 1 and 2 alone.
With several such Dims every non-empty subset of them is set to 1 (2^k - 1 more traces).
Size 0 is refused: a dimension of size 0 is rarely wanted, and empty tensors change more
programs than size 1 does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import operator
from typing import Any, Callable, Optional

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, SymbolSpec, TensorMeta, target_name

from .symbolic import SYM_SIZES, SpecializationError, describe_relation, holds_in_ranges


@dataclasses.dataclass
class Trace:
    """One capture and lowering of the program (what export_capture's `_trace` returns)."""

    gm: fx.GraphModule  # torch-level
    prim_gm: fx.GraphModule
    consts: dict  # prim placeholder name -> tensor
    env: Any  # the capture's ShapeEnv (None when nothing is dynamic)
    extra: tuple  # the rest ExportedProgram needs


def size_one_roots(export_dims: Optional[dict]) -> list:
    """The Dims declared with min=1 (distinct roots, in declaration order); a min below 1 or a
    Dim that can only be 1 raises ValueError."""
    roots: dict[int, Any] = {}
    for dims in (export_dims or {}).values():
        for x in dims.values():
            roots.setdefault(id(x.root()), x.root())
    out = []
    for r in roots.values():
        if r.min is not None and r.min < 1:
            raise ValueError(f"ember.export: {r!r}: sizes below 1 are not supported (a size-0 "
                             "tensor changes what most programs compute); declare min=1 or more")
        if r.min == 1:
            if r.max is not None and r.max < 2:
                raise ValueError(f"ember.export: {r!r} allows only the size 1: drop it from "
                                 "dynamic_shapes (the size is static)")  # fmt: skip
            out.append(r)
    return out


def root_sizes(args, kwargs, export_dims: dict) -> dict[int, int]:
    """{id(root Dim): its size in the example arguments}."""
    out: dict[int, int] = {}
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            for d, x in export_dims.get(id(leaf), {}).items():
                out.setdefault(id(x.root()), leaf.shape[d] // x.scale)
    return out


def resized(args, kwargs, export_dims: dict, sizes: dict, static=frozenset()):
    """(args, kwargs, export_dims) with each root Dim in `sizes` ({id(root): size}) at that size
    (rows repeated or dropped; the values of tensors do not change a capture) and the roots in
    `static` no longer dynamic."""
    new_dims: dict = {}

    def one(leaf):
        if not isinstance(leaf, torch.Tensor) or id(leaf) not in export_dims:
            return leaf
        dims, t = export_dims[id(leaf)], leaf
        for d, x in dims.items():
            n = sizes.get(id(x.root()))
            if n is not None and t.shape[d] != x.scale * n:
                rows = torch.arange(x.scale * n, device=t.device) % t.shape[d]
                t = t.index_select(d, rows).requires_grad_(leaf.requires_grad)
        new_dims[id(t)] = {d: x for d, x in dims.items() if id(x.root()) not in static}
        return t

    with torch.no_grad():
        args, kwargs = pytree.tree_map(one, (args, kwargs))
    return args, kwargs, new_dims


def check_size_one(main: Trace, retrace: Callable, args, kwargs, export_dims: dict,
                   roots: list) -> tuple[SymbolSpec, ...]:  # fmt: skip
    """The exported symbols, the roots' ranges starting at 1, once the program traced at sizes
    >= 2 (`main`) is shown to be the program at 1 (see the module docstring); else
    SpecializationError naming the Dim and the guard or op."""
    env = main.env
    roots = [r for r in roots if id(r) in env.dims]  # (a Dim of an unread input has no symbol)
    for k in range(1, len(roots) + 1):
        for subset in itertools.combinations(roots, k):
            names = ", ".join(repr(r.name) for r in subset)
            ones = {env.dims[id(r)]: sympy.Integer(1) for r in subset}
            _check_guards(env, ones, names)
            ids = {id(r) for r in subset}
            sized = resized(args, kwargs, export_dims, {i: 1 for i in ids}, ids)
            try:
                with _same_attention_kernels(main.prim_gm):
                    one = retrace(*sized)
            except Exception:  # noqa: BLE001  (no such kernel at size 1: torch's own choice)
                one = retrace(*sized)
            subs = dict(ones)
            if one.env is not None:
                subs.update({s: one.env.dims[i] for i, s in env.dims.items()
                             if i not in ids and i in one.env.dims})  # fmt: skip
            _check_torch_ops(main.gm, one.gm, subs, names)
            why = _prim_difference(main, one, subs)
            if why is not None:
                raise SpecializationError(
                    f"ember.export: Dim {names} has min=1, but the lowered program at size 1 "
                    f"differs from the one traced for sizes >= 2: {why}; declare min=2 (the "
                    "program then refuses size 1) or write it for every size")
    lower = {str(env.dims[id(r)]): 1 for r in roots}
    return tuple(dataclasses.replace(s, lower=lower.get(s.name, s.lower)) for s in env.specs())


# torch's fused attention kernels, by the extern a trace records for each: torch picks one by the
# sizes (CUDA takes another kernel, or its math decomposition, for one query row), not by what
# the attention computes
_ATTENTION_BACKENDS = {"extern.sdpa_flash": "FLASH_ATTENTION",
                       "extern.sdpa_flash_cpu": "FLASH_ATTENTION",
                       "extern.sdpa_efficient": "EFFICIENT_ATTENTION",
                       "extern.sdpa_cudnn": "CUDNN_ATTENTION"}  # fmt: skip


def _same_attention_kernels(prim_gm: fx.GraphModule):
    """A context in which the size-1 trace takes the attention kernels the main trace took (its
    choice by size is no difference of program); nothing to pin where it took none."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {target_name(n.target) for n in prim_gm.graph.nodes if n.op == "call_function"}
    chosen = sorted({_ATTENTION_BACKENDS[t] for t in names if t in _ATTENTION_BACKENDS})
    if not chosen:
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, b) for b in chosen])


def _attention_output(node: fx.Node) -> bool:
    """Is `node` a fused attention kernel's call, or an element of its result?"""
    if node.op == "call_function" and node.target is operator.getitem:
        node = node.args[0]
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and target_name(node.target) in _ATTENTION_BACKENDS)  # fmt: skip


def _check_guards(env, ones: dict, names: str) -> None:
    specs = {i.spec.symbol: i.spec for i in env.symbols}
    for relation, where in env.relations.items():
        at_one = sympy.sympify(relation).xreplace(ones)
        if at_one is sympy.true or (at_one is not sympy.false and
                                    holds_in_ranges(at_one, specs)):  # fmt: skip
            continue
        raise SpecializationError(
            f"ember.export: Dim {names} has min=1, but the program assumes "
            f"{describe_relation(relation, env.symbols)} at {where}, which does not hold at "
            "size 1; declare min=2 (the program then refuses size 1) or write it for every size")


def _metas(node) -> list:
    m = node.meta.get(NODE_META_KEY)
    if isinstance(m, TensorMeta):
        return [m]
    if isinstance(m, (tuple, list)) and m and all(isinstance(x, TensorMeta) for x in m):
        return list(m)
    return []


def _check_torch_ops(a: fx.GraphModule, b: fx.GraphModule, subs: dict, names: str) -> None:
    """Check 2: the captured programs' tensor ops, paired in order (both traces took the same
    Python path: the guards hold at 1), have equal sizes at 1. Only for the message: when the
    ops do not pair up, check 3 decides."""
    ops = [[n for n in g.graph.nodes
            if n.op.startswith("call_") and isinstance(n.meta.get(NODE_META_KEY), TensorMeta)]
           for g in (a, b)]  # fmt: skip
    if len(ops[0]) != len(ops[1]) or any(x.target != y.target for x, y in zip(*ops)):
        return
    for x, y in zip(*ops):
        if SYM_SIZES not in x.meta:  # (sizes the rules do not give: check 3's part)
            continue
        traced, want = x.meta[SYM_SIZES], y.meta.get(SYM_SIZES, y.meta[NODE_META_KEY].sizes)
        at_one = tuple(_at(s, subs) for s in traced)
        if len(at_one) != len(want) or not all(map(_equal, at_one, want)):
            op = x.target if isinstance(x.target, str) else getattr(
                x.target, "__name__", str(x.target))  # fmt: skip
            raise SpecializationError(
                f"ember.export: Dim {names} has min=1, but `{op}` at "
                f"{x.meta.get('ember_where', '?')} gives sizes {tuple(want)} at size 1, not "
                f"{at_one} as traced for sizes >= 2 ({tuple(traced)}): it treats a dimension of "
                "size 1 differently (a squeeze, a broadcast); declare min=2 (the program then "
                "refuses size 1) or write it for every size")


def _at(expr, subs: dict):
    return sympy.sympify(expr).xreplace(subs) if isinstance(expr, sympy.Basic) else expr


def _equal(x, y) -> bool:
    if x == y:
        return True
    if isinstance(x, sympy.Basic) or isinstance(y, sympy.Basic):
        return sympy.simplify(sympy.sympify(x) - sympy.sympify(y)) == 0
    if isinstance(x, float) and isinstance(y, float):
        return math.isnan(x) and math.isnan(y)
    return False


def _prim_difference(main: Trace, one: Trace, subs: dict) -> Optional[str]:
    """Check 3: why the prim graph of `main` at `subs` is not the one of `one` (None: it is).
    Nodes pair up from the outputs back (the graphs may order independent nodes differently)."""
    phs = [[n for n in t.prim_gm.graph.nodes if n.op == "placeholder"] for t in (main, one)]
    if len(phs[0]) != len(phs[1]):
        return f"{len(phs[0])} inputs and constants, not {len(phs[1])}"
    paired: dict = dict(zip(*phs))
    for x, y in paired.items():
        if x.name in main.consts:
            cx, cy = main.consts[x.name], one.consts.get(y.name)
            if cy is None or not (cx is cy or (cx.shape == cy.shape and cx.dtype == cy.dtype
                                               and torch.equal(cx, cy))):  # fmt: skip
                return f"the constant {x.name} differs"
        why = _meta_difference(x, y, subs)
        if why:
            return why
    outs = [t.prim_gm.graph.output_node() for t in (main, one)]
    pending = [tuple(outs)]
    while pending:
        x, y = pending.pop()
        (x, sx), (y, sy) = _unit_source(x, subs), _unit_source(y, {})
        if len(sx) != len(sy) or not all(map(_equal, sx, sy)):
            return f"{x.name} has the sizes {sx} at size 1, not {sy}"
        if x in paired and x.op == "placeholder":
            if paired[x] is not y:
                return f"{y.name} reads another input than {x.name}"
            continue
        if paired.setdefault(x, y) is not y:
            return f"{x.name} stands for both {paired[x].name} and {y.name}"
        if x.op != y.op or x.target != y.target:
            if _attention_output(x):  # another kernel for the same attention (sizes agree)
                continue
            return f"{x.name} is {x.target}, at size 1 {y.target}"
        nodes: list = []
        why = _value_difference((x.args, x.kwargs), (y.args, y.kwargs), subs, nodes)
        why = why or (None if x.op == "output" else _meta_difference(x, y, subs))
        if why:
            return f"{x.target}: {why}"
        pending.extend(p for p in nodes if not (p[0] in paired and paired[p[0]] is p[1]))
    return None


# Prims that only add, drop or move dimensions of size 1 (given their sizes), or copy their input
# to another layout: at size 1 a decomposition may pick another of them (expand_dims for a
# broadcast_in_dim to size 1, a reshape of a transpose that needs no copy), or none.
_UNIT_MOVES = {"prims.broadcast_in_dim", "prims.reshape", "prims.split_dim", "prims.squeeze",
               "prims.collapse_view", "prims.expand_dims", "prims.permute", "prims.view_of",
               "prims.copy_strided", "prims.clone"}  # fmt: skip
_READS_LAYOUT = {"prims.as_strided", "prims.view_element_type"}  # their input's strides count


def _unit_source(node: fx.Node, subs: dict) -> tuple:
    """(the first node up `node`'s chain of unit moves, `node`'s sizes at `subs`): a unit move
    holds the elements of its input in the same order, so the chain is one value reshaped."""
    meta = node.meta.get(NODE_META_KEY)
    if not isinstance(meta, TensorMeta):
        return node, ()
    sizes = tuple(_at(s, subs) for s in meta.sizes)
    if any(str(u.target) in _READS_LAYOUT for u in node.users):
        return node, sizes
    src = node
    while _moves_units(src, subs, sizes):
        src = src.args[0]
    return src, sizes


def _moves_units(node: fx.Node, subs: dict, sizes: tuple) -> bool:
    """Is `node` (of `sizes`) its input with dimensions of size 1 added, dropped or moved, or
    the whole of its input (a slice from 0 to the end)?"""
    src = node.args[0] if node.args else None
    m = src.meta.get(NODE_META_KEY) if isinstance(src, fx.Node) else None
    if not isinstance(m, TensorMeta):
        return False
    before = [_at(s, subs) for s in m.sizes]
    target = str(node.target)
    if target == "prims.permute":  # (2, 3, 3) -> (2, 3, 3) may swap the 3s: not a move
        kept = [d for d in node.args[1] if before[d] != 1]
        if kept != sorted(kept):
            return False
    if target in _UNIT_MOVES:
        return _same_non_unit(before, sizes)
    starts = {"prims.slice_in_dim": node.args[1:2], "prims.slice": (node.args[1:2] or [()])[0]}
    if target not in starts or len(before) != len(sizes) or not all(map(_equal, before, sizes)):
        return False
    return all(_equal(_at(s, subs), 0) for s in starts[target])


def _same_non_unit(a: list, b: tuple) -> bool:
    """Do sizes `a` and `b` list the same sizes once the 1s are dropped?"""
    a, b = [s for s in a if s != 1], [s for s in b if s != 1]
    return len(a) == len(b) and all(map(_equal, a, b))


def _value_difference(a, b, subs: dict, nodes: list) -> Optional[str]:
    """Why argument `a` at `subs` is not `b`; node pairs found inside go to `nodes`."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
            return f"argument {a} is {b} at size 1"
        nodes.append((a, b))
        return None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"argument {a} is {b} at size 1"
        for x, y in zip(a, b):
            why = _value_difference(x, y, subs, nodes)
            if why:
                return why
        return None
    if isinstance(a, dict) or isinstance(b, dict):
        if not isinstance(a, dict) or not isinstance(b, dict) or a.keys() != b.keys():
            return f"argument {a} is {b} at size 1"
        return _value_difference(list(a.values()), list(b.values()), subs, nodes)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
        return None if same else "a constant tensor argument differs"
    if isinstance(a, slice):
        return _value_difference((a.start, a.stop, a.step), (b.start, b.stop, b.step) if
                                 isinstance(b, slice) else b, subs, nodes)  # fmt: skip
    if isinstance(a, bool) != isinstance(b, bool) or not _equal(_at(a, subs), b):
        return f"argument {a} is {b} at size 1"
    return None


def _meta_difference(x: fx.Node, y: fx.Node, subs: dict) -> Optional[str]:
    """Why x's tensors at `subs` are not y's: dtype, device, sizes, the strides of dimensions
    longer than 1 (a size-1 dimension's stride addresses nothing), storage offset."""
    mx, my = _metas(x), _metas(y)
    if len(mx) != len(my):
        return f"{len(mx)} tensors, at size 1 {len(my)}"
    for a, b in zip(mx, my):
        sizes = tuple(_at(s, subs) for s in a.sizes)
        if (a.dtype, a.device) != (b.dtype, b.device):
            return f"{a.dtype} on {a.device}, at size 1 {b.dtype} on {b.device}"
        if len(sizes) != len(b.sizes) or not all(map(_equal, sizes, b.sizes)):
            return f"sizes {tuple(a.sizes)} are {sizes} at size 1, not {tuple(b.sizes)}"
        strides = [(_at(s, subs), t) for n, s, t in zip(b.sizes, a.strides, b.strides) if n != 1]
        if not all(_equal(s, t) for s, t in strides) or not _equal(
                _at(a.storage_offset, subs), b.storage_offset):  # fmt: skip
            return f"the layout {tuple(a.strides)} differs from {tuple(b.strides)} at size 1"
    return None
