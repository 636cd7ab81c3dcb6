"""ember.cpp_wrapper: the C++ runtime and wrapper that launch compiled kernels without Python."""

from ember.ir import component_version, require

require("cpp_wrapper", reads=(1,), writes=1)
__version__ = component_version("cpp_wrapper", __file__)

from .build_run_package import build_program, install_run_package  # noqa: E402
from .codegen import generate_wrapper  # noqa: E402
from .config import config  # noqa: E402
from .decode import (decode_step_artifact, donate_index_puts, generate,  # noqa: E402
                     package_decode_step, run_count)
from .errors import EmberRuntimeError, UnsupportedArtifactError  # noqa: E402
from .model import CompiledModel, build_model_library, freeze_inputs, load_artifact, load_package  # noqa: E402
from .package import package  # noqa: E402

__all__ = [
    "CompiledModel",
    "EmberRuntimeError",
    "UnsupportedArtifactError",
    "build_model_library",
    "build_program",
    "config",
    "decode_step_artifact",
    "donate_index_puts",
    "freeze_inputs",
    "generate",
    "generate_wrapper",
    "install_run_package",
    "load_artifact",
    "load_package",
    "package",
    "package_decode_step",
    "run_count",
]
