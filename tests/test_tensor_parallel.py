"""Tensor parallel (DTensor, parallelize_module) under ember.compile on CPU: two gloo processes.

Both ranks run this file as a script (`--rank`), run each case eagerly (DTensor) and compiled,
and write what they saw to JSON; the tests read rank 0's report and check rank 1's agrees.
A colwise Linear -> GELU -> rowwise Linear block is one graph with no break whose forward holds
one all-reduce node; outputs, the input's gradient (all-reduced in backward) and the DTensor
parameters' gradients equal eager TP's, and so do parameters after SGD steps. Colwise and
rowwise Embeddings too. A style Ember does not capture (sequence parallel's Shard input) breaks
the graph with a reason naming the layout and the user's line, and still matches eager; so
does a function of DTensors (no parallelize_module), which runs eagerly.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
import torch.nn.functional as F

from two_ranks import rank_main, run_ranks

D, HIDDEN, VOCAB = 8, 16, 11


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class PlainMLP(MLP):
    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class NormMLP(PlainMLP):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)

    def forward(self, x):
        return super().forward(self.norm(x))


class EmbedMLP(torch.nn.Module):
    """Token ids through a rowwise and a colwise Embedding, then the MLP block."""

    def __init__(self):
        super().__init__()
        self.rows = torch.nn.Embedding(VOCAB, D)
        self.cols = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, D, bias=False)
        self.mlp = MLP()

    def forward(self, ids):
        return self.mlp(self.rows(ids) + self.proj(torch.tanh(self.cols(ids))))


def _plan(kind):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel import SequenceParallel

    if kind == "sp":  # Megatron's sequence parallel: the norm on sequence shards
        return NormMLP(), {"norm": SequenceParallel(),
                           "up": ColwiseParallel(input_layouts=Shard(1)),
                           "down": RowwiseParallel(output_layouts=Shard(1))}
    if kind == "mlp":
        return MLP(), {"up": ColwiseParallel(), "down": RowwiseParallel()}
    if kind == "embed":
        return EmbedMLP(), {"rows": RowwiseParallel(input_layouts=Replicate()),
                            "cols": ColwiseParallel(), "proj": RowwiseParallel(),
                            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    # sequence parallel: the input arrives sharded on dim 0 and is all-gathered
    return PlainMLP(), {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel()}


def _inputs(kind, gen):
    if kind == "embed":
        return torch.randint(0, VOCAB, (2, 5), generator=gen)
    return torch.randn(2, 5, D, generator=gen).requires_grad_()


class _Counting:
    """A named backend that keeps the graphs it is handed."""

    def __init__(self, name):
        import ember.dynamo

        self.inner = ember.dynamo.lookup_backend(name)
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self.inner(gm, example_inputs)


def _max_diff(a, b) -> float:
    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    return float((full(a) - full(b)).abs().max())


def _case(kind, backend, rank):
    import ember
    import ember.dynamo
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    base, plan = _plan(kind)
    eager = parallelize_module(copy.deepcopy(base), mesh, plan)
    model = parallelize_module(copy.deepcopy(base), mesh, plan)
    ember.reset()
    counting = _Counting(backend)
    compiled = ember.compile(model, backend=counting)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    # TP: the same input on both ranks; sequence parallel: each rank's shard
    gen = torch.Generator().manual_seed(7 + (rank if kind in ("seq", "sp") else 0))
    report = {"out": 0.0, "x_grad": 0.0, "grads": 0.0, "placements": {}}
    for _ in range(3):
        x = _inputs(kind, gen)
        xc = x.detach().clone().requires_grad_(x.requires_grad)
        ref, got = eager(x), compiled(xc)
        ref.pow(2).mean().backward()
        got.pow(2).mean().backward()
        report["out"] = max(report["out"], _max_diff(ref, got))
        if x.requires_grad:
            report["x_grad"] = max(report["x_grad"], _max_diff(x.grad, xc.grad))
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            report["grads"] = max(report["grads"], _max_diff(p.grad, q.grad))
            if type(q.grad) is not type(p.grad) or q.grad.placements != p.grad.placements:
                report["placements"][name] = [str(g.placements) for g in (p.grad, q.grad)]
        for opt in opts:
            opt.step()
            opt.zero_grad()
    report["params"] = max(_max_diff(p, q) for p, q in zip(eager.parameters(), model.parameters()))
    stats = ember.dynamo.convert.stats
    report["graphs"] = len(stats.graphs)
    report["breaks"] = [f"{b.reason} @ {b.where}" for b in stats.breaks + stats.failures]
    report["collectives"] = [sorted(str(n.target) for n in gm.graph.nodes
                                    if "ember_dist" in str(n.target)) for gm in counting.graphs]
    explained = ember.explain(parallelize_module(copy.deepcopy(base), mesh, plan))(
        _inputs(kind, torch.Generator().manual_seed(rank)))  # fmt: skip
    report["explain"] = [explained.graph_count, explained.graph_break_count]
    return report


def _dtensor_input_case(rank):
    """A function of DTensors (no parallelize_module): run eagerly, with a reason."""
    import ember
    import ember.dynamo
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    w = distribute_tensor(torch.randn(D, D), mesh, [Shard(1)])
    x = distribute_tensor(torch.randn(4, D), mesh, [Replicate()])

    def f(x, w):
        return torch.relu(x @ w) + 1

    ember.reset()
    got, ref = ember.compile(f, backend="aot_eager")(x, w), f(x, w)
    stats = ember.dynamo.convert.stats
    return {"out": _max_diff(ref, got), "type": type(got).__name__, "graphs": len(stats.graphs),
            "breaks": [f"{b.reason} @ {b.where}" for b in stats.breaks + stats.failures]}


def _worker(rank: int, port: int, out: str, cases: list) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        report = {case: _dtensor_input_case(rank) if case == "dtensor_input"
                  else _case(*case.split(":"), rank) for case in cases}  # fmt: skip
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


# -- the tests -----------------------------------------------------------------------------------


CASES = ["mlp:aot_eager", "mlp:inductor", "embed:aot_eager", "seq:aot_eager", "sp:aot_eager",
         "dtensor_input"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tp")
    r0, r1 = run_ranks(__file__, tmp_path, CASES)
    for case in CASES:
        assert (r0[case]["graphs"], r0[case]["breaks"]) == (r1[case]["graphs"],
                                                            r1[case]["breaks"]), case
    return r0


@pytest.mark.parametrize("case", ["mlp:aot_eager", "mlp:inductor"])
def test_tp_mlp_block_is_one_graph_and_matches_eager(reports, case):
    r = reports[case]
    assert (r["graphs"], r["breaks"], r["explain"]) == (1, [], [1, 0]), r
    # The forward holds the rowwise all-reduce and the input's gradient all-reduce (its
    # backward); the backend saw them as graph nodes of the one graph.
    assert r["collectives"] == [["ember_dist.all_reduce.default",
                                 "ember_dist.grad_all_reduce.default"]], r  # fmt: skip
    tol = 1e-5
    assert r["out"] < tol and r["x_grad"] < tol and r["grads"] < tol and r["params"] < tol, r
    assert r["placements"] == {}, r  # DTensor gradients placed as eager's
    assert r["x_grad"] < 1e-5  # without the backward all-reduce it is a partial sum


def test_tp_embeddings_colwise_and_rowwise(reports):
    r = reports["embed:aot_eager"]
    assert (r["graphs"], r["breaks"]) == (1, []), r
    # rowwise Embedding, rowwise proj, rowwise mlp.down: three all-reduces; mlp.up's input
    # gradient is all-reduced in backward
    assert r["collectives"] == [["ember_dist.all_reduce.default"] * 3
                                + ["ember_dist.grad_all_reduce.default"]], r
    assert r["out"] < 1e-5 and r["grads"] < 1e-5 and r["params"] < 1e-5, r
    # Eager DTensor computes the rowwise Embedding's weight gradient whole on every rank
    # (Replicate); the capture computes each rank's rows (Shard(0), as the weight): the same
    # tensor, the same optimizer step.
    assert r["placements"] == {"rows.weight": ["(Replicate(),)", "(Shard(dim=0),)"]}, r


def test_unsupported_layout_breaks_with_a_reason_and_matches_eager(reports):
    r = reports["seq:aot_eager"]
    assert r["breaks"] and "input layouts (Shard(dim=0))" in r["breaks"][0], r
    assert "test_tensor_parallel.py" in r["breaks"][0], r  # names the user's line
    assert r["out"] < 1e-5 and r["x_grad"] < 1e-5 and r["grads"] < 1e-5, r


def test_other_parallel_styles_break_naming_the_style(reports):
    r = reports["sp:aot_eager"]
    assert "LayerNorm parallelized with SequenceParallel" in r["breaks"][0], r
    assert "test_tensor_parallel.py" in r["breaks"][0], r
    assert r["out"] < 1e-5 and r["x_grad"] < 1e-5 and r["grads"] < 1e-5, r


def test_other_dtensor_programs_run_eagerly_with_a_reason(reports):
    r = reports["dtensor_input"]
    assert r["out"] == 0.0 and r["type"] == "DTensor", r
    assert r["graphs"] == 0 and len(r["breaks"]) == 1, r
    assert "a DTensor (L['x'], placements (Replicate(),))" in r["breaks"][0], r
    assert "test_tensor_parallel.py" in r["breaks"][0], r


if __name__ == "__main__":
    rank_main(_worker)
