"""A Llama-style decoder packaged as a decode step with a dynamic number of new tokens, run by the
standalone runtime: its logits against eager's at several prompt lengths, its `generate` against
eager's greedy tokens, and decoding tokens per second at batch 1 against
`torch.compile(mode="reduce-overhead")` and Ember in process with the same model and cache.

    python bench/decode_package.py --out $OUT/dp                       # ~1.2B parameters, bf16
    python bench/decode_package.py --device cpu --layers 2 --hidden 256 --heads 4 --kv-heads 2 \\
        --intermediate 512 --vocab 1024 --max-new 16 --lengths 1,3,9,16 --tokens 16   # tiny

The step is `forward(tokens (B, T), positions (T,), k0, v0, k1, v1, ...) -> logits (B, T, V)`, its
caches written in place at the positions (`index_copy_`), its attention causal over the new
tokens and the cache's earlier rows (a mask from the positions), GQA. The package
(`package_decode_step(..., max_new_tokens=N)`) takes T in [1, N]. The in-process backends run
the same step through a module that holds the caches as buffers (so CUDA graphs may keep
them), one token per call, positions sliced from a tensor on the device.

Accuracy: each set of logits is compared with a float32 copy of the model (relative error of the
logits, all rows); the package passes where its error is at most twice eager's plus 1e-3.
Greedy tokens: the standalone `run_package --generate` against eager's (where they differ, the
first differing step is reported with eager's margin between its two best logits there). Random
weights give near-flat logits whose two best often round to the same bf16 value, where any
difference in summation order picks another token; so by default (`--head peaked`) the output
head is the embedding table, permuted: the residual stream keeps the current token's embedding,
so its logit for a fixed successor stands out by far more than bf16's rounding (still computed
through every layer, the caches and attention). `--head random` keeps the random head.
Decoding speed: `run_package --generate N --bench R` (the prompt's one token, then N - 1 steps,
each reading the logits back to the host) against a loop of N steps that leaves the tokens on
the device (argmax in the step's stream: it never waits for the host).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _paths  # noqa: F401
import numpy as np
import torch

import ember
import ember.cpp_wrapper as cw
from decode import Cached, build_step, model_args, zero_caches
from measure import kernel_table


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(p)
    p.add_argument("--max-new", type=int, default=128, help="the package's max_new_tokens")
    p.add_argument("--lengths", default="1,7,33,100,128", help="prompt lengths for the logits")
    p.add_argument("--prompt", type=int, default=16, help="the greedy check's prompt length")
    p.add_argument("--tokens", type=int, default=64, help="new tokens: greedy check and timing")
    p.add_argument("--repeat", type=int, default=10, help="timed generations")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    p.add_argument("--head", default="peaked", choices=("peaked", "random"),
                   help="the output head: random, or the embedding table permuted (see above)")
    p.add_argument("--backends", default="eager,torch_compile_cg,ember,package")
    p.add_argument("--out", default=None, help="a directory for the package and results.json")
    p.add_argument("--profile", action="store_true",
                   help="each backend's top GPU kernels of one one-token step (CUDA)")
    return p.parse_args(argv)


def build(cfg, device, dtype):
    model = build_step(cfg, device, dtype)
    if cfg.head == "peaked":  # each token's successor is decisive: see the module's docstring
        perm = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model.lm_head.weight.copy_(model.embed.weight[perm.to(device)])
    return model


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def check_logits(cfg, step, ref, loaded, device, dtype):
    """Per prompt length: the package's and eager's relative error against the float32 model."""
    rows = []
    for n in (int(x) for x in cfg.lengths.split(",")):
        g = torch.Generator().manual_seed(n)
        prompt = torch.randint(0, cfg.vocab, (1, n), generator=g).to(device)
        pos = torch.arange(n, device=device)
        with torch.no_grad():
            want = ref(prompt, pos, *zero_caches(cfg, device, torch.float32))
            eager = step(prompt, pos, *zero_caches(cfg, device, dtype))
        got = loaded(prompt, pos, *zero_caches(cfg, device, dtype))[0]
        e_pkg, e_eager = rel_err(got, want), rel_err(eager, want)
        rows.append({"length": n, "package_err": e_pkg, "eager_err": e_eager,
                     "package_vs_eager": rel_err(got, eager),
                     "ok": e_pkg <= 2 * e_eager + 1e-3})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def eager_greedy(step, cfg, prompt, n, device, dtype):
    """Greedy tokens: the prompt in one call, then one token per call; each step's logits."""
    caches = zero_caches(cfg, device, dtype)
    tokens, logits, p = [], [], prompt.shape[1]
    with torch.no_grad():
        out = step(prompt, torch.arange(p, device=device), *caches)[:, -1]
        for i in range(n):
            logits.append(out.float())
            tokens.append(out.argmax(-1))
            if i + 1 < n:
                pos = torch.tensor([p + i], device=device)
                out = step(tokens[-1][:, None], pos, *caches)[:, -1]
    return torch.stack(tokens, 1).cpu(), torch.stack(logits, 1).cpu()


