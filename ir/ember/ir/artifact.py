"""The compiled-artifact format: what inductor produces and the C++ wrapper runs.

An artifact is a launch plan over named buffers: inputs, constants (weights), intermediates and
outputs, each with a TensorMeta; kernels with their source (and, once built, binary) and launch
configuration; and steps that allocate, launch, call extern ops, make views and free. Sizes and
launch grids are sympy expressions over the artifact's symbols, checked against `guards`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy

from .codec import schema_class
from .meta import TensorMeta
from .symbols import SymbolSpec
from .version import IR_VERSION


@schema_class
@dataclasses.dataclass(frozen=True)
class BufferIR:
    """A named tensor of the plan. `kind` is input, constant, intermediate or output."""

    name: str
    kind: str
    meta: TensorMeta


@schema_class
@dataclasses.dataclass(frozen=True)
class KernelIR:
    """A generated kernel: language ("triton" or "cpp"), source, entry point and launch shape.

    `arg_types` lists the entry's parameters in order ("*fp32" for a pointer, "i64" for a scalar);
    for Triton, `grid` is up to three expressions and `num_warps`/`num_stages`/`shared_mem` the
    compiled configuration; `binary` names the cubin/shared object once built, "" before.
    """

    name: str
    language: str
    source: str
    entry: str
    arg_types: tuple[str, ...]
    grid: tuple[sympy.Expr, ...] = ()
    num_warps: int = 4
    num_stages: int = 1
    shared_mem: int = 0
    binary: str = ""


@schema_class
@dataclasses.dataclass(frozen=True)
class StepIR:
    """One step of the launch plan.

    kind: "alloc" (outputs[0] gets a buffer), "free" (args[0] is dead), "kernel" (target is a kernel
    name, args are buffer names and size expressions in `arg_types` order), "extern" (target is a
    vocabulary op, args/kwargs in JSON form with {"node": buffer} references), "view" (outputs[0]
    is a view of args[0] with args[1] = [sizes, strides, offset]).
    """

    kind: str
    target: str
    args: Any
    kwargs: Any
    outputs: tuple[str, ...]


@schema_class
@dataclasses.dataclass(frozen=True)
class CompiledArtifact:
    """A whole compiled program: device, symbols and guards, buffers, kernels and steps."""

    ir_version: int
    device: str
    symbols: tuple[SymbolSpec, ...]
    guards: tuple[sympy.Expr, ...]
    buffers: tuple[BufferIR, ...]
    kernels: tuple[KernelIR, ...]
    steps: tuple[StepIR, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def buffer(self, name: str) -> BufferIR:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"artifact has no buffer {name!r}")


def new_artifact(**fields) -> CompiledArtifact:
    """A CompiledArtifact of the current IR version."""
    return CompiledArtifact(ir_version=IR_VERSION, **fields)
