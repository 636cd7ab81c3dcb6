"""Timers, memory meters and accuracy checks.

Latency is the median of per-call times after warm-up: CUDA events on the GPU (so queued GPU
work is what is timed, gaps from slow launches included), perf_counter on the CPU. Per-call
overhead is timed as wall-clock over many back-to-back calls. Accuracy compares in float64 on
the CPU, against eager and, where eager itself drifts (bf16/AMP), against a float64 eager run.
"""

import math
import re
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """How a backend is timed once compiled."""

    warmup: int = 3  # calls after the first (compiling) call, before timing
    iters: int = 20  # timed calls at most
    max_seconds: float = 3.0  # stop timing after this long (at least `min_iters` calls)
    min_iters: int = 3
    loop_calls: int = 0  # > 0: wall time of this many back-to-back calls, per call (overhead)

    def describe(self, device):
        if self.loop_calls:
            return (
                f"median over {self.iters} rounds of {self.loop_calls} back-to-back calls "
                f"(wall clock, synchronised per round), after {self.warmup} warm-up calls"
            )
        clock = "CUDA events" if device.startswith("cuda") else "time.perf_counter"
        return (
            f"median of up to {self.iters} calls (at most {self.max_seconds:g} s) after "
            f"{self.warmup} warm-up calls, timed with {clock}"
        )


def synchronize(device):
    """Wait for queued work on `device` (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, device):
    """Run fn() once; return (seconds of wall clock until its work is done, its result)."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def warm_up(fn, device, calls):
    """Call fn() `calls` times and wait for the work to finish."""
    for _ in range(calls):
        fn()
    synchronize(device)


def host_profile(fn, calls, device, profiled=True) -> str:
    """Where the host spends `calls` calls of fn() (cProfile): the top 30 functions by own time
    and by cumulative time. Unprofiled (a distributed run's other ranks), fn() is called along
    and the text is empty."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile() if profiled else None
    if prof is not None:
        prof.enable()
    for _ in range(calls):
        fn()
    synchronize(device)
    if prof is None:
        return ""
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    for key in ("tottime", "cumulative"):
        stats.sort_stats(key).print_stats(30)
    return out.getvalue()


def time_steady(fn, device, timing):
    """Median milliseconds per call of fn() (already warmed up) and the number of timed calls."""
    if timing.loop_calls:
        return _time_loop(fn, device, timing)
    cuda = torch.device(device).type == "cuda"
    times, deadline = [], time.perf_counter() + timing.max_seconds
    for i in range(timing.iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if i + 1 >= timing.min_iters and time.perf_counter() > deadline:
            break
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in times]
    return _median(times), len(times)


def event_median_ms(fn, calls, warm=0):
    """Median milliseconds of fn() over `calls` calls on the GPU, each between two CUDA events
    (after `warm` untimed calls): what the probes time a kernel or an op with."""
    for _ in range(warm):
        fn()
    events = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return _median([s.elapsed_time(e) for s, e in events])


def _time_loop(fn, device, timing):
    rounds = []
    for _ in range(timing.iters):
        t0 = time.perf_counter()
        for _ in range(timing.loop_calls):
            fn()
        synchronize(device)
        rounds.append((time.perf_counter() - t0) * 1e3 / timing.loop_calls)
    return _median(rounds), timing.iters * timing.loop_calls


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])


def merge_intervals(spans):
    """Sorted, disjoint (start, end) covering the union of `spans` (kernel timelines)."""
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


# --------------------------------------------------------------------------------------------
# memory


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(re.findall(r"\d+", line)[0])
    raise OSError(f"{field} not in /proc/self/status")


class Memory:
    """Peak memory of a backend's first call and of its timed calls: CUDA peak allocated, or RSS
    growth on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.kind = "cuda max_memory_allocated" if self.cuda else "RSS delta"
        self.base_kb = None
        self.hwm_reset = False

    def begin(self):
        """Call before compiling: the CPU baseline is the RSS before the backend did anything,
        and `peak_mb` then reads the first (compiling) call's peak."""
        if not self.cuda:
            self.base_kb = _rss_kb()
        self._reset_peak()

    def before_timed(self):
        """Call after warm-up: peaks are taken over the timed calls."""
        self._reset_peak()

    def _reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:  # writing 5 resets the kernel's peak-RSS mark (VmHWM)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False

    def peak_mb(self):
        """MiB: CUDA peak allocated; on the CPU, peak (or final) RSS minus the baseline."""
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        if self.base_kb is None:
            return None
        now = _status_kb("VmHWM") if self.hwm_reset else _rss_kb()
        return (now - self.base_kb) / 1024


def _rss_kb():
    try:
        return _status_kb("VmRSS")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# --------------------------------------------------------------------------------------------
# accuracy


def tensors_of(value):
    """The tensors in an output (tensor, tuple/list/dict of them, or a ModelOutput), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def to_cpu(tensors, dtype=None):
    """Detached CPU copies (float tensors cast to `dtype` when given)."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out.append(t.to("cpu", copy=True))
    return out


