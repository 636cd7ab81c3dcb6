"""Building a model library fast: kernels in groups of about eight per translation unit, units
compiled in parallel, each object cached by content, then one (cached) link.

A package's `model.so` used to be one compiler call over the wrapper and every kernel file: g++
compiled the units one after another, each parsing the same inlined kernel header (cmath,
immintrin.h), so a DenseNet-121-shaped CNN took 69 s where its in-process build took 3. Here:
- each unit (a group of kernels chosen by content, a user operator's source, the wrapper, a
  cubin) is compiled to an object on its own, on a thread pool sized to the cores, and published
  in the cache under a hash of its text, the flags and the compiler: a second package of the
  model compiles nothing, one of a model sharing kernels only the groups it changes;
- the text every kernel starts with (inductor's inlined header) is precompiled once per build
  configuration, and each kernel unit includes it: g++ then loads the parse instead of redoing
  it. The object is the same as from the inlined text, so it is cached under that text's key;
- the wrapper is glue run once per step: it is compiled at `WRAPPER_OPT`, the kernels at the
  toolchain's level;
- the library is linked from the objects and cached under their keys.

`counters` counts compiler and linker runs, for tests and the bench (no timing needed to see a
warm build compile nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

from ember.ir import cache_files, progress, toolchain

# The wrapper validates inputs and calls kernels and the runtime once per step. Measured on a
# 2-core x86 (60 Linear layers, ~120 steps, package called from Python): 23.7 us a call at -O1,
# 23.0 at -O3, 24.3 at -O0; DenseNet-121's wrapper (5,400 lines) compiles in 1.7 s at -O1, 2.7 s
# at -O3, 0.45 s at -O0.
WRAPPER_OPT = "-O1"
# A shared prefix shorter than this, or fewer kernels to compile, is not worth a precompiled
# header (inductor's: ~1 s to precompile, ~0.4 s of parsing saved per kernel).
MIN_PRELUDE = 2048
MIN_PCH_UNITS = 4
# Kernels per translation unit, on average (at most twice as many): a unit costs ~0.27 s on top
# of its kernels (the compiler's start, loading the precompiled header), so DenseNet-121's 66
# kernels took 41 s of CPU as 66 units, 24 s as 9 units of about 8, 24 s as 2 (2-core x86).
KERNELS_PER_UNIT = 8
PRELUDE = "ember_prelude.h"


@dataclasses.dataclass
class BuildCounters:
    """What the builds of this process ran: units compiled, found cached, links, headers."""

    compiled: int = 0
    cached: int = 0
    linked: int = 0
    precompiled_headers: int = 0

    def reset(self) -> None:
        """Zero every count."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)


counters = BuildCounters()
_COUNT_LOCK = threading.Lock()


def _count(field: str) -> None:
    with _COUNT_LOCK:
        setattr(counters, field, getattr(counters, field) + 1)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One translation unit: its name (for messages), its text, and flags of its own."""

    name: str
    text: str
    flags: tuple = ()
    kernel: bool = True  # compiled in a group of kernels, sharing their prelude if they have one


def workers() -> int:
    """How many compilers run at once: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


@functools.cache
def _pool(pid: int) -> ThreadPoolExecutor:
    # per process: a forked child inherits the pool object but none of its threads
    return ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="ember-cppw-build")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little") + p)
    return h.hexdigest()[:32]


def compile_flags(*, isa: str, include_dirs: Sequence[str], defines: Sequence[str],
                  openmp: bool) -> list[str]:  # fmt: skip
    """The compiler driver's flags for a unit of a shared library (toolchain.compile_shared's)."""
    return ["-std=c++17", toolchain.config.opt, "-fPIC", "-fvisibility=hidden",
            "-fno-strict-aliasing",
            '-DEMBER_EXPORT=extern "C" __attribute__((visibility("default")))',
            *toolchain.ISA_FLAGS[isa], *(f"-D{d}" for d in defines),
            *(f"-I{d}" for d in include_dirs), *(["-fopenmp"] if openmp else [])]  # fmt: skip


def _run(cmd: list[str], what: str) -> None:
    if toolchain.config.verbose:
        print("ember build:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise toolchain.BuildError(f"building {what} failed:\n$ {' '.join(cmd)}\n"
                                   f"{proc.stderr[-8000:]}")  # fmt: skip


