"""Errors of the C++ runtime as Python sees them."""

from __future__ import annotations

# EmberStatus values of ember_runtime.h (part of its ABI).
STATUS = {
    "EMBER_OK": 0,
    "EMBER_ERR_INVALID_ARGUMENT": 1,
    "EMBER_ERR_DTYPE": 2,
    "EMBER_ERR_SHAPE": 3,
    "EMBER_ERR_DEVICE": 4,
    "EMBER_ERR_GUARD": 5,
    "EMBER_ERR_PACKAGE": 6,
    "EMBER_ERR_VERSION": 7,
    "EMBER_ERR_OUT_OF_MEMORY": 8,
    "EMBER_ERR_UNSUPPORTED": 9,
    "EMBER_ERR_CUDA": 10,
    "EMBER_ERR_RUNTIME": 11,
}


class EmberRuntimeError(RuntimeError):
    """A failure reported by the C++ runtime: `status` is its EmberStatus code, `name` its name."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.name = name
        self.message = message


class UnsupportedArtifactError(NotImplementedError):
    """The artifact uses something the C++ wrapper cannot run (an op, dtype or device)."""
