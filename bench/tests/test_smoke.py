"""The benchmark harness on the CPU: the cpu-core smoke subset end to end, its failure paths
(a backend that raises, returns wrong numbers, crashes its process, hangs) and merging parts.

Ember may be incomplete: its cells may fail, and that is recorded, not a test failure. What must
hold is the harness's own contract: every model appears under every backend, eager numbers are
positive, a failure carries its error, and output files exist.
"""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

import merge
import report
import run
import suites

STATUSES = {"ok", "failed", "timeout", "crashed", "inaccurate", "fallback", "skipped", "not run"}
QUIET = {"log": lambda *args: None, "chart": False, "iters": 2, "warmup": 1}


def _records(result):
    return {(r["model"], r["backend"]): r for r in result["records"]}


@pytest.mark.slow  # Ember's CPU compiles take a while on two cores
def test_cpu_smoke_subset(tmp_path):
    result = run.run_suite("cpu-core", tmp_path, smoke=True, model_timeout=240, **QUIET)
    assert (tmp_path / "results.md").is_file() and (tmp_path / "results.json").is_file()
    saved = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert saved["records"] == json.loads(json.dumps(result["records"], default=str))
    records = _records(result)
    smoke = suites.SUITES["cpu-core"].smoke
    assert result["backends"] == ["eager", "ember"]
    assert len(records) == len(smoke) * 2
    text = (tmp_path / "results.md").read_text()
    for model in smoke:
        assert model in text
        eager = records[(model, "eager")]
        assert eager["status"] == "ok", eager
        assert eager["latency_ms"] > 0 and eager["first_call_s"] > 0
        # the first call's peak is read apart from the timed calls' (RSS growth on the CPU)
        assert eager["first_peak_mem_mb"] is not None and eager["peak_mem_mb"] is not None
        assert eager["accuracy"]["max_abs"] == 0.0  # eager against its own reference
        ember = records[(model, "ember")]
        assert ember["status"] in STATUSES
        if ember["status"] == "ok":
            assert ember["latency_ms"] > 0 and ember["compile_cold_s"] > 0
        else:
            assert ember["error"], ember
    summary = result["summary"]
    assert summary["backends"]["eager"]["passed"] == len(smoke)
    assert "### Summary" in text and "pass rate" in text


def _run_selftests(tmp_path, backends, **kwargs):
    result = run.run_suite(
        "cpu-core", tmp_path, models=["small_gpt2"], backends=backends, **kwargs, **QUIET
    )
    records = _records(result)
    assert result["summary"]["backends"]["eager"]["passed"] == 1
    assert all(result["summary"]["backends"][b]["passed"] == 0 for b in backends)
    assert "### Failures" in (tmp_path / "results.md").read_text()
    return {b: records[("small_gpt2", b)] for b in ["eager"] + backends}


def test_failures_are_recorded_not_fatal(tmp_path):
    recs = _run_selftests(
        tmp_path, ["_selftest_raise", "_selftest_wrong", "_selftest_fallback", "_selftest_crash"]
    )
    assert {b: r["status"] for b, r in recs.items()} == {
        "eager": "ok",
        "_selftest_raise": "failed",
        "_selftest_wrong": "inaccurate",
        "_selftest_fallback": "fallback",
        "_selftest_crash": "crashed",
    }
    assert "self-test backend failed to compile" in recs["_selftest_raise"]["error"]
    assert "rmse" in recs["_selftest_wrong"]["error"]
    assert "captured no graph" in recs["_selftest_fallback"]["error"]
    assert "SIGKILL" in recs["_selftest_crash"]["error"]


@pytest.mark.slow
def test_hangs_time_out(tmp_path):
    # 15 s: enough for building the model and the eager reference on a loaded 2-core machine.
    recs = _run_selftests(
        tmp_path, ["_selftest_hang", "_selftest_stuck"], model_timeout=15, grace=2
    )
    assert {b: r["status"] for b, r in recs.items()} == {
        "eager": "ok",
        "_selftest_hang": "timeout",
        "_selftest_stuck": "timeout",
    }
    assert "timed out after 15 s" in recs["_selftest_hang"]["error"]
    assert "hard limit" in recs["_selftest_stuck"]["error"]


def test_in_process_mode_records_failures(tmp_path):
    result = run.run_suite(
        "cpu-core",
        tmp_path,
        models=["small_vit"],
        isolate="none",
        backends=["_selftest_raise"],
        **QUIET,
    )
    records = _records(result)
    assert records[("small_vit", "eager")]["status"] == "ok"
    assert records[("small_vit", "_selftest_raise")]["status"] == "failed"


