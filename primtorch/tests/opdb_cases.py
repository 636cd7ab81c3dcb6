"""op_db cases for the sharded tests (test_opdb_shard{0..3}.py) and their known-failure data.

A case is (OpInfo id, dtype name); shard k holds the OpInfos whose op_db index is k mod SHARDS.
Each case runs at most MAX_SAMPLES samples (evenly spaced over the OpInfo's list) so that the
four shards together stay within CI's budget; `python -m ember.primtorch.coverage` runs them all.

`opdb_known_failures.json` lists the cases that fail today, with the reason. A case on the list
that passes fails its test (take it off the list), and so does a new failure. Regenerate with
`python primtorch/tests/opdb_cases.py --write` after fixing decompositions.
"""

from __future__ import annotations

import json
import sys
import warnings
from functools import lru_cache
from pathlib import Path

SHARDS = 4
MAX_SAMPLES = 8
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
KNOWN_FAILURES = Path(__file__).with_name("opdb_known_failures.json")


@lru_cache(maxsize=None)
def _ops():
    from ember.primtorch import coverage

    return coverage.load_op_db()


def cases(shard: int) -> list[tuple[str, str]]:
    """The (OpInfo id, dtype) cases of one shard."""
    from ember.primtorch import coverage

    out = []
    for i, op in enumerate(_ops()):
        if i % SHARDS != shard or coverage.classify(op):
            continue
        supported = set(op.supported_dtypes("cpu"))
        for name in DTYPES:
            if coverage.DTYPES[name] in supported:
                out.append((coverage.opinfo_id(op), name))
    return out


def _op(opinfo: str):
    from ember.primtorch import coverage

    matches = [op for op in _ops() if coverage.opinfo_id(op) == opinfo]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} OpInfos are called {opinfo!r}")
    return matches[0]


def run_case(opinfo: str, dtype: str):
    """None when the case passes, else the reason it fails."""
    from ember.primtorch import coverage

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return coverage.evaluate(_op(opinfo), coverage.DTYPES[dtype], MAX_SAMPLES)


def known_failures() -> dict:
    data = json.loads(KNOWN_FAILURES.read_text())
    return data["failures"]


def check_case(opinfo: str, dtype: str) -> None:
    """Assert that the case behaves as the known-failure data says."""
    key = f"{opinfo}:{dtype}"
    known = known_failures()
    why = run_case(opinfo, dtype)
    if key in known:
        assert why is not None, f"{key} now passes: remove it from {KNOWN_FAILURES.name}"
    else:
        assert why is None, f"{key} fails (not a known failure): {why}"


def check_rate(shard: int) -> None:
    """The shard's pass rate (cases and known failures) is at its recorded level."""
    data = json.loads(KNOWN_FAILURES.read_text())
    all_cases = [f"{o}:{d}" for o, d in cases(shard)]
    failing = sum(1 for c in all_cases if c in data["failures"])
    rate = 1 - failing / max(len(all_cases), 1)
    floor = data["min_pass_rate"][str(shard)]
    assert rate >= floor, f"shard {shard} pass rate {rate:.3f} fell below {floor:.3f}"
    stale = [k for k in data["failures"] if _shard_of(k) == shard and k not in all_cases]
    assert not stale, f"known failures name cases that no longer exist: {stale}"


def _shard_of(key: str) -> int:
    from ember.primtorch import coverage

    opinfo = key.rsplit(":", 1)[0]
    for i, op in enumerate(_ops()):
        if coverage.opinfo_id(op) == opinfo:
            return i % SHARDS
    return -1


def write() -> None:
    """Run every shard and record today's failures and pass rates."""
    failures, rates = {}, {}
    for shard in range(SHARDS):
        shard_cases = cases(shard)
        failed = 0
        for opinfo, dtype in shard_cases:
            why = run_case(opinfo, dtype)
            if why:
                failures[f"{opinfo}:{dtype}"] = why[:200]
                failed += 1
            print(f"{opinfo}:{dtype} {why or 'pass'}"[:160], file=sys.stderr)
        rates[str(shard)] = round(1 - failed / max(len(shard_cases), 1) - 0.0005, 3)
    KNOWN_FAILURES.write_text(
        json.dumps(
            {"max_samples": MAX_SAMPLES, "min_pass_rate": rates, "failures": failures},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