def prelude_of(texts: Sequence[str]) -> str:
    """The longest leading lines all `texts` share that end outside any #if (a header that
    compiles on its own, when it is one); "" when too short to pay for a precompiled header."""
    if len(texts) < 2:
        return ""
    first, last = min(texts), max(texts)  # the common prefix of all is theirs
    n = len(os.path.commonprefix([first, last]))
    depth, cut, pos = 0, 0, 0
    for line in first[:n].splitlines(keepends=True):
        pos += len(line)
        if not line.endswith("\n"):
            break
        word = line.lstrip()
        if word.startswith("#"):
            word = word[1:].lstrip()
            if word.startswith(("if", "ifdef", "ifndef")):
                depth += 1
            elif word.startswith("endif"):
                depth -= 1
        if depth == 0:
            cut = pos
    return first[:cut] if cut >= MIN_PRELUDE else ""


def _precompile(prelude: str, flags: list[str], cxx: str) -> Optional[Path]:
    """A directory holding the prelude as a header and its precompiled form for `flags` (cached);
    None when it does not compile as a header (the units then inline it, as written)."""
    key = _digest(b"pch", cxx.encode(), toolchain._compiler_id(cxx).encode(),
                  " ".join(flags).encode(), prelude.encode())  # fmt: skip
    entry = toolchain.cache_dir() / "cpp_wrapper" / "pch" / key
    names = (PRELUDE, PRELUDE + ".gch")
    found = cache_files.find_dir(entry, key, names)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(prefix="ember-pch-") as tmp:
        header, gch = Path(tmp) / PRELUDE, Path(tmp) / (PRELUDE + ".gch")
        header.write_text(prelude)
        try:
            _run([cxx, *flags, "-x", "c++-header", str(header), "-o", str(gch)], PRELUDE)
        except toolchain.BuildError:
            return None  # only costs compile time
        _count("precompiled_headers")
        return cache_files.publish_dir(entry, key, {PRELUDE: prelude, PRELUDE + ".gch": gch})


def _object(unit: Unit, key: str, flags: list[str], cxx: str,
            pch: Optional[tuple[str, Path]]) -> Path:  # fmt: skip
    """The unit's object file, from the cache or compiled (with the precompiled prelude when
    `pch` = (prelude, its directory) applies to it)."""
    entry = toolchain.cache_dir() / "cpp_wrapper" / "obj" / key

    def build(tmp: Path) -> Path:
        text, extra = unit.text, []
        if pch is not None and unit.kernel and text.startswith(pch[0]):
            # the same text as written: the header is the prelude, byte for byte
            text = f'#include "{PRELUDE}"\n' + text[len(pch[0]):]
            extra = [f"-I{pch[1]}"]
        src, obj = tmp / "unit.cpp", tmp / "unit.o"
        src.write_text(text)
        _run([cxx, *extra, *flags, *unit.flags, "-c", str(src), "-o", str(obj)], unit.name)
        _count("compiled")
        return obj

    return cache_files.built_file(entry, key, "unit.o", build)


def _text_digest(unit: Unit) -> str:
    return _digest(unit.text.encode())


def group_kernels(units: Sequence[Unit]) -> list[list[Unit]]:
    """Kernel units in groups of about KERNELS_PER_UNIT, each compiled as one unit. Chosen by
    content (ordered by hash, a group ending after a kernel whose hash is 0 modulo the size, or
    at twice it): adding or changing a kernel changes its own group only, so a model sharing
    kernels with another finds most groups of either compiled."""
    groups, current = [], []
    for unit in sorted(units, key=_text_digest):
        current.append(unit)
        boundary = int(_text_digest(unit)[:8], 16) % KERNELS_PER_UNIT == 0
        if boundary or len(current) >= 2 * KERNELS_PER_UNIT:
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def _merged(group: Sequence[Unit]) -> Unit:
    """One unit of a group's kernels, one after another (inductor's kernels each inline the same
    guarded header: only the first copy is compiled)."""
    if len(group) == 1:
        return group[0]
    more = f" (+{len(group) - 3})" if len(group) > 3 else ""
    return Unit(", ".join(u.name for u in group[:3]) + more, "\n".join(u.text for u in group),
                group[0].flags)  # fmt: skip


def _group_objects(job: Sequence[Unit], keys: Sequence[str], flags: list[str], cxx: str,
                   pch) -> list:  # fmt: skip
    """The objects of a job: [unit] gives its object; [merged, *kernels] (a group) the merged
    unit's, or where that does not compile (two kernels defining the same helper, say) each
    kernel's own; a kernel that fails alone gives its error instead."""
    try:
        return [_object(job[0], keys[0], flags, cxx, pch)]
    except toolchain.BuildError as e:
        if len(job) == 1:
            return [e]
    out = []
    for unit, key in zip(job[1:], keys[1:]):
        try:
            out.append(_object(unit, key, flags, cxx, pch))
        except toolchain.BuildError as e:
            out.append(e)
    return out


