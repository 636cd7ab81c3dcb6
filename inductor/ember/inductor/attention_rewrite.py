"""Attention written out by hand, as one `F.scaled_dot_product_attention` call.

Many models spell attention as its steps: a batched matmul of queries and transposed keys, a
scale, an additive bias (ALiBi, relative positions, a padding mask) or a masked_fill, a softmax
over the keys, a dropout that is off, and a matmul with the values. Lowered as written, every
layer stores its (L, S) scores and probabilities, in float32 where the softmax is upcast; as
one attention call it runs a fused kernel that never stores them (on CUDA torch's
memory-efficient kernel, which takes a bias; on the CPU Ember's flash kernel, cpu_attention.py).

`rewrite(gm)` works on the torch-level graph the backend receives, before aot_autograd traces
it. From each softmax over the last dimension it walks back through the ops the scores may
pass through to the matmul that made them, and forward to the matmul with the values; every
value on that chain must have no other reader (a model returning its attention probabilities
keeps them). What the chain did is folded into the call's arguments:

- a multiplication or division by a number multiplies the scale (and any bias added before it);
- an added tensor is added to the bias (`baddbmm`'s input is one: alpha is a scale);
- `masked_fill(mask, v)` and `where(keep, scores, v)` become `v` in the bias where masked,
  when `v` is -inf or at most -1e30: added to any score of a realistic size it is still
  itself, so the softmax sees exactly what the fill gave it. (A fill nearer zero, like
  float16's minimum, is not folded: in a row with every key masked, filling gives each key the
  same weight while adding would keep the scores' differences.) One difference remains, as with
  torch's rewrite: a row whose every key is -inf is NaN in eager and zeros from the kernels.
- casts of the scores to float32 (the kernels' softmax is in float32), `contiguous`, an inactive
  dropout (training=False or p=0), and views that regroup only the batch dimensions.

It is not rewritten where a fold is not exact or the call could not take it: a bias or fill
applied where the scores are not in the queries' dtype (a float32 mask on upcast bfloat16 scores:
the kernels take attn_mask in the queries' dtype, which would round it), a narrowing cast of the
scores or probabilities, a bias that needs a gradient, a dropout that is on, a bias or mask
broadcasting the scores up, unequal batches of queries, keys and values, a value written in
place between the two matmuls, scores or probabilities read elsewhere, fewer than three
dimensions, or sizes that are not integers where a view or broadcast needs them (any regrouping
of the batch in a graph with symbolic sizes). Off: `config.attention_rewrite = False`.
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ember.ir import NODE_META_KEY

log = logging.getLogger(__name__)

_MATMULS = {torch.matmul, operator.matmul, torch.bmm, "matmul", "bmm", "__matmul__"}
_BADDBMM = {torch.baddbmm, "baddbmm"}
_SOFTMAX = {torch.softmax, F.softmax, "softmax"}
_MUL = {operator.mul, torch.mul, "mul", "__mul__", "__rmul__"}
_DIV = {operator.truediv, torch.div, torch.true_divide, "div", "__truediv__", "true_divide"}
_ADD = {operator.add, torch.add, "add", "__add__", "__radd__"}
_MASKED_FILL = {torch.masked_fill, "masked_fill"}
_WHERE = {torch.where}
_CASTS = {"float", "to", "type_as", "half", "bfloat16"}
_VIEWS = {"view", "reshape", torch.reshape}
_DROPOUT = {F.dropout, torch.dropout}
_FILL_LIMIT = -1e30  # a fill at or below this is itself after a float32 score is added


def _op(node: fx.Node):
    return node.target if node.op in ("call_function", "call_method") else None


def _meta(node):
    return node.meta.get(NODE_META_KEY) if isinstance(node, fx.Node) else None


def _sizes(node: fx.Node) -> tuple:
    """The node's sizes, sympy integers as ints (symbolic sizes stay expressions)."""
    return tuple(int(s) if getattr(s, "is_Integer", False) else s for s in _meta(node).sizes)


