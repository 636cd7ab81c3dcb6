"""Every prim's meta rule against its reference's real output, and the references against eager."""

import pytest
import sympy
import torch

from ember.ir import TensorMeta, lookup, resolve, sym, target_name
from ember.primtorch import is_extern, is_prim, prims, utils
from prim_samples import CUDA_ONLY_EXTERNS, extern_samples, other_samples, pointwise_samples

POINTWISE = sorted(p.name for p in prims.PRIMS.values() if "pointwise" in p.tags)
OTHER = other_samples()
EXTERN = extern_samples()


def _static(meta):
    return (
        meta.dtype,
        tuple(int(s) for s in meta.sizes),
        tuple(int(s) for s in meta.strides),
    )


def _real(t):
    return (t.dtype, tuple(t.shape), t.stride())


def _assert_meta(p, meta, out, offset=False):
    metas = meta if isinstance(meta, tuple) else (meta,)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(metas) == len(outs), p
    for m, t in zip(metas, outs):
        if not isinstance(t, torch.Tensor):
            assert m is None or not isinstance(m, TensorMeta), (p, m, t)
            continue
        assert _static(m) == _real(t), f"{p}: meta {_static(m)} != real {_real(t)}"
        if offset:
            assert int(m.storage_offset) == t.storage_offset(), p


def test_vocabulary_size_and_registration():
    names = [p for p in prims.PRIMS.values() if p.namespace == "prims"]
    assert 120 <= len(names) <= 250
    for p in prims.PRIMS.values():
        assert lookup(p.qualname).name == p.qualname
        assert resolve(p.qualname) is p
        assert target_name(p) == p.qualname
        assert is_prim(p) != is_extern(p)
        home = prims.extern if p.namespace == "extern" else prims
        assert getattr(home, p.name) is p
    assert is_extern(prims.extern.mm) and "extern" in prims.extern.mm.tags
    assert not is_prim(torch.add) and not is_extern(torch.ops.aten.mm.default)


def test_every_prim_has_samples():
    covered = set(POINTWISE) | set(OTHER) | {f"extern.{n}" for n in EXTERN}
    covered |= {f"extern.{n}" for n in CUDA_ONLY_EXTERNS}
    missing = [q for q, p in prims.PRIMS.items()
               if (p.name if p.namespace == "prims" else q) not in covered]  # fmt: skip
    assert not missing


@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_meta(name):
    p = getattr(prims, name)
    n = 0
    for args, kwargs in pointwise_samples(p):
        out = p(*args, **kwargs)
        _assert_meta(name, p.meta(*args, **kwargs), out)
        n += 1
    assert n >= 5


@pytest.mark.parametrize("name", sorted(OTHER))
def test_prim_meta_and_values(name):
    p = getattr(prims, name)
    for args, kwargs, eager in OTHER[name]:
        out = p(*args, **kwargs)
        _assert_meta(name, p.meta(*args, **kwargs), out, offset="view" in p.tags)
        if eager is not None:
            torch.testing.assert_close(out, eager(), check_dtype=True)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        if "view" not in p.tags and out.numel():
            for t in inputs:
                assert out.untyped_storage()._cdata != t.untyped_storage()._cdata, name


@pytest.mark.parametrize("name", sorted(EXTERN))
def test_extern_meta(name):
    p = getattr(prims.extern, name)
    for args, kwargs in EXTERN[name]:
        out = p(*args, **kwargs)
        meta = p.meta(*args, **kwargs)
        if "data_dependent" in p.tags:
            (size, *rest) = meta.sizes
            assert size.free_symbols and [int(r) for r in rest] == list(out.shape[1:])
            continue
        _assert_meta(name, meta, out)


def test_pad_values():
    x = torch.arange(1.0, 4.0)
    out = prims.pad(x, 0.0, (2,), (-1,), (1,))
    assert out.tolist() == [0.0, 0.0, 1.0, 0.0, 2.0, 0.0]
    out = prims.pad(x.reshape(1, 3), 9.0, (0, -1), (1, 1), (0, 0))
    assert out.tolist() == [[2.0, 3.0, 9.0], [9.0, 9.0, 9.0]]


def test_reductions_with_empty_dims_reduce_nothing():
    x = torch.randn(2, 3)
    torch.testing.assert_close(prims.sum(x, ()), x)
    torch.testing.assert_close(prims.amax(x, []), x)
    assert prims.var(x, (), 0.0).abs().max() == 0


