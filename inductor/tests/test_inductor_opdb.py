"""op_db samples (torch's OpInfo database) traced to prims, compiled, and compared with eager.

The default run covers a fixed, small list of OpInfos (two samples each, float32); the `slow` run
takes every eligible OpInfo in shards. A sample whose tracing fails is primtorch's concern (its
own coverage test reports it) and is skipped here; everything that traces must compile and match.
"""

import pytest
import torch
from ember.inductor import compile_prims, metrics
from ember.primtorch import coverage
from torch.utils import _pytree as pytree

FAST_OPS = [
    "add", "mul", "div", "sub", "exp", "tanh", "sigmoid", "abs", "neg", "maximum", "where", "clamp",
    "softmax", "log_softmax", "sum", "mean", "amax", "var", "std", "prod", "argmax", "cat", "flip",
    "transpose", "permute", "nn.functional.relu", "nn.functional.gelu", "nn.functional.layer_norm",
    "nn.functional.pad", "gather", "index_select", "expand", "narrow", "rsqrt", "pow", "floor_divide",
]  # fmt: skip
SHARDS = 8


def _ops(names=None):
    return [op for op in coverage.load_op_db()
            if (names is None or op.name in names) and not coverage.classify(op)]  # fmt: skip


def _run(op, dtype=torch.float32, max_samples=2):
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:max_samples]
    ran = 0
    for k, sample in enumerate(samples):
        torch.manual_seed(k)
        try:
            expected = coverage._call(
                op, sample, coverage._clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
            )
            gm, _spec, positions, mutated_pos, _flat = coverage.trace_sample(op, sample)
        except Exception:  # noqa: BLE001  (eager rejects the sample, or primtorch cannot trace it)
            continue
        if coverage.non_prim_targets(gm) or mutated_pos:
            continue
        replay = pytree.tree_leaves(
            coverage._clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
        )
        try:  # inductor's contract is the prim graph: skip samples the graph itself gets wrong
            if coverage.compare(gm(*[replay[i] for i in positions])[0], expected) is not None:
                continue
        except Exception:  # noqa: BLE001
            continue
        args = [pytree.tree_leaves(coverage._clone((sample.input, tuple(sample.args), dict(sample.kwargs))))[i]
                for i in positions]  # fmt: skip
        got, _ = compile_prims(gm, args)(*args)
        why = coverage.compare(
            (got, []), (expected, []), values=op.name not in coverage.RANDOM_NAMES
        )
        assert why is None, f"{op.name} sample {k}: {why}"
        ran += 1
    return ran


@pytest.mark.parametrize("op", _ops(FAST_OPS), ids=lambda op: coverage.opinfo_id(op))
def test_op_db_sample(op):
    metrics.reset()
    if _run(op) == 0:
        pytest.skip("primtorch traces no sample of this OpInfo yet")


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_op_db_shard(shard):
    failures = []
    for i, op in enumerate(_ops()):
        if i % SHARDS != shard or op.name in coverage.RANDOM_NAMES:
            continue
        try:
            _run(op, max_samples=1)
        except NotImplementedError:
            continue  # a clear "unsupported" (complex, data-dependent sizes) is not a wrong result
        except Exception as e:  # noqa: BLE001  (collected, so one shard reports every failure)
            failures.append(f"{coverage.opinfo_id(op)}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)
