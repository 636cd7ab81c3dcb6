"""What generated wrappers call at load and run time: kernel loaders, launchers and externs.

Launchers are prepared once per compiled graph: a C++ launcher keeps its ctypes argument array
and only writes data pointers into it per call; a Triton launcher binds its grid and block sizes
(chosen by autotuning on first call, and remembered on disk).

Kernels are independent, so a wrapper that loads inside `collect_builds()` has its C++ kernels
built and its Triton kernels compiled concurrently, on a thread pool sized to the cores (each
job is a compiler subprocess or Triton's own compile), while the compiler goes on (to the
backward graph, say); failures are reported together, by kernel, before the first launch.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ember.ir import cache_files, progress, resolve
from ember.primtorch.prims.movement import index_put as index_put_prim

from . import compile_workers, trial_timing, triton_binaries
from .codegen_common import POINTER_TYPES
from .config import config

CSRC = Path(__file__).with_name("csrc")
_HEADER_HASH = hashlib.sha256((CSRC / "ember_cpu.h").read_bytes()).hexdigest()[:16]
VEC_WIDTH = {"avx512": 16, "avx2": 8, "generic": 4}
POINTER_DTYPES = {name: dtype for dtype, name in POINTER_TYPES.items()}
log = logging.getLogger("ember.inductor")

from ember.ir import toolchain


def cpu_isa() -> str:
    return config.isa or toolchain.cpu_isa()


def cache_dir() -> Path:
    """inductor's part of the cache (not created here: a read-only cache is only read)."""
    return Path(toolchain.cache_dir()) / "inductor"


def atomic_write(path: Path, text) -> None:
    """Write `text` (str or bytes) to `path` so readers see the old file or the whole new one;
    OSError (nothing left behind) when the cache cannot be written."""
    cache_files.write_atomic(path, text)


# --- C++ ---------------------------------------------------------------------------------------


_libraries: dict = {}  # path -> ctypes.CDLL


def _library(so: Path) -> ctypes.CDLL:
    """The loaded library at `so` (its name holds its source's hash). One CDLL a path: ctypes
    never unloads a library, and each CDLL is a small reference cycle (its function-pointer
    class), garbage that a compile-and-reset loop left for the cyclic collector."""
    key = str(so)
    lib = _libraries.get(key)
    if lib is None:
        lib = _libraries[key] = ctypes.CDLL(key)
    return lib


class CppLauncher:
    """Calls `void entry(void** args)` with the tensors' data pointers.

    The pointer array is built per call, never kept on the launcher: one compiled program runs
    on several threads at once, and ctypes releases the GIL for the kernel, so a shared array
    was refilled by a second caller while the first caller's kernel was still reading it (the
    first caller's output was then never written: zeros or garbage)."""

    def __init__(self, nargs: int):
        self.fn, self.argv_type = None, ctypes.c_void_p * nargs

    def bind(self, so: Path, name: str) -> None:
        """Load the built library and take its entry point."""
        fn = getattr(_library(so), name)
        fn.argtypes, fn.restype = [ctypes.c_void_p], None
        self.fn = fn

    def __call__(self, *tensors):
        self.fn(self.argv_type(*[t.data_ptr() for t in tensors]))


class CppSizesLauncher(CppLauncher):
    """A CppLauncher whose trailing arguments are dynamic sizes (ints), each passed as a pointer
    to an int64 (the packed convention of the artifact's C++ kernels). The int64s, like the
    pointer array, belong to the call (see CppLauncher)."""

    def __init__(self, nargs: int):
        super().__init__(nargs)
        self.ints_type = ctypes.c_int64 * nargs

    def __call__(self, *args):
        argv, ints = self.argv_type(), self.ints_type()
        base = ctypes.addressof(ints)
        for i, a in enumerate(args):
            if type(a) is int:
                ints[i] = a
                argv[i] = base + 8 * i
            else:
                argv[i] = a.data_ptr()
        # `ints` stays referenced until the kernel returns: argv points into it
        self.fn(argv)


def build_pool() -> ThreadPoolExecutor:
    """The threads that run kernel builds: one per core (a build is mostly a subprocess)."""
    return _pool_of_process(os.getpid())


@functools.cache
def _pool_of_process(pid: int) -> ThreadPoolExecutor:
    # per process: a forked child inherits the pool object but none of its threads
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="ember-build")


