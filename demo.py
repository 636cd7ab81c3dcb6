"""The README's main command: a tour of Ember on a small transformer, on whatever the machine has.

`./bazelw run //:demo` (or `python demo.py` with the components on PYTHONPATH) walks through:

  1. compile   a cold compile into an empty, temporary cache, then a warm start: a fresh process
               compiling the same model, served from that cache
  2. speed     median latency of eager, Ember and (where it works here) torch.compile, timed in
               alternation, with the result checked against eager; on a CUDA machine again on
               the GPU under bfloat16 autocast
  3. explain   graphs, breaks and ops of the model, and of a variant whose `.item()` breaks the
               graph (the reason, at file:line)
  4. package   ember.export -> ember.cpp_wrapper.package -> the `run_package` program (no Python,
               no libtorch) on .npy files, compared with eager
  5. summary   one screen

A failed step prints one line and the tour goes on; the exit status is 1 if any step failed.
torch.compile is only the reference we race (as in bench/): its absence or failure is no failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

STARTED = time.perf_counter()  # the total counts importing torch and Ember too

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.inductor import metrics  # noqa: E402
from ember.ir import toolchain  # noqa: E402

# 1024 tokens as 2 sequences of 512. On a 2-core CPU the linears run the same BLAS in eager and in
# Ember, so the win is in attention's scale + mask + softmax over seq^2 scores, which Ember fuses
# into one pass: measured there (load ~5), batch 8 x seq 128 gave 1.02x (median) / 1.06x (best),
# 4 x 256 1.29x / 0.98x, 2 x 512 1.23x / 1.46x.
DIM, HEADS, LAYERS, SEQ, BATCH = 256, 4, 2, 512, 2
SPEED_BUDGET_S = 8.0  # wall time the CPU race may take (more rounds on a fast, idle machine)
WIDTH = 78


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # Attention written out (as GPT-2 does): Ember fuses the scale, mask and softmax, and the
        # C++ runtime of a package has no fused-attention kernel to call.
        scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(torch.nn.Module):
    """A stack of pre-norm blocks and a final LayerNorm (embedding-free: it takes activations)."""

    def __init__(self, layers=LAYERS):
        super().__init__()
        self.blocks = torch.nn.Sequential(*(Block() for _ in range(layers)))
        self.norm = torch.nn.LayerNorm(DIM)

    def forward(self, x):
        return self.norm(self.blocks(x))


class ScaleLogger(torch.nn.Module):
    """The same model with a habit that breaks graphs: it reads its output's scale into Python."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.last_scale = 0.0

    def forward(self, x):
        y = self.model(x)
        self.last_scale = y.abs().max().item()  # a Python float: the graph must end here
        return y * 2


def make_model():
    """The demo's model and input, the same in every process (fixed seed)."""
    torch.manual_seed(0)
    return TinyTransformer().eval(), torch.randn(BATCH, SEQ, DIM)


