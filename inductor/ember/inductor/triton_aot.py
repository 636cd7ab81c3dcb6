"""Triton kernels compiled ahead of time, with no GPU: cubins for the C++ wrapper, and a check.

`triton.compile` runs its whole pipeline (TTIR, TTGIR, LLVM IR, PTX, and ptxas for the cubin) for a
named target without a device, so a CUDA artifact's kernels can be built on any machine, and the
kernels a graph generates can be checked against the real compiler (Triton's CPU interpreter
accepts programs the compiler rejects, such as a block mask on a scalar pointer).

A cubin is compiled with the kernel's declared parameter types and, as its only value
specialisation, the divisibility by 16 that the launch plan proves for a parameter at every launch
(triton_hints.divisible_args: 16-byte aligned pointers, multiple-of-16 sizes), what Triton's JIT
would specialise on in process; no "equal to 1". So it is valid for every argument value the
wrapper passes, and still gets vector and cp.async loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import warnings
import tempfile
from pathlib import Path
from typing import Optional

import sympy

from ember.ir import CompiledArtifact, cache_files
from ember.ir.symbols import expr_to_json

from .runtime import _load_module, cache_dir
from .triton_hints import divisible_args

DEFAULT_ARCH = 90  # Hopper, when no GPU says otherwise
# Missing cubins per worker process below which attach_cubins compiles in this process: a
# process costs Triton's import (a few seconds), a cubin about one.
PARALLEL_MIN = 4


@dataclasses.dataclass(frozen=True)
class Cubin:
    path: str  # the cubin on disk, content-addressed
    name: str  # the entry point's symbol in it
    num_warps: int
    shared_mem: int


def current_arch() -> int:
    """The compute capability of the current CUDA device as 90, 80, ...; DEFAULT_ARCH without one."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return DEFAULT_ARCH


def compile_kernel(source: str, name: str, arg_types: tuple, cfg: dict,
                   arch: Optional[int] = None, divisible: tuple = ()) -> Cubin:  # fmt: skip
    """Compile the @triton.jit function `name` of `source` for sm_`arch` with block sizes `cfg`.

    arg_types are the non-constexpr parameters' types in order ("*fp32", "i64", ...); cfg holds
    the constexpr block sizes, num_warps and optionally num_stages (software pipelining depth,
    Triton's default when absent). `divisible` lists the indices (into arg_types) of parameters
    every launch passes divisible by 16: a pointer 16-byte aligned, an integer a multiple of 16
    (Triton's "tt.divisibility" hint; the caller proves it). Raises triton's CompilationError on
    a bad kernel."""
    arch = arch or current_arch()
    divisible = tuple(sorted(set(int(i) for i in divisible)))
    entry, key = _cubin_entry(source, name, arg_types, cfg, arch, divisible)
    found = cache_files.find_dir(entry, key, ("kernel.cubin", "meta.json"))
    if found is not None:
        try:
            meta = json.loads((found / "meta.json").read_text())
            return Cubin(str(found / "kernel.cubin"), meta["name"], meta["num_warps"],
                         meta["shared_mem"])  # fmt: skip
        except (OSError, ValueError, KeyError):
            pass  # a foreign entry's metadata: compile again
    compiled = _compile(source, name, arg_types, cfg, arch, divisible)
    meta = {"name": compiled.metadata.name, "num_warps": compiled.metadata.num_warps,
            "shared_mem": compiled.metadata.shared}  # fmt: skip
    files = {"kernel.cubin": compiled.asm["cubin"], "meta.json": json.dumps(meta)}
    cubin = cache_files.publish_dir(entry, key, files) / "kernel.cubin"
    return Cubin(str(cubin), meta["name"], meta["num_warps"], meta["shared_mem"])


def _compile(source: str, name: str, arg_types, cfg: dict, arch: int, divisible: tuple):
    """triton.compile of a kernel for sm_`arch` (what compile_kernel caches the cubin of)."""
    import triton
    from triton.compiler import ASTSource

    fn = _jit_function(source, name)
    signature, consts, attrs, target, options = _compile_parameters(fn, name, arg_types, cfg,
                                                                    arch, divisible)  # fmt: skip
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                          target=target, options=options)  # fmt: skip


def _compile_parameters(fn, name: str, arg_types, cfg: dict, arch: int, divisible: tuple):
    """(signature, constexprs, attrs, target, options) of triton.compile for a kernel's JITFunction
    (or anything with its arg_names): what _compile passes, and a compile worker too."""
    from triton.backends.compiler import GPUTarget

    options = {k: int(cfg[k]) for k in ("num_warps", "num_stages") if k in cfg}
    options.setdefault("num_warps", 4)
    consts = {k: v for k, v in cfg.items() if k not in options}
    params = [p for p in fn.arg_names if p not in consts]
    if len(params) != len(arg_types):
        raise ValueError(f"kernel {name}: {len(params)} parameters for {len(arg_types)} types")
    signature = {**dict(zip(params, arg_types)), **{k: "constexpr" for k in consts}}
    # attrs are keyed by the position among all the function's parameters, constexprs included
    attrs = {(fn.arg_names.index(params[i]),): [["tt.divisibility", 16]] for i in divisible}
    return signature, consts, attrs, GPUTarget("cuda", arch, 32), options


