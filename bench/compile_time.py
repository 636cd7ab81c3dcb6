"""Cold and warm compile times of ember.compile, model by model, each phase in a fresh process.

    python bench/compile_time.py --device cuda --mode infer-bf16 resnet50 efficientnet_b0
    python bench/compile_time.py small_resnet small_gpt2 small_vit          # CPU, fp32
    python bench/compile_time.py --device cuda --mode train-amp --stages gpt2  # where it goes

Per model, with its own empty EMBER_CACHE_DIR and TRITON_CACHE_DIR: `cold` is the first call of a fresh process on
the empty cache; `warm` the first call of a second process on the filled cache (imports excluded);
each process first calls the model eagerly (`eager 1st`: the first use of cuDNN's and cuBLAS's
kernels, paid by any first call and no part of compiling; a CUDA model with convolutions runs
in both memory formats, since Ember's convolutions run channels-last), then compiles it;
`reset` the first call after ember.dynamo.reset() in that second process (the bench harness's
warm compile). Each line also shows which cache levels hit (fx: the torch-level cache that skips
tracing and lowering; graph: the prim-graph cache; cubins: Triton kernels launched from their
stored binaries, without Triton's JIT).
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import _paths  # noqa: F401  (components and bench/ on sys.path)

MODES = ("infer-fp32", "infer-bf16", "train-fp32", "train-amp")


def _one(name: str, device: str, mode: str) -> dict:
    """Compile and call one model twice (fresh wrapper after a reset); seconds of each call."""
    import torch
    from models import MODELS

    import ember
    import ember.dynamo
    from ember.inductor import metrics
    from ember.ir import progress

    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.build().to(device)
    gen = torch.Generator().manual_seed(0)
    inputs = [t.to(device) for t in spec.make_inputs(spec.batch, spec.seq, gen)]
    train = mode.startswith("train")
    model.train(train)
    autocast = torch.bfloat16 if mode in ("infer-bf16", "train-amp") else None

    def call(fn, args=inputs):
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        start = time.perf_counter()
        with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
            with torch.set_grad_enabled(train):
                out = fn(*args)
            if train:
                out.float().mean().backward()
        sync()
        return time.perf_counter() - start

    # Eager calls first: a new process loads cuDNN's and cuBLAS's kernels at their first use,
    # which any first call pays, eager or compiled, and which is no part of compiling. Ember
    # runs a CUDA model's convolutions channels-last (config.conv_channels_last), whose cuDNN
    # kernels are others: on an H200 their first use was ~2 s of efficientnet_b0's first
    # compiled call in a new process. So the model runs eagerly in both layouts.
    result = {"eager_first": call(model)}
    if device == "cuda" and any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
        last = copy.deepcopy(model).to(memory_format=torch.channels_last)
        nhwc = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                for t in inputs]  # fmt: skip
        result["eager_first"] += call(last, nhwc)
        del last
    for phase in ("first", "reset"):
        metrics.reset()
        ember.dynamo.reset()
        progress.reset_stage_totals()
        result[phase] = call(ember.compile(model))
        result[f"{phase}_stages"] = progress.stage_totals()
        result[f"{phase}_hits"] = (f"fx {metrics.fx_cache_hits} graph {metrics.cache_hits} "
                                   f"cubins {metrics.triton_binaries_loaded}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="infer-fp32", choices=MODES)
    parser.add_argument("--stages", action="store_true",
                        help="also the cold call's seconds by compile stage (ember.ir.progress)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.models[0], args.device, args.mode)))
        return
    print(f"{'model':24} {'cold s':>8} {'warm s':>8} {'reset s':>8} {'eager 1st s':>11}  "
          "caches (cold | warm)")
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="ember-compile-time-") as cache:
            # Triton's own cache too: a kernel Triton compiled before (for another run, or
            # another model) is otherwise loaded, not compiled, and the cold call reads low
            env = {**os.environ, "EMBER_CACHE_DIR": cache,
                   "TRITON_CACHE_DIR": os.path.join(cache, "triton-own")}  # fmt: skip
            runs = []
            for _ in ("cold", "warm"):
                cmd = [sys.executable, __file__, "--one", "--device", args.device, "--mode",
                       args.mode, name]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{name:24} failed:\n{proc.stderr[-3000:]}")
                    break
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if len(runs) == 2:
                cold, warm = runs
                print(f"{name:24} {cold['first']:8.2f} {warm['first']:8.2f} {warm['reset']:8.2f}"
                      f" {warm['eager_first']:11.2f}  {cold['first_hits']} | "
                      f"{warm['first_hits']}")  # fmt: skip
                if args.stages:
                    _print_stages(cold["first"], cold["first_stages"])


def _print_stages(first: float, stages: dict) -> None:
    """The cold first call's seconds by compile stage (inner stages' time included in their
    outer one's), and what ran outside every stage (dynamo's bytecode work, the calls)."""
    outer = sum(t for path, t in stages.items() if " > " not in path)
    for path, seconds in sorted(stages.items()):
        depth = path.count(" > ")
        if depth <= 2:
            print(f"    {'  ' * depth}{path.rsplit(' > ', 1)[-1]:<40} {seconds:8.2f}")
    print(f"    {'outside every stage':<40} {first - outer:8.2f}")


if __name__ == "__main__":
    main()
