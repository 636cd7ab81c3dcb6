"""Build the ember_server example without Bazel, through Ember's compiler driver.

    python examples/server/build_server.py [OUT]      # with PYTHONPATH=ir:cpp_wrapper

The program links the runtime statically (no libtorch, no libpython); OUT is a directory or a file
path (default: print the path of the cached build).
"""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("server.cc")


def build_server(out: str | Path | None = None) -> Path:
    """The ember_server program, compiled (or reused from the driver's cache)."""
    from ember.cpp_wrapper import build_program

    return build_program("ember_server", [SOURCE], out)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: python examples/server/build_server.py [OUT]")
    print(build_server(sys.argv[1] if len(sys.argv) == 2 else None))
