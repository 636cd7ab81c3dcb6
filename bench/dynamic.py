"""The `dynamic` suite: inference over many sequence lengths, one compiled program against many.

    python bench/dynamic.py --device cuda --out $OUT/dynamic                 # gpt2, bert-base
    python bench/dynamic.py --device cpu --small --lengths 6 --out /tmp/dyn  # tiny configs, CPU

For each model, over `--lengths` random sequence lengths in [--min-len, --max-len] (seeded), the
variants are:

- `eager`: the model itself;
- `torch.compile(dynamic=True)`: the reference;
- `ember dynamic`: `ember.compile(model, dynamic=True)`: one program for every length;
- `ember per-length`: `ember.compile(model, dynamic=False)`: a program per length (compiled on
  `--per-length` of the lengths, evenly spread, since each costs a full compile);
- `ember padded`: static programs for the next power of two, at least `--pad-min` (inputs
  padded, with an attention mask where the model is not causal; outputs sliced back).

Per variant: the number of graphs compiled, the wall time of the first pass over all lengths
(compiles included), Ember's CUDA-graph replays among the timed and warm-up calls, and per length
the median latency of `--iters` calls after warm-up and the largest difference from eager at the
real positions. Each variant runs in this one process, one
after another (bfloat16 autocast on CUDA, float32 on the CPU). Writes dynamic.md and dynamic.json.
Models can run in separate processes on one device (`--models gpt2` and `--models
bert-base-uncased`, each with its own --out): with EMBER_BENCH_TIMING_LOCK set to one file, their
timed calls take turns while their compiles overlap; started with `setsid`, each is also stopped
during the others' timed calls (as `run.py`'s workers are); `--merge DIR...` then writes one
report.
"""

import argparse
import atexit
import copy
import json
import os
import random
import statistics
import time
import traceback
from pathlib import Path

import _paths  # noqa: F401  (components and bench/ on sys.path)
import torch

MODELS = {
    # name: (bench model, causal: padding at the end needs no mask)
    "gpt2": ("gpt2", True),
    "bert-base-uncased": ("bert-base-uncased", False),
}
SMALL = {"gpt2": "hf_gpt2", "bert-base-uncased": "hf_bert"}


def _build(name, small, device):
    from models import MODELS as SPECS

    spec = SPECS[SMALL[name] if small else MODELS[name][0]]
    torch.manual_seed(0)
    adapter = spec.build()
    return adapter.model.to(device).eval(), spec


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


WARMUP = 2  # calls before the timed ones, per length


def _time(fn, device, iters):
    from turns import timing_turn  # several of these processes may share one device

    with timing_turn():
        for _ in range(WARMUP):
            fn()
        _sync(device)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            _sync(device)
            samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


class CountingBackend:
    """Ember's inductor, counting the graphs it compiles."""

    ember_supports_dynamic = True

    def __init__(self):
        from ember.inductor import compile_fx

        self.inner, self.count = compile_fx, 0
        self.__name__ = "inductor"

    def __call__(self, gm, example_inputs):
        self.count += 1
        return self.inner(gm, example_inputs)


def _next_pow2(n, least=1):
    return max(least, 1 << (n - 1).bit_length())


def run_model(name, args, lengths):
    import ember
    import ember.dynamo
    from ember.inductor import metrics

    device = args.device
    model, spec = _build(name, args.small, device)
    causal = MODELS[name][1]
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    ids = {n: torch.randint(2, vocab, (args.batch, n), generator=gen).to(device) for n in lengths}
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def logits(fn, x, mask=None):
        with torch.no_grad(), autocast:
            out = fn(input_ids=x, attention_mask=mask) if mask is not None else fn(input_ids=x)
        return out.logits if hasattr(out, "logits") else out[0]

    ref = {n: logits(model, ids[n]).float() for n in lengths}
    variants = {}

    def measure(label, fn_for, count, lens, pad=False):
        print(f"[dynamic] {name}: {label}", flush=True)
        rec = {"lengths": {}, "error": None}
        try:
            start = time.perf_counter()
            for n in lens:  # the first pass: compiles happen here
                x, mask = _padded(ids[n], pad, causal)
                logits(fn_for(n), x, mask)
            _sync(device)
            rec["first_pass_s"] = time.perf_counter() - start
            replays = metrics.cudagraph_replays
            for n in lens:
                x, mask = _padded(ids[n], pad, causal)
                fn = fn_for(n)
                out = logits(fn, x, mask)[:, :n].float()
                rec["lengths"][n] = {
                    "ms": _time(lambda: logits(fn, x, mask), device, args.iters),
                    "max_abs_diff": (out - ref[n]).abs().max().item(),
                }
            rec["graphs"] = count()
            # Ember's CUDA-graph replays among the calls timed (and warmed up) per length
            rec["replays"] = f"{metrics.cudagraph_replays - replays}/{len(lens) * (WARMUP + args.iters)}"
        except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
            # the table gets the message's last line (a Triton CompilationError's reason comes
            # after the source it quotes); the JSON keeps all of it and the traceback
            lines = [ln for ln in str(e).splitlines() if ln.strip()] or [""]
            rec["error"] = f"{type(e).__name__}: {lines[-1][:300]}"
            rec["error_detail"] = traceback.format_exc()[-20000:]
        variants[label] = rec

    measure("eager", lambda n: model, lambda: 0, lengths)
    if args.no_torch_compile:
        return _ember_variants(name, args, lengths, model, measure, variants)

    import torch._dynamo as torch_dynamo

    torch_dynamo.reset()
    torch_dynamo.config.cache_size_limit = max(64, len(lengths) + 8)
    tc = torch.compile(copy.deepcopy(model), dynamic=True)
    from torch._dynamo.utils import counters

    counters.clear()
    measure("torch.compile dynamic", lambda n: tc, lambda: int(counters["stats"]["unique_graphs"]),
            lengths)  # fmt: skip
    return _ember_variants(name, args, lengths, model, measure, variants)