# The builds started while a wrapper loads: None outside `collect_builds()`.
_PENDING: contextvars.ContextVar = contextvars.ContextVar("ember_inductor_builds", default=None)


class Builds:
    """The kernel builds of one program: C++ kernels, built in a few translation units at once,
    and Triton kernels compiled ahead of their first launch.

    A C++ kernel that fails to build fails the program, with every failing kernel named; a
    Triton compile-ahead that fails only logs a warning (the launch compiles it again and
    reports its own error)."""

    def __init__(self):
        self.cpp: list = []  # (name, source, include dir, launcher) not yet submitted
        self.cpp_jobs: list = []  # (kernels of one translation unit, future)
        self.optional: list = []  # (name, future)
        self.keys: set = set()  # of the optional builds submitted
        self.cpp_users: dict = {}  # C++ kernel name -> [(the wrapper's name for it, launcher)]

    def pending(self) -> bool:
        """Is there anything to wait for before the first launch?"""
        return bool(self.cpp or self.cpp_jobs or self.optional)

    def add_cpp(self, name: str, source: str, include: str, launcher: CppLauncher,
                shown: str = "") -> None:  # fmt: skip
        """Build the kernel with the program's; a kernel of the same name (named by content:
        another layer's) is built once and binds every launcher of it. `shown`: the name the
        wrapper knows it by, for messages."""
        users = self.cpp_users.setdefault(name, [])
        users.append((shown or name, launcher))
        if len(users) == 1:
            self.cpp.append((name, source, include, launcher))

    def submit_optional(self, name: str, fn, *args, key=None) -> None:
        """Run fn(*args) in the background; once per `key` (None: always)."""
        if key is not None:
            if key in self.keys:
                return
            self.keys.add(key)
        self.optional.append((name, build_pool().submit(fn, *args)))

    def start(self) -> None:
        """Submit the C++ kernels added so far: one translation unit per core (a compiler
        process costs more than most kernels), each kernel in exactly one."""
        kernels, self.cpp = self.cpp, []
        if kernels:  # the include dir is resolved here: a program never started builds no PCH
            include = _include_dir()
            kernels = [(n, src, inc or include, launcher) for n, src, inc, launcher in kernels]
        for include in sorted({k[2] for k in kernels}):  # one set of build options per unit
            same = [k for k in kernels if k[2] == include]
            for group in _groups(same, os.cpu_count() or 1):
                self.cpp_jobs.append((group, build_pool().submit(_build_group, group)))

    def finish(self) -> None:
        """Wait for every build and bind the C++ launchers; raise one BuildError naming each
        C++ kernel that failed."""
        self.start()
        with progress.stage("kernel compile"):
            self._wait()

    def _wait(self) -> None:
        n = len(self.optional) + sum(len(group) for group, _ in self.cpp_jobs)
        done = 0
        for name, future in self.optional:
            try:
                future.result()
            except Exception as e:  # noqa: BLE001  (the launch compiles again and says why)
                log.warning("ember.inductor: compiling kernel %s ahead of launch failed: %s: %s",
                            name, type(e).__name__, e)  # fmt: skip
            done += 1
            progress.step("kernels built", done, n)
        failures, total = [], 0
        for group, future in self.cpp_jobs:
            total += len(group)
            for (name, _, _, _), built in zip(group, future.result()):
                done += 1
                progress.step("kernels built", done, n)
                users = self.cpp_users[name]
                if isinstance(built, Exception):
                    shown = ", ".join(shown for shown, _ in users)
                    failures.append(f"--- kernel {shown}: {type(built).__name__}: {built}")
                else:
                    for _, launcher in users:
                        launcher.bind(built, name)
        if failures:
            head = f"{len(failures)} of {total} kernels failed to build:"
            raise toolchain.BuildError("\n".join([head, *failures]))


def _groups(kernels: list, n: int) -> list:
    """`kernels` in at most n groups of about equal source size (largest first, each to the
    lightest group); deterministic, so a program always builds the same (cached) units."""
    groups = [[] for _ in range(min(n, len(kernels)))]
    sizes = [0] * len(groups)
    for k in sorted(kernels, key=lambda k: (-len(k[1]), k[0])):
        i = sizes.index(min(sizes))
        groups[i].append(k)
        sizes[i] += len(k[1])
    return [g for g in groups if g]


