"""Distributed training under ember.compile on CPU: DDP and FSDP2 over gloo, two processes.

Both ranks run this file as a script (`--rank`), train the same small models eagerly and
compiled, and write what they saw to JSON; the tests read rank 0's report (rank 1's must agree).
DDP: the wrapped module is captured as one graph with no break, cut into one backend graph per
gradient bucket (each its own autograd Function), and parameters after SGD steps equal eager
DDP's, with no_sync + gradient accumulation, with find_unused_parameters, around an
ember.compile'd module, and (slow) with static_graph and BatchNorm buffers. FSDP2
(fully_shard): each sharded block's forward is captured, with a graph break at each call to a
sharded block (its hooks all-gather), and parameters equal eager FSDP2's.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from two_ranks import rank_main, run_ranks

STEPS = 3
# Each Linear of MLP holds 1056 to 4224 bytes: a 1 KiB cap gives every layer its own bucket.
SMALL_BUCKET_MB = 1024 / 2**20


class MLP(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 8)
        if unused:  # a parameter no forward reads (find_unused_parameters)
            self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class NormMLP(MLP):
    """With BatchNorm: running statistics are buffers the graph updates in place, and DDP
    broadcasts them from rank 0 before each forward."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(32)

    def forward(self, x):
        return self.c(torch.relu(self.norm(self.b(torch.relu(self.a(x))))))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# -- the worker (each rank) ----------------------------------------------------------------------


def _train(model, rank, accumulate=1, steps=STEPS):
    """SGD steps on per-rank data; all but the last micro-batch of a step run under no_sync."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        for micro in range(accumulate):
            x = torch.randn(8, 16, generator=gen)
            if micro < accumulate - 1:
                with model.no_sync():
                    model(x).pow(2).mean().backward()
            else:
                model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _max_diff(ref, got) -> float:
    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    return max(float((full(a) - full(b)).abs().max()) for a, b in zip(ref, got))


class _Counting:
    """A named backend that counts the graphs it is handed."""

    def __init__(self, name):
        import ember.dynamo

        self.inner = ember.dynamo.lookup_backend(name)
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return self.inner(gm, example_inputs)


def _backward_nodes_per_param(model, x) -> int:
    """How many autograd nodes the parameters' gradients come out of (one per compiled piece)."""
    out = model(x)
    params = {id(p) for p in model.parameters()}
    owners, seen, todo = set(), set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None and id(getattr(nxt, "variable", None)) in params:
                owners.add(node)
            todo.append(nxt)
    out.sum().backward()  # DDP expects the backward that prepare_for_backward announced
    model.zero_grad()
    return len(owners)


def _ddp_case(rank, backend, *, unused=False, accumulate=1, bucket_mb=SMALL_BUCKET_MB,
              variant=""):
    """Eager DDP against ember.compile(DDP(model)); variant "outer": DDP(ember.compile(model));
    "static": static_graph=True on a model with BatchNorm buffers."""
    import ember
    import ember.dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = NormMLP() if variant == "static" else MLP(unused)
    kw = dict(bucket_cap_mb=bucket_mb, find_unused_parameters=unused,
              static_graph=variant == "static")  # fmt: skip
    eager = DDP(copy.deepcopy(base), **kw)
    ref = _train(eager, rank, accumulate) + list(eager.module.buffers())
    ember.reset()
    counting = _Counting(backend)
    if variant == "outer":
        compiled = DDP(ember.compile(copy.deepcopy(base), backend=counting), **kw)
    else:
        compiled = ember.compile(DDP(copy.deepcopy(base), **kw), backend=counting)
    got = _train(compiled, rank, accumulate) + list(compiled.module.buffers())
    stats = ember.dynamo.convert.stats
    report = {"diff": _max_diff(ref, got), "graphs": len(stats.graphs),
              "breaks": len(stats.breaks) + len(stats.failures), "backend_graphs": counting.count}
    if backend != "eager":
        x = torch.randn(8, 16)
        report["grad_owners"] = _backward_nodes_per_param(compiled, x)
    return report


def _ddp_called_from_function(rank):
    """A compiled function that calls a DDP module: a graph break at the call, eager DDP."""
    import ember
    import ember.dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = MLP()
    ref_model = DDP(copy.deepcopy(base))
    model = DDP(copy.deepcopy(base))

    def loss_of(m, x):
        return (m(x) * 2).pow(2).mean()

    ember.reset()
    compiled = ember.compile(loss_of, backend="aot_eager")
    gen = torch.Generator().manual_seed(rank)
    stats = ember.dynamo.convert.stats
    converted = []
    for _ in range(3):
        x = torch.randn(8, 16, generator=gen)
        loss_of(ref_model, x).backward()
        compiled(model, x).backward()
        converted.append(stats.frames_converted)
    grads = _max_diff([p.grad for p in ref_model.parameters()],
                      [p.grad for p in model.parameters()])  # fmt: skip
    return {"diff": grads, "reasons": [b.reason for b in stats.breaks + stats.failures],
            "converted": converted}


