"""Compile progress: silent for short compiles, then one line per interval naming the stage."""

import logging

import pytest

from ember.ir import progress


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(progress.config, "clock", c)
    monkeypatch.setattr(progress.config, "enabled", True)
    monkeypatch.setattr(progress.config, "after_s", 10.0)
    monkeypatch.setattr(progress.config, "every_s", 5.0)
    monkeypatch.setattr(progress.config, "watch", False)  # only the polls the test makes
    return c


def test_a_long_compile_reports_its_stage_and_elapsed_time_at_most_once_per_interval(
        clock, caplog):  # fmt: skip
    caplog.set_level(logging.INFO, logger="ember.progress")
    with progress.stage("aot_autograd"):
        with progress.stage("trace"):
            clock.now = 9.0
            progress.poll()
        assert caplog.messages == []  # under the threshold: nothing
        clock.now = 11.0
        with progress.stage("forward graph compile"):
            with progress.stage("lowering"):
                pass
            clock.now = 12.0
            progress.poll()  # within the interval of the last line: nothing more
            clock.now = 16.5
            progress.step("kernels built", 3, 40)
    assert caplog.messages == [
        "ember: compiling for 11s; now: aot_autograd > forward graph compile",
        "ember: compiling for 16s; now: aot_autograd > forward graph compile > kernels built 3/40",
    ]


def test_each_outermost_stage_starts_its_own_clock(clock, caplog):
    caplog.set_level(logging.INFO, logger="ember.progress")
    with progress.stage("capture of forward"):
        clock.now = 20.0
    with progress.stage("kernel compile"):
        clock.now = 25.0
        progress.poll()
    assert caplog.messages == []


def test_progress_can_be_switched_off(clock, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="ember.progress")
    monkeypatch.setattr(progress.config, "enabled", False)
    with progress.stage("trace"):
        clock.now = 100.0
        progress.poll()
    assert caplog.messages == []


def test_the_watcher_thread_reports_a_stage_that_runs_long(monkeypatch, caplog):
    """With the real clock, a stage that runs past the threshold is reported while it runs."""
    import time

    caplog.set_level(logging.INFO, logger="ember.progress")
    monkeypatch.setattr(progress.config, "enabled", True)
    monkeypatch.setattr(progress.config, "after_s", 0.05)
    with progress.stage("kernel compile"):
        deadline = time.monotonic() + 5
        while not caplog.messages and time.monotonic() < deadline:
            time.sleep(0.01)
    assert caplog.messages and caplog.messages[0].endswith("now: kernel compile")


def test_stage_totals_sum_each_stage_path_over_compiles(clock):
    progress.reset_stage_totals()
    for _ in range(2):
        with progress.stage("aot"):
            clock.now += 1.0
            with progress.stage("lowering"):
                clock.now += 2.5
        with progress.stage("kernel compile"):
            clock.now += 0.5
    assert progress.stage_totals() == {"aot": 7.0, "aot > lowering": 5.0, "kernel compile": 1.0}
    progress.reset_stage_totals()
    assert progress.stage_totals() == {}