def _compile_in_workers(jobs, arch: int) -> bool:
    """Compile missing cubins' kernels in the compile workers (compile_workers.py) into Triton's
    cache, where compile_kernel's own triton.compile then finds them; False without workers.
    Each job goes to the next idle worker (no fixed split), and a worker imports Triton only.
    Jobs a worker did not compile (a failing kernel, a lost worker) go to check_jobs' processes
    when there are enough of them; a kernel's own error is raised by compile_kernel, in this
    process, with its traceback."""
    from . import compile_workers
    from .runtime import _module_file

    if compile_workers.worker_count() == 0:
        return False
    futures, submitted = [], []
    for job in jobs:
        name, source, arg_types, cfg, *rest = job
        modname, path = _module_file(source)
        fn = _jit_function(source, name)
        try:
            signature, consts, attrs, target, options = _compile_parameters(
                fn, name, arg_types, cfg, arch, _divisible(rest))
        except ValueError:
            continue  # compile_kernel raises it
        futures.append(compile_workers.compile_source(str(path), modname, name, target, signature,
                                                      consts, attrs, options))  # fmt: skip
        submitted.append(job)
    if any(f is None for f in futures):
        return False
    failed = [job for job, ok in zip(submitted, compile_workers.results(futures)) if not ok]
    if len(failed) >= PARALLEL_MIN and workers() > 1:
        check_jobs(failed, arch)
    return True


def kernel_ptx(source: str, name: str, arg_types: tuple, cfg: dict, arch: int = DEFAULT_ARCH,
               divisible: tuple = ()) -> str:  # fmt: skip
    """The PTX compile_kernel's cubin is assembled from (not cached: for inspection and tests)."""
    return _compile(source, name, tuple(arg_types), cfg, arch, tuple(divisible)).asm["ptx"]


def _cubin_entry(source: str, name: str, arg_types, cfg: dict, arch: int,
                 divisible: tuple = ()) -> tuple:  # fmt: skip
    """(entry directory, key) of a kernel's cubin in the cache: an entry (the cubin and what
    launching it takes) verified against its manifest; the cubin's path goes into the artifact,
    whose C++ wrapper embeds its bytes. The divisibility hints are part of the key (an entry
    without any keeps the key it had before hints existed)."""
    import triton

    what = [source, name, list(arg_types), cfg, arch, triton.__version__]
    if divisible:
        what.append(["tt.divisibility", sorted(divisible)])
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]
    return cache_dir() / "cubin" / key, key


def _cached(job, arch: int) -> bool:
    """Is the cubin of a (name, source, arg_types, cfg[, divisible]) job in the cache?"""
    name, source, arg_types, cfg, *divisible = job
    entry, key = _cubin_entry(source, name, arg_types, cfg, arch, _divisible(divisible))
    return cache_files.find_dir(entry, key, ("kernel.cubin", "meta.json")) is not None


def _divisible(rest) -> tuple:
    """A job's optional fifth element, the divisible parameters, as a sorted tuple."""
    return tuple(sorted(set(rest[0]))) if rest else ()


def workers() -> int:
    """How many compiles run at once: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def _jit_function(source: str, name: str):
    """The compiler's JITFunction for `name`, also while TRITON_INTERPRET=1 makes `triton.jit`
    return interpreted functions (the module is loaded afresh under its own name)."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        if saved != "1":
            return getattr(_load_module(source), name)
        return getattr(_load_module(source, suffix="_compiled"), name)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def launch_args(k, step_args: list) -> list:
    """A Triton kernel step's full argument list: the buffers, then xnumel (and rnumel or ynumel), then the
    size symbols, as the kernel's signature has them (the Python launcher appends the numels
    itself; the C++ wrapper needs them in the step)."""
    meta = dict(k.meta)
    if "numel" in meta:
        numels = [sympy.sympify(meta["numel"][0])]
        if meta["reduction"]:
            numels.append(sympy.sympify(meta["numel"][1]))
        numels = [expr_to_json(n) if n.free_symbols else int(n) for n in numels]
        numels = [{"expr": n} if isinstance(n, (dict, list)) else n for n in numels]
    else:
        second = meta["reduction"] or meta.get("tiled")  # rnumel, or a tile's ynumel
        numels = [int(meta["xnumel"])] + ([int(meta["rnumel"])] if second else [])
    buffers, syms = split_size_args(k, step_args)
    return [*buffers, *numels, *syms]


def split_size_args(k, step_args: list) -> tuple:
    """(the buffer arguments, the trailing size symbols as {"expr": ...}) of a kernel step."""
    n_ptr = sum(1 for t in k.arg_types if t.startswith("*"))
    return step_args[:n_ptr], [{"expr": {"sym": str(a)}} for a in step_args[n_ptr:]]