class _Sums:
    def __init__(self):
        self.n = 0
        self.sq_diff = 0.0
        self.sq_ref = 0.0
        self.max_abs = 0.0
        self.max_ref = 0.0
        self.nonfinite = 0

    def add(self, got, want, chunk=1 << 24):
        """Accumulate over flat chunks, on got's device (the reference is usually on the CPU)."""
        got, want = got.detach().reshape(-1), want.detach().reshape(-1)
        for start in range(0, got.numel(), chunk):
            self._add(
                got[start : start + chunk].double(),
                want[start : start + chunk].to(got.device, torch.float64),
            )

    def _add(self, got, want):
        finite = torch.isfinite(want)
        self.nonfinite += int((~torch.isfinite(got) & finite).sum())
        # Where eager is inf/nan too, agreement (same non-finite value) counts as no error.
        diff = torch.where(finite, got - want, torch.zeros_like(want))
        diff = torch.nan_to_num(diff, nan=0.0, posinf=0.0, neginf=0.0)
        want = torch.where(finite, want, torch.zeros_like(want))
        self.n += want.numel()
        self.sq_diff += float((diff * diff).sum())
        self.sq_ref += float((want * want).sum())
        if diff.numel():
            self.max_abs = max(self.max_abs, float(diff.abs().max()))
            self.max_ref = max(self.max_ref, float(want.abs().max()))

    def rmse(self):
        return math.sqrt(self.sq_diff / max(self.n, 1))

    def rms_ref(self):
        return math.sqrt(self.sq_ref / max(self.n, 1))


def _sums(got, want):
    """Accumulate error statistics of two lists of tensors (None means all zeros)."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} output tensors, eager gave {len(want)}")
    sums = _Sums()
    for g, w in zip(got, want):
        if g is None and w is None:
            continue
        g = torch.zeros_like(w) if g is None else g
        w = torch.zeros_like(g, device="cpu") if w is None else w
        if g.shape != w.shape:
            raise ValueError(f"output shape {tuple(g.shape)} != eager's {tuple(w.shape)}")
        if not w.is_floating_point() and not w.is_complex():
            mismatches = int((g != w.to(g.device)).sum())
            sums.n += w.numel()
            sums.sq_diff += mismatches
            sums.max_abs = max(sums.max_abs, float(mismatches > 0))
            continue
        sums.add(g, w)
    return sums


@dataclass(frozen=True)
class Tolerance:
    """When a result counts as accurate (see README: 'Accuracy')."""

    rel_rmse: float  # without a float64 reference: rmse(got - eager) / rms(eager) at most this
    fp64_factor: float = 3.0  # with one: rmse(got - fp64) <= factor * rmse(eager - fp64) + floor
    fp64_floor: float = 1e-4  # ... floor = fp64_floor * rms(fp64)


def compare(got, eager, ref64, eager64_sums, tol):
    """Accuracy of `got` against eager (and the float64 reference); a dict for the record."""
    vs_eager = _sums(got, eager)
    result = {
        "max_abs": vs_eager.max_abs,
        "max_rel": vs_eager.max_abs / vs_eager.max_ref if vs_eager.max_ref else vs_eager.max_abs,
        "rel_rmse": vs_eager.rmse() / vs_eager.rms_ref() if vs_eager.rms_ref() else vs_eager.rmse(),
    }
    if vs_eager.nonfinite:
        return {
            **result,
            "ok": False,
            "why": f"{vs_eager.nonfinite} non-finite values where eager is finite",
        }
    if ref64 is not None and eager64_sums is not None:
        vs64 = _sums(got, ref64)
        bound = tol.fp64_factor * eager64_sums.rmse() + tol.fp64_floor * eager64_sums.rms_ref()
        ratio = vs64.rmse() / eager64_sums.rmse() if eager64_sums.rmse() else 0.0
        result.update(err64_ratio=ratio, rmse64=vs64.rmse(), eager_rmse64=eager64_sums.rmse())
        ok = vs64.rmse() <= bound
        why = "" if ok else f"rmse vs fp64 {vs64.rmse():.3g} > {bound:.3g} ({ratio:.2f}x eager's)"
        return {**result, "ok": ok, "why": why}
    ok = result["rel_rmse"] <= tol.rel_rmse
    why = "" if ok else f"relative rmse vs eager {result['rel_rmse']:.3g} > {tol.rel_rmse:g}"
    return {**result, "ok": ok, "why": why}


def eager_vs_fp64(eager, ref64):
    """Error statistics of eager itself against the float64 reference (the drift to tolerate)."""
    return _sums(eager, ref64)


def kernel_table(fn, calls=5, top=15):
    """The `top` GPU kernels of `calls` calls by total time: [name, us per call, launches per
    call], from torch.profiler (the loaded package's launches are seen as any other)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):  # CUDA graphs are recorded after a few calls
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t, n = total.get(e.name, (0.0, 0))
            total[e.name] = (t + e.device_time, n + 1)
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])
    table = [[k[:90], round(t / calls, 1), n // calls] for k, (t, n) in rows[:top]]
    table.append(["(all)", round(sum(t for t, _ in total.values()) / calls, 1),
                  sum(n for _, n in total.values()) // calls])  # fmt: skip
    return table
