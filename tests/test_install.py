"""Each component installs alone into an empty venv (ir first, then its dependants) and imports.

Wheels are built offline with the .venv's setuptools, installed with --no-deps into a venv that has
nothing of Ember; torch and sympy are borrowed from the running interpreter through PYTHONPATH (a
plain path entry, so the .venv's editable-install .pth files stay inactive in the child).
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).absolute().parents[1]
# Each component after the components it depends on (ARCHITECTURE.md's table).
ORDER = ("ir", "primtorch", "aot_autograd", "dynamo", "inductor", "cpp_wrapper")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    build = tmp_path_factory.mktemp("build")
    for c in ORDER:
        # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
        subprocess.run(["cp", "-r", str(ROOT / c), str(build / c)], check=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "-w", str(out), str(build / c)], check=True)  # fmt: skip
    return out


def test_components_install_alone_and_import(wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"], PYTHONNOUSERSITE="1")
    env.pop("EMBER_CACHE_DIR", None)
    installed = []
    for c in ORDER:
        dist = f"ember_{c}"
        (wheel,) = wheels.glob(f"{dist}-*.whl")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], check=True)  # fmt: skip
        installed.append(c)
        probe = (
            "import json, ember, importlib;"
            f"mods = [importlib.import_module('ember.' + n) for n in {installed!r}];"
            "print(json.dumps([m.__file__ for m in mods] + [m.__version__ for m in mods]))"
        )
        out = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"ember.{c} does not import once installed:\n{out.stderr}"
        files_and_versions = json.loads(out.stdout)
        files = files_and_versions[: len(installed)]
        assert all(str(venv) in f for f in files), files  # imported from the new venv, not the tree
        assert files_and_versions[len(installed):] == [
            (ROOT / n / "VERSION").read_text().strip() for n in installed
        ]


def test_wheels_declare_their_component_dependencies(wheels):
    import zipfile

    for c in ORDER:
        (wheel,) = wheels.glob(f"ember_{c}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith("METADATA"))
            requires = [ln for ln in z.read(meta).decode().splitlines() if ln.startswith("Requires-Dist")]
        needed = {"primtorch": {"ir"}, "aot_autograd": {"ir", "primtorch"}, "dynamo": {"ir"},
                  "inductor": {"ir", "primtorch", "aot_autograd"}, "cpp_wrapper": {"ir"}}.get(c, set())  # fmt: skip
        for dep in needed:
            assert any(f"ember-{dep.replace('_', '-')}" in r for r in requires), (c, dep, requires)
