"""Reads a `bazel test` log and prints the slowest test targets with their share of the timeout.

`.ci/run` calls it after the test run: a target that takes more than half of its timeout on CI's
2-core machine would time out on a slower newcomer's, so such targets are flagged (and the exit
status says so with --strict). Timeouts come from each target's `timeout` attribute, else from its
`size`, as Bazel assigns them; a sharded target is judged by its slowest shard.

    python tools/test_times.py LOG [--top 10] [--strict] [--query-file FILE]

--query-file reads `bazel query --output=xml 'tests(//...)'` from a file instead of running Bazel.
"""

import argparse
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

# Bazel's defaults: the timeout of each `timeout` value, and the timeout each `size` implies.
TIMEOUTS = {"short": 60, "moderate": 300, "long": 900, "eternal": 3600}
SIZE_TIMEOUT = {"small": "short", "medium": "moderate", "large": "long", "enormous": "eternal"}

_SUMMARY = re.compile(r"^(?P<label>(//|@)\S+)\s+(\(cached\) )?(?P<status>[A-Z][A-Z ]*?)\s+in\s+"
                      r"(?:\d+ out of \d+ in )?(?P<secs>[0-9.]+)s\s*$")
_STATS = re.compile(r"^\s+Stats over \d+ runs: max = (?P<max>[0-9.]+)s")


def parse_log(text):
    """{label: (status, seconds)} from Bazel's test summary; sharded targets take the slowest
    shard (the 'Stats over N runs: max = ...' line under them)."""
    times, last = {}, None
    for line in text.splitlines():
        m = _SUMMARY.match(line)
        if m:
            last = m["label"]
            times[last] = (m["status"], float(m["secs"]))
            continue
        s = _STATS.match(line)
        if s and last is not None:
            times[last] = (times[last][0], float(s["max"]))
        elif line and not line[0].isspace():
            last = None
    return times


def parse_query(xml_text):
    """{label: (timeout seconds, shard count)} from `bazel query --output=xml`."""
    targets = {}
    for rule in ET.fromstring(xml_text).iter("rule"):
        attrs = {a.get("name"): a.get("value") for a in rule if a.get("name")}
        timeout = attrs.get("timeout")
        if timeout not in TIMEOUTS:
            timeout = SIZE_TIMEOUT.get(attrs.get("size") or "medium", "moderate")
        shards = int(attrs.get("shard_count") or 0)
        targets[rule.get("name")] = (TIMEOUTS[timeout], max(shards, 1))
    return targets


def query_targets():
    """Runs Bazel's query over every test target (no build, seconds)."""
    out = subprocess.run(["bazel", "query", "--output=xml", "tests(//...)"], check=True,
                         capture_output=True, text=True).stdout
    return parse_query(out)


def report(times, targets, top=10):
    """The table's lines, slowest share of timeout first, and the labels above half of it."""
    rows = []
    for label, (status, secs) in times.items():
        timeout, shards = targets.get(label, (TIMEOUTS["moderate"], 1))
        rows.append((secs / timeout, label, status, secs, timeout, shards))
    rows.sort(reverse=True)
    lines = [f"{'target':<58} {'status':<8} {'time':>8} {'timeout':>8} {'share':>6}"]
    for share, label, status, secs, timeout, shards in rows[:top]:
        name = label + (f" ({shards} shards)" if shards > 1 else "")
        lines.append(f"{name:<58} {status:<8} {secs:>7.1f}s {timeout:>7d}s {share:>5.0%}")
    over = [label for share, label, *_ in rows if share > 0.5]
    return lines, over


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--strict", action="store_true", help="exit 1 if a target is above half")
    ap.add_argument("--query-file")
    args = ap.parse_args(argv)
    with open(args.log, errors="replace") as f:
        times = parse_log(f.read())
    if not times:
        print("test_times: no test summary in the log")
        return 0
    if args.query_file:
        with open(args.query_file) as f:
            targets = parse_query(f.read())
    else:
        try:
            targets = query_targets()
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"test_times: bazel query failed ({e}); assuming the 'moderate' timeout")
            targets = {}
    lines, over = report(times, targets, args.top)
    print(f"The {min(args.top, len(times))} slowest of {len(times)} test targets "
          "(a sharded target: its slowest shard), by share of their timeout:")
    print("\n".join(lines))
    if over:
        print(f"above half of their timeout: {', '.join(over)}")
        return 1 if args.strict else 0
    print("every target is within half of its timeout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
