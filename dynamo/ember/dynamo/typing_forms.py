"""Subscripts of typing forms (`Optional[X]`, `Dict[str, List[int]]`) met in traced code: run-time
annotations (`torch.jit.annotate`, `self.x: Optional[T] = v`) evaluated from guarded forms."""

from __future__ import annotations

from . import variables as V
from .exc import PyExc, Unsupported


def is_typing_form(obj) -> bool:
    """`Optional`, `Union`, `List`, `Dict[str, int]`...: objects of the typing module that
    build type annotations when subscripted."""
    return type(obj).__module__ == "typing" and hasattr(obj, "__getitem__")


def _annotation_part(tx, vt):
    """The real value of a subscript's part in a type annotation (a class, a string, None, a
    typing form or a tuple of them), or Unsupported."""
    if isinstance(vt, V.ClassVT):
        return vt.cls
    if isinstance(vt, V.ObjectVT) and (is_typing_form(vt.obj) or isinstance(vt.obj, type)):
        if vt.source is not None:
            tx.output.guards.add("ID", vt.source, vt.obj)
        return vt.obj
    if isinstance(vt, V.ListVT) and vt.is_tuple:
        return tuple(_annotation_part(tx, i) for i in vt.items)
    if isinstance(vt, V.ConstVT) and (vt.value is None or isinstance(vt.value, str)):
        return vt.value
    raise Unsupported(f"a type annotation over {type(vt).__name__}")


def typing_subscript(tx, obj, key):
    """`Optional[X]`, `Dict[str, Tensor]`: evaluated now (a pure function of guarded objects),
    not traced through typing's internals (they format messages from the form itself)."""
    form = _annotation_part(tx, obj)
    try:
        return V.ObjectVT(form[_annotation_part(tx, key)])
    except TypeError as e:
        raise PyExc(V.ExcVT(TypeError, [V.ConstVT(str(e))]), f"TypeError: {e}") from None