def _ints(sizes) -> Optional[tuple]:
    sizes = tuple(sizes)
    return sizes if all(type(s) is int for s in sizes) else None


def _arg(node: fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_fill(value) -> bool:
    return _number(value) and value <= _FILL_LIMIT


def rewrite(gm: fx.GraphModule) -> int:
    """Replace each hand-written attention in `gm` by scaled_dot_product_attention; the number
    replaced (the graph is recompiled when any was)."""
    count, dynamic = 0, bool(gm.meta.get("ember_symbols"))
    for node in list(gm.graph.nodes):  # (a rewrite erases no other softmax)
        if _op(node) in _SOFTMAX:
            count += _rewrite_one(gm.graph, node, dynamic)
    if count:
        gm.recompile()
    return count


def _rewrite_one(graph: fx.Graph, softmax: fx.Node, dynamic: bool) -> bool:
    meta, dim = _meta(softmax), _arg(softmax, 1, "dim")
    if meta is None or not isinstance(dim, int) or dim not in (-1, len(meta.sizes) - 1):
        return False
    source = _arg(softmax, 0, "input")
    if not isinstance(source, fx.Node):
        return False
    try:  # (reading the graph only: a node unlike any seen leaves the graph as it is)
        back, forward = _walk_back(source), _walk_forward(softmax)
        if back is None or forward is None:
            return False
        (scores, steps), (after, final) = back, forward
        plan = _plan(scores, steps, softmax, after, final)
    except (AttributeError, IndexError, TypeError, ValueError):
        log.debug("attention_rewrite: %s not read", softmax, exc_info=True)
        return False
    if plan is None or (dynamic and plan["regroups"]) or _mutation_between(scores, final):
        return False
    _emit(graph, plan, final)
    for node in [final, *after[::-1], softmax, *[n for n, _ in steps[::-1]], scores]:
        if not node.users:
            graph.erase_node(node)
    return True


# -- finding the chain ------------------------------------------------------------------------


def _walk_back(node: fx.Node) -> Optional[tuple]:
    """(the matmul or baddbmm that made the scores, [(node, effect)] from it to the softmax)."""
    steps = []
    for _ in range(64):
        if _op(node) in _MATMULS or _op(node) in _BADDBMM:
            # (scores read elsewhere too would be computed twice)
            return (node, steps[::-1]) if len(node.users) == 1 else None
        if len(node.users) != 1:
            return None
        step = _step(node)
        if step is None:
            return None
        source, effect = step
        steps.append((node, effect))
        node = source
    return None


def _step(node: fx.Node) -> Optional[tuple]:
    """(the scores' node that `node` reads, what it does to them), if it is an allowed op:
    ("scale", c), ("add", bias), ("fill", mask, value, keep), ("view",) or ("same",)."""
    op, args, kwargs = _op(node), node.args, node.kwargs
    if op in _MUL and len(args) == 2 and not kwargs:
        a, b = args
        if isinstance(a, fx.Node) and _number(b):
            return a, ("scale", float(b))
        if isinstance(b, fx.Node) and _number(a):
            return b, ("scale", float(a))
        return None
    if op in _DIV and len(args) == 2 and not kwargs:
        a, b = args
        if isinstance(a, fx.Node) and _number(b) and b != 0:
            return a, ("scale", 1.0 / b)
        return None
    if op in _ADD and len(args) == 2 and not kwargs:
        a, b = args
        if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
            return None
        a_scores, b_scores = _reaches_matmul(a), _reaches_matmul(b)
        if a_scores == b_scores:
            return None  # neither side, or both, could be the scores
        return (a, ("add", b)) if a_scores else (b, ("add", a))
    if op in _MASKED_FILL:
        x, mask, value = _arg(node, 0, "input"), _arg(node, 1, "mask"), _arg(node, 2, "value")
        if isinstance(x, fx.Node) and isinstance(mask, fx.Node) and _is_fill(value):
            return x, ("fill", mask, float(value), False)
        return None
    if op in _WHERE and len(args) == 3 and not kwargs:
        keep, x, value = args
        if isinstance(keep, fx.Node) and isinstance(x, fx.Node) and _is_fill(value):
            return x, ("fill", keep, float(value), True)
        return None
    x = args[0] if args else None
    if not isinstance(x, fx.Node):
        return None
    if op in _VIEWS:
        return x, ("view",)
    if op == "contiguous":
        return x, ("same",)
    if op in _CASTS and _dtype_cast(node, x):
        if _meta(node).dtype in (_meta(x).dtype, torch.float32):
            return x, ("same",)  # (the kernels' softmax is float32)
    return None


def _dtype_cast(node: fx.Node, x: fx.Node) -> bool:
    before, after = _meta(x), _meta(node)
    return (before is not None and after is not None and after.device == before.device
            and tuple(after.sizes) == tuple(before.sizes))  # fmt: skip


def _reaches_matmul(node: fx.Node, depth: int = 0) -> bool:
    """Whether `node` is a scores value: a matmul through allowed ops, each read once."""
    if _op(node) in _MATMULS or _op(node) in _BADDBMM:
        return True
    if depth > 64 or len(node.users) != 1:
        return False
    if _op(node) in _ADD and len(node.args) == 2 and not node.kwargs:
        return any(isinstance(a, fx.Node) and _reaches_matmul(a, depth + 1) for a in node.args)
    step = _step(node)
    return step is not None and _reaches_matmul(step[0], depth + 1)


def _walk_forward(softmax: fx.Node) -> Optional[tuple]:
    """([the casts, views and inactive dropout after the softmax], the matmul reading the
    probabilities as its first operand), every value read only by the next."""
    node, after = softmax, []
    for _ in range(64):
        users = list(node.users)
        if len(users) != 1 or _arg(users[0], 0, "input") is not node:
            return None
        user = users[0]
        op = _op(user)
        if op in _MATMULS:
            return (after, user) if len(user.args) == 2 and not user.kwargs else None
        if op in _DROPOUT:
            p = _arg(user, 1, "p", 0.5)
            training = _arg(user, 2, "train" if op is torch.dropout else "training", True)
            if not (training is False or p == 0):
                return None
        elif not ((op in _CASTS and _dtype_cast(user, node)) or op in _VIEWS
                  or op == "contiguous"):  # fmt: skip
            return None
        after.append(user)
        node = user
    return None


# -- the call ---------------------------------------------------------------------------------


def _plan(scores: fx.Node, steps: list, softmax: fx.Node, after: list,
          final: fx.Node) -> Optional[dict]:  # fmt: skip
    """What the call needs, checked: the operands, the scale, the bias's recipe, batch shapes;
    None where the fold would not be exact or the call could not take it."""
    op = _op(scores)
    if op in _BADDBMM:
        inp, q, kt = _arg(scores, 0, "input"), _arg(scores, 1, "batch1"), _arg(scores, 2, "batch2")
        beta, alpha = _arg(scores, 3, "beta", 1), _arg(scores, 4, "alpha", 1)
        if not (_number(alpha) and isinstance(inp, fx.Node)) or beta not in (0, 1):
            return None
        if _meta(inp) is None or _meta(inp).requires_grad:
            return None
        scale, recipe = float(alpha), ([("add", inp, _batch(scores))] if beta == 1 else [])
    else:
        if len(scores.args) != 2 or scores.kwargs:
            return None
        (q, kt), scale, recipe = scores.args, 1.0, []
    v = final.args[1]
    nodes = (q, kt, v, scores, final)
    if not all(isinstance(x, fx.Node) and _meta(x) is not None for x in nodes):
        return None
    if any(len(_sizes(x)) < 3 for x in nodes):
        return None  # (a batch dimension at least: the kernels take (batch, heads, L, E))
    dtype = _meta(q).dtype
    if {_meta(x).dtype for x in nodes} != {dtype} or not dtype.is_floating_point:
        return None
    bs, bf = _batch(scores), _batch(final)
    probabilities = after[-1] if after else softmax
    if not (_batch(q) == _batch(kt) == bs and _batch(v) == _batch(probabilities) == bf):
        return None  # (no broadcasting between the operands' batches)
    length, keys = _sizes(scores)[-2:]
    if _sizes(v)[-2] != keys or _sizes(final)[-2] != length:
        return None
    if _meta(softmax).dtype.itemsize < dtype.itemsize:
        return None  # (softmax(dtype=float16) in a float32 program rounds its probabilities)
    for node in after:  # views of the probabilities regroup their batch only; casts keep
        if _meta(node) is None or _sizes(node)[-2:] != (length, keys):  # them floating
            return None  # (a narrowing round trip, p.to(bf16).float(), would be lost)
        if _meta(node).dtype not in (_meta(softmax).dtype, dtype):
            return None
    level, levels, source, current = bs, [bs, bf], scores, dtype
    for node, effect in steps:
        kind = effect[0]
        if kind != "view" and _sizes(node) != _sizes(source):
            return None  # a bias or mask broadcasting the scores up
        # A bias or fill folds exactly only where the scores are in the queries' dtype: the
        # kernels take attn_mask in it (a float32 bias on bfloat16 scores would be rounded).
        if kind in ("add", "fill") and not (current == dtype == _meta(node).dtype):
            return None
        if kind == "same":
            current = _meta(node).dtype
            if current.itemsize < dtype.itemsize:
                return None  # (a narrowing cast rounds the scores; the kernels would not)
        source = node
        if kind == "scale":
            recipe.append(("scale", effect[1]))
        elif kind == "add":
            bias_meta = _meta(effect[1])
            if bias_meta is None or bias_meta.requires_grad:
                return None
            recipe.append(("add", effect[1], level))
        elif kind == "fill":
            if _meta(effect[1]) is None:
                return None
            recipe.append(("fill", effect[1], effect[2], effect[3], level))
        elif kind == "view":
            if _meta(node) is None or _sizes(node)[-2:] != (length, keys):
                return None
            level = _batch(node)
            levels.append(level)
    # The kernels take (batch, heads, L, E): the call is made at a level of two batch
    # dimensions where the program has one (BLOOM masks its (B*H) scores viewed as (B, H)), so
    # no bias is regrouped past its broadcast dimensions; else at one, unsqueezed.
    kernel = next((lv for lv in levels if len(lv) == 2), bf if len(bf) == 1 else None)
    if kernel is None:
        return None
    terms = [item for item in recipe if item[0] in ("add", "fill")]
    regroups = {bs, bf, *[item[-1] for item in terms]} != {kernel}
    if regroups:  # sizes written into the graph: the example's, checked to be integers
        sized = [q, kt, v, *[item[1] for item in terms]]
        if any(_ints(_sizes(n)) is None for n in sized) or _ints(kernel) is None:
            return None
        for item in terms:
            if len(_sizes(item[1])) > len(item[-1]) + 2:
                return None
    scale *= math.prod(item[1] for item in recipe if item[0] == "scale")
    return dict(q=q, kt=kt, v=v, scale=scale, recipe=recipe, bs=bs, bf=bf, kernel=kernel,
                dtype=dtype, length=length, keys=keys, regroups=regroups)  # fmt: skip


_INPLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul,
                      operator.itruediv, operator.ipow, operator.iand, operator.ior}  # fmt: skip


