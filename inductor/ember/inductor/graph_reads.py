"""How a prim graph's nodes are read: elementwise chains, views and copies, as the lowering
decides whether to store a value or inline it into its readers."""

from __future__ import annotations

from torch import fx

from ember.ir import target_name

from .loop_ir import BINARY_OPS, UNARY_OPS

# Elementwise prims: a chain of them is inlined into one expression (see `readers`).
ELEMENTWISE = {f"prims.{op}" for op in (*UNARY_OPS, *BINARY_OPS)} | {
    "prims.div", "prims.where", "prims.convert_element_type", "prims.sgn",
    "prims.floor_div", "prims.trunc_div", "prims.frac"}  # fmt: skip
_CHAIN_DEPTH = 16


def readers(n: fx.Node) -> int:
    """How many separate consumers read `n`'s value: users whose single-user chains of
    elementwise prims all end at one node count as one. ReLU is where(x <= 0, 0, x), GELU and
    SiLU read x twice too: one expression, where inlining `n` costs nothing (the renderer's CSE
    computes it once), but two fx users, which made a heavy producer (an inference batch norm,
    five loads) a buffer of its own written before every ReLU whose reader is another kernel (a
    concatenation of branches)."""
    if len(n.users) <= 1:
        return len(n.users)
    ends = set()
    for u in n.users:
        for _ in range(_CHAIN_DEPTH):
            if (u.op != "call_function" or target_name(u.target) not in ELEMENTWISE
                    or len(u.users) != 1):  # fmt: skip
                break
            u = next(iter(u.users))
        ends.add(u)
        if len(ends) > 1:
            return len(n.users)
    return 1


# Prims that only view their input: a value read through them is still read elementwise.
_VIEWS = {f"prims.{n}" for n in ("reshape", "view", "collapse_view", "collapse", "split_dim",
                                 "squeeze", "expand_dims", "unsqueeze", "transpose", "permute")}
# ... and readers that copy it elementwise (attention's heads made contiguous)
_COPIES = {"prims.clone", "prims.copy_strided", "prims.view_of"}  # fmt: skip


def read_elementwise(n: fx.Node) -> bool:
    """Whether every reader of `n` reads it elementwise: elementwise prims and copies, reached
    through views (a Linear's product viewed back to (B, S, N), then activated)."""
    pending, seen = list(n.users), 0
    while pending:
        user = pending.pop()
        seen += 1
        name = target_name(user.target) if user.op == "call_function" else ""
        if name in _VIEWS and seen < _CHAIN_DEPTH:
            pending.extend(user.users)
        elif name not in ELEMENTWISE and name not in _COPIES:
            return False
    return seen > 0


def slice_boxes(n: fx.Node) -> list | None:
    """The box (a (start, limit) per dim) each user of `n` reads when every user is a unit-step
    slice of it (a chunk or split: GLU's and gMLP's halves); None otherwise, or where a bound
    is symbolic. A prim's node holds its canonical arguments, all positional: slice_in_dim's
    (a, start, limit, stride, axis), slice's (a, starts, limits, strides)."""
    boxes = []
    for u in n.users:
        if u.op != "call_function" or u.args[0] is not n:
            return None
        name = target_name(u.target)
        if name == "prims.slice_in_dim":
            _, start, limit, step, axis = u.args
            box = {axis: (start, limit, step)}
        elif name == "prims.slice":
            _, starts, limits, steps = u.args
            box = dict(enumerate(zip(starts, limits, steps)))
        else:
            return None
        try:
            if any(int(step) != 1 for _, _, step in box.values()):
                return None
            boxes.append({d: (int(lo), int(hi)) for d, (lo, hi, _) in box.items()})
        except TypeError:  # a symbolic bound
            return None
    return boxes


def reads_disjoint_parts(n: fx.Node) -> bool:
    """Whether `n`'s users are slices that read no element twice between them: computed inline
    into each, `n` is computed once per element all the same (the halves of a gated unit)."""
    boxes = slice_boxes(n)
    if not boxes or len(boxes) < 2:
        return False
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            # apart when some dim both slice holds intervals that do not meet (a dim only one
            # slices is whole in the other: the two meet there)
            if not any(d in b and (a[d][1] <= b[d][0] or b[d][1] <= a[d][0]) for d in a):
                return False
    return True
