"""The README's `./bazelw run //:demo`: the whole tour runs in a subprocess and every step passes.

torch.compile is left out (`--no-torch-compile`): it is only the reference the demo races, and its
own cold compile would dominate this test's time.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).parent.parent / "demo.py"  # in Bazel's runfiles too (data = //:demo.py)

SECTIONS = ["[1] compile", "[2] speed", "[2b] speed on the GPU", "[3] explain", "[4] export"]
SUMMARY = ["compile  | cold", "speed    | CPU: eager", "explain  | 1 graph, 0 breaks",
           "package  | export", "all steps passed"]  # fmt: skip


@pytest.fixture(scope="module")
def tour():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, str(DEMO), "--no-torch-compile"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_every_step_of_the_tour_passes(tour):
    out = tour.stdout
    assert tour.returncode == 0, out + tour.stderr
    for text in SECTIONS + SUMMARY:
        assert text in out, f"{text!r} missing from the demo's output:\n{out}"
    assert "FAILED" not in out and "Traceback" not in out + tour.stderr, out + tour.stderr


def test_the_tour_reports_what_it_measured(tour):
    out = tour.stdout
    assert "graph and its" in out and "loaded from the cache" in out, out  # the warm start hit
    assert "break: Tensor.item()" in out and "demo.py:" in out, out  # the break, at file:line
    assert "links neither libtorch nor libpython" in out, out
    assert "torch.compile not run (--no-torch-compile)" in out, out


def test_a_failing_step_is_one_line_and_a_nonzero_exit(capsys):
    spec = importlib.util.spec_from_file_location("ember_demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    tour = demo.Tour(argparse.Namespace(no_torch_compile=True, keep=False))
    shutil.rmtree(tour.workdir)
    tour.step(9, "a step that breaks", "broken", lambda: 1 / 0)
    tour.step(10, "a step that works", "fine", lambda: "ok")
    tour.print_summary(1.0)
    out = capsys.readouterr().out
    assert "  FAILED: ZeroDivisionError: division by zero" in out
    assert "Traceback" not in out and " broken   | FAILED (ZeroDivisionError)" in out, out
    assert " fine     | ok" in out and "FAILED: broken" in out, out
    assert tour.failed == ["broken"]