def standalone(run_package, pkg, prompt, n, repeat, tmp):
    """`run_package --generate`: (tokens, timing line's fields)."""
    np.save(tmp / "prompt.npy", prompt.cpu().numpy())
    cmd = [str(run_package), "--generate", str(n)]
    if repeat:
        cmd += ["--bench", str(repeat)]
    run = subprocess.run(cmd + [str(pkg), str(tmp / "prompt.npy"), str(tmp / "out.npy")],
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode:
        raise RuntimeError(f"run_package failed ({run.returncode}): {run.stderr[-2000:]}")
    fields = {}
    for line in run.stdout.splitlines():
        if line.startswith("generate "):
            fields = dict(kv.split("=") for kv in line.split()[1:])
    return torch.from_numpy(np.load(tmp / "out.npy")), fields


def in_process_rate(fn, cfg, device, n, repeat):
    """Tokens per second of `fn(tokens, positions)` over n one-token steps at batch 1."""
    positions = torch.arange(cfg.max_len, device=device)

    def loop(k):
        tok = torch.zeros(1, 1, dtype=torch.long, device=device)
        for i in range(k):
            tok = fn(tok, positions[i : i + 1])[:, -1].argmax(-1, keepdim=True)
        return tok

    with torch.no_grad():
        t0 = time.perf_counter()
        loop(2)  # compiles
        _sync(device)
        first = time.perf_counter() - t0
        loop(n)  # warm (and CUDA graphs recorded)
        times = []
        for _ in range(repeat):
            _sync(device)
            t0 = time.perf_counter()
            loop(n)
            _sync(device)
            times.append(time.perf_counter() - t0)
    ms = 1000 * statistics.median(times)
    return {"tokens_per_s": round(1000 * n / ms, 1), "ms_per_token": round(ms / n, 4),
            "first_calls_s": round(first, 1)}  # fmt: skip


def backend(name, module):
    if name == "eager":
        return module
    if name == "torch_compile_cg":
        return torch.compile(module, mode="reduce-overhead")
    if name == "ember":
        return ember.compile(module)
    raise ValueError(name)


def main(cfg):
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.dtype]
    out = Path(cfg.out or tempfile.mkdtemp(prefix="decode_package_"))
    out.mkdir(parents=True, exist_ok=True)
    step = build(cfg, device, dtype)
    params = sum(p.numel() for p in step.parameters())
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result = {"config": vars(cfg), "device": name, "params": params, "torch": torch.__version__}
    print(f"# decode_package: {params / 1e6:.0f}M parameters, {cfg.dtype}, {name}", flush=True)
    backends = cfg.backends.split(",")
    if "package" in backends:
        builder = cw.install_run_package(out / "bin")
        example = (torch.zeros(1, 1, dtype=torch.long, device=device),
                   torch.zeros(1, dtype=torch.long, device=device),
                   *zero_caches(cfg, device, dtype))  # fmt: skip
        t0 = time.perf_counter()
        pkg = cw.package_decode_step(step, example, out / "pkg", tokens=0, positions=1,
                                     caches=range(2, len(example)), max_new_tokens=cfg.max_new,
                                     device=device)  # fmt: skip
        result["package_s"] = round(time.perf_counter() - t0, 1)
        print(f"packaged in {result['package_s']} s", flush=True)
        ref = copy.deepcopy(step).float()
        result["logits"] = check_logits(cfg, step, ref, cw.load_package(pkg), device, dtype)
        del ref
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, cfg.vocab, (1, cfg.prompt), generator=g)
        want, logits = eager_greedy(step, cfg, prompt.to(device), cfg.tokens, device, dtype)
        got, _ = standalone(builder, pkg, prompt, cfg.tokens, 0, out)
        same = got.tolist() == want.tolist()
        greedy = {"prompt": cfg.prompt, "new": cfg.tokens, "same": same}
        if not same:
            k = int((got != want).nonzero()[0, 1])
            top = logits[0, k].topk(2).values
            greedy.update(first_difference=k, eager_margin=float(top[0] - top[1]))
        result["greedy"] = greedy
        print(json.dumps(greedy), flush=True)
        _, fields = standalone(builder, pkg, torch.zeros(1, 1, dtype=torch.long), cfg.tokens,
                               cfg.repeat, out)  # fmt: skip
        result["package"] = {"tokens_per_s": float(fields["tokens_per_s"]),
                             "ms_per_token": round(float(fields["median_ms"]) / cfg.tokens, 4)}
        print(json.dumps({"package": result["package"]}), flush=True)
        if cfg.profile and device == "cuda":
            loaded, caches = cw.load_package(pkg), zero_caches(cfg, device, dtype)
            tok = torch.zeros(1, 1, dtype=torch.long, device=device)
            at = torch.tensor([cfg.tokens], device=device)
            table = kernel_table(lambda: loaded(tok, at, *caches), top=40)
            result["package_kernels"] = table
            print(json.dumps({"package_kernels": table}), flush=True)
    for b in (b for b in backends if b != "package"):
        try:
            fn = backend(b, Cached(step, zero_caches(cfg, device, dtype)))
            result[b] = in_process_rate(fn, cfg, device, cfg.tokens, cfg.repeat)
            if cfg.profile and device == "cuda":
                tok = torch.zeros(1, 1, dtype=torch.long, device=device)
                at = torch.arange(cfg.max_len, device=device)[cfg.tokens : cfg.tokens + 1]
                with torch.no_grad():
                    result[b + "_kernels"] = kernel_table(lambda: fn(tok, at), top=40)
        except Exception as e:  # a backend's failure is a result
            result[b] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(json.dumps({b: result[b]}), flush=True)
        ember.reset()
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    ok = all(r["ok"] for r in result.get("logits", [])) and result.get("greedy", {}).get("same", 1)
    return bool(ok)


if __name__ == "__main__":
    sys.exit(0 if main(_args()) else 1)