def build_library(name: str, units: Sequence[Unit], flags: list[str], *,
                  ldflags: Sequence[str] = ()) -> Path:  # fmt: skip
    """Compile `units` (in parallel, each cached) with `flags` and link them into NAME.so
    (cached by the objects' keys); raises BuildError naming every unit that failed."""
    cxx = toolchain.config.cxx
    ident = toolchain._compiler_id(cxx).encode()

    def key(unit: Unit) -> str:
        return _digest(b"obj", cxx.encode(), ident, " ".join([*flags, *unit.flags]).encode(),
                       unit.text.encode())  # fmt: skip

    # jobs: [units] each; a group of kernels is [merged, *members] (members: its fallback)
    jobs = [[u] for u in units if not u.kernel]
    for group in group_kernels([u for u in units if u.kernel]):
        jobs.append([_merged(group), *group] if len(group) > 1 else group)
    keys = [[key(u) for u in job] for job in jobs]
    openmp = ["-fopenmp"] if "-fopenmp" in flags else []
    link = ["-shared", "-fPIC", *openmp, *ldflags]
    so_key = _digest(b"so", cxx.encode(), ident, " ".join(link).encode(),
                     *(k[0].encode() for k in keys))  # fmt: skip
    filename, so_entry = f"{name}.so", toolchain.cache_dir() / "so" / so_key
    found = cache_files.find_dir(so_entry, so_key, [filename])
    if found is not None:  # linked before from these very units
        for _ in jobs:
            _count("cached")
        return found / filename
    root = toolchain.cache_dir() / "cpp_wrapper" / "obj"
    found = [cache_files.find_dir(root / k[0], k[0], ["unit.o"]) for k in keys]
    objects: list = [None if d is None else [d / "unit.o"] for d in found]
    missing = [i for i, o in enumerate(objects) if o is None]
    for _ in range(len(jobs) - len(missing)):
        _count("cached")
    pool, futures = _pool(os.getpid()), {}
    with progress.stage("package build"):
        # the wrapper and data units compile while the prelude is precompiled
        for i in missing:
            if not jobs[i][0].kernel:
                futures[i] = pool.submit(_group_objects, jobs[i], keys[i], flags, cxx, None)
        texts = [jobs[i][0].text for i in missing if jobs[i][0].kernel]
        prelude = prelude_of(texts) if len(texts) >= MIN_PCH_UNITS else ""
        pch = None
        if prelude:
            found_pch = _precompile(prelude, flags, cxx)
            pch = (prelude, found_pch) if found_pch is not None else None
        for i in missing:
            if jobs[i][0].kernel:
                futures[i] = pool.submit(_group_objects, jobs[i], keys[i], flags, cxx, pch)
        failures = []
        for done, (i, future) in enumerate(futures.items(), 1):
            objects[i] = future.result()
            members = jobs[i][1:] or jobs[i]
            failures += [f"--- {u.name}: {o}" for u, o in zip(members, objects[i])
                         if isinstance(o, Exception)]  # fmt: skip
            progress.step("units built", done, len(futures))
    if failures:
        raise toolchain.BuildError(f"{len(failures)} of {len(units)} translation units of "
                                   f"{name} failed to build:\n" + "\n".join(failures))  # fmt: skip
    objects = [o for objs in objects for o in objs]

    def build(tmp: Path) -> Path:
        out = tmp / filename
        _run([cxx, *link[:2], *map(str, objects), "-o", str(out), *link[2:]], filename)
        _count("linked")
        return out

    return cache_files.built_file(so_entry, so_key, filename, build)


# Each byte as it stands in a C string literal: itself when plain, else a three-digit octal
# escape (never more than three digits, so a digit may follow it; no "?" for trigraphs).
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,:;+-*/=")
_C_CHARS = [chr(b) if b in _PLAIN else f"\\{b:03o}" for b in range(256)]


def _escape(data: bytes) -> str:
    """`data` as C string literals, 96 bytes a line (g++ reads a literal far faster than the list
    of integers the wrapper used to embed)."""
    chars = _C_CHARS.__getitem__
    lines = ['"' + "".join(map(chars, data[at:at + 96])) + '"' for at in range(0, len(data), 96)]
    return "\n".join(lines) or '""'


def data_unit(symbol: str, data: bytes) -> Unit:
    """A unit defining `extern "C" const unsigned char SYMBOL[]` with `data` (a cubin): its own
    object, cached by content, so the wrapper's unit stays small and a cubin compiles once."""
    text = (f'extern "C" __attribute__((visibility("hidden"))) const unsigned char '
            f"{symbol}[{len(data) + 1}] =\n{_escape(data)};\n")  # fmt: skip
    return Unit(f"cubin {symbol}", text, ("-O0",), kernel=False)
