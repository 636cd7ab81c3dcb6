"""Every cache level under faults: truncated, corrupted and foreign entries, a read-only cache, a
full disk and 8 processes sharing one empty cache each compile correctly, in a process that
survives (a damaged library once crashed the loader).

Levels: torch-level entries (inductor/fx), prim-graph programs (inductor/graphs), wrapper code
(inductor/wrappers), Triton kernel sources (inductor/triton) and C++ builds (so/: kernels, the
precompiled header, dynamo's extension); Triton binaries need a GPU, so their entry directories
are checked here through the same cache_files calls (test_inductor_gpu.py loads real ones).
Each case runs in a subprocess (a crash is a failed test, not a dead test run), compares its
results with eager, counts the warnings it logged and audits the cache it leaves.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ember.ir import cache_files

WORKER = textwrap.dedent('''
    import errno, json, logging, os, random, shutil, sys
    from pathlib import Path
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from torch import nn
    from ember.ir import cache_files

    mode, cache, warm, levels = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
    warnings = []

    class Count(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("ember").addHandler(Count(logging.WARNING))
    if mode == "enospc":  # the cache's disk fills up half way through every write to it
        write = cache_files._write
        def full(f, data):
            if not str(f.name).startswith(str(cache)):
                return write(f, data)
            f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        cache_files._write = full

    import ember, ember.dynamo  # (builds dynamo's extension: after the hook)
    from ember.inductor import config, metrics, runtime

    LEVELS = {"fx": "inductor/fx/*.json", "programs": "inductor/graphs/*.json",
              "wrappers": "inductor/wrappers/*.bin", "triton": "inductor/triton/*.py",
              "cpp": "so/*/*"}

    def files(level, alone):
        out = sorted(p for p in cache.glob(LEVELS[level]) if p.is_file())
        if level == "cpp" and alone:
            # alone, only kernels: an extension loads once a process, and the precompiled
            # header (seconds to build again) is damaged with every level, in a new process
            out = [p for p in out if p.parent.name in kernel_entries]
        return out

    def replace(path, data):  # a new file: what another process maps keeps its pages
        tmp = path.with_name(path.name + ".damage")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def damage(level, fault, alone):
        rng, paths = random.Random(0), files(level, alone)
        contents = [p.read_bytes() for p in paths]
        for i, p in enumerate(paths):
            data = contents[i]
            if fault == "truncated":
                data = data[: len(data) // 2]
            elif fault == "corrupted":
                b = bytearray(data)
                for j in rng.sample(range(len(b)), max(1, len(b) // 100)):
                    b[j] ^= 0xFF
                data = bytes(b)
            elif fault == "foreign":  # another entry's (valid) bytes, under this one's name
                others = [c for c in contents if c != data]
                data = others[i % len(others)] if others else b"foreign"
            replace(p, data)
        return len(paths)

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)

    def tri(x):
        return torch.softmax(x, -1) * x.cos(), (x * 2).sum(0)

    def run_models():
        ember.dynamo.reset()
        with torch.no_grad():
            torch.testing.assert_close(ember.compile(mlp)(x), mlp(x), rtol=1e-4, atol=1e-5)
        config.cpu_backend = "triton"
        try:
            got, want = ember.compile(tri)(x), tri(x)
        finally:
            config.cpu_backend = "cpp"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    def fresh_state():
        cache_files._VERIFIED.clear()
        runtime._pch_dir.cache_clear()
        for name in [m for m in sys.modules if m.startswith("ember_inductor_triton_")]:
            del sys.modules[name]
        metrics.reset()
        warnings.clear()

    if mode in ("enospc", "race") or (mode == "readonly" and not any(cache.iterdir())):
        # a cold start without the precompiled header (published like every other entry, and
        # seconds to build); its setting is part of every key, so a warm cache keeps it
        config.cpp_pch = False
    kernel_entries = {p.parent.name for p in cache.glob("so/*/k*.so")}
    report = []
    for level in levels:
        damaged = 0
        if level not in ("none",) and mode in ("truncated", "corrupted", "foreign"):
            if level != "all" or report:  # "all": the cache the parent prepared
                shutil.rmtree(cache, ignore_errors=True)
                shutil.copytree(warm, cache)
            fresh_state()
            for name in (LEVELS if level == "all" else [level]):
                damaged += damage(name, mode, alone=level != "all")
        # prim-graph programs are looked up only behind a torch-level miss
        config.fx_cache = level != "programs"
        run_models()
        config.fx_cache = True
        report.append(dict(level=level, damaged=damaged, warnings=list(warnings),
                           fx_hits=metrics.fx_cache_hits, fx_misses=metrics.fx_cache_misses))
        fresh_state()
    print("REPORT " + json.dumps(report))
''')

LEVELS = ("fx", "programs", "wrappers", "triton", "cpp")


def _env(cache: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), EMBER_CACHE_DIR=str(cache),
                TRITON_INTERPRET="1")  # fmt: skip


def _worker(mode: str, cache: Path, warm: Path, levels, prefix=()) -> list:
    cmd = [*prefix, sys.executable, "-c", WORKER, mode, str(cache), str(warm), *levels]
    run = subprocess.run(cmd, env=_env(cache), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}{run.stderr[-4000:]}"
    line = next(s for s in run.stdout.splitlines() if s.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def _audit(cache: Path) -> int:
    """Every entry the cache holds checks out and nothing half-written is left; entries seen."""
    from ember.inductor import cache as program_cache

    leftovers = [p for p in cache.rglob("*") if p.name.endswith((".tmp", ".bad", ".damage"))]
    assert not leftovers, leftovers
    seen = 0
    for manifest in cache.rglob(cache_files.MANIFEST):
        entry = manifest.parent
        assert cache_files.verified_dir(entry, entry.name), entry
        seen += 1
    for path in cache.glob("inductor/*/*.json"):  # fx and graphs: key, versions, checksum
        header = json.loads(path.read_bytes().partition(b"\n")[0])
        with_versions_of_this_checkout = program_cache.read_entry(path, header["key"])
        assert isinstance(with_versions_of_this_checkout, dict)
        seen += 1
    return seen


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> tuple:
    """(the cache every case runs in, a pristine copy of it warmed by compiling the models once
    in another process). One path for all: kernel builds are keyed by their include
    directories, the precompiled header's among them, which lie inside the cache."""
    cache, warm = tmp_path_factory.mktemp("cache"), tmp_path_factory.mktemp("warm")
    report = _worker("populate", cache, cache, ["none"])
    assert report[0]["fx_misses"] == 2
    for pattern in ("inductor/fx/*.json", "inductor/graphs/*.json", "inductor/wrappers/*.bin",
                    "inductor/triton/*.py", "so/*/*.so", "so/*/*.gch"):  # fmt: skip
        assert list(cache.glob(pattern)), f"the warm cache has no {pattern}"
    assert _audit(cache) > 0
    shutil.rmtree(warm)
    shutil.copytree(cache, warm)
    return cache, warm


