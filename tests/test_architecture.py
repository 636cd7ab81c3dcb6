"""Checks that guard the architecture: no torch compiler imports, and only the allowed arrows."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).absolute().parents[1]
COMPONENTS = ("ir", "primtorch", "aot_autograd", "dynamo", "inductor", "cpp_wrapper")
# Which components each component's product code may import (ARCHITECTURE.md, "Components").
ALLOWED = {
    "ir": set(),
    "primtorch": {"ir"},
    "aot_autograd": {"ir", "primtorch"},
    "dynamo": {"ir"},
    "inductor": {"ir", "primtorch", "aot_autograd"},
    "cpp_wrapper": {"ir"},
}
FORBIDDEN = re.compile(
    r"torch\._(dynamo|inductor|functorch|decomp|prims|prims_common|refs|subclasses|export|guards)\b"
    r"|torch\.fx\.experimental\.(proxy_tensor|symbolic_shapes|sym_node)"
    r"|torch\.utils\._sympy|torch\.export\b|torch\.compile\b|torch\.compiler\b|torch\.ops\.prims\b"
)


def product_files(component, suffixes=(".py", ".cc", ".cpp", ".h")):
    """Product code of a component: its package, without its tests."""
    pkg = ROOT / component / "ember" / component
    return [p for p in pkg.rglob("*") if p.suffix in suffixes and "tests" not in p.parts]


def test_every_component_is_complete():
    for c in COMPONENTS:
        for name in ("BUILD.bazel", "VERSION", "pyproject.toml", "README.md"):
            assert (ROOT / c / name).is_file(), f"{c}/{name} is missing"
        assert re.fullmatch(r"\d+\.\d+\.\d+", (ROOT / c / "VERSION").read_text().strip())


def test_namespace_init_is_shared():
    first = (ROOT / "ir" / "ember" / "__init__.py").read_text()
    for c in COMPONENTS:
        assert (ROOT / c / "ember" / "__init__.py").read_text() == first, f"{c}/ember/__init__.py differs"


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_torch_compiler_imports(component):
    hits = []
    for path in product_files(component):
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("#", 1)[0] if path.suffix == ".py" else line
            if FORBIDDEN.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not hits, "product code uses torch's compiler:\n" + "\n".join(hits)


def imported_components(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ember" and len(parts) > 1 and parts[1] in COMPONENTS:
                yield parts[1], node.lineno


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_imports_follow_the_table(component):
    bad = []
    for path in product_files(component, (".py",)):
        for other, lineno in imported_components(path):
            if other != component and other not in ALLOWED[component]:
                bad.append(f"{path.relative_to(ROOT)}:{lineno} imports ember.{other}")
    assert not bad, f"ember.{component} may import only {sorted(ALLOWED[component])}:\n" + "\n".join(bad)


def test_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch._dynamo\nfrom ember.inductor import compile_fx\n")
    assert FORBIDDEN.search(bad.read_text())
    assert ("inductor", 2) in list(imported_components(bad))
