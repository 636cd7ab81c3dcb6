"""The small benchmark architectures of aot_autograd's tests (ResNet with BatchNorm, ViT, BERT,
GPT-2), loaded by path: one copy of them for the cross-component tests here."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).parents[1] / "aot_autograd" / "tests" / "models.py"


def load():
    spec = importlib.util.spec_from_file_location("aot_models", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
