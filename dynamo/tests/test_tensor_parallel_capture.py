"""Capture of parallelize_module's colwise/rowwise modules (tensor_parallel.py) in one process: a
gloo group of one rank, so the collectives run and the graph's text, the gradients' placements
and the refusals can be checked without spawning ranks (/tests/test_tensor_parallel.py runs two)."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ember.dynamo
from ember.dynamo import GraphBreakError


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


def _parallel(mesh, **up_kw):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    base = MLP()
    plan = {"up": ColwiseParallel(**up_kw), "down": RowwiseParallel()}
    return parallelize_module(copy.deepcopy(base), mesh, plan), \
        parallelize_module(copy.deepcopy(base), mesh, plan)  # fmt: skip


def _ops(gm):
    return [str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes
            if n.op == "call_function"]  # fmt: skip


def test_mlp_is_one_graph_of_local_ops_and_collectives(mesh):
    eager, model = _parallel(mesh)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ember.dynamo.reset()
    compiled = ember.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(2, 3, 8, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    ref, got = eager(x), compiled(xc)
    torch.testing.assert_close(got, ref)
    ref.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(xc.grad, x.grad)
    for p, q in zip(eager.parameters(), model.parameters()):
        assert type(q.grad).__name__ == "DTensor" and q.grad.placements == p.grad.placements
        torch.testing.assert_close(q.grad.to_local(), p.grad.to_local())
    (gm,) = graphs
    # the input's gradient all-reduce, the colwise Linear on local shards, the rowwise one, its
    # all-reduce, the bias after it, the residual
    assert _ops(gm) == ["grad_all_reduce.default", "linear", "gelu", "linear",
                        "all_reduce.default", "add", "add"], gm.code  # fmt: skip
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert sum(name.endswith("to_local") for name in names) == 4, names
    with torch.no_grad():  # no gradient: no gradient all-reduce (a recompile: grad mode)
        compiled(torch.randn(2, 3, 8))
    assert _ops(graphs[-1])[0] == "linear", graphs[-1].code


def test_sequence_parallel_input_is_refused_naming_the_layout(mesh):
    from torch.distributed.tensor import Shard

    _, model = _parallel(mesh, input_layouts=Shard(0))
    ember.dynamo.reset()
    with pytest.raises(GraphBreakError, match=r"input layouts \(Shard\(dim=0\)\)"):
        ember.compile(model, backend="eager", fullgraph=True)(torch.randn(2, 3, 8))


def test_other_styles_are_refused_naming_the_style(mesh):
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
    parallelize_module(model, mesh, {"0": SequenceParallel()})
    ember.dynamo.reset()
    with pytest.raises(GraphBreakError, match="LayerNorm parallelized with SequenceParallel"):
        ember.compile(model, backend="eager", fullgraph=True)(torch.randn(2, 3, 8))


def test_export_refuses_a_tensor_parallel_module(mesh):
    _, model = _parallel(mesh)
    with pytest.raises(GraphBreakError, match="tensor parallel Linear in ember.export"):
        ember.export(model, (torch.randn(2, 3, 8),))


def test_linears_without_bias(mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(),
                               torch.nn.Linear(16, 8, bias=False))  # fmt: skip
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    eager = parallelize_module(copy.deepcopy(base), mesh, plan)
    model = parallelize_module(copy.deepcopy(base), mesh, plan)
    ember.dynamo.reset()
    x = torch.randn(4, 8)
    got = ember.compile(model, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got, eager(x))
    got.sum().backward()
    eager(x).sum().backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad.to_local(), p.grad.to_local())


def test_embeddings_colwise_with_padding_idx_and_rowwise(mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import parallelize_module

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Embedding(10, 8, padding_idx=0)
            self.b = torch.nn.Embedding(10, 8)

        def forward(self, ids):
            return self.a(ids) * self.b(ids)

    torch.manual_seed(0)
    base = Two()
    plan = {"a": ColwiseParallel(), "b": RowwiseParallel(input_layouts=Replicate())}
    eager = parallelize_module(copy.deepcopy(base), mesh, plan)
    model = parallelize_module(copy.deepcopy(base), mesh, plan)
    ember.dynamo.reset()
    ids = torch.tensor([[0, 3, 9], [1, 0, 4]])
    got = ember.compile(model, backend="eager", fullgraph=True)(ids)
    ref = eager(ids)
    torch.testing.assert_close(got, ref)
    got.sum().backward()
    ref.sum().backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad.full_tensor(), p.grad.full_tensor())
    assert float(model.a.weight.grad.full_tensor()[0].abs().sum()) == 0.0  # the padding row