def _fresh(caches, start: str) -> tuple:
    """The shared cache path holding a copy of the warm cache, or nothing ("empty")."""
    cache, warm = caches
    shutil.rmtree(cache)
    shutil.copytree(warm, cache) if start == "warm" else cache.mkdir()
    return cache, warm


@pytest.mark.parametrize("fault", ["truncated", "corrupted", "foreign"])
def test_damaged_entries_are_rebuilt(caches, fault):
    """First every level damaged at once in a new process (dynamo's extension among them), then
    each level alone under intact ones: results match eager, every damaged level was noticed
    (warned) and the cache ends whole again."""
    cache, warm = _fresh(caches, "warm")
    report = _worker(fault, cache, warm, ["all", *LEVELS])
    for case in report:
        assert case["damaged"] > 0, case
        assert case["warnings"], case  # each damaged level said so
        assert not any("cannot write" in w for w in case["warnings"]), case
    by_level = {c["level"]: c for c in report}
    assert by_level["all"]["fx_misses"] == 2
    for level in ("wrappers", "triton", "cpp"):  # found behind an intact fx entry
        assert by_level[level]["fx_hits"] == 2, by_level[level]
    assert _audit(cache) >= _audit(warm)


def _read_only_prefix(cache: Path):
    """A command prefix under which `cache` is read-only (None: this machine cannot make it so)."""
    if os.geteuid() != 0:
        for p in [cache, *cache.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
        return ()
    if shutil.which("unshare") is None:
        return None
    # root writes through permissions: a read-only bind mount in a mount namespace of its own
    prefix = ("unshare", "-m", "sh", "-c", f'mount --bind -o ro "{cache}" "{cache}" && exec "$@"',
              "sh")  # fmt: skip
    probe = subprocess.run([*prefix, "touch", str(cache / "probe")], capture_output=True)
    return prefix if probe.returncode != 0 and not (cache / "probe").exists() else None


@pytest.mark.parametrize("start", ["warm", "empty"])
def test_read_only_cache(caches, start):
    """A read-only cache is read (warm: every level hits, nothing to say) or only costs one
    warning (empty: builds go to a private directory); results match eager either way."""
    cache, warm = _fresh(caches, start)
    prefix = _read_only_prefix(cache)
    if prefix is None:
        pytest.skip("cannot make a directory read-only here (root without mount namespaces)")
    try:
        (case,) = _worker("readonly", cache, warm, ["none"], prefix)
    finally:
        for p in [cache, *cache.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
    if start == "warm":
        assert case["fx_hits"] == 2 and case["warnings"] == [], case
    else:
        assert case["fx_misses"] == 2 and len(case["warnings"]) <= 1, case
        assert not any(cache.iterdir())


def test_full_disk(caches):
    """Every cache write fails half way (ENOSPC): one warning, correct results, and nothing
    half-written left in the cache."""
    cache, warm = _fresh(caches, "empty")
    (case,) = _worker("enospc", cache, warm, ["none"])
    assert case["fx_misses"] == 2 and len(case["warnings"]) == 1, case
    assert "No space left" in case["warnings"][0]
    assert _audit(cache) == 0


def test_eight_processes_share_an_empty_cache(caches):
    """8 processes compile the same models into one empty cache at once: all correct, no
    crash, and the cache they leave is whole (a ninth process finds every entry)."""
    cache, warm = _fresh(caches, "empty")
    # dynamo's extension is seeded (building it 8 times over would take most of a minute on two
    # cores); its entry is published by the same code as every kernel's
    for entry in warm.glob("so/*"):
        if any(".cpython-" in p.name for p in entry.iterdir()):
            shutil.copytree(entry, cache / "so" / entry.name)
    cmd = [sys.executable, "-c", WORKER, "race", str(cache), str(warm), "none"]
    procs = [subprocess.Popen(cmd, env=_env(cache), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}{err[-4000:]}"
        (case,) = json.loads(next(s for s in out.splitlines() if s.startswith("REPORT "))[7:])
        assert not any("damaged" in w for w in case["warnings"]), case
    assert _audit(cache) >= 5  # fx and graph entries of both models, the kernel library
    (after,) = _worker("race", cache, warm, ["none"])
    assert after["fx_hits"] == 2 and after["warnings"] == [], after


# Triton binaries' entries (a GPU's) through the calls triton_binaries.py makes
_FILES = {"kernel.cubin": b"\x7fELF cubin bytes" * 64, "kernel.json": b'{"shared": 0}',
          "launch.json": b'{"name": "k"}'}  # fmt: skip


@pytest.mark.parametrize("fault", ["truncated", "corrupted", "foreign", "absent"])
def test_binary_entry_is_used_only_whole(tmp_path, fault):
    entry = cache_files.publish_dir(tmp_path / "triton_bin" / "a", "a", _FILES)
    other = cache_files.publish_dir(tmp_path / "triton_bin" / "b", "b", {**_FILES,
                                    "kernel.cubin": b"another kernel"})  # fmt: skip
    assert cache_files.read_verified(entry, "a", _FILES) == _FILES
    cubin = entry / "kernel.cubin"
    if fault == "truncated":
        cubin.write_bytes(cubin.read_bytes()[:10])
    elif fault == "corrupted":
        cubin.write_bytes(b"\x00" + cubin.read_bytes()[1:])
    elif fault == "foreign":  # another entry's files, manifest and all
        shutil.rmtree(entry)
        shutil.copytree(other, entry)
    else:
        (entry / cache_files.MANIFEST).unlink()
    assert cache_files.read_verified(entry, "a", _FILES) is None
    again = cache_files.publish_dir(tmp_path / "triton_bin" / "a", "a", _FILES)
    assert cache_files.read_verified(again, "a", _FILES) == _FILES


def test_binary_entry_on_a_full_disk(tmp_path, monkeypatch):
    """The cache's disk is full: nothing half-written stays; the entry lands in a private
    directory of the process, whole."""
    cache = tmp_path / "cache"
    write = cache_files._write

    def full(f, data):
        if not str(f.name).startswith(str(cache)):
            return write(f, data)
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device (simulated)")

    monkeypatch.setattr(cache_files, "_write", full)
    entry = cache_files.publish_dir(cache / "triton_bin" / "e", "e", _FILES)
    assert not str(entry).startswith(str(cache))
    assert list(cache.rglob("*")) == [cache / "triton_bin"]  # nothing half-written
    assert cache_files.read_verified(entry, "e", _FILES) == _FILES
    assert cache_files.find_dir(cache / "triton_bin" / "e", "e", _FILES) == entry
