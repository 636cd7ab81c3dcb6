"""Measured coverage of the decompositions over torch's OpInfo database (op_db).

`python -m ember.primtorch.coverage [--ops a,b] [--dtypes float32,int64] [--shard i/n] [--json out]`
prints a JSON report: how many prims and decompositions exist, and for each dtype how many eligible
OpInfos have every sample traced to prims/extern ops and matching eager, with each failure's reason
and the missing decompositions ranked by how many OpInfos they block.

An OpInfo passes a dtype when every sample (`op.sample_inputs("cpu", dtype)`) whose eager call
succeeds is traced by `ember.primtorch.Tracer` into a graph whose every call is a prim or extern op,
and replaying that graph on fresh copies of the inputs gives eager's outputs (and eager's new values
of any input it mutates) within tolerance. 16-bit float results that miss the default tolerance
pass when they are no further from a float64 reference than twice eager's own error. Random ops are
checked for shapes and dtypes only (their streams differ from torch's by design), `empty*` likewise.

Excluded from the denominator, by name (see `classify`): extern ops (linear algebra, FFT, matmul,
convolution, attention, sort/scan kernels), complex-only OpInfos (no real dtype, or a complex
result: complex, polar, view_as_complex/real), sparse, quantized, and OpInfos with no CPU dtypes.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import re
import sys
import time
import warnings
from collections import Counter
from typing import Optional

import torch
from torch.utils import _pytree as pytree

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "bool": torch.bool,
}  # fmt: skip

# OpInfos whose computation is a library kernel Ember calls rather than generates.
EXTERN_PREFIXES = ("linalg.", "fft.")
EXTERN_NAMES = {
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "addmv",
    "addbmm",
    "baddbmm",
    "mv",
    "dot",
    "vdot",
    "inner",
    "tensordot",
    "einsum",
    "chain_matmul",
    "nn.functional.bilinear",
    "__rmatmul__",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "lu",
    "lu_solve",
    "lu_unpack",
    "triangular_solve",
    "geqrf",
    "ormqr",
    "qr",
    "svd",
    "svd_lowrank",
    "pca_lowrank",
    "pinverse",
    "logdet",
    "det",
    "matrix_exp",
    "inverse",
    "slogdet",
    "symeig",
    "eig",
    "lstsq",
    "nn.functional.conv1d",
    "nn.functional.conv2d",
    "nn.functional.conv3d",
    "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d",
    "nn.functional.conv_transpose3d",
    "conv1d",
    "conv2d",
    "conv3d",
    "nn.functional.scaled_dot_product_attention",
    "torch.ops.aten._flash_attention_forward",
    "torch.ops.aten._efficient_attention_forward",
    "torch._scaled_mm",
    "torch._scaled_mm_v2",
    "sort",
    "argsort",
    "msort",
    "topk",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "logcumsumexp",
    "stft",
    "istft",
}
# Variants that are linear algebra (the nuclear norm is a sum of singular values).
EXTERN_IDS = {"norm.nuc"}  # fmt: skip

# Values are not comparable with eager (independent random streams, uninitialised memory).
RANDOM_NAMES = {
    "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "randn", "randn_like",
    "rand_like", "randint", "randint_like", "multinomial", "bernoulli", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "nn.functional.multi_head_attention_forward",
    # These draw their window offsets with torch.rand unless given _random_samples.
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
}  # fmt: skip

# OpInfos that build or take apart complex tensors (their results are complex).
COMPLEX_NAMES = {"complex", "polar", "view_as_complex", "view_as_real"}

_REAL = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


CLASSIFICATION = {
    "extern": "linalg.*, fft.*, and OpInfos whose computation is a library kernel (matmul family, "
    "convolution, attention, sort/scan, LAPACK-backed ops, the nuclear norm): EXTERN_NAMES",
    "complex_only": "no real dtype on CPU, or a complex result (complex, polar, "
    "view_as_complex, view_as_real)",
    "sparse": "sparse.* and to_sparse",
    "quantized": "names with 'quantize'",
    "no_cpu_dtypes": "no dtype supported on CPU",
    "random": "values not compared (own Philox stream; empty*): shapes and dtypes only, "
    "RANDOM_NAMES",
}


def opinfo_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def classify(op) -> Optional[str]:
    """Why an OpInfo is outside the denominator ("extern", "complex_only", ...), or None."""
    name = op.name
    if name.startswith("sparse.") or "to_sparse" in name:
        return "sparse"
    if "quantize" in name or "quantized" in name:
        return "quantized"
    if name.startswith(EXTERN_PREFIXES) or name in EXTERN_NAMES or opinfo_id(op) in EXTERN_IDS:
        return "extern"
    if name in COMPLEX_NAMES:
        return "complex_only"
    dtypes = set(op.supported_dtypes("cpu"))
    if not dtypes:
        return "no_cpu_dtypes"
    if not dtypes & _REAL:
        return "complex_only"
    return None


def load_op_db():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return op_db


# --- one sample ----------------------------------------------------------------------------------


def _clone(tree):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _call(op, sample, tree):
    inp, args, kwargs = tree
    return op(inp, *args, **kwargs)


def trace_sample(op, sample):
    """(graph module, flat inputs spec, flat tensors) for one sample; mutated inputs are outputs."""
    from ember.primtorch import Tracer

    tree = _clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    flat, spec = pytree.tree_flatten(tree)
    tracer = Tracer(allow_data_dependent=True)
    positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    for i in positions:
        tracer.placeholder(flat[i], f"arg{i}")
    with tracer:
        out = _call(op, sample, pytree.tree_unflatten(flat, spec))
    mutated = [t for node, t in tracer.inputs.items() if node in tracer.mutated_inputs]
    gm = tracer.output((out, mutated))
    mutated_pos = [next(j for j in positions if flat[j] is t) for t in mutated]
    return gm, spec, positions, mutated_pos, flat


def non_prim_targets(gm) -> list[str]:
    """Call targets of gm that are neither prims, extern ops nor getitem."""
    from ember.primtorch import is_extern, is_prim

    bad = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and not (
            is_prim(n.target) or is_extern(n.target) or n.target is operator.getitem
        ):
            bad.append(str(n.target))
    return bad


def _tols(dtype):
    if dtype is torch.float16:
        return dict(rtol=1e-3, atol=1e-3)
    if dtype is torch.bfloat16:
        return dict(rtol=1.6e-2, atol=1e-2)
    return {}


def _to64(tree):
    return pytree.tree_map(
        lambda t: (
            t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        ),
        tree,
    )


def _max_err(a, b) -> float:
    diff = (a.double() - b.double()).abs()
    both_nan = a.isnan() & b.isnan()
    same_inf = (a == b) & a.isinf()
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    return float(diff.max()) if diff.numel() else 0.0


def compare(got, expected, *, values=True, ref64=None) -> Optional[str]:
    """None when got matches expected (structure, shapes, dtypes, values), else why not."""
    g_flat, g_spec = pytree.tree_flatten(got)
    e_flat, e_spec = pytree.tree_flatten(expected)
    if len(g_flat) != len(e_flat):
        return f"{len(g_flat)} outputs, eager has {len(e_flat)}"
    r_flat = pytree.tree_leaves(ref64) if ref64 is not None else [None] * len(e_flat)
    for i, (g, e, r) in enumerate(zip(g_flat, e_flat, r_flat)):
        if not isinstance(e, torch.Tensor):
            if isinstance(g, torch.Tensor) or (values and g != e and not _both_nan(g, e)):
                return f"output {i}: {g!r}, eager {e!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {i}: {type(g).__name__}, eager a tensor"
        if g.dtype != e.dtype or g.shape != e.shape:
            return f"output {i}: {g.dtype}{list(g.shape)}, eager {e.dtype}{list(e.shape)}"
        if not values:
            continue
        try:
            torch.testing.assert_close(g, e, equal_nan=True, check_stride=False, **_tols(e.dtype))
        except AssertionError as err:
            if _close_to_reference(g, e, r):
                continue
            return f"output {i}: " + " ".join(str(err).split())[:300]
    return None


def _both_nan(a, b):
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def _close_to_reference(got, eager, ref) -> bool:
    # A 16-bit result may differ from eager's because we round once where eager rounds per op;
    # it passes when it is at least nearly as accurate as eager against a float64 reference.
    if ref is None or got.dtype not in (torch.float16, torch.bfloat16):
        return False
    ref = ref.to(got.dtype).double() if ref.dtype is torch.float64 else ref.double()
    scale = max(float(ref.abs().max()) if ref.numel() else 0.0, 1.0)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[got.dtype] * scale
    return _max_err(got, ref) <= 2 * _max_err(eager, ref) + tol


def run_sample(op, sample, dtype, random_op: bool) -> Optional[str]:
    """None when the sample passes (or eager rejects it), else the reason it fails."""
    eager_inputs = _clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    try:
        expected = _call(op, sample, eager_inputs)
    except Exception:
        return None  # eager rejects this sample: nothing to match
    try:
        gm, spec, positions, mutated_pos, flat = trace_sample(op, sample)
    except Exception as err:  # noqa: BLE001  (the reason is the report)
        return _reason(err)
    bad = non_prim_targets(gm)
    if bad:
        return f"not decomposed: {', '.join(sorted(set(bad)))}"
    replay_flat = pytree.tree_leaves(
        _clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    )
    args = [replay_flat[i] for i in positions]
    try:
        got, got_mutated = gm(*args)
    except Exception as err:  # noqa: BLE001
        return "replay: " + _reason(err)
    e_flat = pytree.tree_leaves(eager_inputs)
    expected_mutated = [e_flat[i] for i in mutated_pos]
    ref64 = None
    if dtype in (torch.float16, torch.bfloat16) and not random_op:
        ref64 = _reference64(op, sample)
    why = compare(
        (got, got_mutated),
        (expected, expected_mutated),
        values=not random_op,
        ref64=None if ref64 is None else (ref64, [None] * len(expected_mutated)),
    )
    return why


def _reference64(op, sample):
    try:
        return _call(
            op, sample, _to64(_clone((sample.input, tuple(sample.args), dict(sample.kwargs))))
        )
    except Exception:
        return None


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:240]}"


# --- the report ----------------------------------------------------------------------------------


def evaluate(op, dtype, max_samples: Optional[int] = None) -> Optional[str]:
    """None when every sample of op passes in dtype, else the first failure's reason."""
    random_op = op.name in RANDOM_NAMES
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
    except Exception as err:  # noqa: BLE001
        return "samples: " + _reason(err)
    if max_samples and len(samples) > max_samples:
        # An evenly spaced subset keeps the variety of the list (sample lists are ordered).
        step = len(samples) / max_samples
        samples = [samples[int(i * step)] for i in range(max_samples)]
    for k, sample in enumerate(samples):
        torch.manual_seed(k)
        why = run_sample(op, sample, dtype, random_op)
        if why:
            return f"sample {k}: {why}"
    return None


