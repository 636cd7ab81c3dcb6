"""Exported programs with torch.cond, torch.while_loop and map saved and loaded again: the subgraphs
travel in program.json (GraphIR subgraphs), the loaded program matches eager in this process, in a
fresh one, and compiled by inductor on CPU; packaging still refuses them, naming what is missing."""

import json
import os
import subprocess
import sys

import functorch.experimental.control_flow as control_flow
import pytest
import torch

import ember
from ember.dynamo import load_exported
from ember.inductor import pipeline
from ember.ir import graph_to_ir


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


class Controlled(torch.nn.Module):
    """A cond whose branches read weights, a loop that reads one, and a map over rows."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor(3.0))

    def forward(self, x):
        h = torch.cond(x.sum() > 0, lambda a: self.lin(a).relu(), lambda a: a * self.scale, (x,))
        n, h = torch.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 0.5 + self.lin.bias),
                                (torch.zeros((), dtype=torch.int64), h))  # fmt: skip
        return control_flow.map(lambda r, w: r @ w, h, self.lin.weight), n


def _inputs():
    torch.manual_seed(0)
    return [s * (torch.rand(2, 4) + 0.5) for s in (1.0, -1.0)]  # one input per branch


def _assert_matches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.detach())


def test_saved_program_loads_and_runs_both_branches(tmp_path):
    m = Controlled().eval()
    ep = ember.export(m, (torch.randn(2, 4),))
    ep2 = load_exported(ep.save(tmp_path / "ep"))
    doc = json.loads((tmp_path / "ep" / "program.json").read_text())
    # two branches, a loop's condition and body, a map's body
    assert len(doc["graph"]["subgraphs"]) == 5
    assert graph_to_ir(ep2.graph_module) == graph_to_ir(ep.graph_module)
    assert list(ep2.constants) == list(ep.constants)
    for x in _inputs():
        _assert_matches(ep2(x), m(x))


def test_loaded_program_compiles_with_inductor(tmp_path):
    m = Controlled().eval()
    ep2 = load_exported(ember.export(m, (torch.randn(2, 4),)).save(tmp_path / "ep"))
    compiled = pipeline.compile_prims(ep2.graph_module, ep2.example_inputs())
    assert [s.kind for s in compiled.steps] == ["piece", "cond", "piece", "while_loop", "map"]
    for x in _inputs():
        flat = [*ep2.flat_inputs((x,)), *ep2.constants.values()]
        _assert_matches(ep2.unflatten_outputs(list(compiled(*flat))), m(x))


def nested(x, y):
    """A cond inside a while_loop's body: subgraphs nested two levels deep."""

    def body(i, v):
        return i + 1, torch.cond(v.sum() > 0, lambda a, b: a - b, lambda a, b: a + b * 2, (v, y))

    _, v = torch.while_loop(lambda i, v: i < 4, body, (torch.zeros((), dtype=torch.int64), x))
    return v


_FRESH_PROCESS = """
import sys, torch
from ember.dynamo import load_exported
ep = load_exported(sys.argv[1])
x, y, want = torch.load(sys.argv[2])
torch.testing.assert_close(ep(x, y), want)
print("matches")
"""


def test_nested_control_flow_loads_in_a_fresh_process(tmp_path):
    y = torch.tensor([0.5, -1.0, 2.0])
    ep = ember.export(nested, (torch.randn(3), y))
    inner = [n for n in ep.graph_ir.subgraphs if n.name.startswith("while_body")]
    assert len(inner) == 1 and len(inner[0].graph.subgraphs) == 2  # the cond's branches
    ep.save(tmp_path / "ep")
    x = torch.tensor([1.0, -3.0, 0.25])
    torch.save((x, y, nested(x, y)), tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(tmp_path / "ep"),
                        str(tmp_path / "io.pt")], capture_output=True, text=True, env=env,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0 and "matches" in r.stdout, r.stderr[-2000:]


def test_packaging_a_saved_program_with_control_flow_is_refused_clearly(tmp_path):
    from ember import cpp_wrapper

    ep = ember.export(lambda x: torch.cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (x,)),
                      (torch.randn(4),))  # fmt: skip
    saved = ep.save(tmp_path / "ep")
    with pytest.raises(NotImplementedError, match="C\\+\\+ wrapper cannot.*ExportedProgram.save"):
        cpp_wrapper.package(saved, tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()
