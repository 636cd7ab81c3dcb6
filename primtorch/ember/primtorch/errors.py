"""The errors the tracer raises."""


class NotDecomposableError(NotImplementedError):
    """An ATen op with no decomposition to prims, not kept and not extern."""


class DataDependentError(RuntimeError):
    """The traced program depends on tensor data (.item(), data-dependent output sizes)."""


class TraceError(RuntimeError):
    """The program does something the tracer cannot record faithfully."""


class LentInputWritten(RuntimeError):
    """The traced program would write a tensor the tracer was lent (`Tracer.lend`): the caller's
    own, traced without a copy; nothing was written (trace again on a copy)."""


class MetaMismatchError(AssertionError):
    """A meta rule or decomposition disagrees with the real computation (check mode)."""
