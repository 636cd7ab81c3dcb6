"""The schema as a whole: its classes, and the golden copy that pins them per IR version."""

from __future__ import annotations

import json
from pathlib import Path

from . import artifact, graph, ops  # noqa: F401  (importing registers their schema classes)
from .codec import describe_schema, schema_class
from .meta import TensorMeta
from .symbols import SymbolSpec
from .version import IR_VERSION

schema_class(TensorMeta)
schema_class(SymbolSpec)

GOLDEN_DIR = Path(__file__).with_name("golden")


def golden_path(version: int = IR_VERSION) -> Path:
    return GOLDEN_DIR / f"schema_v{version}.json"


def current_schema() -> dict:
    """The schema the code defines now, in the golden file's form."""
    return {"ir_version": IR_VERSION, "classes": describe_schema()}


def write_golden() -> Path:
    """Write the golden copy for the current version (only for a new, unreleased version)."""
    path = golden_path()
    path.write_text(json.dumps(current_schema(), indent=1, sort_keys=True) + "\n")
    return path


def check_golden() -> None:
    """Raise when the code's schema differs from the golden copy of its version."""
    path = golden_path()
    if not path.exists():
        raise AssertionError(f"no golden schema for IR version {IR_VERSION}: {path}")
    golden = json.loads(path.read_text())
    if golden != current_schema():
        raise AssertionError(
            f"the IR schema differs from its golden copy {path.name} while IR_VERSION is still "
            f"{IR_VERSION}: bump ember.ir.version.IR_VERSION, keep reading the old version, and "
            "write the new golden with `python -m ember.ir.schema --write`"
        )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        print(write_golden())
    else:
        check_golden()
        print(f"IR schema v{IR_VERSION} matches {golden_path().name}")