def _fsdp_case(rank, backend):
    import ember
    import ember.dynamo
    from torch.distributed.fsdp import fully_shard

    def shard(m):
        for block in m.blocks:
            fully_shard(block)
        return fully_shard(m)

    torch.manual_seed(0)
    base = Stack()
    ref = _train(shard(copy.deepcopy(base)), rank)
    ember.reset()
    compiled = ember.compile(shard(copy.deepcopy(base)), backend=backend)
    got = _train(compiled, rank)
    stats = ember.dynamo.convert.stats
    return {"diff": _max_diff(ref, got),
            "graphs": [(g.code_name, g.op_count) for g in stats.graphs],
            "breaks": [b.reason for b in stats.breaks + stats.failures]}  # fmt: skip


def _worker(rank: int, port: int, out: str, cases: list) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    report = {}
    try:
        for case in cases:
            name, *args = case.split(":")
            if name == "ddp":
                backend, unused, accumulate, bucket, *variant = args
                report[case] = _ddp_case(rank, backend, unused=unused == "1",
                                         accumulate=int(accumulate), bucket_mb=float(bucket),
                                         variant=variant[0] if variant else "")
            elif name == "ddp_in_fn":
                report[case] = _ddp_called_from_function(rank)
            elif name == "fsdp":
                report[case] = _fsdp_case(rank, args[0])
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


# -- the tests -----------------------------------------------------------------------------------


def _run_ranks(tmp_path, cases: list) -> dict:
    """Run `cases` on two ranks (two processes, gloo) and return rank 0's report."""
    reports = run_ranks(__file__, tmp_path, cases)
    for case in cases:  # both ranks compiled the same graphs and ended with the same parameters
        assert reports[0][case].get("graphs") == reports[1][case].get("graphs"), case
    return reports[0]


DDP_CASES = ["ddp:eager:0:1:%r" % SMALL_BUCKET_MB, "ddp:aot_eager:0:1:%r" % SMALL_BUCKET_MB,
             "ddp:aot_eager:0:2:%r" % SMALL_BUCKET_MB, "ddp:aot_eager:1:1:%r" % SMALL_BUCKET_MB,
             "ddp:aot_eager:0:2:%r:outer" % SMALL_BUCKET_MB,
             "ddp:aot_eager:0:1:25.0", "ddp_in_fn", "fsdp:aot_eager"]  # fmt: skip


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return _run_ranks(tmp_path_factory.mktemp("ddp"), DDP_CASES)


def test_ddp_captures_one_graph_split_per_bucket(reports):
    for case in DDP_CASES[:5]:
        r = reports[case]
        assert r["graphs"] == 1 and r["breaks"] == 0, (case, r)
        assert r["backend_graphs"] == 3, (case, r)  # one backend graph per bucket (per layer)
        assert r["diff"] < 1e-5, (case, r)


def test_ddp_buckets_are_separate_autograd_functions(reports):
    # The gradients of each bucket's parameters come out of their own backward node, so DDP's
    # hooks on the last layer's parameters fire before the first layer's backward runs.
    for case in DDP_CASES[1:5]:
        assert reports[case]["grad_owners"] == 3, (case, reports[case])


def test_ddp_one_bucket_is_one_graph(reports):
    r = reports["ddp:aot_eager:0:1:25.0"]
    assert (r["graphs"], r["breaks"], r["backend_graphs"], r["grad_owners"]) == (1, 0, 1, 1), r
    assert r["diff"] < 1e-5


def test_ddp_no_sync_accumulation_and_unused_parameters(reports):
    assert reports["ddp:aot_eager:0:2:%r" % SMALL_BUCKET_MB]["diff"] < 1e-5
    assert reports["ddp:aot_eager:1:1:%r" % SMALL_BUCKET_MB]["diff"] < 1e-5


def test_ddp_called_from_compiled_function_breaks_at_the_call(reports):
    r = reports["ddp_in_fn"]
    assert r["diff"] < 1e-5
    assert any("DistributedDataParallel" in reason for reason in r["reasons"]), r
    assert r["converted"][0] == r["converted"][2], r  # later calls hit the cache: no recompiles


def test_fsdp2_captures_each_block_and_matches_eager(reports):
    r = reports["fsdp:aot_eager"]
    assert r["diff"] < 1e-5, r
    # Block.forward for each of the two sharded blocks (up, gelu, down, add), then the head
    # after the loop; the calls to the sharded blocks are the breaks.
    assert [ops for _, ops in r["graphs"]] == [4, 4, 1], r
    assert len(r["breaks"]) == 2 and all("fully_shard" in b for b in r["breaks"]), r


@pytest.mark.slow
def test_ddp_and_fsdp2_through_inductor_and_static_graph(tmp_path):
    cases = ["ddp:inductor:0:2:%r" % SMALL_BUCKET_MB, "fsdp:inductor",
             "ddp:aot_eager:0:1:%r:static" % SMALL_BUCKET_MB]
    r = _run_ranks(tmp_path, cases)
    ddp = r[cases[0]]
    assert (ddp["graphs"], ddp["breaks"], ddp["backend_graphs"]) == (1, 0, 3), ddp
    assert ddp["diff"] < 1e-4 and ddp["grad_owners"] == 3, ddp
    assert r["fsdp:inductor"]["diff"] < 1e-4, r["fsdp:inductor"]
    static = r[cases[2]]  # parameters and running statistics as eager's
    assert (static["graphs"], static["breaks"], static["backend_graphs"]) == (1, 0, 3), static
    assert static["diff"] < 1e-5, static


if __name__ == "__main__":
    rank_main(_worker)
