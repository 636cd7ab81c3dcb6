"""Builds (once, cached by content) and imports the C++ extension `ember.dynamo._C`."""

from pathlib import Path

from ember.ir import toolchain

_CSRC = Path(__file__).with_name("csrc")

_C = toolchain.build_extension(
    "ember.dynamo._C", [_CSRC / "eval_frame.cc"], binding="none", cflags=("-Wall",)
)