def test_missing_package_is_skipped_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(run.model_registry, "missing_requirements", lambda spec: ["timm"])
    result = run.run_suite("cpu-core", tmp_path, models=["resnet18"], **QUIET)
    rec = _records(result)[("resnet18", "eager")]
    assert rec["status"] == "skipped" and "timm" in rec["error"]
    assert result["summary"]["counted"] == 0


def _fake_run(part, models, latency):
    records = []
    for m in models:
        records.append({"model": m, "backend": "eager", "status": "ok", "latency_ms": 2.0})
        records.append(
            {
                "model": m,
                "backend": "torch_compile",
                "status": "ok",
                "latency_ms": latency,
                "compile_cold_s": 10.0,
                "compile_warm_s": 1.0,
            }
        )
        records.append({"model": m, "backend": "ember", "status": "failed", "error": "boom"})
    return {
        "suite": "gpu-core",
        "mode": "infer-bf16",
        "device": "cuda",
        "part": part,
        "backends": ["eager", "torch_compile", "ember"],
        "models": models,
        "suite_models": list(suites.SUITES["gpu-core"].models),
        "unit": "ms",
        "timing": "t",
        "records": records,
        "notes": [],
        "elapsed_s": 1.0,
    }


def test_merge_orders_parts_and_summarises(tmp_path):
    models = list(suites.SUITES["gpu-core"].models[:4])
    parts = [
        _fake_run(f"{i}/2", suites.part_of(models, f"{i}/2"), 1.0 if i == 1 else 0.5)
        for i in (1, 2)
    ]
    for i, part in enumerate(parts):
        report.write(tmp_path / f"p{i}", [part], chart=False)
    assert (
        merge.main(
            [str(tmp_path / "p0"), str(tmp_path / "p1"), "--out", str(tmp_path / "m"), "--no-chart"]
        )
        == 0
    )
    merged = json.loads((tmp_path / "m" / "results.json").read_text())["runs"]
    assert len(merged) == 1 and merged[0]["models"] == models
    summary = merged[0]["summary"]
    assert summary["backends"]["ember"]["passed"] == 0 and summary["all_pass"] == []
    # torch.compile ran 2x and 4x faster on alternate models: geomean of its own passes is sqrt(8)
    assert summary["backends"]["torch_compile"]["geomean_speedup_own"] == pytest.approx(8**0.5)
    text = (tmp_path / "m" / "results.md").read_text()
    assert "failed: boom" in text and "| ember | 0/4 | 0% |" in text


def test_jobs_run_models_side_by_side(tmp_path):
    result = run.run_suite(
        "cpu-core", tmp_path, models=["small_gpt2", "small_bert"], backends=["eager"], jobs=2,
        **QUIET,
    )  # fmt: skip
    assert {(r["model"], r["status"]) for r in result["records"]} == {
        ("small_gpt2", "ok"),
        ("small_bert", "ok"),
    }
    assert result["jobs"] == 2
    assert "2 models at a time per device" in (tmp_path / "results.md").read_text()


def test_host_turns_share_one_lock_across_devices(tmp_path):
    """--turns host: every worker takes its timed turn on one host-wide lock (here two jobs on
    the CPU; on a multi-GPU host, the workers of every GPU)."""
    cache = tmp_path / "cache"
    result = run.run_suite(
        "cpu-core", tmp_path / "out", models=["small_gpt2", "small_bert"], backends=["eager"],
        jobs=2, turns="host", cache_dir=str(cache), **QUIET,
    )  # fmt: skip
    assert {r["status"] for r in result["records"]} == {"ok"}
    assert result["turns"] == "host"
    assert [p.name for p in cache.rglob("timing-*.lock")] == ["timing-host.lock"]


def test_timed_calls_take_turns(tmp_path, monkeypatch):
    import threading
    import time

    import turns

    monkeypatch.setenv("EMBER_BENCH_TIMING_LOCK", str(tmp_path / "timing.lock"))
    spans = []

    def timed(name):
        with turns.timing_turn():
            start = time.monotonic()
            time.sleep(0.2)
            spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=timed, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


_COUNTER = """
import os, sys, time
sys.path.insert(0, sys.argv[2])
import turns
turns.register()
n = 0
while True:
    n += 1
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # a reader never sees a half-written count
    time.sleep(0.01)
"""


