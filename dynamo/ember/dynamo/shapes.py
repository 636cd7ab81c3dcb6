"""Symbolic output sizes of torch-level calls, for a trace with dynamic sizes.

The tracer runs each op on real example tensors (the hint sizes); a tensor whose sizes depend on
symbols also carries them as sympy expressions (`TensorVT.sym`), computed here by one rule per
family of ops. A rule's answer is checked against the example's real sizes; an op with no rule,
or a rule that disagrees, leaves the sizes UNKNOWN. That is always safe: the graph computes sizes
at run time, and reading an unknown size makes the frame fall back to static shapes.
"""

from __future__ import annotations

import operator

import sympy
import torch

from ember.ir.symbols import CeilDiv, FloorDiv, exact_quotient

from . import variables as V
from .symbolic import SymbolicFallback, SymIntVT, SymSliceVT, as_sym, is_int_vt

UNKNOWN = "unknown"


class _NoRule(Exception):
    pass


# -- reading arguments ------------------------------------------------------------------------
def sizes_of(vt) -> tuple:
    """The sizes of a TensorVT as expressions (static ones from its example)."""
    if vt.sym is UNKNOWN:
        raise _NoRule
    if vt.sym is not None:
        return vt.sym
    return tuple(sympy.Integer(s) for s in vt.example.shape)


def _int(vt) -> sympy.Expr:
    if not is_int_vt(vt):
        raise _NoRule
    return as_sym(vt)


def _ints(vts) -> list:
    """A size list given as varargs or as one list/tuple/torch.Size."""
    if len(vts) == 1 and isinstance(vts[0], V.ListVT):
        vts = vts[0].items
    if len(vts) == 1 and isinstance(vts[0], V.ConstVT) and isinstance(vts[0].value, (tuple, list)):
        return [sympy.Integer(v) for v in vts[0].value]
    return [_int(v) for v in vts]


def _const(vt, default=None):
    if vt is None:
        return default
    if isinstance(vt, V.ConstVT):
        return vt.value
    if isinstance(vt, V.ListVT) and all(isinstance(i, V.ConstVT) for i in vt.items):
        return [i.value for i in vt.items]
    raise _NoRule


