"""Compile workers (compile_workers.py): a kernel compiled in a worker process for a GPU target
lands in Triton's on-disk cache, where another process compiling it then only loads it; the
worker count's variable is checked. Runs on the CPU: Triton compiles for sm_90 without a GPU."""

import os
import time

import pytest
import torch

from ember.inductor import compile_workers

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scale_kernel(in_ptr, out_ptr, n, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = x < n
    tl.store(out_ptr + x, tl.load(in_ptr + x, mask) * 3.0, mask)
'''


@pytest.fixture
def fresh_pool(tmp_path, monkeypatch):
    """Two workers that compile into an empty Triton cache (the variables are read when the pool
    starts); the pool is shut down afterwards."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("EMBER_COMPILE_WORKERS", "2")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(compile_workers, "_POOL", [None, None])
    yield tmp_path
    _close_pool()


def _close_pool():
    pool = compile_workers._POOL[1]
    if pool is not None:
        pool.close()
        for p in pool.procs:
            p.wait(timeout=60)
    compile_workers._POOL[:] = [None, None]


def _files(root):
    """Each file of the Triton cache with its inode and mtime (a compile rewrites its files)."""
    return sorted((str(p), p.stat().st_ino, p.stat().st_mtime_ns)
                  for p in (root / "triton").rglob("*") if p.is_file())  # fmt: skip


def test_a_worker_compiles_into_the_cache_and_a_fresh_process_then_only_loads(fresh_pool):
    pytest.importorskip("triton.backends.nvidia")
    from triton.backends.compiler import GPUTarget

    path = fresh_pool / "k_scale.py"
    path.write_text(KERNEL)
    target = GPUTarget("cuda", 90, 32)
    args = (torch.float32, torch.float32, 4096)
    kwargs = {"grid": (4,), "XBLOCK": 1024, "num_warps": 4}

    def compile_in_a_new_pool():
        _close_pool()
        future = compile_workers.compile_ahead(str(path), "k_scale", "scale_kernel", target, args,
                                               kwargs)  # fmt: skip
        assert future is not None and future.result(timeout=300) is True
        assert os.getpid() not in {p.pid for p in compile_workers._POOL[1].procs}

    compile_in_a_new_pool()
    built = _files(fresh_pool)
    assert any(name.endswith(".cubin") for name, *_ in built), built
    # a process that never compiled it (as the main process has not) finds it in the cache:
    # nothing is compiled or written again
    compile_in_a_new_pool()
    assert _files(fresh_pool) == built


def test_no_workers_means_no_future(monkeypatch):
    monkeypatch.setenv("EMBER_COMPILE_WORKERS", "0")
    monkeypatch.setattr(compile_workers, "_POOL", [None, None])
    assert compile_workers.compile_ahead("k.py", "k", "f", None, (), {}) is None


@pytest.mark.parametrize("text", ["-1", "two", "1.5"])
def test_a_malformed_worker_count_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("EMBER_COMPILE_WORKERS", text)
    with pytest.raises(ValueError, match="EMBER_COMPILE_WORKERS must be a whole number"):
        compile_workers.worker_count()


def test_a_lost_worker_or_a_failing_compile_is_no_error(fresh_pool):
    """The caller then compiles in process: a worker's failure only returns False."""
    bad = compile_workers.compile_ahead("/nonexistent/k.py", "k", "f", None, (), {})
    assert bad.result(timeout=300) is False  # the worker answered with its error
    pool = compile_workers._POOL[1]
    for p in pool.procs:
        p.kill()
        p.wait(timeout=60)
    for _ in range(3):  # each dead worker found, then none left: never a wait without end
        lost = compile_workers.compile_ahead("/nonexistent/k.py", "k", "f", None, (), {})
        assert lost.result(timeout=60) is False


def test_a_silent_worker_is_given_up(fresh_pool, monkeypatch):
    """A worker that does not answer in time is killed; the caller compiles in process."""
    path = fresh_pool / "k_scale.py"
    path.write_text(KERNEL)
    monkeypatch.setattr(compile_workers, "WORKER_TIMEOUT_S", 0.001)
    from triton.backends.compiler import GPUTarget

    args = (torch.float32, torch.float32, 4096)
    kwargs = {"grid": (4,), "XBLOCK": 1024, "num_warps": 4}
    future = compile_workers.compile_ahead(str(path), "k_scale", "scale_kernel",
                                           GPUTarget("cuda", 90, 32), args, kwargs)  # fmt: skip
    assert future.result(timeout=60) is False
    pool = compile_workers._POOL[1]
    assert pool.alive == 1  # one of the two was given up
    deadline = time.monotonic() + 30
    while sum(p.poll() is not None for p in pool.procs) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(p.poll() is not None for p in pool.procs) == 1  # and killed


def test_a_packages_cubin_compiles_in_a_worker_and_this_process_only_loads_it(fresh_pool,
                                                                               monkeypatch):
    """triton_aot's cubins for packages: the workers run the triton.compile the main process
    then makes, which finds every file in Triton's cache and writes none."""
    pytest.importorskip("triton.backends.nvidia")
    from ember.ir import toolchain
    from ember.inductor import triton_aot

    monkeypatch.setattr(toolchain.config, "cache_dir", str(fresh_pool / "ember"))
    cfg = {"XBLOCK": 1024, "num_warps": 4}
    job = ("scale_kernel", KERNEL, ["*fp32", "*fp32", "i32"], cfg, [0, 1])
    assert triton_aot._compile_in_workers([job], 90)
    built = _files(fresh_pool)
    made = [name for name, *_ in built if name.endswith(".cubin")]
    assert len(made) == 1, built
    cubin = triton_aot.compile_kernel(KERNEL, "scale_kernel", ("*fp32", "*fp32", "i32"), cfg, 90,
                                      (0, 1))  # fmt: skip
    assert _files(fresh_pool) == built
    with open(cubin.path, "rb") as mine, open(made[0], "rb") as theirs:
        assert mine.read() == theirs.read()


def test_a_cubin_no_worker_compiled_goes_to_the_check_processes(fresh_pool, monkeypatch):
    """A job whose compile fails in a worker (here: a kernel the compiler rejects) is handed to
    check_jobs (which compiles, or reports, in processes of their own), never silently dropped
    into one-at-a-time compiles; the jobs that compiled are not."""
    pytest.importorskip("triton.backends.nvidia")
    from ember.ir import toolchain
    from ember.inductor import triton_aot

    monkeypatch.setattr(toolchain.config, "cache_dir", str(fresh_pool / "ember"))
    monkeypatch.setattr(triton_aot, "PARALLEL_MIN", 1)
    monkeypatch.setattr(triton_aot, "workers", lambda: 2)
    handed = []
    monkeypatch.setattr(triton_aot, "check_jobs", lambda jobs, arch: handed.extend(jobs) or [])
    bad = KERNEL.replace("* 3.0", "* undefined_name")
    cfg = {"XBLOCK": 1024, "num_warps": 4}
    good_job = ("scale_kernel", KERNEL, ["*fp32", "*fp32", "i32"], cfg)
    bad_job = ("scale_kernel", bad, ["*fp32", "*fp32", "i32"], cfg)
    assert triton_aot._compile_in_workers([good_job, bad_job], 90)
    assert handed == [bad_job]
