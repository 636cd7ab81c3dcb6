"""ember.cpp_wrapper's configuration, in one place."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional


def _env_flag(name: str) -> Optional[bool]:
    value = os.environ.get(name)
    return None if value in (None, "") else value not in ("0", "false", "False")


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
    conv_as_matmul: Optional[bool] = dataclasses.field(
        default_factory=lambda: _env_flag("EMBER_CONV_AS_MATMUL")
    )

    def decomposed_externs(self, device: str) -> tuple[str, ...]:
        """The extern ops a package for `device` gets as generated code plus other externs:
        cumsum always (the runtime has no scan), convolution where the runtime has no kernel
        for it on `device` (or as conv_as_matmul says)."""
        on = self.conv_as_matmul
        if on is None:
            from .extern_ops import EXTERN_OPS  # the runtime's kernels per device

            on = device not in EXTERN_OPS["extern.convolution"].devices
        return ("extern.cumsum",) + (("extern.convolution",) if on else ())


config = CppWrapperConfig()
