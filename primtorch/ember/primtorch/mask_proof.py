"""What an attention mask built from sizes alone is, proved for every size.

A model that is given no attention mask often builds one anyway: transformers makes a padding
mask of ones and a causal mask from `arange` comparisons (through cumsums and gathers of position
ids, since it also handles packed sequences). With static sizes the tracer sees the mask's values
and hands an all-allowing or causal one to the flash kernel without a bias
(`attention.constant_mask_kind`). With symbolic sizes the values seen are those of one size, which
prove nothing about the others; attention with a materialized bias then costs a B*H*L*S tensor
per layer and a slower kernel.

`proven_mask_kind` proves it instead. It reads the prim graph that computed the mask and gives
each node its element as a sympy expression of the element's index (symbols m0, m1, ...): `iota`
is its index, `full` its value, broadcasts and views move indices, pointwise prims combine the
expressions, `gather`/`index` substitute an index tensor's expression for an index, and a cumsum
of a value that does not vary along its dim multiplies it by the position. A placeholder, a
constant or any other prim has no expression, so a mask that reads an input's values (a real
padding mask) is never proved anything. With the mask's element as an expression e(i, j) of the
query row i and the key column j:

- "none": e is True (a boolean mask) or 0 (an additive one), for every index;
- "causal": rows and columns number the query's length (the keys' length, another symbol
  when keys are another input, is guarded equal), and for every d >= 0, e at column j = i - d is
  True / 0 while e at column j = i + 1 + d is False / an additive value at or below -1e4 (-inf,
  finfo.min: masked out, as the flash kernel's causal mask is).

Index symbols are nonnegative integers; their upper bounds are not used, nor is j >= 0 in the
substitutions, which only asks more of e. A mask that equals one of these only at the example's
sizes (the first five keys of a short example) is not proved, and stays a mask.
"""

from __future__ import annotations

import operator

import sympy
import torch
from torch import fx

from ember.ir import NODE_META_KEY, TensorMeta, target_name

from .symbolic import to_expr
from .utils import guard_equal

_BLOCKED = -1e4  # an additive bias at or below this masks a position out

_COMPARE = {"prims.eq": sympy.Eq, "prims.ne": sympy.Ne, "prims.lt": sympy.Lt,
            "prims.le": sympy.Le, "prims.gt": sympy.Gt, "prims.ge": sympy.Ge}  # fmt: skip
_LOGICAL = {"prims.logical_and": sympy.And, "prims.logical_or": sympy.Or,
            "prims.logical_xor": sympy.Xor, "prims.bitwise_and": sympy.And,
            "prims.bitwise_or": sympy.Or, "prims.bitwise_xor": sympy.Xor}  # fmt: skip
_ARITH = {"prims.add": operator.add, "prims.sub": operator.sub, "prims.mul": operator.mul,
          "prims.maximum": sympy.Max, "prims.minimum": sympy.Min}  # fmt: skip
_SAME = ("prims.view_of", "prims.clone", "prims.copy_strided", "prims.device_put")


class _NoProof(Exception):
    """The mask's element has no expression here."""


def _is_bool(e) -> bool:
    # (a sympy Symbol is a Boolean too, but ours are indices: numbers)
    return isinstance(e, sympy.logic.boolalg.Boolean) and not isinstance(e, sympy.Expr)


def _as_bool(e):
    return e if _is_bool(e) else sympy.Ne(e, 0)


def _as_number(e):
    return sympy.Piecewise((1, e), (0, True)) if _is_bool(e) else e


def _scalar(v):
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return sympy.oo if v > 0 else -sympy.oo
    if isinstance(v, (int, float)):
        return sympy.sympify(v)
    if isinstance(v, sympy.Expr):
        return v
    raise _NoProof(f"scalar {v!r}")


def _position(e):
    """An index tensor's value used as a position: one that may be negative counts from the end
    in torch, which an expression of the position does not follow."""
    if _is_bool(e) or e.is_nonnegative is not True:
        raise _NoProof(f"an index that may be negative: {e}")
    return e


