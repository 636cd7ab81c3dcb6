"""What generated wrappers call at load and run time: kernel loaders, launchers and externs.

Launchers are prepared once per compiled graph: a C++ launcher keeps its ctypes argument array
and only writes data pointers into it per call; a Triton launcher binds its grid and block sizes
(chosen by autotuning on first call, and remembered on disk).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from ember.ir import resolve

from .config import config

CSRC = Path(__file__).with_name("csrc")
_HEADER_HASH = hashlib.sha256((CSRC / "ember_cpu.h").read_bytes()).hexdigest()[:16]
VEC_WIDTH = {"avx512": 16, "avx2": 8, "generic": 4}

from ember.ir import toolchain


def cpu_isa() -> str:
    return config.isa or toolchain.cpu_isa()


def cache_dir() -> Path:
    path = Path(toolchain.cache_dir()) / "inductor"
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --- C++ ---------------------------------------------------------------------------------------


class CppLauncher:
    """Calls `void entry(void** args)` with the tensors' data pointers."""

    def __init__(self, fn, nargs: int):
        self.fn, self.argv = fn, (ctypes.c_void_p * nargs)()

    def __call__(self, *tensors):
        argv = self.argv
        for i, t in enumerate(tensors):
            argv[i] = t.data_ptr()
        self.fn(argv)


class CppSizesLauncher(CppLauncher):
    """A CppLauncher whose trailing arguments are dynamic sizes (ints), passed in pointer slots."""

    def __call__(self, *args):
        argv = self.argv
        for i, a in enumerate(args):
            argv[i] = a if type(a) is int else a.data_ptr()
        self.fn(argv)


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
        copy = gch.with_name("ember_cpu.h")
        if not copy.exists():
            atomic_write(copy, header)
        return str(copy.parent)
    except Exception:  # noqa: BLE001  (no PCH only costs compile time)
        return str(CSRC)


def cpp_kernel(name: str, source: str, nargs: int, sizes: int = 0) -> CppLauncher:
    """Compile (cached by content) and load one C++ kernel."""
    opts = _build_options()
    include = _pch_dir(repr(sorted(opts.items()))) if config.cpp_pch else str(CSRC)
    so = toolchain.compile_shared(name, code=source, include_dirs=(include,), **opts)
    fn = getattr(ctypes.CDLL(str(so)), name)
    fn.argtypes, fn.restype = [ctypes.c_void_p], None
    return (CppSizesLauncher if sizes else CppLauncher)(fn, nargs)


# --- Triton ------------------------------------------------------------------------------------


def _load_module(source: str, suffix: str = ""):
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    path = cache_dir() / "triton" / f"k_{digest}.py"
    if not path.exists():
        atomic_write(path, source)
    modname = f"ember_inductor_triton_{digest}{suffix}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module


class TritonLauncher:
    """Launches a Triton kernel with a fixed grid; picks block sizes on first call."""

    def __init__(self, name, source, configs, xnumel, rnumel):
        self.fn = getattr(_load_module(source), name)
        self.key = hashlib.sha256(source.encode()).hexdigest()[:20]
        self.configs, self.sizes = configs, (xnumel,) + ((rnumel,) if rnumel is not None else ())
        self.cfg, self.fast = None, None

    def _launch(self, cfg, args):
        grid = (-(-self.sizes[0] // cfg["XBLOCK"]),)
        consts = {k: v for k, v in cfg.items() if k != "num_warps"}
        return self.fn[grid](*args, *self.sizes, **consts, num_warps=cfg["num_warps"])

    def __call__(self, *args):
        if self.fast is not None:
            return self.fast(*args)
        if self.cfg is None:
            self.cfg = autotune(self, args)
        compiled = self._launch(self.cfg, args)
        self.fast = _direct_launcher(compiled, self.cfg, self.sizes)


def _direct_launcher(compiled, cfg, sizes):
    """A launch that skips Triton's Python binder (argument specialisation, cache lookup): the
    compiled kernel's own launcher, as Triton's `JITFunction.run` calls it. None if unavailable."""
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    if os.environ.get("TRITON_INTERPRET") == "1" or not hasattr(compiled, "packed_metadata"):
        return None
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    get_stream = driver.active.get_current_stream
    grid = -(-sizes[0] // cfg["XBLOCK"])
    tail = (*sizes, *(v for k, v in cfg.items() if k != "num_warps"))
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata

    def launch(*args):
        run(grid, 1, 1, get_stream(device), fn, meta, None, None, None, *args, *tail)

    return launch


def autotune(launcher: TritonLauncher, args) -> dict:
    """The fastest config (on copies of the arguments), remembered on disk by kernel and sizes."""
    if (
        not config.autotune
        or os.environ.get("TRITON_INTERPRET") == "1"
        or len(launcher.configs) == 1
    ):
        return launcher.configs[0]
    path = cache_dir() / "autotune.json"
    key = f"{launcher.key}:{launcher.sizes}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), dict) and known[key] in launcher.configs:
        return known[key]
    from triton.testing import do_bench

    copies = [a.clone() for a in args]
    times = [
        do_bench(lambda c=c: launcher._launch(c, copies), warmup=5, rep=20)
        for c in launcher.configs
    ]
    best = launcher.configs[min(range(len(times)), key=times.__getitem__)]
    known[key] = best
    atomic_write(path, json.dumps(known))
    return best


class TritonSizesLauncher(TritonLauncher):
    """A Triton launcher for dynamic sizes: its trailing arguments are the size symbols, from
    which `numel` computes (xnumel, rnumel), and so the grid, at each call. Block sizes are the
    first config's (chosen for the example sizes; every config is correct for any size)."""

    def __init__(self, name, source, configs, xnumel, rnumel, numel):
        super().__init__(name, source, configs, xnumel, rnumel)
        self.numel, self.nsyms, self.cfg = numel, numel.__code__.co_argcount, configs[0]

    def __call__(self, *args):
        buffers, syms = args[: -self.nsyms], args[-self.nsyms :]
        xnumel, rnumel = self.numel(*syms)
        sizes = (xnumel,) if rnumel is None else (xnumel, rnumel)
        cfg = self.cfg
        grid = (-(-xnumel // cfg["XBLOCK"]),)
        consts = {k: v for k, v in cfg.items() if k != "num_warps"}
        self.fn[grid](*buffers, *sizes, *syms, **consts, num_warps=cfg["num_warps"])


def triton_kernel(name, source, configs, xnumel, rnumel, numel=None) -> TritonLauncher:
    if numel is not None:
        return TritonSizesLauncher(name, source, configs, xnumel, rnumel, numel)
    return TritonLauncher(name, source, configs, xnumel, rnumel)


# --- externs and buffers -----------------------------------------------------------------------


def extern(name: str):
    """The callable behind an extern step: torch's eager kernel, or a prim's reference."""
    from .lowering_views import EXTERN_KERNELS

    if name in EXTERN_KERNELS:
        return EXTERN_KERNELS[name]
    target = resolve(name)
    return getattr(target, "ref", None) or target


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
