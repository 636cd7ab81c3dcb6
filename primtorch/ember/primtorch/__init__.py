"""ember.primtorch: the primitive operator set and decompositions of ATen into it."""

from ember.ir import component_version, require

require("primtorch", reads=(1,), writes=1)
__version__ = component_version("primtorch", __file__)

from . import prims, utils  # noqa: E402
from .config import config  # noqa: E402
from .errors import (  # noqa: E402
    DataDependentError, LentInputWritten, MetaMismatchError, NotDecomposableError, TraceError,
)  # fmt: skip
from .prims.core import is_extern, is_prim  # noqa: E402
from .trace import Tracer, trace_to_prims  # noqa: E402
from .extern_rewrite import decompose_externs  # noqa: E402


def __getattr__(name):
    # The decomposition table imports prims, so it is loaded on first use, not at import.
    if name == "DECOMPOSITIONS":
        from .decomp import DECOMPOSITIONS

        return DECOMPOSITIONS
    raise AttributeError(f"module 'ember.primtorch' has no attribute {name!r}")


__all__ = [
    "DECOMPOSITIONS", "DataDependentError", "MetaMismatchError", "NotDecomposableError",
    "TraceError", "Tracer", "config", "decompose_externs", "is_extern", "is_prim", "prims",
    "trace_to_prims", "utils",
]  # fmt: skip
