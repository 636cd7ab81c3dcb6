"""Packages are untrusted input: over a thousand mutated packages and inputs through run_package.

Two small CPU packages are built once (a static MLP with four weights, and a model with a dynamic
batch size and two outputs). Each mutation (package_mutations.py: truncations and byte flips of
every file, hostile values in every manifest field, resized weights, filesystem tricks, wrong or
malformed input .npy files) is written as its own package directory and run by `run_package` in a
subprocess, two at a time. A run must end in a clean error (an EmberStatus exit code with a
message on stderr) or, where the meaning survives the mutation, in the right result; never a
signal, a hang or a wrong answer. A sample runs again under an AddressSanitizer build.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cppw_artifacts as A
import numpy as np
import package_mutations as M
import pytest
import torch

from ember.cpp_wrapper import _build, package
from ember.cpp_wrapper.errors import STATUS

STATUS_NAMES = {v: k for k, v in STATUS.items()}
WORKERS = 2  # the machine's cores; each case is one short process
SANITIZER_REPORTS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")


class Subject:
    """A packaged model, its reference input, and its eager reference."""

    def __init__(self, name, path, x, eager, n_out):
        self.name, self.path, self.x, self.eager, self.n_out = name, path, x, eager, n_out
        self.manifest_text = (path / "manifest.json").read_text()

    def mutations(self, rng: random.Random, wrong_shapes, good_shapes, scale: int):
        files = {f: (self.path / f).read_bytes() for f in M.PACKAGE_FILES}
        out = []
        for name, data in files.items():
            out += M.truncations(name, data, rng, 6 * scale)
            out += M.byte_flips(name, data, rng, 10 * scale)
        out += M.resizes("weights.bin", files["weights.bin"]) + M.resizes("model.so", files["model.so"])
        out += M.manifest_field_mutations(json.loads(self.manifest_text))
        out = M.classify_manifest_mutations(json.loads(self.manifest_text), out)
        out += M.manifest_text_mutations(self.manifest_text)  # expectations of their own
        out += M.filesystem_mutations()
        out += M.npy_mutations(self.x, rng, wrong_shapes, good_shapes)
        return [(self, m) for m in out]


@pytest.fixture(scope="module")
def subjects(tmp_path_factory):
    root = tmp_path_factory.mktemp("subjects")
    consts = A.small_mlp_constants()
    mlp = package(A.small_mlp(), root / "mlp", constants=consts)
    w = torch.randn(8, generator=torch.Generator().manual_seed(1))
    dyn = package(A.elementwise_reduction(), root / "dyn", constants={"w": w})
    x6 = torch.randn(6, 8, generator=torch.Generator().manual_seed(2)).numpy()
    x5 = torch.randn(5, 8, generator=torch.Generator().manual_seed(3)).numpy()
    return (
        Subject("mlp", mlp, x6, lambda x: [A.small_mlp_eager(x, consts)], 1),
        Subject("dyn", dyn, x5, lambda x: A.elementwise_reduction_eager(x, w), 2),
    )


@pytest.fixture(scope="module")
def cases(subjects):
    mlp, dyn = subjects
    rng = random.Random(20240917)
    shape_errors = [((6, 9), 3), ((5, 8), 3), ((6,), 3), ((6, 8, 1), 3), ((0, 8), 3), ((48,), 3)]
    shape_errors += [((), 3), ((1, 6, 8), 3)]
    dyn_errors = [((1, 8), 5), ((4097, 8), 5), ((0, 8), 5), ((3, 9), 3), ((3,), 3), ((2, 2, 8), 3)]
    found = mlp.mutations(rng, shape_errors, [], scale=4)
    found += dyn.mutations(rng, dyn_errors, [(2, 8), (17, 8), (4096, 8)], scale=2)
    return found


def _verdict(subject: Subject, m: M.Mutation, proc, outs: list[Path]) -> str | None:
    """None when the run is an acceptable outcome of mutation `m`, else what went wrong."""
    rc, err = proc.returncode, proc.stderr
    if any(word in err for word in SANITIZER_REPORTS):
        return "sanitizer report:\n" + err[-3000:]
    if rc < 0:
        return f"killed by {signal.Signals(-rc).name}: {err[-500:]}"
    if rc == 0:
        if m.expect == "error":
            return "ran, but the mutation must be rejected"
        try:
            xs = [np.load(io.BytesIO(b)) for b in m.inputs] if m.inputs else [subject.x]
        except Exception as e:  # noqa: BLE001 (any numpy complaint)
            return f"ran an input numpy itself rejects ({e})"
        want = subject.eager(*[torch.from_numpy(np.ascontiguousarray(x)) for x in xs])
        for path, w in zip(outs, want):
            got = np.load(path)
            w = w.numpy()
            if got.shape != w.shape or not np.allclose(got, w, rtol=1e-5, atol=1e-5, equal_nan=True):
                return f"WRONG RESULT in {path.name}: {got.ravel()[:4]} vs {w.ravel()[:4]}"
        return None
    if rc not in STATUS_NAMES or rc == 0:
        return f"exit status {rc} is no EmberStatus: {err[-500:]}"
    if m.expect == "ok":
        return f"rejected a mutation that keeps the meaning: {err.strip()}"
    if m.status is not None and rc != m.status:
        return f"status {STATUS_NAMES[rc]}, expected {STATUS_NAMES[m.status]}: {err.strip()}"
    if not err.startswith("run_package: ") or STATUS_NAMES[rc] not in err or len(err) < 40:
        return f"no message naming the failure: {err!r}"
    return None


def run_mutations(exe: Path, cases, work: Path, env=None) -> list[str]:
    """Run every case (two at a time); the failures, one line per mutation."""

    def one(i: int) -> str | None:
        subject, m = cases[i]
        root = work / f"case{i}"
        pkg = M.materialise(subject.path, m, root / "pkg")
        ins = []
        for k, blob in enumerate(m.inputs or [M.npy_bytes(subject.x)]):
            ins.append(root / f"in{k}.npy")
            ins[-1].write_bytes(blob)
        outs = [root / f"out{k}.npy" for k in range(subject.n_out)]
        cmd = [str(exe), str(pkg), *map(str, ins), *map(str, outs)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, errors="replace", timeout=60, env=env
            )
            verdict = _verdict(subject, m, proc, outs)
        except subprocess.TimeoutExpired:
            verdict = "hung (60 s)"
        shutil.rmtree(root, ignore_errors=True)
        return None if verdict is None else f"[{subject.name}] {m.name}: {verdict}"

    with ThreadPoolExecutor(WORKERS) as pool:
        return [f for f in pool.map(one, range(len(cases))) if f is not None]


def test_a_thousand_mutated_packages_fail_cleanly_or_run_correctly(subjects, cases, tmp_path):
    assert len(cases) >= 1000, len(cases)
    kinds = {m.expect for _, m in cases}
    assert kinds == {"ok", "error", "either"}
    exe = _build.build_run_package()
    start = time.perf_counter()
    failures = run_mutations(exe, cases, tmp_path)
    elapsed = time.perf_counter() - start
    assert not failures, f"{len(failures)} of {len(cases)} mutations misbehaved:\n" + "\n".join(
        failures[:60]
    )
    print(f"{len(cases)} mutations in {elapsed:.1f} s")


def test_the_base_packages_run_and_mutations_are_distinct(subjects, cases, tmp_path):
    """The harness itself: unmutated packages pass, and the cases are not one mutation repeated."""
    exe = _build.build_run_package()
    clean = [(s, M.Mutation("none", "ok")) for s in subjects]
    assert run_mutations(exe, clean, tmp_path) == []
    wrong = [(subjects[0], M.Mutation("claims an error", "error"))]
    assert "must be rejected" in run_mutations(exe, wrong, tmp_path)[0]
    assert len({(s.name, m.name) for s, m in cases}) > 0.95 * len(cases)


def _asan_available() -> str | None:
    """Why an AddressSanitizer build cannot run here, or None when it can."""
    try:
        return _build.sanitizer_unavailable()
    except Exception as e:  # noqa: BLE001
        return str(e)


def test_mutations_under_address_sanitizer(subjects, cases, tmp_path):
    why = _asan_available()
    if why:
        pytest.skip(f"no AddressSanitizer build here: {why}")
    exe = _build.build_run_package(sanitize=True)
    sample = cases[:: max(1, len(cases) // 220)]
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86:handle_segv=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    failures = run_mutations(exe, sample, tmp_path, env=env)
    assert not failures, f"{len(failures)} of {len(sample)} under ASan:\n" + "\n".join(failures[:30])
    assert len(sample) >= 200