def attach_cubins(program, arch: Optional[int] = None) -> CompiledArtifact:
    """The artifact of a compiled program (wrapper.Program, or a pipeline.CompiledGraph) with
    every Triton kernel compiled to a cubin (KernelIR.binary) with the block sizes its grid was
    computed for, and every user Triton launch made a kernel of its own (user_triton.py)."""
    from .user_triton import attach_user_kernels

    program = getattr(program, "program", program)
    sources = {k.name: k for k in program.kernels}
    arch = arch or current_arch()
    hints = divisible_args(program.artifact)
    jobs = [(k.name, sources[k.name]) for k in program.artifact.kernels
            if k.language == "triton" and not k.binary]  # fmt: skip
    jobs = [(name, s.source, list(s.arg_types), _config(s), list(hints.get(name, ())))
            for name, s in jobs]  # fmt: skip
    # a cubin in the cache compiled before: neither compiled nor checked again
    missing = list({json.dumps(j): j for j in jobs if not _cached(j, arch)}.values())
    if os.environ.get("TRITON_INTERPRET") == "1":  # compile in clean processes (check_kernels)
        failures = check_jobs(missing, arch) if missing else []
        if failures:
            raise RuntimeError("Triton kernels failed to compile:\n" + "\n\n".join(failures))
    elif missing and _compile_in_workers(missing, arch):
        pass  # Triton's cache holds them now: the loop below only loads them
    elif len(missing) >= PARALLEL_MIN and workers() > 1:
        # Triton compiles one kernel at a time per process (its passes hold the GIL), so many
        # missing cubins compile in worker processes, into the cache the loop below reads; a
        # failure there is left for that loop to raise, in this process, with its traceback.
        check_jobs(missing, arch)
    kernels = []
    for k in program.artifact.kernels:
        if k.language != "triton" or k.binary:
            kernels.append(k)
            continue
        src = sources[k.name]
        cfg = _config(src)
        c = compile_kernel(src.source, src.name, src.arg_types, cfg, arch, hints.get(k.name, ()))
        kernels.append(dataclasses.replace(k, entry=c.name, binary=c.path, num_warps=c.num_warps,
                                           shared_mem=c.shared_mem))  # fmt: skip
    return attach_user_kernels(dataclasses.replace(program.artifact, kernels=tuple(kernels)), arch)


def check_kernels(sources, arch: int = DEFAULT_ARCH) -> list[str]:
    """Compile each (name, KernelSource) with the real Triton compiler; the failures, as text.

    Runs in a fresh process: once Triton's interpreter has run kernels in this one, its patches
    of triton.language break the compiler."""
    return check_jobs([(name, src.source, list(src.arg_types), _config(src))
                       for name, src in sources], arch)  # fmt: skip


def check_jobs(jobs, arch: int = DEFAULT_ARCH) -> list[str]:
    """check_kernels for (kernel name, module source, arg_types, cfg) jobs: compiled in fresh
    processes (and so landing in the cubin cache), one per core, each taking every n-th job; the
    failures, as text."""
    n = min(workers(), -(-len(jobs) // PARALLEL_MIN) or 1)  # a process costs Triton's import
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
        procs = []
        for i in range(n):
            path = Path(tmp) / f"kernels{i}.json"
            path.write_text(json.dumps({"arch": arch, "jobs": jobs[i::n]}))
            procs.append((path, subprocess.Popen(
                [sys.executable, "-m", "ember.inductor.triton_aot", str(path)], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))  # fmt: skip
        failures = []
        for path, proc in procs:
            _, stderr = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"the compile check itself failed:\n{stderr[-4000:]}")
            else:
                failures += json.loads(path.read_text())
        return failures


def _config(src) -> dict:
    """The block sizes a kernel's artifact grid was computed for (its first launch config)."""
    from .codegen_triton import launch_configs

    meta = dict(src.meta)
    return dict(meta["configs"][0]) if "configs" in meta else launch_configs(src)[0]


def _check_main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    failures = []
    for name, source, arg_types, cfg, *divisible in doc["jobs"]:
        try:
            # what Triton deprecates it already refuses in some builds (a where on an int32
            # condition failed a compile on the device's Triton 3.6 and only warned here)
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message=".*deprecated.*", category=UserWarning)
                compile_kernel(source, name, tuple(arg_types), cfg, doc["arch"],
                               _divisible(divisible))  # fmt: skip
        except Exception as e:  # noqa: BLE001  (reported, with the kernel, to the caller)
            failures.append(f"{name} {cfg} divisible {_divisible(divisible)}: "
                            f"{type(e).__name__}: {e}\n{source}")  # fmt: skip
    Path(path).write_text(json.dumps(failures))


if __name__ == "__main__":
    _check_main(sys.argv[1])


__all__ = ["Cubin", "attach_cubins", "check_jobs", "check_kernels", "compile_kernel", "kernel_ptx",
           "launch_args", "split_size_args"]
