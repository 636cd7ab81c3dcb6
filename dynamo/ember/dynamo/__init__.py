"""ember.dynamo: PEP 523 graph capture of Python programs, and the ember.compile front door."""

from ember.ir import component_version, require

require("dynamo", reads=(1,), writes=1)
__version__ = component_version("dynamo", __file__)

from .api import (ExplainOutput, OptimizedModule, compile, disable, explain, export,  # noqa: E402
                  reset)
from .backends import CompileCounter, list_backends, lookup_backend, register_backend  # noqa: E402
from .config import config  # noqa: E402
from .dynamic import Dim, mark_dynamic  # noqa: E402
from .exc import GraphBreakError, Unsupported  # noqa: E402
from .exported import ExportedProgram, TensorSpec, load_exported  # noqa: E402
from .quantize import dequantize_weights, quantize_weights  # noqa: E402
from .symbolic import SpecializationError  # noqa: E402
from ember.ir.native_kernels import register_cpp_kernel  # noqa: E402  (ember.register_cpp_kernel)

__all__ = ["CompileCounter", "Dim", "ExplainOutput", "ExportedProgram", "GraphBreakError",
           "OptimizedModule", "SpecializationError", "TensorSpec", "Unsupported", "compile",
           "config", "dequantize_weights", "disable", "explain", "export", "list_backends",
           "load_exported", "lookup_backend", "mark_dynamic", "quantize_weights",
           "register_backend", "register_cpp_kernel", "reset"]  # fmt: skip
