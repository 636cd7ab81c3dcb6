"""How Triton's compile scales on this host: N distinct kernels compiled one at a time, on 4, 8
and 16 threads, and in 8 spawned processes (the figures behind inductor's compile workers).

    python bench/triton_compile_probe.py 16      # needs a GPU (Triton's target)
"""

import concurrent.futures as cf
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import time

import torch

# Distinct kernels of a few dozen ops: the constants differ, so each one compiles anew.
SRC = '''
import triton, triton.language as tl
@triton.jit
def k(in_ptr, out_ptr, n, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = x < n
    v = tl.load(in_ptr + x, m).to(tl.float32)
    for i in range(%d):
        v = tl.exp(v * %f) + tl.sin(v) * tl.sqrt(tl.abs(v) + 1.0)
    s = v * tl.sigmoid(v) + tl.log(tl.abs(v) + 2.0)
    tl.store(out_ptr + x, s.to(tl.bfloat16), m)
'''


def load(i: int, tag: str):
    path = os.path.join(tempfile.mkdtemp(), f"k_{tag}_{i}.py")
    with open(path, "w") as f:
        f.write(SRC % (4 + i % 3, 0.5 + i * 0.01 + sum(map(ord, tag)) * 1e-6))
    spec = importlib.util.spec_from_file_location(f"k_{tag}_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.k


def compile_one(job) -> int:
    i, tag = job
    kernel = load(i, tag)
    kernel.warmup(torch.bfloat16, torch.bfloat16, 1 << 20, grid=(1024,), XBLOCK=1024, num_warps=4)
    return i


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # every kernel compiles
    torch.cuda.init()
    compile_one((999, "warm"))
    start = time.perf_counter()
    for i in range(n):
        compile_one((i, "serial"))
    print(f"serial {n}: {time.perf_counter() - start:.2f} s", flush=True)
    for w in (4, 8, 16):
        start = time.perf_counter()
        with cf.ThreadPoolExecutor(w) as pool:
            list(pool.map(compile_one, [(i, f"thr{w}") for i in range(n)]))
        print(f"threads {w}: {time.perf_counter() - start:.2f} s", flush=True)
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(compile_one, [(i, "warmproc") for i in range(8)]))
        ready = time.perf_counter()
        list(pool.map(compile_one, [(i, "proc") for i in range(n)]))
    print(f"processes 8: start and warm-up {ready - start:.2f} s, {n} kernels "
          f"{time.perf_counter() - ready:.2f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