def _arg(args, kwargs, i, name, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if i < len(args) else default


def _dim(d, ndim) -> int:
    return d + ndim if d < 0 else d


def _prod(exprs):
    return sympy.Mul(*exprs) if exprs else sympy.S.One


# -- rules ------------------------------------------------------------------------------------
def _broadcast(env, shapes) -> tuple:
    """Broadcast sizes; two different sizes neither of which is 1 are assumed equal (guarded)."""
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = [s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0]
        big = [d for d in dims if d != 1]
        if not big:
            out.append(sympy.S.One)
            continue
        rep = next((d for d in big if d.is_Integer), big[0])
        for d in big:
            if d != rep:
                env.assume(sympy.Eq(d, rep))
        out.append(rep)
    return tuple(out)


def _elementwise(env, args, kwargs):
    shapes = [sizes_of(a) for a in [*args, *kwargs.values()] if isinstance(a, V.TensorVT)]
    return _broadcast(env, shapes)


def _same_as_first(env, args, kwargs):
    return sizes_of(args[0])


def _reduction(env, args, kwargs, dim_at=1, keep_at=2):
    x = sizes_of(args[0])
    dim = _const(_arg(args, kwargs, dim_at, "dim"))
    keep = bool(_const(_arg(args, kwargs, keep_at, "keepdim"), False))
    if dim is None:
        return tuple(sympy.S.One for _ in x) if keep else ()
    dims = {_dim(d, len(x)) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    return tuple(sympy.S.One if i in dims else s for i, s in enumerate(x) if keep or i not in dims)


def _var_like(env, args, kwargs):
    return _reduction(env, args, kwargs, dim_at=1, keep_at=3)


def _minmax(env, args, kwargs):
    if len(args) > 1 and isinstance(args[1], V.TensorVT):
        return _elementwise(env, args, kwargs)
    out = _reduction(env, args, kwargs)
    has_dim = "dim" in kwargs or len(args) > 1
    return [out, out] if has_dim else out


def _view(env, args, kwargs):
    x = sizes_of(args[0])
    shape = _ints(list(args[1:]) or [kwargs.get("size", kwargs.get("shape"))])
    if any(s == -1 for s in shape):
        known = _prod([s for s in shape if s != -1])
        total = _prod(x)
        q = exact_quotient(total, known)
        if q is None:
            env.assume(sympy.Eq(sympy.Mod(total, known), 0))
            q = FloorDiv(total, known)
        shape = [q if s == -1 else s for s in shape]
    else:
        _assume_equal(env, _prod(shape), _prod(x))
    return tuple(shape)


def _assume_equal(env, a, b):
    a, b = env.simplify(a), env.simplify(b)
    if sympy.expand(a - b) != 0:
        env.assume(sympy.Eq(a, b))


def _expand(env, args, kwargs):
    x = sizes_of(args[0])
    shape = _ints(list(args[1:]) or [kwargs["size"]])
    lead = len(shape) - len(x)
    out = []
    for i, s in enumerate(shape):
        if s == -1:
            out.append(x[i - lead])
        else:
            if i >= lead and x[i - lead] != 1 and x[i - lead] != s:
                env.assume(sympy.Eq(x[i - lead], s))
            out.append(s)
    return tuple(out)


def _like_other(env, args, kwargs):
    return sizes_of(args[1])


def _gather(env, args, kwargs):
    return sizes_of(_arg(args, kwargs, 2, "index"))  # the output has the index's sizes


def _transpose(env, args, kwargs):
    x = list(sizes_of(args[0]))
    if len(x) < 2:
        return tuple(x)
    a = _dim(_const(_arg(args, kwargs, 1, "dim0"), -2), len(x))
    b = _dim(_const(_arg(args, kwargs, 2, "dim1"), -1), len(x))
    x[a], x[b] = x[b], x[a]
    return tuple(x)


def _permute(env, args, kwargs):
    x = sizes_of(args[0])
    dims = _const(args[1]) if len(args) == 2 else [_const(a) for a in args[1:]]
    if dims is None:
        dims = _const(kwargs["dims"])
    return tuple(x[_dim(d, len(x))] for d in dims)


def _unsqueeze(env, args, kwargs):
    x = list(sizes_of(args[0]))
    d = _const(_arg(args, kwargs, 1, "dim"))
    x.insert(d + len(x) + 1 if d < 0 else d, sympy.S.One)
    return tuple(x)


def _squeeze(env, args, kwargs):
    x = sizes_of(args[0])
    d = _const(_arg(args, kwargs, 1, "dim"))
    if d is None:
        return tuple(s for s in x if s != 1)
    dims = {_dim(i, len(x)) for i in (d if isinstance(d, (list, tuple)) else [d])}
    return tuple(s for i, s in enumerate(x) if not (i in dims and s == 1))


def _flatten(env, args, kwargs):
    x = sizes_of(args[0])
    if not x:
        return (sympy.S.One,)
    a = _dim(_const(_arg(args, kwargs, 1, "start_dim"), 0), len(x))
    b = _dim(_const(_arg(args, kwargs, 2, "end_dim"), -1), len(x))
    return (*x[:a], _prod(x[a : b + 1]), *x[b + 1 :])


def _unflatten(env, args, kwargs):
    x = sizes_of(args[0])
    d = _dim(_const(_arg(args, kwargs, 1, "dim")), len(x))
    parts = _ints([_arg(args, kwargs, 2, "sizes")])
    if any(p == -1 for p in parts):
        known = _prod([p for p in parts if p != -1])
        parts = [FloorDiv(x[d], known) if p == -1 else p for p in parts]
    return (*x[:d], *parts, *x[d + 1 :])


def _linear(env, args, kwargs):
    x, w = sizes_of(args[0]), sizes_of(_arg(args, kwargs, 1, "weight"))
    _assume_equal(env, x[-1], w[-1])
    return (*x[:-1], w[0]) if len(w) == 2 else x[:-1]


def _matmul(env, args, kwargs):
    a, b = sizes_of(args[0]), sizes_of(args[1])
    _assume_equal(env, a[-1], b[-2] if len(b) > 1 else b[0])
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(b) == 1:
        return a[:-1]
    if len(a) == 1:
        return (*b[:-2], b[-1])
    batch = _broadcast(env, [a[:-2], b[:-2]]) if len(a) > 2 or len(b) > 2 else ()
    return (*batch, a[-2], b[-1])


def _addmm(env, args, kwargs):
    names = ("batch1", "batch2") if "batch1" in kwargs or "batch2" in kwargs else ("mat1", "mat2")
    a, b = (sizes_of(_arg(args, kwargs, i + 1, n)) for i, n in enumerate(names))
    _assume_equal(env, a[-1], b[-2])
    return (*a[:-1], b[-1])


def _layer_norm(env, args, kwargs):
    x = sizes_of(args[0])
    shape = _ints([_arg(args, kwargs, 1, "normalized_shape")])
    for have, want in zip(x[len(x) - len(shape) :], shape):
        _assume_equal(env, have, want)  # the weight's and bias's sizes
    return x


def _embedding(env, args, kwargs):
    return (*sizes_of(args[0]), sizes_of(args[1])[1])


def _cat(env, args, kwargs):
    tensors = [t for t in args[0].items if sizes_of(t) != (0,)]
    d = _dim(_const(_arg(args, kwargs, 1, "dim"), 0), len(sizes_of(tensors[0])))
    shapes = [sizes_of(t) for t in tensors]
    out = list(shapes[0])
    for s in shapes[1:]:
        for i, (x, y) in enumerate(zip(out, s)):
            if i != d and x != y:
                env.assume(sympy.Eq(x, y))
    out[d] = sympy.Add(*[s[d] for s in shapes])
    return tuple(out)


def _stack(env, args, kwargs):
    shapes = [sizes_of(t) for t in args[0].items]
    d = _const(_arg(args, kwargs, 1, "dim"), 0)
    out = list(_broadcast(env, shapes))
    out.insert(d + len(out) + 1 if d < 0 else d, sympy.Integer(len(shapes)))
    return tuple(out)


def _split(env, args, kwargs):
    x = sizes_of(args[0])
    d = _dim(_const(_arg(args, kwargs, 2, "dim"), 0), len(x))
    size = _arg(args, kwargs, 1, "split_size_or_sections", kwargs.get("split_size"))
    if isinstance(size, V.ListVT):
        parts = [_int(p) for p in size.items]
        _assume_equal(env, sympy.Add(*parts), x[d])
        return [(*x[:d], p, *x[d + 1 :]) for p in parts]
    return _pieces(env, x, d, _int(size))


def _chunk(env, args, kwargs):
    x = sizes_of(args[0])
    d = _dim(_const(_arg(args, kwargs, 2, "dim"), 0), len(x))
    return _pieces(env, x, d, CeilDiv(x[d], _const(_arg(args, kwargs, 1, "chunks"))))


def _pieces(env, x, d, k):
    """Sizes of splitting dim `d` into pieces of `k` (the last one shorter); their number is
    guarded, since the tracer unpacks them."""
    n = x[d]
    count = env.hint(CeilDiv(n, k))
    env.assume(sympy.Eq(CeilDiv(n, k), count))
    parts = [k] * (count - 1) + [n - k * (count - 1)]
    return [(*x[:d], p, *x[d + 1 :]) for p in parts]


def _unbind(env, args, kwargs):
    x = sizes_of(args[0])
    d = _dim(_const(_arg(args, kwargs, 1, "dim"), 0), len(x))
    env.assume(sympy.Eq(x[d], env.hint(x[d])))
    return [x[:d] + x[d + 1 :]] * env.hint(x[d])


def _creation(env, args, kwargs):
    return tuple(_ints(list(args) or [kwargs["size"]]))


def _full(env, args, kwargs):
    return tuple(_ints([_arg(args, kwargs, 0, "size")]))


def _new_creation(env, args, kwargs):
    return tuple(_ints(list(args[1:]) or [kwargs["size"]]))


def _new_full(env, args, kwargs):
    return tuple(_ints([_arg(args, kwargs, 1, "size")]))


def _arange(env, args, kwargs):
    ends = [a for a in args if is_int_vt(a)]
    if len(ends) == 1:
        return (_int(ends[0]),)
    if len(ends) == 2:
        return (_int(ends[1]) - _int(ends[0]),)
    raise _NoRule


def _conv(env, args, kwargs):
    x, w = sizes_of(args[0]), sizes_of(args[1])
    nsp = len(w) - 2
    params = ((3, "stride", 1), (4, "padding", 0), (5, "dilation", 1))
    stride, padding, dilation = (_tuple(_const(_arg(args, kwargs, i, n), dft), nsp)
                                 for i, n, dft in params)  # fmt: skip
    if not isinstance(padding[0], int):
        raise _NoRule
    spatial = [FloorDiv(x[-nsp + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1,
                        stride[i]) + 1 for i in range(nsp)]  # fmt: skip
    return (*x[: len(x) - nsp - 1], w[0], *spatial)


def _tuple(v, n):
    return tuple(v) if isinstance(v, (list, tuple)) else (v,) * n


def _adaptive_pool(nsp):
    def rule(env, args, kwargs):
        x = sizes_of(args[0])
        out = _tuple(_const(_arg(args, kwargs, 1, "output_size")), nsp)
        lead = x[: len(x) - nsp]
        return (*lead, *(x[len(lead) + i] if o is None else sympy.Integer(o)
                         for i, o in enumerate(out)))  # fmt: skip

    return rule


def _loss(env, args, kwargs):
    if _const(kwargs.get("reduction"), "mean") == "none":
        raise _NoRule
    return ()


def _sdpa(env, args, kwargs):
    q, k, v = (sizes_of(a) for a in args[:3])
    _assume_equal(env, q[-1], k[-1])
    _assume_equal(env, k[-2], v[-2])
    return (*q[:-1], v[-1])


def _advanced(i):
    """The sizes of an advanced (integer array) index: a tensor of integers or a list of ints;
    None for a basic one."""
    if isinstance(i, V.TensorVT):
        if i.example.dtype in (torch.bool, torch.uint8) or i.example.is_floating_point():
            raise _NoRule  # a mask selects by value (the tracer refuses it); floats are errors
        return sizes_of(i)
    if isinstance(i, V.ListVT):
        if not all(isinstance(v, V.ConstVT) and type(v.value) is int for v in i.items):
            raise _NoRule
        return (sympy.Integer(len(i.items)),)
    return None


def _getitem(env, args, kwargs):
    """x[index]: basic indices (ints, slices, None, ...) and integer array indices, whose
    broadcast sizes replace the dims they index where they are adjacent, or lead otherwise."""
    x = sizes_of(args[0])
    tuple_index = isinstance(args[1], V.ListVT) and args[1].is_tuple
    index = args[1].items if tuple_index else [args[1]]  # x[[0, 2]]: one list index
    if len(index) == 1 and isinstance(index[0], V.ConstVT) and isinstance(index[0].value, tuple):
        index = [V.ConstVT(i) for i in index[0].value]  # x[..., None]: one constant tuple
    arrays = [_advanced(i) for i in index]
    if any(a is not None for a in arrays) and any(is_int_vt(i) for i in index):
        raise _NoRule  # an int beside array indices is one of them (broadcast, placement)
    consumed = sum(1 for i in index if not (isinstance(i, V.ConstVT) and i.value in (None, ...)))
    out, d, spot = [], 0, None
    for i, array in zip(index, arrays):
        if array is not None:
            if spot is None:
                spot = len(out)  # where the broadcast sizes go
            d += 1
            continue
        if isinstance(i, V.ConstVT) and i.value is None:
            out.append(sympy.S.One)
        elif isinstance(i, V.ConstVT) and i.value is ...:
            n = len(x) - consumed
            out.extend(x[d : d + n])
            d += n
        elif is_int_vt(i):
            d += 1
        elif isinstance(i, (V.ConstVT, SymSliceVT)):
            out.append(_slice_len(env, x[d], i))
            d += 1
        else:
            raise _NoRule
    out.extend(x[d:])
    if spot is None:
        return tuple(out)
    at = [k for k, a in enumerate(arrays) if a is not None]
    batch = list(_broadcast(env, [arrays[k] for k in at]))
    if at[-1] - at[0] + 1 != len(at):  # a basic index between array indices: they lead
        return tuple(batch + out)
    return tuple(out[:spot] + batch + out[spot:])


def _slice_len(env, n, s) -> sympy.Expr:
    """len(range(n)[s]) for a slice with int or symbolic bounds, deciding clamps by the hints."""
    if isinstance(s, V.ConstVT):
        if not isinstance(s.value, slice):
            raise _NoRule
        start, stop, step = (None if p is None else sympy.Integer(p)
                             for p in (s.value.start, s.value.stop, s.value.step))  # fmt: skip
    else:
        start, stop, step = (None if isinstance(p, V.ConstVT) and p.value is None else _int(p)
                             for p in s.parts)  # fmt: skip
    step = step if step is not None else sympy.S.One
    if not step.is_Integer or int(step) <= 0:
        raise _NoRule

    def clamp(p, default):
        if p is None:
            return default
        if env.decide(p < 0):
            p = p + n
            return p if env.decide(p >= 0) else sympy.S.Zero
        return p if env.decide(p <= n) else n

    lo, hi = clamp(start, sympy.S.Zero), clamp(stop, n)
    if not env.decide(hi > lo):
        return sympy.S.Zero
    return CeilDiv(hi - lo, step) if step != 1 else hi - lo


def _select(env, args, kwargs):
    x = sizes_of(args[0])
    d = _dim(_const(_arg(args, kwargs, 1, "dim")), len(x))
    return x[:d] + x[d + 1 :]


def _narrow(env, args, kwargs):
    x = list(sizes_of(args[0]))
    d = _dim(_const(args[1]), len(x))
    x[d] = _int(args[3])
    return tuple(x)


def _index_select(env, args, kwargs):
    x = list(sizes_of(args[0]))
    d = _dim(_const(args[1]), len(x))
    idx = sizes_of(args[2])
    x[d] = idx[0] if idx else sympy.S.One
    return tuple(x)


def _pad(env, args, kwargs):
    x = list(sizes_of(args[0]))
    pad = [_int(p) for p in args[1].items] if isinstance(args[1], V.ListVT) else [
        sympy.Integer(p) for p in _const(args[1])]  # fmt: skip
    for i in range(len(pad) // 2):
        x[-1 - i] = x[-1 - i] + pad[2 * i] + pad[2 * i + 1]
    return tuple(x)


def _repeat(env, args, kwargs):
    x = sizes_of(args[0])
    reps = _ints(list(args[1:]))
    x = (sympy.S.One,) * (len(reps) - len(x)) + tuple(x)
    return tuple(a * b for a, b in zip(x, reps))


def _topk(env, args, kwargs):
    x = list(sizes_of(args[0]))
    d = _dim(_const(_arg(args, kwargs, 2, "dim"), -1), len(x))
    x[d] = _int(_arg(args, kwargs, 1, "k"))
    return [tuple(x), tuple(x)]


def _repeat_interleave(env, args, kwargs):
    x = sizes_of(args[0])
    reps = _arg(args, kwargs, 1, "repeats")
    if not is_int_vt(reps):
        raise _NoRule  # tensor repeats: sizes from data
    d = _const(_arg(args, kwargs, 2, "dim"))
    if d is None:
        return (_prod(x) * _int(reps),)
    d = _dim(d, len(x))
    return (*x[:d], x[d] * _int(reps), *x[d + 1 :])


def _sort(env, args, kwargs):
    x = sizes_of(args[0])
    return [x, x]


def _one_hot(env, args, kwargs):
    n = _const(_arg(args, kwargs, 1, "num_classes"), -1)
    if n < 0:
        raise _NoRule
    return (*sizes_of(args[0]), sympy.Integer(n))


_SAME = ("relu gelu silu tanh sigmoid softmax log_softmax dropout batch_norm group_norm "
         "instance_norm rms_norm contiguous clone detach to float half double bfloat16 int long "
         "bool type_as tril triu cumsum cumprod exp log log1p sqrt rsqrt abs neg sin cos erf "
         "clamp clamp_min clamp_max fill zeros_like ones_like empty_like rand_like randn_like "
         "full_like requires_grad hardtanh leaky_relu elu softplus mish hardswish hardsigmoid "
         "relu6 sign reciprocal floor ceil round logical_not bitwise_not isnan isinf nan_to_num "
         "normalize invert pos flip roll square exp2 expm1 log2 log10 sinh cosh tan asin acos "
         "atan selu celu logsigmoid softmin dropout1d dropout2d alpha_dropout "
         "feature_alpha_dropout type cpu cuda trunc frac sigmoid_ sgn local_response_norm "
         "masked_fill_ index_fill iadd isub imul itruediv ifloordiv imod ipow iand ior ixor "
         "ilshift irshift").split()  # fmt: skip
_ELEMENTWISE = ("add sub mul div truediv floordiv true_divide floor_divide remainder fmod pow "
                "maximum minimum where masked_fill eq ne lt le gt ge logical_and logical_or "
                "logical_xor and_ or_ xor bitwise_and bitwise_or bitwise_xor atan2 lerp addcmul "
                "addcdiv rsub mod copysign hypot lshift rshift isclose "
                "xlogy").split()  # fmt: skip
_RULES = {
    **{n: _same_as_first for n in _SAME},
    **{n: _elementwise for n in _ELEMENTWISE},
    **{n: _reduction for n in ("sum mean amax amin argmax argmin logsumexp prod all any nansum "
                               "nanmean count_nonzero").split()},  # fmt: skip
    "std": _var_like, "var": _var_like, "layer_norm": _layer_norm, "max": _minmax, "min": _minmax,
    "view": _view, "reshape": _view, "expand": _expand, "broadcast_to": _expand,
    "view_as": _like_other, "reshape_as": _like_other, "expand_as": _like_other,
    "transpose": _transpose, "swapaxes": _transpose, "swapdims": _transpose, "t": _transpose,
    "T": _transpose, "mT": _transpose, "permute": _permute, "unsqueeze": _unsqueeze,
    "squeeze": _squeeze, "flatten": _flatten, "unflatten": _unflatten, "linear": _linear,
    "matmul": _matmul, "mm": _matmul, "bmm": _matmul, "addmm": _addmm, "baddbmm": _addmm,
    "embedding": _embedding, "cat": _cat, "concat": _cat, "concatenate": _cat, "stack": _stack,
    "split": _split, "chunk": _chunk, "unbind": _unbind, "zeros": _creation,
    "ones": _creation, "empty": _creation, "rand": _creation, "randn": _creation,
    "full": _full, "new_zeros": _new_creation, "new_ones": _new_creation,
    "new_empty": _new_creation, "new_full": _new_full, "arange": _arange,
    "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "adaptive_avg_pool1d": _adaptive_pool(1),
    "adaptive_avg_pool2d": _adaptive_pool(2), "adaptive_max_pool2d": _adaptive_pool(2),
    "cross_entropy": _loss, "nll_loss": _loss, "mse_loss": _loss, "l1_loss": _loss,
    "binary_cross_entropy": _loss, "binary_cross_entropy_with_logits": _loss,
    "smooth_l1_loss": _loss, "scaled_dot_product_attention": _sdpa, "getitem": _getitem,
    "__getitem__": _getitem, "select": _select, "narrow": _narrow,
    "index_select": _index_select, "pad": _pad, "repeat": _repeat, "topk": _topk,
    "sort": _sort, "one_hot": _one_hot, "gather": _gather,
    "repeat_interleave": _repeat_interleave,
}  # fmt: skip


def op_name(kind, target) -> str:
    if kind == "call_method":
        name = target
    else:
        name = getattr(target, "__name__", "")
    if target is operator.getitem:
        return "getitem"
    if name.startswith("__") and name.endswith("__") and name != "__getitem__":
        name = name.strip("_")
    if name.endswith("_") and name not in _RULES:  # in-place: the shape of self
        return "fill" if name[:-1] in _RULES else name
    return name


def is_symbolic(vt) -> bool:
    """Whether a VT (or a container of VTs) holds anything whose value depends on symbols."""
    if isinstance(vt, V.TensorVT):
        return vt.sym is not None
    if isinstance(vt, (SymIntVT, SymSliceVT)):
        return True
    if isinstance(vt, V.ListVT):
        return any(is_symbolic(i) for i in vt.items)
    if isinstance(vt, V.DictVT):
        return any(is_symbolic(i) for i in vt.items.values())
    return False


def infer(env, kind, target, args, kwargs, result):
    """Symbolic sizes of `result` (a tensor, or a list of them): a tuple of expressions, UNKNOWN,
    or, for a list result, a list of those (None for a non-tensor item)."""
    rule = _RULES.get(op_name(kind, target))
    try:
        if rule is None:
            raise _NoRule
        out = rule(env, list(args), dict(kwargs))
    except (_NoRule, KeyError, IndexError, TypeError, ValueError, AttributeError, StopIteration):
        out = None
    if isinstance(result, torch.Tensor):
        return _checked(env, out, result) if not isinstance(out, list) else UNKNOWN
    if isinstance(result, (tuple, list)):
        if not isinstance(out, list) or len(out) != len(result):
            raise SymbolicFallback(f"{op_name(kind, target)} returns a sequence whose length "
                                   "may depend on dynamic sizes")  # fmt: skip
        return [_checked(env, o, r) if isinstance(r, torch.Tensor) else None
                for o, r in zip(out, result)]  # fmt: skip
    return None


def _checked(env, sizes, example: torch.Tensor):
    """`sizes` if they evaluate to the example's sizes (static if they hold no symbol)."""
    if sizes is None or len(sizes) != example.dim():
        return UNKNOWN
    sizes = tuple(env.simplify(s) for s in sizes)
    try:
        if tuple(env.hint(s) for s in sizes) != tuple(example.shape):
            return UNKNOWN
    except Exception:
        return UNKNOWN
    return sizes if any(not s.is_Integer for s in sizes) else None