def _mutation_between(first: fx.Node, last: fx.Node) -> bool:
    """Whether a node between `first` and `last` may write a value in place: the call reads
    every operand just before `last`, where the chain read them earlier."""
    node = first.next
    while node is not last and node.op != "root":
        if node.op == "call_method" and node.target.endswith("_") and not node.target.endswith(
                "__"):  # fmt: skip
            return True
        if node.op == "call_function" and (node.target in _INPLACE_FUNCTIONS or getattr(
                node.target, "__name__", "").endswith("_") or node.kwargs.get("out") is not None):
            return True  # fmt: skip
        node = node.next
    return False


def _batch(node: fx.Node) -> tuple:
    return _sizes(node)[:-2]


def _emit(graph: fx.Graph, plan: dict, final: fx.Node) -> None:
    """The call, before `final`, and every reader of `final` reading it instead."""
    kernel = plan["kernel"]

    def call(target, *args, **kwargs):
        return graph.call_function(target, args, kwargs)

    def method(name, *args):
        return graph.call_method(name, args)

    def operand(x, level):  # (*level, n, e) as (*kernel, n, e)
        return x if level == kernel else method("reshape", x, (*kernel, *_sizes(x)[-2:]))

    def term(t, level):
        """A bias or mask broadcast against (*level, L, S), as one against (*kernel, L, S):
        only its batch dimensions are expanded, and only if it has any but ones."""
        if level == kernel:
            for _ in range(2 - len(_sizes(t))):  # (attn_mask has two dimensions at least)
                t = method("unsqueeze", t, 0)
            return t
        sizes = (1,) * (len(level) + 2 - len(_sizes(t))) + _sizes(t)
        batch, tail = sizes[:-2], sizes[-2:]
        if all(b == 1 for b in batch):
            return method("reshape", t, (*(1,) * len(kernel), *tail))
        return method("reshape", method("expand", t, (*level, *tail)), (*kernel, *tail))

    with graph.inserting_before(final):
        q, v = operand(plan["q"], plan["bs"]), operand(plan["v"], plan["bf"])
        k = method("transpose", plan["kt"], -2, -1)
        if plan["bs"] != kernel:
            k = method("reshape", k, (*kernel, *_sizes(plan["kt"])[-2:][::-1]))
        # The fused kernels read rows of E contiguous elements (else torch's dispatch, and the
        # tracer with it, falls back to the math path: BLOOM's keys, made as (B*H, E, S)).
        strides = (_meta(plan["q"]).strides[-1], _meta(plan["kt"]).strides[-2],
                   _meta(plan["v"]).strides[-1])  # fmt: skip
        q, k, v = (x if stride == 1 else method("contiguous", x)
                   for x, stride in zip((q, k, v), strides))  # fmt: skip
        bias = None
        for item in plan["recipe"]:
            if item[0] == "scale":
                bias = None if bias is None else call(operator.mul, bias, item[1])
            elif item[0] == "add":  # (in the scores' dtype, as eager's sum promotes it)
                t = method("to", term(item[1], item[2]), plan["dtype"])
                bias = t if bias is None else call(operator.add, bias, t)
            else:
                _, mask, value, keep, level = item
                mask = term(mask, level)
                rest = method("new_zeros", plan["q"], ()) if bias is None else bias
                bias = call(torch.where, mask, rest, value) if keep else call(
                    torch.where, mask, value, rest)  # fmt: skip
        squeeze = len(kernel) == 1
        if squeeze:  # (batch, heads) as the kernels take them
            q, k, v = (method("unsqueeze", x, 0) for x in (q, k, v))
            if bias is not None:
                bias = method("unsqueeze", bias, 0)
        out = call(F.scaled_dot_product_attention, q, k, v, attn_mask=bias, dropout_p=0.0,
                   is_causal=False, scale=plan["scale"])  # fmt: skip
        if squeeze:
            out = method("squeeze", out, 0)
        if plan["bf"] != kernel:
            out = method("reshape", out, _sizes(final))
    out.meta.update(final.meta)
    final.replace_all_uses_with(out)