class _Elements:
    """Each node's element as a function of its index (a list of sympy expressions)."""

    def __init__(self):
        self.memo: dict[fx.Node, object] = {}

    def of(self, a):
        """The element function of an argument: a node's, or a Python number's (any index)."""
        if isinstance(a, fx.Node):
            if a not in self.memo:
                self.memo[a] = self._node(a)
            return self.memo[a]
        value = _scalar(a)
        return lambda idx: value

    @staticmethod
    def dtype(n: fx.Node):
        meta = n.meta.get(NODE_META_KEY)
        return meta.dtype if isinstance(meta, TensorMeta) else None

    @staticmethod
    def sizes(n: fx.Node) -> tuple:
        meta = n.meta.get(NODE_META_KEY)
        if not isinstance(meta, TensorMeta):
            raise _NoProof(f"{n.name} has no tensor meta")
        return tuple(sympy.sympify(s) for s in meta.sizes)

    def _node(self, n: fx.Node):
        if n.op != "call_function":
            raise _NoProof(f"{n.op} {n.name}")  # an input or a constant: its values are unknown
        if n.target is operator.getitem:
            raise _NoProof("a multi-output op")
        name = target_name(n.target)
        rule = getattr(self, "_" + name.replace(".", "_"), None)
        a, kw = n.args, n.kwargs
        if name in _SAME:
            return self.of(a[0])
        if name in _COMPARE:
            x, y, rel = self.of(a[0]), self.of(a[1]), _COMPARE[name]
            return lambda idx: rel(_as_number(x(idx)), _as_number(y(idx)))
        if name in _LOGICAL:
            x, y, op = self.of(a[0]), self.of(a[1]), _LOGICAL[name]
            return lambda idx: op(_as_bool(x(idx)), _as_bool(y(idx)))
        if name in _ARITH:
            if self.dtype(n) == torch.bool:
                raise _NoProof("arithmetic on booleans")  # (True + True is True in torch)
            x, y, op = self.of(a[0]), self.of(a[1]), _ARITH[name]
            return lambda idx: op(_as_number(x(idx)), _as_number(y(idx)))
        if rule is None:
            raise _NoProof(name)
        return rule(n, *a, **kw)

    # --- creation ---------------------------------------------------------------------------------

    def _prims_full(self, n, shape, fill_value, *rest, **kw):
        value = _scalar(fill_value)
        return lambda idx: value

    def _prims_scalar_tensor(self, n, value, *rest, **kw):
        v = _scalar(value)
        return lambda idx: v

    def _prims_iota(self, n, length, start, step, *rest, **kw):
        start, step = _scalar(start), _scalar(step)
        return lambda idx: start + step * idx[0]

    # --- pointwise --------------------------------------------------------------------------------

    def _prims_logical_not(self, n, a):
        x = self.of(a)
        return lambda idx: sympy.Not(_as_bool(x(idx)))

    def _prims_bitwise_not(self, n, a):
        if self.dtype(n) != torch.bool:
            raise _NoProof("bitwise_not of integers")
        return self._prims_logical_not(n, a)

    def _prims_neg(self, n, a):
        x = self.of(a)
        return lambda idx: -_as_number(x(idx))

    def _prims_where(self, n, pred, a, b):
        p, x, y = self.of(pred), self.of(a), self.of(b)

        def at(idx):
            c, u, v = _as_bool(p(idx)), x(idx), y(idx)
            if _is_bool(u) and _is_bool(v):
                return sympy.ITE(c, u, v)
            return sympy.Piecewise((_as_number(u), c), (_as_number(v), True))

        return at

    def _prims_convert_element_type(self, n, a, dtype):
        x = self.of(a)
        if dtype == torch.bool:
            return lambda idx: _as_bool(x(idx))
        if dtype.is_floating_point:
            return lambda idx: _as_number(x(idx))  # rounding keeps 0 at 0 and -1e4 far below 0

        if dtype not in (torch.int64, torch.int32):
            raise _NoProof(f"a cast to {dtype}, which may wrap")

        def integer(idx):
            v = _as_number(x(idx))
            if v.is_integer is not True:
                raise _NoProof("a cast to an integer of a value that may not be one")
            return v

        return integer

    # --- movement ---------------------------------------------------------------------------------

    def _prims_broadcast_in_dim(self, n, a, shape, broadcast_dimensions):
        x, src = self.of(a), self.sizes(a)

        def at(idx):
            return x([0 if src[d] == 1 else idx[k] for d, k in enumerate(broadcast_dimensions)])

        return at

    def _prims_expand_dims(self, n, a, dims, *rest):
        x, ndim = self.of(a), len(self.sizes(n))
        new = {d % ndim for d in dims}
        return lambda idx: x([i for k, i in enumerate(idx) if k not in new])

    def _prims_squeeze(self, n, a, dims):
        x, ndim = self.of(a), len(self.sizes(a))
        gone = sorted(d % ndim for d in dims)

        def at(idx):
            full = list(idx)
            for d in gone:
                full.insert(d, sympy.S.Zero)
            return x(full)

        return at

    def _prims_permute(self, n, a, dims):
        x = self.of(a)

        def at(idx):
            src = [None] * len(dims)
            for k, d in enumerate(dims):
                src[d] = idx[k]
            return x(src)

        return at

    def _prims_reshape(self, n, a, shape):
        """Only a reshape that adds or drops dims of size 1."""
        x, src, dst = self.of(a), self.sizes(a), self.sizes(n)
        keep_src = [d for d, s in enumerate(src) if s != 1]
        keep_dst = [k for k, s in enumerate(dst) if s != 1]
        if [src[d] for d in keep_src] != [dst[k] for k in keep_dst]:
            raise _NoProof("a reshape that merges or splits dims")

        def at(idx):
            full = [sympy.S.Zero] * len(src)
            for d, k in zip(keep_src, keep_dst):
                full[d] = idx[k]
            return x(full)

        return at

    def _prims_slice(self, n, a, start_indices, limit_indices, strides=None):
        x = self.of(a)
        steps = strides or [1] * len(start_indices)
        return lambda idx: x([sympy.sympify(s) + st * i
                              for s, st, i in zip(start_indices, steps, idx)])  # fmt: skip

    def _prims_slice_in_dim(self, n, a, start, limit, stride, axis):
        x = self.of(a)

        def at(idx):
            full = list(idx)
            full[axis] = sympy.sympify(start) + stride * idx[axis]
            return x(full)

        return at

    def _prims_pad(self, n, a, padding_value, low, high, interior):
        if any(sympy.sympify(i) != 0 for i in interior):
            raise _NoProof("interior padding")
        x, src, value = self.of(a), self.sizes(a), _scalar(padding_value)

        def at(idx):
            inner = [i - sympy.sympify(lo) for i, lo in zip(idx, low)]
            inside = sympy.And(*(sympy.And(i >= 0, i < s) for i, s in zip(inner, src)))
            return sympy.Piecewise((x(inner), inside), (value, True))

        return at

    def _prims_cat(self, n, tensors, dim):
        parts = [(self.of(t), self.sizes(t)[dim]) for t in tensors]

        def at(idx):
            i, offset, pieces = idx[dim], sympy.S.Zero, []
            for k, (x, size) in enumerate(parts):
                full = list(idx)
                full[dim] = i - offset
                cond = sympy.true if k == len(parts) - 1 else sympy.Lt(i, offset + size)
                pieces.append((x(full), cond))
                offset = offset + size
            if all(_is_bool(v) for v, _ in pieces):
                out = pieces[-1][0]
                for v, c in reversed(pieces[:-1]):
                    out = sympy.ITE(c, v, out)
                return out
            return sympy.Piecewise(*((_as_number(v), c) for v, c in pieces))

        return at

    def _prims_gather(self, n, a, dim, index):
        x, ix = self.of(a), self.of(index)

        def at(idx):
            full = list(idx)
            full[dim] = _position(ix(idx))
            return x(full)

        return at

    def _prims_index(self, n, a, indices):
        """Index tensors on the leading dims, broadcast together (the result's leading dims)."""
        x = self.of(a)
        tensors = list(indices)
        while tensors and tensors[-1] is None:
            tensors.pop()
        if not tensors or any(t is None for t in tensors):
            raise _NoProof("index with gaps")
        shapes = [self.sizes(t) for t in tensors]
        rank = max(len(sh) for sh in shapes)
        for k in range(rank):
            sizes = {sh[k - rank + len(sh)] for sh in shapes if k - rank + len(sh) >= 0} - {1}
            if len(sizes) > 1:
                raise _NoProof("index tensors that do not broadcast")

        def reader(t, sh):
            f, lead = self.of(t), rank - len(sh)
            return lambda idx: f([0 if sh[k] == 1 else idx[lead + k] for k in range(len(sh))])

        fns = [reader(t, sh) for t, sh in zip(tensors, shapes)]
        return lambda idx: x([_position(f(idx[:rank])) for f in fns] + list(idx[rank:]))

    def _extern_cumsum(self, n, a, dim, dtype=None):
        """A cumsum of a value that does not vary along `dim`: the value times the count."""
        x, ndim = self.of(a), len(self.sizes(a))
        dim = dim % ndim
        probe = sympy.Dummy("p", integer=True, nonnegative=True)

        def at(idx):
            full = list(idx)
            full[dim] = probe
            v = _as_number(x(full))
            if probe in v.free_symbols:
                raise _NoProof("a cumsum of a value that varies along its dim")
            return v * (idx[dim] + 1)

        return at


