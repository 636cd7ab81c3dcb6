"""Example values of each schema version, pinned in golden/example_vN.json.

Every released version's example must keep loading: that is how "every released version stays
readable" is tested. `python -m ember.ir.golden_examples --write` writes the current version's file.
"""

from __future__ import annotations

import json

import sympy
import torch

from .artifact import BufferIR, CompiledArtifact, KernelIR, StepIR, new_artifact
from .codec import to_json
from .graph import GraphIR, NodeIR
from .meta import TensorMeta
from .schema import GOLDEN_DIR
from .symbols import FloorDiv, SymbolSpec, sym
from .version import IR_VERSION


def example_artifact() -> CompiledArtifact:
    s0 = sym("s0")
    x = TensorMeta(torch.float32, (s0, 64), (64, 1))
    return new_artifact(
        device="cpu",
        symbols=(SymbolSpec("s0", 2, 4096),),
        guards=(sympy.Le(s0, 4096),),
        buffers=(BufferIR("arg0", "input", x), BufferIR("buf0", "intermediate", x),
                 BufferIR("out0", "output", x)),  # fmt: skip
        kernels=(
            KernelIR("kernel0", "cpp", "EMBER_EXPORT void kernel0(...) {}", "kernel0",
                     ("*fp32", "*fp32", "i64"), grid=(FloorDiv(s0 * 64 + 1023, 1024),)),  # fmt: skip
        ),
        steps=(
            StepIR("alloc", "", [], [], ("buf0",)),
            StepIR("kernel", "kernel0", ["arg0", "buf0", {"expr": ["mul", {"sym": "s0"}, 64]}], [], ()),
            StepIR("extern", "extern.mm", [{"node": "buf0"}, {"node": "buf0"}], [], ("out0",)),
            StepIR("free", "", ["buf0"], [], ()),
        ),
        inputs=("arg0",),
        outputs=("out0",),
    )


def example_graph_ir() -> GraphIR:
    meta = TensorMeta(torch.float32, (4,), (1,))
    return GraphIR(
        ir_version=IR_VERSION,
        opset_version=1,
        symbols=(),
        nodes=(
            NodeIR("x", "placeholder", "x", {"tuple": []}, {"tuple": []}, (meta,)),
            NodeIR("y", "call_function", "getitem", {"tuple": [{"node": "x"}, 0]}, {"tuple": []}, ()),
            NodeIR("output", "output", "output", {"tuple": [{"node": "y"}]}, {"tuple": []}, ()),
        ),
    )


def write() -> None:
    path = GOLDEN_DIR / f"example_v{IR_VERSION}.json"
    data = {"artifact": to_json(example_artifact()), "graph": to_json(example_graph_ir())}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(path)


if __name__ == "__main__":
    write()
