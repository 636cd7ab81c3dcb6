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
from .graph import GraphIR, NodeIR, SubgraphIR
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
    """A graph whose control.cond names a subgraph (both branches the same one)."""
    meta = TensorMeta(torch.float32, (4,), (1,))
    pred = TensorMeta(torch.bool, (), ())
    none = {"tuple": []}
    branch = GraphIR(
        ir_version=IR_VERSION,
        opset_version=1,
        symbols=(),
        nodes=(
            NodeIR("a", "placeholder", "a", none, none, (meta,)),
            NodeIR("output", "output", "output", {"tuple": [{"tuple": [{"node": "a"}]}]}, none, ()),
        ),
    )
    return GraphIR(
        ir_version=IR_VERSION,
        opset_version=1,
        symbols=(),
        nodes=(
            NodeIR("x", "placeholder", "x", none, none, (meta,)),
            NodeIR("p", "placeholder", "p", none, none, (pred,)),
            NodeIR("branch", "get_attr", "branch", none, none, ()),
            NodeIR("c", "call_function", "control.cond",
                   {"tuple": [{"node": "p"}, {"node": "branch"}, {"node": "branch"},
                              [{"node": "x"}]]}, none, (meta,)),  # fmt: skip
            NodeIR("y", "call_function", "getitem", {"tuple": [{"node": "c"}, 0]}, none, (meta,)),
            NodeIR("output", "output", "output", {"tuple": [{"tuple": [{"node": "y"}]}]}, none, ()),
        ),
        subgraphs=(SubgraphIR("branch", branch),),
    )


def write() -> None:
    path = GOLDEN_DIR / f"example_v{IR_VERSION}.json"
    data = {"artifact": to_json(example_artifact()), "graph": to_json(example_graph_ir())}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(path)


if __name__ == "__main__":
    write()
