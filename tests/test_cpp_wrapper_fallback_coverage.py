"""The prims ember.inductor has no lowering for reach a CPU artifact as calls of their reference
(an extern step the C++ wrapper cannot run): each one is listed here with the reason, so a new
op without a lowering fails this test and a new lowering must take its op off the list.

Extern ops proper are held to C++ runtime kernels by cpp_wrapper/tests/test_extern_coverage.py.
The fix for a prim below is a lowering in inductor (generated code), never a runtime kernel.
"""

import ember.primtorch  # noqa: F401  (defines the vocabulary)
from ember.inductor.lowering import LOWERINGS
from ember.ir import vocabulary

from ember.cpp_wrapper import extern_ops

_SPECIAL = "a special function without a lowering yet (its reference runs under the Python wrapper)"
_COMPLEX = "complex dtypes and dtype reinterpretation: the generated kernels have no complex type"
_SCATTER = "an indexed write: wants a generated scatter kernel in inductor"
_POINTWISE = "a pointwise op without a lowering yet"

NO_LOWERING = {
    **{f"prims.{n}": _SPECIAL for n in (
        "bessel_j0", "bessel_j1", "digamma", "erfcx", "i0", "i0e", "i1", "i1e", "igamma",
        "igammac", "ndtri", "polygamma", "spherical_bessel_j0", "zeta")},  # fmt: skip
    **{f"prims.{n}": _COMPLEX for n in (
        "complex", "conj_physical", "imag", "real", "view_element_type")},  # fmt: skip
    **{f"prims.{n}": _SCATTER for n in ("index_put", "scatter", "scatter_add", "scatter_reduce")},
    **{f"prims.{n}": _POINTWISE for n in (
        "copysign", "fmax", "fmin", "gcd", "lcm", "nextafter", "xor_sum")},  # fmt: skip
    "prims.device_put": "a copy between devices: a CPU artifact has one device",
    "control.cond": "control flow compiles as subgraphs (compile_with_control_flow); the C++ "
    "wrapper has no control-flow steps",
    "control.map": "control flow (as cond)",
    "control.while_loop": "control flow (as cond)",
}


def _called_by_reference() -> set[str]:
    """Prims with no lowering, or with one that lowers some calls only (`partial`: the others
    call the reference)."""
    vocab = vocabulary()
    return {name for name, op in vocab.items() if "extern" not in op.tags and (
        name not in LOWERINGS or getattr(LOWERINGS[name], "partial", False))}  # fmt: skip


def test_every_prim_without_a_lowering_is_listed_with_a_reason():
    unlisted = _called_by_reference() - set(NO_LOWERING)
    assert not unlisted, (
        f"ops inductor would call by reference in a CPU artifact, which the C++ wrapper cannot "
        f"run: {sorted(unlisted)}; give them a lowering in inductor (or list them here, saying why)"
    )


def test_the_list_only_shrinks():
    lowered = set(NO_LOWERING) - _called_by_reference()
    assert not lowered, f"lowered (or gone) now: take {sorted(lowered)} off NO_LOWERING"
    assert not set(NO_LOWERING) & set(extern_ops.EXTERN_OPS)