def _build_group(group: list) -> list:
    """Build the kernels of one group as one library; per kernel its path or its error. When the
    unit fails, each kernel is built alone, so every failure is pinned on its own kernel."""
    names = [name for name, *_ in group]
    if len(group) > 1 and len(set(names)) == len(names):
        code = "\n".join(source for _, source, _, _ in group)
        try:
            so = _cpp_build("kernels_" + "_".join(names[:4]), code, group[0][2])
            return [so] * len(group)
        except toolchain.BuildError:
            pass
    out = []
    for name, source, include, _ in group:
        try:
            out.append(_cpp_build(name, source, include))
        except Exception as e:  # noqa: BLE001  (reported by Builds.finish)
            out.append(e)
    return out


@contextlib.contextmanager
def collect_builds():
    """Kernels loaded inside are collected into the yielded Builds, whose owner starts them
    (`start()`, in the background) and finishes them before the first launch (`finish()`)."""
    builds = Builds()
    token = _PENDING.set(builds)
    try:
        yield builds
    finally:
        _PENDING.reset(token)


def _build_options() -> dict:
    isa = cpu_isa()
    return dict(openmp=config.openmp, isa=isa, cflags=tuple(config.cpp_flags),
                defines=(f"EMBER_VEC_WIDTH={VEC_WIDTH[isa]}", f"EMBER_CPU_H={_HEADER_HASH}"))  # fmt: skip


@functools.cache
def _pch_dir(options_key: str) -> str:
    """A directory holding ember_cpu.h and its precompiled form for these build options.

    Parsing the header (cmath, immintrin.h) is most of a kernel's compile time; g++ uses the
    .gch only when its flags match, and silently falls back to the header otherwise.
    """
    opts = _build_options()
    header = (CSRC / "ember_cpu.h").read_text()
    try:
        gch = toolchain.compile_shared(
            "ember_cpu.h",
            code=header,
            suffix=".gch",
            **{**opts, "cflags": opts["cflags"] + ("-x", "c++-header")},
        )
        # g++ takes the .gch beside the header it names: a copy of the header, checked whole
        copy = gch.with_name("ember_cpu.h")
        if not cache_files.verified_text(copy, header):
            atomic_write(copy, header)
        return str(copy.parent)
    except Exception:  # noqa: BLE001  (no PCH only costs compile time)
        return str(CSRC)


def _cpp_build(name: str, source: str, include: str) -> Path:
    return toolchain.compile_shared(name, code=source, include_dirs=(include,), **_build_options())


def _named_by_content(name: str, source: str, head: str) -> tuple:
    """(name, source) with the kernel's definition `head.format(name)` renamed after the rest of
    its source: the same kernel in every layer of a model is then one build (and one Triton
    autotuning). Unchanged when the definition is not found once."""
    old = head.format(name)
    if source.count(old) != 1:
        return name, source
    body = source.replace(old, head.format("__kernel__"))
    canon = "k" + hashlib.sha256(body.encode()).hexdigest()[:16]
    return canon, body.replace(head.format("__kernel__"), head.format(canon))


def _canonical_cpp(name: str, source: str) -> tuple:
    return _named_by_content(name, source, " {}(void** args)")


def cpp_kernel(name: str, source: str, nargs: int, sizes: int = 0) -> CppLauncher:
    """Compile (cached by content) and load one C++ kernel; inside `collect_builds()` the build
    joins the program's (`Builds.start()`) and the launcher is bound by `Builds.finish()`.
    `sizes`: how many trailing arguments are dynamic sizes (ints) rather than tensors."""
    launcher = (CppSizesLauncher if sizes else CppLauncher)(nargs)
    canon, source = _canonical_cpp(name, source)
    builds = _PENDING.get()
    if builds is None:
        launcher.bind(_cpp_build(canon, source, _include_dir()), canon)
    else:  # the include dir is resolved when the builds start
        builds.add_cpp(canon, source, "", launcher, shown=name)
    return launcher


def _include_dir() -> str:
    """Where kernels find ember_cpu.h: beside its precompiled form for these build options.
    Resolved on the thread that starts builds, so the precompiled header is built once."""
    opts = _build_options()
    return _pch_dir(repr(sorted(opts.items()))) if config.cpp_pch else str(CSRC)


# --- Triton ------------------------------------------------------------------------------------


