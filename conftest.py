"""Lets plain `python -m pytest` import every component from this checkout, with no install."""

import sys
from pathlib import Path

_ROOT = Path(__file__).absolute().parent
for _component in ("ir", "primtorch", "aot_autograd", "dynamo", "inductor", "cpp_wrapper"):
    _path = str(_ROOT / _component)
    if _path not in sys.path:
        sys.path.insert(0, _path)