def _ember_variants(name, args, lengths, model, measure, variants):
    import ember
    import ember.dynamo

    ember.dynamo.reset()
    be = CountingBackend()
    dyn = ember.compile(copy.deepcopy(model), backend=be, dynamic=True)
    measure("ember dynamic", lambda n: dyn, lambda: be.count, lengths)

    ember.dynamo.reset()
    ember.dynamo.config.cache_size_limit = max(64, len(lengths) + 8)
    be_static = CountingBackend()
    static = ember.compile(copy.deepcopy(model), backend=be_static, dynamic=False)
    step = max(1, len(lengths) // max(1, args.per_length))
    subset = sorted(lengths)[::step][: args.per_length]
    measure("ember per-length", lambda n: static, lambda: be_static.count, subset)

    ember.dynamo.reset()
    be_pad = CountingBackend()
    padded = ember.compile(copy.deepcopy(model), backend=be_pad, dynamic=False)
    measure("ember padded", lambda n: padded, lambda: be_pad.count, lengths, pad=args.pad_min)
    return {"model": name, "small": args.small, "batch": args.batch, "lengths": lengths,
            "per_length_subset": subset, "variants": variants}  # fmt: skip


def _padded(x, pad, causal):
    if not pad:
        return x, None
    n = x.shape[1]
    full = _next_pow2(n, pad)
    out = torch.zeros(x.shape[0], full, dtype=x.dtype, device=x.device)
    out[:, :n] = x
    if causal:
        return out, None  # later positions never reach earlier ones
    mask = torch.zeros_like(out)
    mask[:, :n] = 1
    return out, mask


def report(results, env) -> str:
    lines = ["# dynamic: one program for many sequence lengths", "", env, ""]
    for res in results:
        lines += [f"## {res['model']} (batch {res['batch']}{', small config' if res['small'] else ''})",
                  "", "| variant | graphs compiled | first pass s | median ms (mean over lengths) "
                  "| vs ember per-length (same lengths) | max abs diff vs eager | CUDA graph "
                  "replays / calls | error |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        per = res["variants"].get("ember per-length", {}).get("lengths", {})
        for label, rec in res["variants"].items():
            lens = rec["lengths"]
            mean = statistics.mean(v["ms"] for v in lens.values()) if lens else None
            common = [n for n in per if n in lens]
            ratio = (
                statistics.mean(lens[n]["ms"] / per[n]["ms"] for n in common) if common else None
            )
            diff = max((v["max_abs_diff"] for v in lens.values()), default=None)
            lines.append(
                f"| {label} | {rec.get('graphs', '-')} | {_f(rec.get('first_pass_s'), '.1f')} | "
                f"{_f(mean, '.3f')} | {_f(ratio, '.3f')} | {_f(diff, '.2e')} | "
                f"{rec.get('replays', '-')} | {rec['error'] or ''} |"
            )
        lines += ["", "Per length (ms):", "",
                  "| length | " + " | ".join(res["variants"]) + " |",
                  "|---|" + "---|" * len(res["variants"])]  # fmt: skip
        for n in sorted(res["lengths"]):
            cells = [_f(rec["lengths"].get(n, {}).get("ms"), ".3f")
                     for rec in res["variants"].values()]  # fmt: skip
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _f(v, spec):
    return "-" if v is None else format(v, spec)


def _with_int_lengths(result):
    """A result read back from JSON, whose per-length keys came back as strings."""
    for rec in result["variants"].values():
        rec["lengths"] = {int(n): v for n, v in rec["lengths"].items()}
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="gpt2,bert-base-uncased")
    p.add_argument("--lengths", type=int, default=20)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--per-length", type=int, default=5, help="lengths compiled one by one")
    p.add_argument("--pad-min", type=int, default=64, help="the smallest padded length")
    p.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile's variant")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--small", action="store_true", help="tiny configs (CPU check)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--merge", nargs="*", help="merge these output folders into --out")
    args = p.parse_args(argv)
    if args.merge:
        runs = [json.loads((Path(d) / "dynamic.json").read_text()) for d in args.merge]
        results = [_with_int_lengths(r) for run in runs for r in run["results"]]
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dynamic.md").write_text(report(results, runs[0]["env"]))
        print(report(results, runs[0]["env"]))
        return
    import turns

    # Started as its own process group (setsid) beside other benchmark workers, it is stopped
    # during their timed phases as they are during its own.
    turns.register()
    atexit.register(turns.unregister, os.environ.get(turns.LOCK_ENV), os.getpid())
    rng = random.Random(args.seed)
    lengths = sorted(rng.sample(range(args.min_len, args.max_len + 1), args.lengths))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    env = (f"device {dev} · torch {torch.__version__} · Python {os.sys.version.split()[0]} · "
           f"{'bf16 autocast' if args.device == 'cuda' else 'float32'} · lengths {lengths}")  # fmt: skip
    results = []
    for name in args.models.split(","):
        results.append(run_model(name, args, lengths))
        (out / "dynamic.json").write_text(json.dumps({"env": env, "results": results}, indent=1,
                                                     default=str))  # fmt: skip
        (out / "dynamic.md").write_text(report(results, env))
    print(report(results, env))


if __name__ == "__main__":
    main()