# Kernels are loaded from the build pool's threads (ahead-of-launch compiles) and the caller's;
# two launchers of one source must not see each other's half-executed module.
_LOAD_LOCK = threading.Lock()


def _module_file(source: str, suffix: str = "") -> tuple:
    """(module name, path) of a kernel's source file, written if missing: named by its source's
    hash, checked against the source itself (Triton reads the kernel's text back from it)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    path = cache_files.content_file(cache_dir() / "triton" / f"k_{digest}.py", source)
    return f"ember_inductor_triton_{digest}{suffix}", path


def _load_module(source: str, suffix: str = ""):
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    modname = f"ember_inductor_triton_{digest}{suffix}"
    with _LOAD_LOCK:
        module = sys.modules.get(modname)
        if module is not None:
            return module
        _, path = _module_file(source, suffix)
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[modname] = module  # only once it is whole
        return module


class TritonLauncher:
    """Launches a Triton kernel with a fixed grid; picks block sizes on first call."""

    def __init__(self, name, source, configs, xnumel, rnumel):
        self.fn_name, self.source = _named_by_content(name, source, "def {}(")
        self._fn = None  # the JITFunction, loaded when first needed (a stored binary needs none)
        self.key = hashlib.sha256(self.source.encode()).hexdigest()[:20]
        self.configs, self.sizes = configs, (xnumel,) + ((rnumel,) if rnumel is not None else ())
        self.cfg, self.fast = None, None

    @property
    def fn(self):
        if self._fn is None:
            self._fn = getattr(_load_module(self.source), self.fn_name)
        return self._fn

    def _grid_and_constants(self, cfg) -> tuple:
        return _grid(self.sizes, cfg), block_constants(cfg)

    def _launch(self, cfg, args):
        grid, consts = self._grid_and_constants(cfg)
        return self.fn[grid](*args, *self.sizes, **consts, **launch_options(cfg))

    def precompile(self, dtypes: tuple) -> None:
        """Compile, ahead of the first call, each config that call will launch (every config
        when it autotunes), for pointer arguments of these dtypes (Triton's warmup)."""
        remembered = _remembered_config(self)
        if remembered is not None:
            planned = [remembered]
        else:
            planned = self.configs if _autotunes(self) else self.configs[:1]
        calls = []
        for cfg in planned:
            if triton_binaries.stored(self.key, cfg):
                continue  # the first call most likely launches the stored binary
            grid, consts = self._grid_and_constants(cfg)
            calls.append(((*dtypes, *self.sizes), {"grid": grid, **consts, **launch_options(cfg)}))
        target = _gpu_target() if calls else None
        if target is not None:  # compiled in worker processes into Triton's cache, in parallel
            modname, path = _module_file(self.source)
            compile_workers.results([  # (a failure: this process compiles it again, below)
                compile_workers.compile_ahead(str(path), modname, self.fn_name, target, a, k)
                for a, k in calls
            ])  # fmt: skip
        for args, kwargs in calls:  # loads what a worker compiled (or compiles it here)
            self.fn.warmup(*args, **kwargs)

    def __call__(self, *args):
        if self.fast is not None:
            return self.fast(*args)
        if self.cfg is None:
            self.cfg = autotune(self, args)
        full = (*args, *self.sizes)
        stored = triton_binaries.load(self.key, self.cfg, full)
        if stored is not None:
            self.fast = _direct_launcher(stored, self.cfg, self.sizes)
            if self.fast is not None:
                return self.fast(*args)
        compiled = self._launch(self.cfg, args)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled
        self.fast = _direct_launcher(compiled, self.cfg, self.sizes)
        if self.fast is not None:
            triton_binaries.save(self.key, self.cfg, full, compiled)


def _gpu_target():
    """The Triton target of this process's current GPU, for compile workers (None without
    workers, or if Triton cannot say)."""
    if not compile_workers.worker_count():
        return None
    try:
        from triton.runtime.driver import driver

        return driver.active.get_current_target()
    except Exception:  # noqa: BLE001  (the kernel then compiles in this process)
        return None


def _direct_launcher(compiled, cfg, sizes):
    """A launch that skips Triton's Python binder (argument specialisation, cache lookup): the
    compiled kernel's own launcher, as Triton's `JITFunction.run` calls it. None if unavailable."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not hasattr(compiled, "packed_metadata"):
        return None
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    get_stream = driver.active.get_current_stream
    gx, gy = (*_grid(sizes, cfg), 1)[:2]
    tail = (*sizes, *block_constants(cfg).values())
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata

    def launch(*args):
        run(gx, gy, 1, get_stream(device), fn, meta, None, None, None, *args, *tail)

    return launch


# A launch config's entries that are options of the launch, not constexpr parameters of the
# kernel (a matmul template's configs set num_stages: gemm_template.py).
LAUNCH_OPTIONS = ("num_warps", "num_stages")


def block_constants(cfg: dict) -> dict:
    """The constexpr parameters of a launch config (XBLOCK, ...), in its order."""
    return {k: v for k, v in cfg.items() if k not in LAUNCH_OPTIONS}


def launch_options(cfg: dict) -> dict:
    """The launch options of a config (num_warps, and num_stages where it sets one)."""
    return {k: cfg[k] for k in LAUNCH_OPTIONS if k in cfg}


def _grid(sizes, cfg) -> tuple:
    """Programs along x, and along a tile's inner dims (YBLOCK: sizes are (xnumel, ynumel))."""
    if "YBLOCK" in cfg:
        return (-(-sizes[0] // cfg["XBLOCK"]), -(-sizes[1] // cfg["YBLOCK"]))
    return (-(-sizes[0] // cfg["XBLOCK"]),)


def _autotunes(launcher: TritonLauncher) -> bool:
    return (
        config.autotune
        and os.environ.get("TRITON_INTERPRET") != "1"
        and len(launcher.configs) > 1
    )


def _autotune_path() -> Path:
    return cache_dir() / "autotune.json"


# The last autotune.json read: (path, the file's identity when read, its choices). Every Triton
# kernel of a program looks its choice up (ahead of launch and at its first call), and the file
# holds the choices of every kernel tuned so far, so reading it each time made a warm compile
# cost O(kernels x file size). atomic_write replaces the file (new inode, new mtime), so the
# identity changes with every write, ours or another process's; a stale read could only pick
# another of the kernel's configs, each of which computes the same result.
_CHOICES: list = [None, None, {}]
_CHOICES_LOCK = threading.Lock()  # lookups run on the build threads too


def _known_choices() -> dict:
    """The remembered choices, by `_autotune_key` (read again only when the file changed).
    Shared: copy before changing it."""
    path = _autotune_path()
    try:
        with open(path, "rb") as f:  # the identity of the very file that is read
            st = os.fstat(f.fileno())
            stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with _CHOICES_LOCK:
                if _CHOICES[0] == path and _CHOICES[1] == stamp:
                    return _CHOICES[2]
            known = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    with _CHOICES_LOCK:
        _CHOICES[:] = [path, stamp, known]
    return known


def _autotune_key(launcher: TritonLauncher) -> str:
    return f"{launcher.key}:{launcher.sizes}"


def _remembered_config(launcher: TritonLauncher):
    """The config autotuning chose for this kernel and sizes before, if it is still offered."""
    if not _autotunes(launcher):
        return None
    known = _known_choices().get(_autotune_key(launcher))
    return known if isinstance(known, dict) and known in launcher.configs else None


def scratch_copy(a):
    """A copy of a kernel argument for trial launches, laid out as `a` is: the kernel indexes it
    with `a`'s strides, baked in when it was generated. (`clone` lays out a view with gaps, such
    as a row-padded buffer viewed back to its length, contiguously: a trial launch then wrote
    past its end, an illegal memory access in a Swin transformer's training step.)"""
    if not isinstance(a, torch.Tensor):
        return a
    # the memory the view spans, copied whole: a broadcast view (stride 0) cannot be copied into
    extent = 0 if a.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))
    span = torch.empty(extent, dtype=a.dtype, device=a.device)
    span.copy_(a.as_strided((extent,), (1,), a.storage_offset()))
    return span.as_strided(a.shape, a.stride())


def _trial_launch(launcher: TritonLauncher, cfg: dict, copies: list):
    """One config's launch on the copies: its compiled kernel's own launcher where there is one
    (Triton's Python binder costs more than a small kernel runs). Launches once, which compiles
    the config if its ahead-of-time build has not."""
    compiled = launcher._launch(cfg, copies)
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    fast = _direct_launcher(compiled, cfg, launcher.sizes)
    if fast is not None:
        return lambda: fast(*copies)
    return lambda: launcher._launch(cfg, copies)


_STORED = re.compile(r"\btl\.(store|atomic_\w+)\(\s*(\w+)")
_LOADED = re.compile(r"\btl\.load\(\s*(\w+)")


@functools.lru_cache(maxsize=4096)
def _writes_of(source: str, fn_name: str) -> tuple:
    """Per parameter of the kernel: (stored to, stored to by an atomic, loaded from); read off
    the source (every store and load names its pointer argument first)."""
    head = re.search(rf"def {re.escape(fn_name)}\(([^)]*)\)", source)
    names = [p.split(":")[0].strip() for p in head.group(1).split(",")] if head else []
    stored = {m.group(2): m.group(1) for m in _STORED.finditer(source)}
    loaded = set(_LOADED.findall(source))
    return tuple((n in stored, stored.get(n, "").startswith("atomic"), n in loaded) for n in names)


def trial_arguments(launcher: TritonLauncher, args) -> list:
    """The arguments of autotuning's trial launches: a copy (`scratch_copy`) only of what a
    launch repeated would change: an argument the kernel writes and also reads, or accumulates
    into, or whose memory another argument shares. Every other argument is the real one: a
    kernel writes its outputs whole, so the launch after the trials writes what it would have
    (copying every argument held a second copy of the largest tensors, a GPT-2 training step's
    logits among them, at the peak of the first step)."""
    kinds = _writes_of(launcher.source, launcher.fn_name)
    if len(kinds) < len(args):  # a signature not understood: copy all, as before
        return [scratch_copy(a) for a in args]
    storages = [a.untyped_storage().data_ptr() if isinstance(a, torch.Tensor) else None
                for a in args]  # fmt: skip
    out = list(args)
    for i, a in enumerate(args):
        stored, atomic, loaded = kinds[i]
        if not stored or not isinstance(a, torch.Tensor):
            continue
        shared = any(j != i and s == storages[i] for j, s in enumerate(storages))
        if atomic or loaded or shared:
            out[i] = scratch_copy(a)
    return out


def autotune(launcher: TritonLauncher, args) -> dict:
    """The fastest config (on copies of the arguments), remembered on disk by kernel and sizes."""
    if not _autotunes(launcher):
        return launcher.configs[0]
    remembered = _remembered_config(launcher)
    if remembered is not None:
        return remembered
    with progress.stage("autotune"):  # at a kernel's first call: part of the first step's cost
        copies = trial_arguments(launcher, args)
        warmup, rep = config.autotune_ms
        launches = [_trial_launch(launcher, c, copies) for c in launcher.configs]
        times = trial_timing.choose(trial_timing.cuda_measure(launches), len(launches), warmup, rep)
    best = launcher.configs[min(range(len(times)), key=times.__getitem__)]
    known = dict(_known_choices())
    known[_autotune_key(launcher)] = best
    cache_files.try_write_atomic(_autotune_path(), json.dumps(known))
    return best


class TritonSizesLauncher(TritonLauncher):
    """A Triton launcher for dynamic sizes: its trailing arguments are the size symbols, from
    which `numel` computes (xnumel, rnumel), and so the grid, at each call. Block sizes are the
    first config's (chosen for the example sizes; every config is correct for any size)."""

    def __init__(self, name, source, configs, xnumel, rnumel, numel):
        super().__init__(name, source, configs, xnumel, rnumel)
        self.numel, self.nsyms, self.cfg = numel, numel.__code__.co_argcount, configs[0]

    def precompile(self, dtypes: tuple) -> None:
        """Nothing ahead of the first call: the size arguments are not known until then."""

    def __call__(self, *args):
        buffers, syms = args[: -self.nsyms], args[-self.nsyms :]
        xnumel, rnumel = self.numel(*syms)
        sizes = (xnumel,) if rnumel is None else (xnumel, rnumel)
        cfg = self.cfg
        grid = (-(-xnumel // cfg["XBLOCK"]),)
        self.fn[grid](*buffers, *sizes, *syms, **block_constants(cfg), **launch_options(cfg))


def triton_kernel(name, source, configs, xnumel, rnumel, numel=None) -> TritonLauncher:
    if numel is not None:
        return TritonSizesLauncher(name, source, configs, xnumel, rnumel, numel)
    return TritonLauncher(name, source, configs, xnumel, rnumel)


class TritonTemplateLauncher:
    """Launches a hand-written Triton kernel (a template such as triton_attention's flash
    attention) with one fixed configuration: `launcher[grid](*args)`; the constants of `cfg`
    (UPCAST on under Triton's CPU interpreter, see the template) and its num_warps/num_stages."""

    def __init__(self, name, source, cfg):
        self.fn_name, self.source = _named_by_content(name, source, "def {}(")
        self._fn = None
        # the launch's keywords, once: its constants, then num_warps/num_stages
        self.kwargs = {**block_constants(cfg), **launch_options(cfg)}
        if "UPCAST" in self.kwargs and os.environ.get("TRITON_INTERPRET") == "1":
            self.kwargs["UPCAST"] = True

    def __getitem__(self, grid):
        if self._fn is None:
            self._fn = getattr(_load_module(self.source), self.fn_name)
        launch, kwargs = self._fn[tuple(int(g) for g in grid)], self.kwargs
        return lambda *args: launch(*args, **kwargs)


def triton_template(name, source, cfg) -> TritonTemplateLauncher:
    return TritonTemplateLauncher(name, source, cfg)


def precompile_triton(name: str, launcher: TritonLauncher, arg_types: tuple) -> None:
    """Inside `collect_builds()` on a GPU, compile `launcher`'s kernel in the background;
    arg_types are its ir types ("*fp32" for a pointer; the trailing sizes are the launcher's)."""
    builds = _PENDING.get()
    if builds is None or os.environ.get("TRITON_INTERPRET") == "1":
        return
    if not isinstance(launcher, TritonLauncher):  # a template's kernel compiles at its first call
        return
    dtypes = tuple(POINTER_DTYPES[t[1:]] for t in arg_types if t.startswith("*"))
    # the same kernel (another layer's) compiles once
    builds.submit_optional(name, launcher.precompile, dtypes, key=(launcher.key, launcher.sizes, dtypes))


# --- externs and buffers -----------------------------------------------------------------------


def extern(name: str):
    """The callable behind an extern step: torch's eager kernel, or a prim's reference."""
    from .lowering_views import EXTERN_KERNELS

    if name in EXTERN_KERNELS:
        return EXTERN_KERNELS[name]
    target = resolve(name)
    return getattr(target, "ref", None) or target


def index_put(a, indices, values, accumulate=False, in_place=False):
    """prims.index_put, with a CUDA accumulation through one index tensor run as index_add_:
    atomic adds. torch's index_put_ sorts the indices and gives each distinct one a warp that
    walks its repeats in turn, so a few rows taking many updates serialise: a relative position
    bias's gradient (512 x 512 indices into 32 rows, T5) took 10 ms on an H200. Several index
    tensors stay on index_put_, which checks each against its own dim; so do deterministic runs.
    `in_place`: write into `a` (a view of a graph input nothing else reads; input_updates.py)
    and return it."""
    if in_place:
        return a.index_put_(tuple(indices), values, accumulate)
    if (not accumulate or a.device.type != "cuda" or len(indices) != 1 or indices[0] is None
            or indices[0].dtype not in (torch.int64, torch.int32)
            or torch.are_deterministic_algorithms_enabled()
            or not isinstance(values, torch.Tensor) or a.dim() == 0):  # fmt: skip
        return index_put_prim.ref(a, indices, values, accumulate)
    idx, rows = indices[0], a.shape[0]
    idx = torch.where(idx < 0, idx + rows, idx).reshape(-1)  # index_add_ takes no negatives
    # repeats of a 16-bit float add in float32, as torch's kernel sums them, then round once
    wide = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    out = a.to(wide, memory_format=torch.contiguous_format, copy=True)
    values = values.expand(*indices[0].shape, *a.shape[1:]).reshape(-1, *a.shape[1:])
    return out.index_add_(0, idx, values.to(wide)).to(a.dtype)


def empty_strided(sizes, strides, dtype, device):
    return torch.empty_strided(sizes, strides, dtype=dtype, device=device)


def reinterpret(t: torch.Tensor, sizes, strides, offset=0):
    """A view of `t`'s storage (for buffer reuse and strided views)."""
    return t.as_strided(sizes, strides, t.storage_offset() + offset)


def restride(t: torch.Tensor, sizes, strides):
    """`t` with exactly the strides the kernels expect (a copy only when they differ)."""
    if tuple(t.stride()) == tuple(strides) or t.numel() <= 1:
        return t
    out = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
