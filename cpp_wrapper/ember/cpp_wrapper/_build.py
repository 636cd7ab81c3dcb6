"""Building the C++ pieces through the compiler driver: the runtime, run_package and C++ tests."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from ember.ir import cache_files, toolchain

CSRC = Path(__file__).resolve().with_name("csrc")
# The runtime library: everything under csrc/runtime (the C ABI, loader, pool, extern kernels).
RUNTIME_SOURCES = tuple(sorted((CSRC / "runtime").glob("*.cc")))
RUN_PACKAGE_SOURCE = CSRC / "run_package.cc"
EXTENSION_SOURCE = CSRC / "python" / "ext.cc"


def headers_digest() -> str:
    """A hash of every header under csrc/: the driver hashes sources only, so builds that include
    these headers carry this digest (as a define or a comment) to rebuild when a header changes."""
    h = hashlib.sha256()
    for path in sorted(CSRC.rglob("*.h")):
        h.update(path.relative_to(CSRC).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _find_dlpack_header() -> Path:
    import torch  # only to locate the header it ships; nothing of torch is linked

    base = Path(torch.__file__).resolve().parent / "include"
    for candidate in (base / "dlpack" / "dlpack.h", base / "ATen" / "dlpack.h"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError("no dlpack.h found in the torch install; set EMBER_DLPACK_INCLUDE")


@functools.lru_cache(maxsize=None)
def dlpack_include_dir() -> str:
    """A directory with dlpack/dlpack.h, as Bazel's @local_python//:dlpack provides it."""
    override = os.environ.get("EMBER_DLPACK_INCLUDE")
    if override:
        return override
    header = _find_dlpack_header()
    data = header.read_bytes()
    root = toolchain.cache_dir() / "cpp_wrapper" / "include" / hashlib.sha256(data).hexdigest()[:16]
    # checked against the header itself; a private copy when the cache cannot be written
    target = cache_files.content_file(root / "dlpack" / "dlpack.h", data)
    return str(target.parent.parent)


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[str, ...]:
    """Where cuda.h is, if anywhere (the runtime declares what it needs itself otherwise)."""
    roots = [
        os.environ.get("CUDA_HOME", ""),
        "/usr/local/cuda",
        *sorted(Path("/usr/local").glob("cuda-*")),
    ]
    for root in roots:
        if root and (Path(root) / "include" / "cuda.h").exists():
            return (str(Path(root) / "include"),)
    return ()


def include_dirs() -> list[str]:
    """Include directories for anything that includes ember_runtime.h."""
    return [str(CSRC), dlpack_include_dir(), *cuda_include_dirs()]


def runtime_defines() -> list[str]:
    return [f"EMBER_HEADERS_DIGEST={headers_digest()}"]


def build_runtime_library() -> Path:
    """libember_runtime.so: the C ABI of ember_runtime.h, for C/C++ programs that link it."""
    return toolchain.compile_shared(
        "libember_runtime",
        RUNTIME_SOURCES,
        include_dirs=include_dirs(),
        defines=runtime_defines(),
        ldflags=["-ldl"],
        openmp=True,
        isa="generic",  # the GEMM picks AVX-512/AVX2 at load time by itself
    )


# AddressSanitizer + UndefinedBehaviorSanitizer: for the loader's tests on hostile packages
# (tests/test_package_mutations.py). Frame pointers and -g make the reports point at a line.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]


def _flags(sanitize: bool = False) -> list[str]:
    return [
        "-std=c++17",
        "-O1" if sanitize else toolchain.config.opt,
        *(SANITIZE_FLAGS if sanitize else []),
        "-fvisibility=hidden",
        "-fno-strict-aliasing",
        "-fopenmp",
        "-fPIC",
        *(f"-I{d}" for d in include_dirs()),
        *(f"-D{d}" for d in runtime_defines()),
    ]


def _key(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:32]


