"""Timing a Triton kernel's candidate launch configs against each other, for autotuning.

Each config used to be timed alone by triton's `do_bench`: its own estimate runs, its own
warm-up and a fixed budget, with device synchronisations in between. A cold GPT-2 training
compile spent 10.9 of its 28.9 s there (H100, session 17), most of it for kernels of a few
microseconds whose configs differ by far more than the noise.

Here all configs of one kernel are timed together, in rounds: each round launches every config
once, in an order that turns from round to round, each launch after the L2 cache is flushed, and
timed by CUDA events; the host waits once per phase, not per launch. A first phase of a few rounds
drops the configs that are clearly slower (`KEEP_WITHIN` of the best); only the close ones get
the rest of the rounds. A config's time is the lower quartile of its samples.

A launch's events time the GPU, but the GPU only runs what the host has queued: a host late to
launch (another thread holding the interpreter: in a training step, the backward's kernels load
on the build threads while the forward's kernels autotune) left the GPU idle between a launch's
start event and its kernel. The first kernels of a Swin transformer's step measured 1 to 14 ms
for a few microseconds of work, and the slowest config was picked for some. So each phase is
queued behind a spin kernel that holds the GPU for longer than the host took to queue the
previous phase (per launch, times the launches of this one), and the lower quartile leaves out
the samples a longer stall still reached (a stall only ever lengthens a sample).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

# Rounds in the first phase, which every config takes part in.
FIRST_ROUNDS = 5
# Rounds in all, at least and at most (the budget decides between them).
MIN_ROUNDS, MAX_ROUNDS = 5, 40
# A config whose first-phase time is within this factor of the best goes on being timed.
KEEP_WITHIN = 1.15


# The spin that holds the GPU while the host queues a phase: this many times the host's time per
# launch in the phase before (at first HOLD_FIRST_S), at most HOLD_MAX_S.
HOLD_MARGIN = 2.0
HOLD_FIRST_S = 200e-6
HOLD_MAX_S = 1.0


def median(samples: Sequence[float]) -> float:
    s = sorted(samples)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def low_quartile(samples: Sequence[float]) -> float:
    """The median of the lower half of the samples (the lone sample when there is one)."""
    s = sorted(samples)
    return median(s[: max(1, (len(s) + 1) // 2)])


def plan(estimates: Sequence[float], warm_ms: float, rep_ms: float) -> tuple[int, int]:
    """(warm-up launches per config, timed rounds) from one launch's milliseconds per config:
    the fastest config gets about `rep_ms` of timed launches and `warm_ms` of warm-up."""
    fastest = max(min(estimates), 1e-3)
    warm = max(1, min(20, int(warm_ms / fastest)))
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(rep_ms / fastest)))
    return warm, rounds


def choose(measure: Callable, n: int, warm_ms: float, rep_ms: float) -> list[float]:
    """Each config's time in ms (configs dropped after the first phase keep that phase's
    lower quartile). `measure(indices, rounds, warm)` launches the configs of `indices` for `warm`
    untimed rounds, then `rounds` timed ones, and returns each one's samples in order; called
    with rounds=1, warm=1 first for the estimates."""
    estimates = [s[0] for s in measure(list(range(n)), 1, 1)]
    warm, rounds = plan(estimates, warm_ms, rep_ms)
    first = min(FIRST_ROUNDS, rounds)
    samples = measure(list(range(n)), first, warm)
    times = [low_quartile(s) for s in samples]
    best = min(times)
    close = [i for i in range(n) if times[i] <= best * KEEP_WITHIN]
    if len(close) > 1 and rounds > first:
        more = measure(close, rounds - first, 0)
        for i, extra in zip(close, more):
            times[i] = low_quartile(samples[i] + extra)
    return times


def cuda_measure(launches: Sequence[Callable[[], object]]) -> Callable:
    """A `measure` for `choose` over CUDA launches (each runs one config on its own copies)."""
    import torch

    flush = _flush_buffer()
    per_launch = HOLD_FIRST_S  # the host's seconds per launch in the last phase

    def measure(indices, rounds, warm):
        nonlocal per_launch
        for _ in range(warm):
            for i in indices:
                launches[i]()
        _hold_gpu(min(HOLD_MAX_S, HOLD_MARGIN * per_launch * rounds * len(indices)))
        queued = time.perf_counter()
        events = []
        for r in range(rounds):
            shift = r % len(indices)  # no config always runs first, or right after another
            order = indices[shift:] + indices[:shift]
            for i in order:
                flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                launches[i]()
                end.record()
                events.append((i, start, end))
        per_launch = (time.perf_counter() - queued) / max(1, len(events))
        torch.cuda.synchronize()
        samples = {i: [] for i in indices}
        for i, start, end in events:
            samples[i].append(start.elapsed_time(end))
        return [samples[i] for i in indices]

    return measure


_L2_BYTES: dict = {}  # device -> the flush buffer's bytes
_CYCLES_PER_S: dict = {}  # device -> the spin kernel's clock cycles per second


def _hold_gpu(seconds: float) -> None:
    """Queue a kernel that keeps the current GPU busy for about `seconds` (torch's spin kernel,
    calibrated once per device; nothing where this torch has none)."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None or seconds <= 0:
        return
    device = torch.cuda.current_device()
    if device not in _CYCLES_PER_S:
        cycles = 1_000_000
        sleep(cycles)  # (its first launch loads it)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_S[device] = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
    sleep(int(seconds * _CYCLES_PER_S[device]))


def _flush_buffer():
    """A buffer twice the device's L2 cache: zeroing it leaves none of a kernel's data there.
    Made for one kernel's timing and dropped with it (back to the caching allocator, which hands
    it out again at the next kernel's): kept for the process, its twice-L2 (about 100 MB on an
    H100) stayed allocated through every later step, memory the program never uses."""
    import torch

    device = torch.cuda.current_device()
    if device not in _L2_BYTES:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
        _L2_BYTES[device] = max(2 * l2, 16 << 20)
    return torch.empty(_L2_BYTES[device] // 4, dtype=torch.int32, device="cuda")
