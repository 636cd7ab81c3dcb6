"""Autotuning's config timing (trial_timing): rounds planned from the budget, clearly slower
configs dropped after the first phase, medians over the samples (CPU: a fake measure)."""

import itertools

from ember.inductor import trial_timing as tt


def _measure(samples_of, calls):
    """A measure whose config i yields the values of samples_of[i] in turn."""
    streams = {i: itertools.cycle(s) for i, s in samples_of.items()}

    def measure(indices, rounds, warm):
        calls.append((list(indices), rounds, warm))
        return [[next(streams[i]) for _ in range(rounds)] for i in indices]

    return measure


def test_rounds_follow_the_fastest_config_within_bounds():
    assert tt.plan([0.01, 0.5], warm_ms=2, rep_ms=10) == (20, tt.MAX_ROUNDS)
    assert tt.plan([4.0, 5.0], warm_ms=2, rep_ms=10) == (1, tt.MIN_ROUNDS)
    assert tt.plan([0.5], warm_ms=2, rep_ms=10) == (4, 20)


def test_close_configs_get_the_remaining_rounds_and_slow_ones_do_not():
    calls = []
    # config 1 is 10% slower than 0 (close), config 2 is twice as slow
    measure = _measure({0: [0.5], 1: [0.55], 2: [1.0]}, calls)
    times = tt.choose(measure, 3, warm_ms=1, rep_ms=10)
    assert times == [0.5, 0.55, 1.0]
    assert calls[0] == ([0, 1, 2], 1, 1)  # the estimate
    assert calls[1] == ([0, 1, 2], tt.FIRST_ROUNDS, 2)
    assert calls[2] == ([0, 1], 20 - tt.FIRST_ROUNDS, 0)
    assert len(calls) == 3


def test_an_outlier_sample_does_not_decide():
    calls = []
    # config 0 is faster but one launch in five is disturbed (say, by a clock change)
    measure = _measure({0: [1.0, 1.0, 9.0, 1.0, 1.0], 1: [1.1]}, calls)
    times = tt.choose(measure, 2, warm_ms=1, rep_ms=10)
    assert times.index(min(times)) == 0


def test_a_lone_config_is_timed_once_after_the_first_phase():
    calls = []
    times = tt.choose(_measure({0: [0.2]}, calls), 1, warm_ms=1, rep_ms=100)
    assert times == [0.2] and len(calls) == 2
