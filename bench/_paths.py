"""Puts every Ember component and bench/ itself on sys.path, so `python bench/run.py` works from a
plain checkout (the same job the root conftest.py does for pytest)."""

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
COMPONENTS = ("ir", "primtorch", "aot_autograd", "dynamo", "inductor", "cpp_wrapper")


def install():
    """Idempotently prepend the component dirs and bench/ to sys.path."""
    for path in [BENCH_DIR] + [ROOT / c for c in COMPONENTS]:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


install()
