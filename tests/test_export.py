"""ember.export end to end: dynamo's capture lowered by aot_autograd to one prim inference graph.

Cross-component: ember.dynamo captures, ember.aot_autograd (through dynamo's registry) traces to
prims, ember.ir serialises. Values are checked against eager.
"""

import inspect

import pytest
import torch

import ember
from ember.dynamo import ExportedProgram, GraphBreakError, load_exported
from ember.ir import graph_to_ir, target_name

torch.manual_seed(0)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def _cnn():
    m = CNN().eval()
    with torch.no_grad():  # non-trivial running statistics, so eval-mode BN is really tested
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


class Breaks(torch.nn.Module):
    def forward(self, x):
        y = x.sin()
        print("a print is a graph break")
        return y.cos()


def data_dependent_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@pytest.mark.parametrize(
    "fn, text", [(Breaks(), "print("), (data_dependent_branch, "if x.sum() > 0")],
    ids=["print", "tensor-if"],
)
def test_graph_break_raises_with_construct_and_file_line(fn, text):
    code = fn.forward if isinstance(fn, torch.nn.Module) else fn
    with pytest.raises(GraphBreakError) as info:
        ember.export(fn, (torch.randn(3),))
    msg = str(info.value)
    assert f"{__file__}:{_line_of(code, text)}" in msg, msg
    assert "ember.export" in msg


def test_cnn_values_metas_and_prim_graph():
    m = _cnn()
    x = torch.randn(2, 3, 6, 6)
    ep = ember.export(m, (x,))
    assert isinstance(ep, ExportedProgram)
    torch.testing.assert_close(ep(x), m(x).detach())
    y = torch.randn(2, 3, 6, 6)  # a different input of the same shape: nothing baked in
    torch.testing.assert_close(ep(y), m(y).detach())
    assert [s.name for s in ep.inputs] == ["x"]
    assert tuple(int(s) for s in ep.outputs[0].meta.sizes) == (2, 5)
    assert set(ep.constant_fqns.values()) == set(dict(m.named_parameters())) | {
        "bn.running_mean", "bn.running_var"}  # fmt: skip
    nodes = ep.graph_module.graph.nodes
    targets = {target_name(n.target) for n in nodes if n.op == "call_function"}
    assert all(t.split(".")[0] in ("prims", "extern") or t == "getitem" for t in targets), targets
    assert "extern.convolution" in targets
    compiled = ember.compile(m, backend="eager")  # exporting a compiled module exports its original
    torch.testing.assert_close(ember.export(compiled, (x,))(y), m(y).detach())


def test_save_load_round_trip(tmp_path):
    m = _cnn()
    x = torch.randn(2, 3, 6, 6)
    ep = ember.export(m, (x,))
    ep2 = load_exported(ep.save(tmp_path / "cnn"))
    assert graph_to_ir(ep2.graph_module) == graph_to_ir(ep.graph_module)
    assert ep2.inputs == ep.inputs and ep2.outputs == ep.outputs
    assert ep2.constant_fqns == ep.constant_fqns
    for name, t in ep.constants.items():
        assert torch.equal(ep2.constants[name], t)
    torch.testing.assert_close(ep2(x), m(x).detach())
    (tmp_path / "cnn" / "constants.bin").write_bytes(b"\0" * 8)  # damaged weights are refused
    with pytest.raises(ValueError, match="damaged"):
        load_exported(tmp_path / "cnn")


class Structured(torch.nn.Module):
    """kwargs, a baked constant argument, an unused input, and a structured result."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x, unused, *, k=1, ys=()):
        h = self.lin(x) * self.scale * k
        return {"h": h, "pair": (h.relu(), ys[0] + ys[1]), "x": x, "k": k, "none": None}


def test_structured_arguments_and_results(tmp_path):
    m = Structured()
    args = (torch.randn(2, 4), torch.randn(5))
    kwargs = {"ys": [torch.randn(2), torch.randn(2)], "k": 3}
    ep = ember.export(m, args, kwargs)
    assert [s.name for s in ep.inputs] == ["x", "unused", "ys_0", "ys_1"]
    for prog in (ep, load_exported(ep.save(tmp_path / "s"))):
        got, want = prog(*args, **kwargs), m(*args, **kwargs)
        assert set(got) == set(want) and got["k"] == 3 and got["none"] is None
        torch.testing.assert_close(got["h"], want["h"].detach())
        torch.testing.assert_close(got["pair"][1], want["pair"][1])
        assert isinstance(got["pair"], tuple)
        assert torch.equal(got["x"], args[0]) and got["x"] is not args[0]  # returned as a copy
    with pytest.raises(ValueError, match="baked into the graph"):
        ep(*args, **{**kwargs, "k": 4})
    with pytest.raises(ValueError, match="exported for float32\\[2, 4\\]"):
        ep(torch.randn(3, 4), args[1], **kwargs)


TABLE = torch.arange(6.0).reshape(2, 3)


def uses_a_global(x):
    return [x @ TABLE, x.sum()]


def test_function_reading_a_global_tensor():
    x = torch.randn(4, 2)
    ep = ember.export(uses_a_global, (x,))
    got = ep(x)
    assert isinstance(got, list) and len(got) == 2
    torch.testing.assert_close(got[0], x @ TABLE)
    torch.testing.assert_close(got[1], x.sum())
    assert list(ep.constant_fqns.values()) == ["G['TABLE']"]


SEEN = []


def appends_to_a_global(x):
    SEEN.append(1)
    return x + 1


def test_unexportable_programs_fail_clearly():
    bn = torch.nn.BatchNorm1d(3).train()  # updates its running statistics in place
    with pytest.raises(NotImplementedError, match="model.eval"):
        ember.export(bn, (torch.randn(4, 3),))
    with pytest.raises(GraphBreakError, match="side effects"):
        ember.export(appends_to_a_global, (torch.randn(2),))
    assert SEEN == []