def _decided(e):
    """e with its Boolean and Piecewise parts settled where sympy can settle them."""
    if e in (sympy.true, sympy.false) or e.is_number:
        return e
    try:
        return sympy.simplify(e)
    except (TypeError, ValueError, RecursionError):
        return e


def _allows(e, boolean: bool) -> bool:
    e = _decided(e)
    return e == sympy.true if boolean else bool(not _is_bool(e) and e.is_zero)


def _blocks(e, boolean: bool) -> bool:
    e = _decided(e)
    if boolean:
        return e == sympy.false
    return bool(e.is_number and (e == -sympy.oo or (e.is_real and e <= _BLOCKED)))


def proven_mask_kind(tracer, mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
    """"none" when `mask` (of a traced program with symbolic sizes) provably allows every position
    for every size, "causal" when it is provably the causal mask, else None (see the module)."""
    if not (isinstance(mask, torch.Tensor) and tracer.is_traced(mask)) or mask.dim() < 2:
        return None
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        return None
    boolean = mask.dtype == torch.bool
    node = tracer.node_of(mask)
    idx = [sympy.Symbol(f"m{k}", integer=True, nonnegative=True) for k in range(mask.dim())]
    try:
        sizes = _Elements.sizes(node)
        e = _Elements().of(node)(idx)
        if _allows(e, boolean):
            return "none"
        length, source = to_expr(query.shape[-2]), to_expr(key.shape[-2])
        if tuple(sizes[-2:]) != (length, length):
            return None
        i, j, d = idx[-2], idx[-1], sympy.Symbol("d", integer=True, nonnegative=True)
        if not (_allows(e.subs(j, i - d), boolean) and _blocks(e.subs(j, i + 1 + d), boolean)):
            return None
        # The mask has `length` columns, so attention needs as many keys; two inputs' lengths
        # are distinct symbols, equal here under a guard (a call where they differ recompiles).
        return "causal" if guard_equal(length, source) else None
    except (_NoProof, TypeError, ValueError, AttributeError, IndexError):
        return None
    return None


__all__ = ["proven_mask_kind"]
