"""op_db samples (torch's OpInfo database) traced to prims, compiled, and compared with eager.

The default run covers a fixed, small list of OpInfos (two samples each, float32, C++ kernels);
the `slow` run takes every eligible OpInfo in shards, for each renderer (C++, and Triton through
its interpreter) and each of float32, float16 and bfloat16 the OpInfo supports on the CPU. A
sample whose tracing fails is primtorch's concern (its own coverage test reports it) and is
skipped here; everything that traces must compile and match: within the dtype's tolerance of
eager, or (16-bit results, which we may round once where eager rounds per op) nearly as close to
a float64 reference as eager is.

    EMBER_OPDB_SHARDS=float16 python -m pytest -m slow inductor/tests/test_inductor_opdb.py

Triton kernels run through Triton's interpreter, which has no libdevice: an OpInfo whose kernel
needs a libdevice function (asin, lgamma, ...) is reported as not supported there (it is printed
with the shard); on a GPU those kernels call libdevice.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere in this process

import pytest
import torch
from ember.inductor import compile_prims, config, metrics
from ember.primtorch import coverage
from torch.utils import _pytree as pytree

FAST_OPS = [
    "add", "mul", "div", "sub", "exp", "tanh", "sigmoid", "abs", "neg", "maximum", "where", "clamp",
    "softmax", "log_softmax", "sum", "mean", "amax", "var", "std", "prod", "argmax", "cat", "flip",
    "transpose", "permute", "nn.functional.relu", "nn.functional.gelu", "nn.functional.layer_norm",
    "nn.functional.pad", "gather", "index_select", "expand", "narrow", "rsqrt", "pow", "floor_divide",
]  # fmt: skip
SHARDS = 8
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Which (renderer, dtype) runs the slow shards take: all, or those naming a word of this variable.
_PICK = os.environ.get("EMBER_OPDB_SHARDS", "").replace(",", " ").split()
SLOW_RUNS = [(r, d) for r in ("cpp", "triton") for d in DTYPES
             if not _PICK or r in _PICK or d in _PICK]  # fmt: skip


def _ops(names=None):
    return [op for op in coverage.load_op_db()
            if (names is None or op.name in names) and not coverage.classify(op)]  # fmt: skip


def _run(op, dtype=torch.float32, max_samples=2):
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:max_samples]
    random_op = op.name in coverage.RANDOM_NAMES
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
        ref64 = None
        if dtype in (torch.float16, torch.bfloat16) and not random_op:
            ref64 = coverage._reference64(op, sample)
        replay = pytree.tree_leaves(
            coverage._clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
        )
        try:  # inductor's contract is the prim graph: skip samples the graph itself gets wrong
            traced = gm(*[replay[i] for i in positions])[0]
            if coverage.compare(traced, expected, values=not random_op, ref64=ref64) is not None:
                continue
        except Exception:  # noqa: BLE001
            continue
        args = [pytree.tree_leaves(coverage._clone((sample.input, tuple(sample.args), dict(sample.kwargs))))[i]
                for i in positions]  # fmt: skip
        got, _ = compile_prims(gm, args)(*args)
        why = coverage.compare(
            (got, []), (expected, []), values=not random_op,
            ref64=None if ref64 is None else (ref64, []),
        )  # fmt: skip
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
@pytest.mark.parametrize("renderer,dtype", SLOW_RUNS, ids=[f"{r}-{d}" for r, d in SLOW_RUNS])
def test_op_db_shard(renderer, dtype, shard, monkeypatch):
    if renderer == "triton":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
        monkeypatch.setattr(config, "cpu_backend", "triton")
    dt = DTYPES[dtype]
    failures, unsupported, checked = [], [], 0
    for i, op in enumerate(_ops()):
        if i % SHARDS != shard or op.name in coverage.RANDOM_NAMES:
            continue
        if dt not in op.supported_dtypes("cpu"):
            continue
        try:
            checked += _run(op, dt, max_samples=1) > 0
        except NotImplementedError as e:
            # A clear "unsupported" (complex, data-dependent sizes; under Triton's interpreter, a
            # libdevice function) is not a wrong result.
            unsupported.append(f"{coverage.opinfo_id(op)}: {str(e)[:120]}")
        except Exception as e:  # noqa: BLE001  (collected, so one shard reports every failure)
            failures.append(f"{coverage.opinfo_id(op)}: {str(e)[:200]}")
    print(f"{renderer} {dtype} shard {shard}: {checked} OpInfos matched eager, "
          f"{len(unsupported)} not supported", *unsupported, sep="\n  ")  # fmt: skip
    assert not failures, "\n".join(failures)