def test_timed_phase_pauses_the_other_workers(tmp_path, monkeypatch):
    """A worker in its timed phase stops the other registered workers' groups, continues them
    after, and each stopped worker can subtract the pause from its compile times."""
    import subprocess
    import time

    import turns

    lock = tmp_path / "timing.lock"
    monkeypatch.setenv("EMBER_BENCH_TIMING_LOCK", str(lock))
    count = tmp_path / "count"
    child = subprocess.Popen(
        [sys.executable, "-c", _COUNTER, str(count), str(BENCH)],
        env={**__import__("os").environ, "EMBER_BENCH_TIMING_LOCK": str(lock)},
        start_new_session=True,
    )

    def read():
        return int(count.read_text()) if count.exists() else 0

    try:
        deadline = time.time() + 30
        while read() < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert (lock.parent / "timing.lock.workers" / str(child.pid)).exists()
        t0 = time.time()
        with turns.timing_turn():
            time.sleep(0.1)
            during = read()
            time.sleep(0.4)
            assert read() == during  # stopped: no progress while this phase times
        time.sleep(0.3)
        assert read() > during  # continued
        paused = turns.paused_seconds(t0, time.time(), pid=child.pid)
        assert 0.45 <= paused <= 1.0
        assert turns.paused_seconds(t0, time.time()) == 0.0  # this process was never stopped
    finally:
        turns.unregister(str(lock), child.pid)
        child.kill()
        child.wait()
    assert not (lock.parent / "timing.lock.workers" / str(child.pid)).exists()


def test_a_killed_holder_leaves_nobody_stopped(tmp_path):
    """resume_all (the runner, when a worker ends) continues the groups a dead holder stopped."""
    import os
    import signal
    import subprocess
    import time

    import turns

    lock = str(tmp_path / "timing.lock")
    env = {**os.environ, "EMBER_BENCH_TIMING_LOCK": lock}
    count = tmp_path / "count"
    child = subprocess.Popen(
        [sys.executable, "-c", _COUNTER, str(count), str(BENCH)], env=env, start_new_session=True
    )
    try:
        while not count.exists():
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGSTOP)  # as a holder that died mid-turn would leave it
        time.sleep(0.2)
        stopped_at = int(count.read_text())
        time.sleep(0.3)
        assert int(count.read_text()) == stopped_at
        turns.resume_all(lock)
        time.sleep(0.3)
        assert int(count.read_text()) > stopped_at
    finally:
        child.kill()
        child.wait()


def test_report_says_which_calls_replayed_cuda_graphs(tmp_path):
    run_ = _fake_run("1/1", ["resnet50"], 1.0)
    run_["records"][-1] = {"model": "resnet50", "backend": "ember", "status": "ok",
                           "latency_ms": 1.5, "cudagraph_replays": 23,
                           "cudagraph_skipped": "capture failed: boom"}  # fmt: skip
    report.write(tmp_path, [run_], chart=False)
    text = (tmp_path / "results.md").read_text()
    assert "Calls replayed from CUDA graphs (warm-up and timed calls): resnet50 / ember 23." in text
    assert "resnet50 / ember: a CUDA graph was given up: capture failed: boom" in text


def test_warm_compile_is_timed_in_the_workers_turn(tmp_path, monkeypatch):
    """A backend's warm compile (a second or so) holds the timing turn, as its timed calls do:
    other workers' compiles would otherwise share the CPU it is measured on."""
    import contextlib

    import harness
    import turns

    phases = []
    real_time_call = harness._time_call

    @contextlib.contextmanager
    def turn():
        phases.append("enter")
        yield
        phases.append("exit")

    def time_call(step, device):
        phases.append("warm" if phases and phases[-1] == "enter" else "outside")
        return real_time_call(step, device)

    monkeypatch.setattr(turns, "timing_turn", turn)
    monkeypatch.setattr(harness, "_time_call", time_call)
    result = run.run_suite("cpu-core", tmp_path, models=["small_vit"], isolate="none",
                           backends=["ember_eager"], **QUIET)  # fmt: skip
    rec = _records(result)[("small_vit", "ember_eager")]
    assert rec["status"] == "ok" and rec["compile_warm_s"] is not None
    assert "warm" in phases  # the warm compile's call ran inside a turn


def test_dynamic_merge_keeps_the_per_length_table(tmp_path):
    """Merged dynamic runs (one process per model) come back from JSON with string length keys;
    the per-length table still shows every measured cell."""
    import dynamic

    def result(model):
        lengths = {36: {"ms": 1.5, "max_abs_diff": 0.0}, 148: {"ms": 2.25, "max_abs_diff": 0.0}}
        rec = {"lengths": lengths, "error": None, "graphs": 1, "first_pass_s": 1.0}
        return {"model": model, "small": True, "batch": 2, "lengths": [36, 148],
                "per_length_subset": [36], "variants": {"eager": rec}}  # fmt: skip

    dirs = []
    for model in ("gpt2", "bert-base-uncased"):
        d = tmp_path / model
        d.mkdir()
        (d / "dynamic.json").write_text(json.dumps({"env": "cpu", "results": [result(model)]}))
        dirs.append(str(d))
    dynamic.main(["--merge", *dirs, "--out", str(tmp_path / "all")])
    text = (tmp_path / "all" / "dynamic.md").read_text()
    assert text.count("| 148 | 2.250 |") == 2, text
