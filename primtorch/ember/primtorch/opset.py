"""The opset golden: `python -m ember.primtorch.opset --write` pins the prim vocabulary.

The golden file lives in ember.ir (`ir/ember/ir/golden/opset_v<N>.json`); a test compares the
registered vocabulary with it and asks for an opset version bump when they differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ember.ir import ops

from . import prims  # noqa: F401  (registers every prim and extern op)


def snapshot() -> dict:
    """The vocabulary as registered now, in the golden file's form."""
    return json.loads(json.dumps(ops.opset_snapshot()))


def write_golden() -> Path:
    """Write the golden opset file for the current opset version."""
    path = ops.GOLDEN_OPSET
    path.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    return path


def diff_golden() -> list[str]:
    """Human-readable differences between the registered vocabulary and the golden file."""
    if not ops.GOLDEN_OPSET.exists():
        return [f"no golden opset file {ops.GOLDEN_OPSET}"]
    golden, current = ops.golden_opset(), snapshot()
    lines = []
    if golden.get("opset_version") != current["opset_version"]:
        lines.append(f"opset_version {golden.get('opset_version')} != {current['opset_version']}")
    g_ops, c_ops = golden.get("ops", {}), current["ops"]
    lines += [f"added: {n}" for n in sorted(set(c_ops) - set(g_ops))]
    lines += [f"removed: {n}" for n in sorted(set(g_ops) - set(c_ops))]
    lines += [f"changed: {n}" for n in sorted(set(g_ops) & set(c_ops)) if g_ops[n] != c_ops[n]]
    return lines


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(write_golden())
    else:
        problems = diff_golden()
        print("\n".join(problems) or f"opset v{ops.OPSET_VERSION} matches {ops.GOLDEN_OPSET.name}")
        sys.exit(1 if problems else 0)
