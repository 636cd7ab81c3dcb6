"""inductor's `rendered_kernels` fixture (inductor/tests/rendered_kernels.py), loaded by path: one
copy of it for the cross-component tests here. Import the fixture from this module."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).parents[1] / "inductor" / "tests" / "rendered_kernels.py"
_spec = importlib.util.spec_from_file_location("inductor_rendered_kernels", _PATH)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
rendered_kernels = _module.rendered_kernels
