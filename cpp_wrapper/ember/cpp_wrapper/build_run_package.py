"""Build the standalone `run_package` program without Bazel.

    python -m ember.cpp_wrapper.build_run_package OUT

OUT is a directory (the program is written as OUT/run_package) or a file path. The build goes
through the compiler driver's configuration and cache (ember.ir.toolchain); the program links the
runtime statically and needs neither libtorch nor libpython.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Sequence

from ._build import build_run_package, compile_program


def install_run_package(out: str | Path) -> Path:
    """Build (or reuse) run_package and copy it to `out`; returns the program's path."""
    into_dir = Path(out).is_dir() or str(out).endswith("/")  # Path() drops a trailing "/"
    target = Path(out) / "run_package" if into_dir else Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build_run_package(), target)
    return target


def build_program(name: str, sources: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Compile a C++ program that uses ember_runtime.h, linked with the runtime statically (no
    libtorch, no libpython), through the compiler driver's compiler, flags and cache; copied to
    `out` (a directory or a file path) when given. Returns the program's path."""
    built = compile_program(name, [Path(s) for s in sources])
    if out is None:
        return built
    into_dir = Path(out).is_dir() or str(out).endswith("/")  # Path() drops a trailing "/"
    target = Path(out) / name if into_dir else Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ember.cpp_wrapper.build_run_package OUT", file=sys.stderr)
        return 2
    print(install_run_package(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