def test_canonical_arguments():
    x = torch.randn(2, 3, 4)
    assert prims.sum.canonical_args((x, [-1, 0]), {}) == ((x, (0, 2)), {})
    assert prims.reshape.canonical_args((x, [4, -1]), {}) == ((x, (4, 6)), {})
    assert prims.permute.canonical_args((x, [-1, 0, 1]), {})[0][1] == (2, 0, 1)


def test_elementwise_operand_errors():
    a, b = torch.randn(2, 3), torch.randn(3)
    with pytest.raises(ValueError, match="equal shapes"):
        prims.add.meta(a, b)
    with pytest.raises(ValueError, match="equal dtypes"):
        prims.add.meta(a, a.double())
    with pytest.raises(TypeError, match="cannot be a torch.int64 scalar"):
        prims.add.meta(torch.ones(2, dtype=torch.int64), 0.5)
    with pytest.raises(TypeError, match="does not accept torch.int64"):
        prims.sqrt.meta(torch.ones(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="start <= limit"):
        prims.slice.meta(a, (0, 2), (2, 5))
    with pytest.raises(ValueError, match="without a copy"):
        prims.collapse_view.meta(a.t(), 0, 2)


# --- symbolic sizes ------------------------------------------------------------------------------

s0, s1 = sym("s0"), sym("s1")


def _sym_meta(sizes, dtype=torch.float32):
    return TensorMeta(dtype, sizes, utils.make_contiguous_strides_for(sizes))


def test_symbolic_broadcast_and_pointwise():
    a = _sym_meta((s0, 1, 4))
    b = prims.broadcast_in_dim.meta(a, (3, s0, s1, 4), (1, 2, 3))
    assert b.sizes == (3, s0, s1, 4)
    assert b.strides == (0, 4, 0, 1)
    c = prims.exp.meta(b)
    assert c.sizes == b.sizes and c.strides == utils.make_contiguous_strides_for(b.sizes)
    assert c.strides == (4 * s0 * s1, 4 * s1, 4, 1)
    assert utils.broadcast_shapes((s0, 1), (1, s1)) == (s0, s1)
    with pytest.raises(ValueError, match="do not broadcast"):
        utils.broadcast_shapes((s0,), (s1,))


def test_symbolic_channels_last_pointwise():
    sizes = (s0, 3, s1, 5)
    cl = TensorMeta(torch.float32, sizes, utils.make_channels_last_strides_for(sizes))
    out = prims.add.meta(cl, cl)
    assert out.strides == cl.strides
    mixed = prims.add.meta(cl, _sym_meta(sizes))
    assert mixed.strides == cl.strides  # the first operand with an opinion decides, as in torch


def test_symbolic_reshape_and_views():
    a = _sym_meta((s0, 4, 6))
    r = prims.reshape.meta(a, (s0 * 4, 6))
    assert r.sizes == (4 * s0, 6) and r.strides == (6, 1)
    r2 = prims.reshape.meta(a, (s0, 24))
    assert r2.strides == (24, 1)
    t = prims.permute.meta(a, (1, 0, 2))
    copied = prims.reshape.meta(t, (4 * s0 * 6,))
    assert copied.strides == (1,) and copied.sizes == (24 * s0,)
    sp = prims.split_dim.meta(a, 0, s0)
    assert sp.sizes == (s0, 1, 4, 6)
    sl = prims.slice.meta(a, (1, 0, 0), (s0, 4, 6), (2, 1, 1))
    assert sympy.simplify(sl.sizes[0].subs(s0, 7) - 3) == 0
    assert sl.storage_offset == 24


def test_symbolic_reductions_cat_pad_and_matmul():
    a = _sym_meta((s0, s1, 3))
    s = prims.sum.meta(a, (1,))
    assert s.sizes == (s0, 3) and s.strides == (3, 1)
    v = prims.var.meta(a, (0, 2), 1.0)
    assert v.sizes == (s1,)
    c = prims.cat.meta([a, a], 1)
    assert c.sizes == (s0, 2 * s1, 3)
    p = prims.pad.meta(a, 0.0, (1, 0, 0), (1, 0, 0), (0, 0, 1))
    assert p.sizes == (s0 + 2, s1, 5)
    mm = prims.extern.mm.meta(_sym_meta((s0, 8)), _sym_meta((8, s1)))
    assert mm.sizes == (s0, s1) and mm.strides == (s1, 1)


def test_no_int_on_symbolic_sizes_in_conv():
    x = _sym_meta((s0, 3, s1, s1))
    out = prims.extern.convolution.meta(x, _sym_meta((4, 3, 3, 3)), None, [2, 2], [1, 1], [1, 1],
                                        False, [0, 0], 1)  # fmt: skip
    size = out.sizes[2]
    assert size.free_symbols == {s1}
    assert int(size.subs(s1, 9)) == 5
