"""Ember: a compiler stack for PyTorch programs.

Every Ember component ships this same file: ``ember`` is a pkgutil-style namespace package, so the
components install separately and still share one import name. A test checks the copies agree.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)

# The front door lives in ember.dynamo; it is imported on first use so `import ember.ir` stays cheap.
_FRONT_DOOR = ("compile", "export", "explain", "disable", "reset", "quantize_weights",
               "dequantize_weights", "register_cpp_kernel")


def __getattr__(name):
    if name in _FRONT_DOOR:
        import importlib

        return getattr(importlib.import_module("ember.dynamo"), name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
