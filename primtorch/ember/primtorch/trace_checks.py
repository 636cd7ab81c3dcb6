"""Check mode: meta rules against real outputs, decompositions against eager."""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils import _pytree as pytree

from ember.ir import TensorMeta

from .errors import MetaMismatchError


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)} strides {list(t.stride())}"


def meta_mismatch(meta: TensorMeta, t: torch.Tensor, strides: bool = True) -> Optional[str]:
    """Why `meta` does not describe `t` (dtype, sizes, strides of dims of size > 1), or None."""
    if meta.dtype != t.dtype:
        return f"dtype {meta.dtype} vs {t.dtype}"
    if len(meta.sizes) != t.dim():
        return f"sizes {meta.sizes} vs {tuple(t.shape)}"
    for m, r in zip(meta.sizes, t.shape):
        if not m.free_symbols and int(m) != r:
            return f"sizes {meta.sizes} vs {tuple(t.shape)}"
    if strides:
        for m, s, r in zip(meta.strides, t.shape, t.stride()):
            if s > 1 and not m.free_symbols and int(m) != r:
                return f"strides {meta.strides} vs {t.stride()}"
    return None


def check_prim_output(prim, meta, out) -> None:
    """Raise MetaMismatchError when the meta rule disagrees with the reference's output."""
    metas = meta if isinstance(meta, (tuple, list)) else (meta,)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for m, t in zip(metas, outs):
        if isinstance(t, torch.Tensor) and isinstance(m, TensorMeta):
            why = meta_mismatch(m, t)
            if why:
                raise MetaMismatchError(f"{prim}: meta rule says {why} ({_describe(t)})")


_NO_VALUE_CHECK = ("empty", "new_empty", "empty_like", "empty_strided", "empty_permuted")


def _skip_values(func) -> bool:
    return (
        torch.Tag.nondeterministic_seeded in func.tags
        or func.overloadpacket.__name__ in _NO_VALUE_CHECK
    )


def _private_copy(x):
    if not isinstance(x, torch.Tensor):
        return x
    storage = x.untyped_storage().clone()
    out = torch.empty(0, dtype=x.dtype, device=x.device)
    return out.set_(storage, x.storage_offset(), x.size(), x.stride())


def check_decomposition(func, args, kwargs, out, strict_strides: bool) -> Optional[str]:
    """Compare a decomposition's result with eager; raise on dtype, shape or value differences,
    return a note (or raise when strict) on stride differences."""
    # Eager runs on private copies: some ops write arguments their schema does not mark as written
    # (native_batch_norm's running stats), and the real run has done that already.
    args, kwargs = pytree.tree_map(_private_copy, (args, kwargs))
    expected = func(*args, **kwargs)
    got_flat, exp_flat = pytree.tree_leaves(out), pytree.tree_leaves(expected)
    if len(got_flat) != len(exp_flat):
        raise MetaMismatchError(
            f"decomposition of {func}: {len(got_flat)} outputs, eager {len(exp_flat)}"
        )
    note = None
    for i, (g, e) in enumerate(zip(got_flat, exp_flat)):
        if not isinstance(e, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.dtype != e.dtype or g.shape != e.shape:
            got = _describe(g) if isinstance(g, torch.Tensor) else repr(g)
            raise MetaMismatchError(
                f"decomposition of {func} output {i}: {got}, eager {_describe(e)}"
            )
        if not _skip_values(func):
            try:
                torch.testing.assert_close(g, e, equal_nan=True, check_stride=False)
            except AssertionError as err:
                raise MetaMismatchError(f"decomposition of {func} output {i}: {err}") from None
        if meta_mismatch(TensorMeta.from_tensor(e), g) is not None:
            note = f"decomposition of {func} output {i}: {_describe(g)}, eager {_describe(e)}"
            if strict_strides:
                raise MetaMismatchError(note)
    return note
