"""Builds (once, cached by the compiler driver) and becomes the `ember.cpp_wrapper._C` extension.

Importing this module compiles csrc/python/ext.cc with the runtime sources through
`ember.ir.toolchain.build_extension` and replaces itself in sys.modules with the extension, so
`import ember.cpp_wrapper._C` yields the native module.
"""

import sys

from ember.ir import toolchain

from . import _build

_placeholder = sys.modules.pop(__name__)
try:
    _ext = toolchain.build_extension(
        __name__,
        [_build.EXTENSION_SOURCE, *_build.RUNTIME_SOURCES],
        binding="nanobind",
        include_dirs=_build.include_dirs(),
        defines=_build.runtime_defines(),
        cflags=["-fopenmp"],
    )
finally:
    if __name__ not in sys.modules:
        sys.modules[__name__] = _placeholder
