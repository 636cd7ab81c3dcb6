"""Golden text of generated code (C++ and Triton) for a few tiny graphs.

Regenerate after an intended codegen change with EMBER_UPDATE_GOLDEN=1 and review the diff.
"""

import os
from pathlib import Path

import pytest
import torch
from ember.inductor import config, pipeline
from ember.inductor.loop_ir import program_text
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import schedule
from ember.primtorch import prims
from inductor_helpers import PrimGraph, softmax_graph

GOLDEN = Path(__file__).with_name("golden")


def _pointwise():
    g = PrimGraph()
    x, y = g.input(torch.randn(4, 8)), g.input(torch.randn(8))
    yb = g(prims.broadcast_in_dim, y, [4, 8], [1])
    g.output(g(prims.mul, g(prims.exp, g(prims.add, x, yb)), 0.5))
    return g


GRAPHS = {"pointwise": _pointwise, "softmax": lambda: softmax_graph(torch.randn(4, 8))}


def _kernels(g, backend):
    config.cpu_backend = backend
    low = lower_graph(g.module(), g.inputs)
    steps = schedule(low.buffers, [o.name for o in low.outputs])
    buffers = {b.name: b for b in [*low.inputs, *low.buffers] if b is not None}
    srcs = pipeline.render_kernels(steps, buffers, "cpu")
    return program_text(low.buffers) + "\n\n" + "\n".join(s.source for s in srcs.values())


def _check(name, text):
    path = GOLDEN / name
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden copy (EMBER_UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_generated_code_matches_golden(graph, backend):
    _check(f"{graph}_{backend}.txt", _kernels(GRAPHS[graph](), backend))
