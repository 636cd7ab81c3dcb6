"""The compiler driver: builds generated kernels, wrappers and Python extensions with g++.

Every piece of C++ that Ember compiles at run time goes through here, with or without Bazel: flags
are chosen for the CPU it runs on (AVX2 or AVX512), outputs are cached by a hash of the sources,
the flags and the compiler, each build lands as one entry directory with a manifest of SHA-256s
(`cache_files`), and a cached library is loaded only once its bytes match that manifest.
`python -m ember.ir.toolchain build` prebuilds the Python extensions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Optional, Sequence

from . import cache_files


@dataclasses.dataclass
class ToolchainConfig:
    """Where builds go and which compiler makes them; EMBER_CACHE_DIR and EMBER_CXX override."""

    cache_dir: Path = dataclasses.field(
        default_factory=lambda: Path(
            os.environ.get("EMBER_CACHE_DIR") or Path.home() / ".cache" / "ember"
        )
    )
    cxx: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_CXX", "g++"))
    opt: str = "-O3"
    verbose: bool = dataclasses.field(default_factory=lambda: bool(os.environ.get("EMBER_VERBOSE_BUILD")))


config = ToolchainConfig()


class BuildError(RuntimeError):
    """The C++ compiler rejected a source; the message carries its command and diagnostics."""


def cache_dir() -> Path:
    """The root of Ember's on-disk caches."""
    return Path(config.cache_dir)


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The CPU's feature flags as /proc/cpuinfo lists them ("avx2", "amx_bf16", ...); none
    where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=None)
def cpu_isa() -> str:
    """The widest vector ISA this CPU and compiler both support: "avx512", "avx2" or "generic"."""
    forced = os.environ.get("EMBER_CPU_ISA")
    if forced:
        return forced
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "generic"


ISA_FLAGS = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "generic": (),
}


@functools.lru_cache(maxsize=None)
def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"no C++ compiler {cxx!r} found ({e}); set EMBER_CXX") from None


def python_include_dirs() -> list[str]:
    return [sysconfig.get_paths()["include"]]


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()[:32]


def compile_shared(
    name: str,
    sources: Sequence[os.PathLike | str] = (),
    *,
    code: Optional[str] = None,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    openmp: bool = False,
    isa: Optional[str] = None,
    lang: str = "c++",
    suffix: str = ".so",
) -> Path:
    """Compile `sources` (paths) and/or `code` (text) into a shared library; cached by content."""
    isa = isa or cpu_isa()
    srcs = [Path(s) for s in sources]
    std = "-std=c++17" if lang == "c++" else "-std=c11"
    # Symbols are hidden unless marked EMBER_EXPORT, so kernels never clash with each other.
    flags = [std, config.opt, "-fPIC", "-shared", "-fvisibility=hidden", "-fno-strict-aliasing",
             '-DEMBER_EXPORT=extern "C" __attribute__((visibility("default")))', *ISA_FLAGS[isa], *(f"-D{d}" for d in defines), *(f"-I{d}" for d in include_dirs),
             *cflags]  # fmt: skip
    if openmp:
        flags.append("-fopenmp")
    key = _digest(
        [name.encode(), _compiler_id(config.cxx).encode(), " ".join(flags + list(ldflags)).encode(),
         (code or "").encode(), *(s.read_bytes() for s in srcs)]  # fmt: skip
    )
    filename = f"{name}{suffix}"

    def build(tmp: Path) -> Path:
        inputs = [str(s) for s in srcs]
        if code is not None:
            ext = ".cpp" if lang == "c++" else ".c"
            src = tmp / f"{name}{ext}"
            src.write_text(code)
            inputs.append(str(src))
        out = tmp / filename
        cmd = [config.cxx if lang == "c++" else "gcc", *flags, *inputs, "-o", str(out), *ldflags]
        if openmp:
            cmd.append("-fopenmp")
        if config.verbose:
            print("ember build:", " ".join(cmd), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"building {name} failed:\n$ {' '.join(cmd)}\n{proc.stderr[-8000:]}")
        return out

    # verified before anyone dlopens it
    return cache_files.built_file(cache_dir() / "so" / key, key, filename, build)


def _binding_sources(binding: str) -> tuple[list[Path], list[str], list[str]]:
    """Extra sources, include dirs and defines that a binding library needs."""
    if binding == "nanobind":
        import nanobind

        src = Path(nanobind.source_dir())
        robin = Path(nanobind.include_dir()).parent / "ext" / "robin_map" / "include"
        return [src / "nb_combined.cpp"], [nanobind.include_dir(), str(robin)], ["NB_COMPACT_ASSERTIONS"]
    if binding == "pybind11":
        import pybind11

        return [], [pybind11.get_include()], []
    if binding == "none":
        return [], [], []
    raise ValueError(f"unknown binding library {binding!r}")


def build_extension(
    module_name: str,
    sources: Sequence[os.PathLike | str],
    *,
    binding: str = "nanobind",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    cflags: Sequence[str] = (),
) -> object:
    """Build (or reuse) the Python extension `module_name` from `sources` and import it."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    extra_srcs, extra_inc, extra_def = _binding_sources(binding)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    path = compile_shared(
        module_name.rsplit(".", 1)[-1],
        [*sources, *extra_srcs],
        include_dirs=[*include_dirs, *extra_inc, *python_include_dirs()],
        defines=[*defines, *extra_def],
        cflags=[*cflags, "-Wno-unused-parameter"],
        isa="generic",  # an extension is not a kernel: it must load on any CPU of this arch
        suffix=suffix,
    )
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# The Python extensions of the components, by importable module name: importing each one builds it.
EXTENSION_MODULES = ("ember.dynamo._C", "ember.cpp_wrapper._C")


def build_all(modules: Sequence[str] = EXTENSION_MODULES) -> list[str]:
    """Build every listed extension (skipping components not installed); returns what was built."""
    built = []
    for name in modules:
        package = name.rsplit(".", 1)[0]
        if importlib.util.find_spec(package) is None:
            continue
        importlib.import_module(name)
        built.append(name)
    return built


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] != "build":
        print("usage: python -m ember.ir.toolchain build [module ...]", file=sys.stderr)
        return 2
    for name in build_all(argv[1:] or EXTENSION_MODULES):
        print(f"built {name}")
    print(f"cpu isa: {cpu_isa()}; cache: {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
