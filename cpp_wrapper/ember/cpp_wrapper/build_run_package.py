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

from ._build import build_run_package


def install_run_package(out: str | Path) -> Path:
    """Build (or reuse) run_package and copy it to `out`; returns the program's path."""
    out = Path(out)
    target = out / "run_package" if out.is_dir() or str(out).endswith("/") else out
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build_run_package(), target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ember.cpp_wrapper.build_run_package OUT", file=sys.stderr)
        return 2
    print(install_run_package(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
