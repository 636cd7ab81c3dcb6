"""Errors raised while capturing a frame."""


class Unsupported(Exception):
    """A construct the symbolic interpreter does not handle; `where` is the user's file:line."""

    def __init__(self, msg: str, where: str = ""):
        super().__init__(msg)
        self.msg = msg
        self.where = where

    def __str__(self):
        return f"{self.msg} (at {self.where})" if self.where else self.msg


class PyExc(Unsupported):
    """A Python exception the traced code raises, known at trace time (a missing dict key, an
    explicit `raise`). Handlers in the exception tables of the traced frames may catch it; if
    none does, it is unsupported like any other construct (the frame breaks or runs eagerly)."""

    def __init__(self, exc_vt, msg: str = ""):
        super().__init__(msg or f"raising {exc_vt.cls.__name__}")
        self.exc_vt = exc_vt


class AttrMissing(PyExc):
    """getattr found no attribute (hasattr answers False, getattr returns its default)."""

    def __init__(self, msg: str, exc_vt=None):
        from .variables import ExcVT

        super().__init__(exc_vt or ExcVT(AttributeError, []), msg)


class GraphBreakError(RuntimeError):
    """Raised under fullgraph=True when a graph break would be needed."""


class GenericFallback(Exception):
    """Internal: a frame traced for any module instance (convert.CodeState.generic) read
    something of an instance that no guard covers (its identity, a value computed by a
    descriptor): the frame is traced again for this instance, and the code never generically.
    (Not an Unsupported: it must not turn into a graph break.)"""


class RestartAnalysis(Exception):
    """Internal: translate the frame again, breaking the graph at root instruction `index`."""

    def __init__(self, index: int, reason: Unsupported):
        super().__init__(str(reason))
        self.index = index
        self.reason = reason
