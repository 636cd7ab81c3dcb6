"""bench/distributed.py on two CPU processes (gloo) with a tiny decoder: every configuration runs
and reports, the TP MLP block is one Ember graph matching eager, and the exposed-communication
arithmetic over kernel intervals is right."""

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

import distributed  # noqa: E402


def test_exposed_time_counts_only_uncovered_communication():
    # comm [0, 10) and [20, 30); compute covers [2, 5), [4, 8) and [25, 40)
    comm = [(20, 30), (0, 10)]
    compute = [(4, 8), (2, 5), (25, 40)]
    assert distributed.merge_intervals(compute) == [(2, 8), (25, 40)]
    assert distributed.exposed_time(comm, compute) == (10 - 6) + (10 - 5)
    assert distributed.exposed_time(comm, []) == 20
    assert distributed.exposed_time([(0, 4)], [(-1, 9)]) == 0


def test_tiny_run_on_cpu_reports_every_configuration(tmp_path):
    distributed.main(["--device", "cpu", "--tiny", "--amp", "none", "--parallel", "ddp",
                      "--backends", "eager,ember", "--steps", "1", "--warmup", "0",
                      "--profile-steps", "1", "--out", str(tmp_path)])  # fmt: skip
    data = json.loads((tmp_path / "results.json").read_text())["results"]
    assert set(data) == {"tp", "ddp:eager", "ddp:ember"}, data
    for name in ("ddp:eager", "ddp:ember"):
        r = data[name]
        assert "error" not in r and r["ranks_ok"] == 2 and r["step_ms"] > 0, r
        assert "note" in r["profile"], r  # no device kernels on the CPU
    ember = data["ddp:ember"]
    assert (ember["graphs"], ember["breaks"]) == (1, 0), ember
    assert ember["grad_vs_eager"]["rel"] < 1e-5, ember
    tp = data["tp"]
    assert "error" not in tp["eager"] and tp["ember"]["graphs"] == 1, tp
    assert tp["ember"]["breaks"] == 0 and tp["ember"]["fp32_counts"]["graphs"] == 1, tp
    for phase in ("fp32", "amp"):  # --amp none: both phases in float32
        for what in ("out", "x_grad", "grad"):
            assert tp["ember"][f"{phase}_{what}_rel"] < 1e-5, (phase, what, tp)
    assert "ddp:ember" in (tmp_path / "results.md").read_text()


def test_each_collective_counts_its_least_exposure_over_the_ranks():
    # rank 0 waits 6 units in its first all-reduce (it arrived first); rank 1 in its second
    rank0 = distributed.comm_spans([("ar", 0, 10), ("ar", 20, 24), ("ag", 30, 32)], [(0, 3)])
    rank1 = distributed.comm_spans([("ar", 6, 10), ("ag", 30, 33), ("ar", 14, 24)], [])
    assert rank0 == {"ar": [(10, 7), (4, 4)], "ag": [(2, 2)]}
    assert rank1 == {"ar": [(4, 4), (10, 10)], "ag": [(3, 3)]}
    assert distributed.matched_exposure([rank0, rank1]) == (4 + 4 + 2, 4 + 4 + 2)
    assert distributed.matched_exposure([rank0, {"ar": rank1["ar"]}]) is None  # unmatched
    assert distributed.matched_exposure([rank0, None]) is None
