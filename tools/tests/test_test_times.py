"""tools/test_times.py: Bazel's test summary and query output turned into shares of the timeout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import test_times  # noqa: E402

LOG = """\
INFO: Build completed, 1 test FAILED, 4 total actions
//ir:test_codec                                                          PASSED in 2.1s
//inductor:test_inductor_opdb                                            PASSED in 120.0s
  Stats over 8 runs: max = 160.5s, min = 30.0s, avg = 90.0s, dev = 20.0s
//primtorch:test_prims                                          (cached) PASSED in 40.0s
//bench:test_smoke                                                      TIMEOUT in 900.1s
//tests:test_flaky                                         FAILED in 1 out of 2 in 3.0s

Executed 4 out of 5 tests: 4 tests pass and 1 fails locally.
"""

QUERY = """<?xml version="1.1" encoding="UTF-8" standalone="no"?>
<query version="2">
  <rule class="py_test" location="x" name="//ir:test_codec">
    <string name="size" value="small"/>
  </rule>
  <rule class="py_test" location="x" name="//inductor:test_inductor_opdb">
    <int name="shard_count" value="8"/>
  </rule>
  <rule class="py_test" location="x" name="//primtorch:test_prims"/>
  <rule class="py_test" location="x" name="//bench:test_smoke">
    <string name="size" value="large"/>
    <string name="timeout" value="long"/>
  </rule>
</query>
"""


def test_summary_lines_and_slowest_shard():
    times = test_times.parse_log(LOG)
    assert times["//ir:test_codec"] == ("PASSED", 2.1)
    assert times["//inductor:test_inductor_opdb"] == ("PASSED", 160.5)  # the slowest shard
    assert times["//primtorch:test_prims"] == ("PASSED", 40.0)
    assert times["//bench:test_smoke"] == ("TIMEOUT", 900.1)
    assert times["//tests:test_flaky"] == ("FAILED", 3.0)


def test_timeouts_from_timeout_then_size():
    targets = test_times.parse_query(QUERY)
    assert targets["//ir:test_codec"] == (60, 1)
    assert targets["//inductor:test_inductor_opdb"] == (300, 8)
    assert targets["//primtorch:test_prims"] == (300, 1)
    assert targets["//bench:test_smoke"] == (900, 1)


def test_report_orders_by_share_and_flags_above_half():
    lines, over = test_times.report(test_times.parse_log(LOG), test_times.parse_query(QUERY), top=3)
    assert len(lines) == 4  # header and three rows
    assert lines[1].startswith("//bench:test_smoke") and "100%" in lines[1]
    assert lines[2].startswith("//inductor:test_inductor_opdb (8 shards)") and "54%" in lines[2]
    assert over == ["//bench:test_smoke", "//inductor:test_inductor_opdb"]


def test_main_exit_status(tmp_path, capsys):
    log, query = tmp_path / "log", tmp_path / "q.xml"
    log.write_text(LOG)
    query.write_text(QUERY)
    assert test_times.main([str(log), "--query-file", str(query)]) == 0
    assert test_times.main([str(log), "--query-file", str(query), "--strict"]) == 1
    assert "above half of their timeout" in capsys.readouterr().out
