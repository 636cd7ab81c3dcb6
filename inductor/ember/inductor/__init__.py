"""ember.inductor: loop-level IR, fusion and Triton/C++ code generation."""

from ember.ir import component_version, require

require("inductor", reads=(1,), writes=1)
__version__ = component_version("inductor", __file__)

from . import metrics
from .config import config
from .pipeline import CompiledGraph, compile_fx, compile_prims

BACKENDS = {"inductor": compile_fx}

__all__ = ["BACKENDS", "CompiledGraph", "compile_fx", "compile_prims", "config", "metrics"]