_MISSING = re.compile(r"(aten\.[\w.]+) has no decomposition|not decomposed: ([\w., ]+)")


def blockers(failures: dict) -> list[tuple[str, int]]:
    """Missing decompositions ranked by how many (OpInfo, dtype) failures name them."""
    counts: Counter = Counter()
    for per_dtype in failures.values():
        seen = set()
        for why in per_dtype.values():
            m = _MISSING.search(why)
            if m:
                for name in (m.group(1) or m.group(2)).split(", "):
                    seen.add(name.strip())
        counts.update(seen)
    return counts.most_common()


def run(
    ops=None,
    dtypes=("float32", "float16", "bfloat16", "int64", "bool"),
    shard=(0, 1),
    max_samples=None,
    progress=False,
) -> dict:
    """Evaluate op_db (or the named OpInfos) and return the report as a dict."""
    from ember.primtorch import prims
    from ember.primtorch.decomp import DECOMPOSITIONS

    start = time.time()
    op_db = load_op_db()
    index, count = shard
    selected = [
        (i, op)
        for i, op in enumerate(op_db)
        if i % count == index and (not ops or op.name in ops or opinfo_id(op) in ops)
    ]
    excluded: dict[str, list[str]] = {}
    results: dict[str, dict[str, str]] = {}
    failures: dict[str, dict[str, str]] = {}
    timings: dict[str, float] = {}
    for _, op in selected:
        why_out = classify(op)
        if why_out:
            excluded.setdefault(why_out, []).append(opinfo_id(op))
            continue
        supported = set(op.supported_dtypes("cpu"))
        for name in dtypes:
            dtype = DTYPES[name]
            if dtype not in supported:
                continue
            t0 = time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                why = evaluate(op, dtype, max_samples)
            timings[f"{opinfo_id(op)}:{name}"] = round(time.time() - t0, 2)
            results.setdefault(opinfo_id(op), {})[name] = "pass" if why is None else "fail"
            if why:
                failures.setdefault(opinfo_id(op), {})[name] = why
            if progress:
                print(f"{opinfo_id(op)} {name}: {why or 'pass'}", file=sys.stderr)
    per_dtype = {}
    for name in dtypes:
        ran = [r[name] for r in results.values() if name in r]
        passed = sum(1 for r in ran if r == "pass")
        per_dtype[name] = {
            "eligible": len(ran),
            "passed": passed,
            "rate": round(passed / len(ran), 4) if ran else None,
        }
    prim_names = [p for p in prims.PRIMS.values()]
    return {
        "prims": sum(1 for p in prim_names if p.namespace == "prims"),
        "extern_ops": sum(1 for p in prim_names if p.namespace == "extern"),
        "aten_overloads_decomposed": len(DECOMPOSITIONS),
        "opinfos_selected": len(selected),
        "opinfos_eligible": len(results),
        "excluded": {k: sorted(v) for k, v in sorted(excluded.items())},
        "classification": CLASSIFICATION,
        "per_dtype": per_dtype,
        "results": results,
        "failures": failures,
        "blockers": blockers(failures),
        "slowest": sorted(timings.items(), key=lambda kv: -kv[1])[:25],
        "shard": f"{index}/{count}",
        "seconds": round(time.time() - start, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated dtypes")
    parser.add_argument("--shard", default="0/1", help="i/n: OpInfos whose op_db index is i mod n")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--progress", action="store_true", help="one line per OpInfo on stderr")
    args = parser.parse_args(argv)
    index, count = (int(x) for x in args.shard.split("/"))
    report = run(
        ops=set(args.ops.split(",")) if args.ops else None,
        dtypes=tuple(args.dtypes.split(",")),
        shard=(index, count),
        max_samples=args.max_samples,
        progress=args.progress,
    )
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