def _run(cmd: list[str], what: str) -> None:
    if toolchain.config.verbose:
        print("ember build:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise toolchain.BuildError(
            f"building {what} failed:\n$ {' '.join(cmd)}\n{proc.stderr[-8000:]}"
        )


def _cached(folder: str, key: str, name: str, build) -> Path:
    """`name` of the entry `key` under the cache's `folder`, verified, or built and published."""
    return cache_files.built_file(toolchain.cache_dir() / folder / key, key, name, build)


@functools.lru_cache(maxsize=None)
def sanitizer_unavailable() -> str | None:
    """Why the compiler cannot build and run a sanitized program here, or None when it can."""
    cxx = toolchain.config.cxx
    with tempfile.TemporaryDirectory(prefix="ember-asan-") as tmp:
        src, exe = Path(tmp) / "probe.cc", Path(tmp) / "probe"
        src.write_text("#include <vector>\nint main() { std::vector<int> v(3); return v[1]; }\n")
        proc = subprocess.run(
            [cxx, *SANITIZE_FLAGS, str(src), "-o", str(exe)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            return f"{cxx} {' '.join(SANITIZE_FLAGS)} fails: {proc.stderr[-500:]}"
        proc = subprocess.run([str(exe)], capture_output=True, text=True)
        if proc.returncode != 0:  # e.g. ASan cannot map its shadow memory under this kernel
            return f"a sanitized program does not run: {proc.stderr[-500:]}"
    return None


def build_runtime_archive(sanitize: bool = False) -> Path:
    """libember_runtime.a: the runtime's objects, compiled once (cached), linked into programs.
    `sanitize` builds them with AddressSanitizer and UBSan (a separate cache entry)."""
    cxx = toolchain.config.cxx
    flags = _flags(sanitize)
    key = _key(
        cxx.encode(),
        toolchain._compiler_id(cxx).encode(),
        " ".join(flags).encode(),
        *(s.read_bytes() for s in RUNTIME_SOURCES),
    )

    def build(tmp: Path) -> Path:
        objects = []
        for src in RUNTIME_SOURCES:
            obj = tmp / f"{src.stem}.o"
            _run([cxx, *flags, "-c", str(src), "-o", str(obj)], f"{src.name}")
            objects.append(str(obj))
        archive = tmp / "libember_runtime.a"
        _run(["ar", "rcs", str(archive), *objects], "libember_runtime.a")
        return archive

    return _cached("lib", key, "libember_runtime.a", build)


def compile_program(name: str, sources: Sequence[Path], sanitize: bool = False) -> Path:
    """Compile an executable from `sources` and link it with the runtime archive (cached).

    Flags follow the compiler driver's (its compiler, -O3, hidden visibility, OpenMP); the program
    links only libc, libstdc++, libm, libdl and libgomp (never libtorch or libpython). `sanitize`:
    built and linked with AddressSanitizer and UBSan (which add their own runtime libraries).
    """
    cxx = toolchain.config.cxx
    archive = build_runtime_archive(sanitize)
    flags = _flags(sanitize)
    key = _key(
        name.encode(),
        cxx.encode(),
        " ".join(flags).encode(),
        str(archive).encode(),
        *(Path(s).read_bytes() for s in sources),
    )

    def build(tmp: Path) -> Path:
        out = tmp / name
        _run(
            [cxx, *flags, *map(str, sources), str(archive), "-o", str(out), "-ldl", "-lpthread"],
            name,
        )
        return out

    return _cached("bin", key, name, build)


def build_run_package(sanitize: bool = False) -> Path:
    """The run_package program (the runtime linked in statically), cached; `sanitize`: an
    AddressSanitizer + UBSan build for tests."""
    return compile_program("run_package", [RUN_PACKAGE_SOURCE], sanitize)


def build_cpp_test(name: str) -> Path:
    """A C++ test program csrc/tests/NAME.cc linked with the runtime."""
    return compile_program(name, [CSRC / "tests" / f"{name}.cc"])