@contextlib.contextmanager
def cache_at(path):
    """Point Ember's on-disk caches (kernels, graphs, builds) at `path` for a while."""
    saved = toolchain.config.cache_dir
    toolchain.config.cache_dir = Path(path)
    try:
        yield
    finally:
        toolchain.config.cache_dir = saved


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def race(fns, x, budget_s, sync=lambda: None, min_rounds=5, max_rounds=200):
    """(median, best) ms of each function, timed in alternation (load hits all alike), and the
    number of rounds, within a time budget."""
    for fn in fns:  # one untimed call each: first-call work is not latency
        fn(x)
    sync()
    times = [[] for _ in fns]
    deadline = time.perf_counter() + budget_s
    while len(times[0]) < max_rounds and (len(times[0]) < min_rounds
                                          or time.perf_counter() < deadline):  # fmt: skip
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn(x)
            sync()
            samples.append(time.perf_counter() - start)
    return [(sorted(t)[len(t) // 2] * 1e3, min(t) * 1e3) for t in times], len(times[0])


def max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def heading(n, title):
    print(f"\n[{n}] {title} " + "-" * (WIDTH - len(title) - 5))


class Tour:
    """Runs the steps in order; each records a summary line, or its failure as one line."""

    def __init__(self, args):
        self.args = args
        self.model, self.x = make_model()
        with torch.no_grad():
            self.expected = self.model(self.x)
        self.workdir = Path(tempfile.mkdtemp(prefix="ember-demo-"))
        self.cache = self.workdir / "cache"
        self.summary = []  # (label, text)
        self.failed = []
        self.compiled = None

    def step(self, n, title, label, fn):
        heading(n, title)
        start = time.perf_counter()
        try:
            text = fn()
        except Exception as e:  # a broken step is one line, and the tour goes on
            first = (str(e).strip().splitlines() or [""])[0][:200]
            print(f"  FAILED: {type(e).__name__}: {first}")
            self.failed.append(label)
            text = f"FAILED ({type(e).__name__})"
        print(f"  ({time.perf_counter() - start:.1f} s)")
        self.summary.append((label, text))

    # 1 ------------------------------------------------------------------------------------------
    def compile_step(self):
        params = sum(p.numel() for p in self.model.parameters())
        print(f"  model: {LAYERS} pre-norm blocks (causal {HEADS}-head attention + GELU MLP), "
              f"d={DIM}, {params / 1e6:.1f}M params")  # fmt: skip
        print(f"  input: batch {BATCH} x seq {SEQ} x {DIM}, float32, {self.x.device}")
        print(f"  cache: empty temporary directory ({self.cache})")
        metrics.reset()
        with cache_at(self.cache), torch.no_grad():
            self.compiled = ember.compile(self.model)
            got, cold_s = timed(self.compiled, self.x)
        kernels, misses = metrics.generated_kernel_count, metrics.fx_cache_misses
        diff = max_diff(got, self.expected)
        torch.testing.assert_close(got, self.expected, rtol=1e-4, atol=1e-4)
        print(f"  cold compile (first call): {cold_s:.2f} s, {kernels} C++ kernels generated and "
              f"compiled ({misses} graph missed the cache); max abs diff vs eager {diff:.1e}")
        warm = self.warm_start()
        print(f"  warm start (fresh process, same cache): first call {warm['first_call_s']:.2f} s, "
              f"{warm['fx_cache_hits']} graph and its {warm['kernels']} kernels loaded from the "
              f"cache; process total {warm['process_s']:.1f} s incl. importing torch")  # fmt: skip
        if warm["fx_cache_hits"] < 1 or warm["fx_cache_misses"]:
            raise RuntimeError(f"the warm start missed the cache: {warm}")
        return (f"cold {cold_s:.1f} s (empty cache) -> warm start {warm['first_call_s']:.2f} s "
                f"({cold_s / warm['first_call_s']:.0f}x faster, fresh process)")  # fmt: skip

    def warm_start(self) -> dict:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        cmd = [sys.executable, os.path.abspath(__file__), "--warm-start", str(self.cache)]
        proc, process_s = timed(lambda: subprocess.run(cmd, capture_output=True, text=True,
                                                       env=env))  # fmt: skip
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the warm-start process failed ({proc.returncode}): {tail}")
        return dict(json.loads(lines[-1]), process_s=process_s)

    # 2 ------------------------------------------------------------------------------------------
    def speed_step(self):
        if self.compiled is None:
            raise RuntimeError("step 1 did not compile the model")
        env_threads = os.environ.get("OMP_NUM_THREADS", "unset")
        print(f"  threads: torch {torch.get_num_threads()}, Ember's OpenMP kernels "
              f"{env_threads if env_threads != 'unset' else os.cpu_count()} "
              f"(OMP_NUM_THREADS {env_threads}); {os.cpu_count()} CPUs")  # fmt: skip
        contenders = {"eager": self.model, "ember": self.compiled}
        tc_note = self.add_torch_compile(contenders, self.model, self.x)
        with torch.no_grad():
            ms, rounds = race(list(contenders.values()), self.x, SPEED_BUDGET_S)
        return self.report_speed(contenders, ms, rounds, self.x, self.expected, tc_note, "CPU")

    def add_torch_compile(self, contenders, model, x):
        """torch.compile, the reference we race, where it works here (a try, as bench/ does)."""
        if self.args.no_torch_compile:
            return "not run (--no-torch-compile)"
        try:
            tc = torch.compile(model)
            with torch.no_grad():
                _, tc_s = timed(tc, x)
        except Exception as e:  # not ours to fix: say so and race without it
            msg = (str(e).strip().splitlines() or [""])[0][:120]
            print(f"  torch.compile: not available here ({type(e).__name__}: {msg})")
            return "not available here"
        contenders["torch.compile"] = tc
        print(f"  torch.compile: first call {tc_s:.1f} s (its compile, its cache as it finds it)")
        return None

    @staticmethod
    def report_speed(contenders, ms, rounds, x, expected, tc_note, where):
        (eager_ms, eager_best), parts = ms[0], []
        print(f"  {'':>14}  {'median':>9}  {'speedup':>7}  {'best':>9}  {'speedup':>7}")
        with torch.no_grad():
            for (name, fn), (t, best) in zip(contenders.items(), ms):
                line = f"  {name:>14}  {t:6.2f} ms  {eager_ms / t:6.2f}x  {best:6.2f} ms  "
                line += f"{eager_best / best:6.2f}x"
                if name != "eager":
                    line += f"   max abs diff vs eager {max_diff(fn(x), expected):.1e}"
                    parts.append(f"{name} {t:.1f} ms ({eager_ms / t:.2f}x, best-of "
                                 f"{eager_best / best:.2f}x)")  # fmt: skip
                else:
                    parts.append(f"{name} {t:.1f} ms")
                print(line)
        if tc_note:
            parts.append(f"torch.compile {tc_note}")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        busy = f"; load {load:.1f} on {os.cpu_count()} CPUs: best-of is the less disturbed figure"
        print(f"  {rounds} rounds, contenders timed in alternation"
              + (busy if load > os.cpu_count() else ""))  # fmt: skip
        return f"{where}: " + " | ".join(parts)

    def gpu_step(self):
        if not torch.cuda.is_available():
            print("  no CUDA device here: skipped")
            return "skipped (no CUDA device)"
        torch.cuda.manual_seed(0)
        model, x = make_model()
        model, x = model.cuda(), x.cuda()
        print(f"  device: {torch.cuda.get_device_name()}, bfloat16 autocast")
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            expected = model(x)
            compiled = ember.compile(model)
            got, cold_s = timed(lambda: (compiled(x), torch.cuda.synchronize())[0])
            diff = max_diff(got, expected)
            print(f"  ember compile (first call): {cold_s:.1f} s; max abs diff vs eager {diff:.1e}")
            contenders = {"eager": model, "ember": compiled}
            tc_note = self.add_torch_compile(contenders, model, x)
            ms, rounds = race(list(contenders.values()), x, SPEED_BUDGET_S / 2,
                              sync=torch.cuda.synchronize)  # fmt: skip
            return self.report_speed(contenders, ms, rounds, x, expected, tc_note, "GPU bf16")

    # 3 ------------------------------------------------------------------------------------------
    def explain_step(self):
        with torch.no_grad():
            clean = ember.explain(self.model)(self.x)
            broken = ember.explain(ScaleLogger(self.model))(self.x)
        print(f"  TinyTransformer: {clean.graph_count} graph, {clean.graph_break_count} breaks, "
              f"{len(clean.out_guards)} guards")  # fmt: skip
        for i, ops in enumerate(clean.ops_per_graph):
            common = ", ".join(f"{op} x{n}" for op, n in Counter(ops).most_common(6))
            print(f"    graph {i}: {len(ops)} ops ({common}, ...)")
        print(f"  ScaleLogger (reads .item() in forward): {broken.graph_count} graphs, "
              f"{broken.graph_break_count} break")  # fmt: skip
        for i, ops in enumerate(broken.ops_per_graph):
            print(f"    graph {i}: {len(ops)} ops")
        for b in broken.break_reasons:  # demo.py's path relative to its directory (runfiles)
            where = str(b.where).replace(os.path.dirname(os.path.abspath(__file__)) + os.sep, "")
            print(f"    break: {b.reason}\n      at {where}")
        if clean.graph_break_count or not broken.graph_break_count:
            raise RuntimeError("explain did not see what the demo expects (0 and >= 1 breaks)")
        where = Path(str(broken.break_reasons[0].where)).name
        return (f"{clean.graph_count} graph, {clean.graph_break_count} breaks, "
                f"{sum(map(len, clean.ops_per_graph))} ops; the .item() variant: "
                f"{broken.graph_break_count} break at {where}")  # fmt: skip

    # 4 ------------------------------------------------------------------------------------------
    def package_step(self):
        import ember.cpp_wrapper as cw  # the deployment path: imported where it is used

        # The usual cache this time: a package's model.so is built once per model and machine.
        started = time.time()
        with torch.no_grad():
            exported, export_s = timed(ember.export, self.model, (self.x,))
            path, package_s = timed(cw.package, exported, self.workdir / "tiny_transformer_pkg")
        # package() copies model.so out of the compiler driver's cache with its time stamp
        built = (path / "model.so").stat().st_mtime >= started - 1
        files = ", ".join(sorted(p.name for p in path.iterdir()))
        size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
        print(f"  ember.export: {export_s:.1f} s, one graph, {len(exported.constants)} weights")
        how = "model.so compiled now" if built else "model.so from the cache"
        print(f"  package: {package_s:.1f} s ({how}) -> {path.name}/ ({files}; {size:.1f} MB)")
        program, how = self.run_package_program()
        print(f"  run_package: {how}")
        y = torch.randn_like(self.x)  # not the export's example: the weights are frozen, x is not
        np.save(self.workdir / "in.npy", y.numpy())
        cmd = [str(program), str(path), str(self.workdir / "in.npy"), str(self.workdir / "out.npy")]
        proc, run_s = timed(lambda: subprocess.run(cmd, capture_output=True, text=True))
        if proc.returncode != 0:
            raise RuntimeError(f"run_package exited {proc.returncode}: {proc.stderr.strip()[:200]}")
        got = torch.from_numpy(np.load(self.workdir / "out.npy"))
        with torch.no_grad():
            want = self.model(y)
        diff = max_diff(got, want)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        ldd = subprocess.run(["ldd", str(path / "model.so")], capture_output=True, text=True).stdout
        pure = not any(lib in ldd for lib in ("libtorch", "libpython"))
        links = "links neither libtorch nor libpython" if pure else "LINKS libtorch/libpython"
        print(f"  $ run_package {path.name} in.npy out.npy   ({run_s:.2f} s incl. loading; "
              f"model.so {links})")  # fmt: skip
        print(f"  out.npy vs eager: max abs diff {diff:.1e}")
        return (f"export {export_s:.1f} s + package {package_s:.1f} s; run_package (no Python) "
                f"diff {diff:.1e}")  # fmt: skip

    def run_package_program(self):
        """The run_package program, built by the compiler driver (cached by its sources' hash, so
        never stale as an old bazel-bin/ can be)."""
        import ember.cpp_wrapper as cw

        # It goes into the usual cache, not the demo's empty one: it is a tool, not the model.
        program, build_s = timed(cw.install_run_package, self.workdir / "bin")
        how = f"built in {build_s:.1f} s" if build_s > 1 else "already built"
        return program, (f"{how} by the compiler driver (python -m "
                         "ember.cpp_wrapper.build_run_package OUT; with Bazel: "
                         "./bazelw build //cpp_wrapper:run_package)")  # fmt: skip

    # 5 ------------------------------------------------------------------------------------------
    def print_summary(self, total_s):
        print("\n" + "=" * WIDTH)
        print(f" Ember tour: TinyTransformer ({LAYERS} blocks, d={DIM}, seq {SEQ}, batch {BATCH}, "
              "float32)")  # fmt: skip
        print("=" * WIDTH)
        for label, text in self.summary:
            print(f" {label:<9}| {text}")
        status = "all steps passed" if not self.failed else f"FAILED: {', '.join(self.failed)}"
        print(f" {'total':<9}| {total_s:.1f} s wall, {cpu_seconds():.0f} s CPU (compilers incl.);"
              f" {status}")  # fmt: skip
        print("=" * WIDTH)

    def run(self, setup: str) -> int:
        print(f"Ember demo on {describe_machine()}")
        print(f"  {setup}")
        try:
            self.step(1, "compile: cold, then a warm start from the cache", "compile",
                      self.compile_step)
            self.step(2, "speed: eager vs Ember vs torch.compile (CPU)", "speed", self.speed_step)
            self.step("2b", "speed on the GPU (bfloat16 autocast)", "gpu", self.gpu_step)
            self.step(3, "explain: graphs and graph breaks", "explain", self.explain_step)
            self.step(4, "export -> package -> run_package (no Python)", "package",
                      self.package_step)
            self.print_summary(time.perf_counter() - STARTED)
        finally:
            if self.args.keep:
                print(f"kept: {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return 1 if self.failed else 0


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the C++ compilers, the warm start)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def describe_machine() -> str:
    cpu = "CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu} ({os.cpu_count()} CPUs, vector ISA {toolchain.cpu_isa()}, load {load:.1f}), "
            f"{gpu}; torch {torch.__version__}, Python {sys.version.split()[0]}")  # fmt: skip


def warm_start_child(cache: str) -> int:
    """The warm start's fresh process: compile the same model from `cache`, print one JSON line."""
    toolchain.build_all()  # the components' extensions come from the usual cache, as any start
    model, x = make_model()
    metrics.reset()
    with cache_at(cache), torch.no_grad():
        _, first_s = timed(ember.compile(model), x)
    print(json.dumps({"first_call_s": first_s, "fx_cache_hits": metrics.fx_cache_hits,
                      "fx_cache_misses": metrics.fx_cache_misses,
                      "kernels": metrics.generated_kernel_count}))  # fmt: skip
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="do not race torch.compile (it is only the reference)")
    parser.add_argument("--keep", action="store_true", help="keep the package and cache")
    parser.add_argument("--warm-start", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warm_start:
        return warm_start_child(args.warm_start)
    imported_s = time.perf_counter() - STARTED
    # Ember's own extensions come from the usual cache (built there on a first run), before the
    # demo points the cache at an empty directory for the model.
    _, build_s = timed(toolchain.build_all)
    how = f"built in {build_s:.1f} s" if build_s > 1 else "loaded"
    setup = (f"importing torch and Ember {imported_s:.1f} s; Ember's C++ extensions {how} "
             f"(cache {toolchain.cache_dir()})")  # fmt: skip
    return Tour(args).run(setup)


if __name__ == "__main__":
    sys.exit(main())
