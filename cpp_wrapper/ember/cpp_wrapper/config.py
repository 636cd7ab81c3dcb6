"""ember.cpp_wrapper's configuration, in one place."""

from __future__ import annotations

import dataclasses
import os


def _env_list(name: str) -> list[str]:
    return [p for p in os.environ.get(name, "").split(os.pathsep) if p]


@dataclasses.dataclass
class CppWrapperConfig:
    """Settings of the C++ wrapper; environment variables are documented overrides.

    kernel_include_dirs / kernel_defines: extra -I and -D for compiling an artifact's C++ kernels,
    for kernels that include headers outside the artifact (EMBER_KERNEL_INCLUDE_DIRS, separated by
    os.pathsep). restride_inputs: the Python callable copies an input whose strides differ from the
    compiled ones (as the Python wrapper does) instead of letting the runtime reject it.
    """

    kernel_include_dirs: list[str] = dataclasses.field(
        default_factory=lambda: _env_list("EMBER_KERNEL_INCLUDE_DIRS")
    )
    kernel_defines: list[str] = dataclasses.field(default_factory=list)
    restride_inputs: bool = True


config = CppWrapperConfig()
