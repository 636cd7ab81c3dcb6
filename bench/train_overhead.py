"""Where the host time of a compiled training step goes: cProfile over a few steps of a GPT-2
(transformers config, random weights, bf16 autocast, AdamW) under a backend, with the step's
wall time against the GPU's busy time, to tell a launch-bound step from a kernel-bound one.

    python bench/train_overhead.py --backend ember --out $OUT/overhead
"""

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import _paths  # noqa: F401 - puts the Ember components on sys.path


def main():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import backends as backend_registry

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="ember")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", default="/tmp/train_overhead")
    p.add_argument("--no-dropout", action="store_true", help="dropout probabilities 0")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    drop = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0) if args.no_dropout else {}
    model = GPT2LMHeadModel(GPT2Config(**drop)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    backend = backend_registry.get(args.backend)
    backend.begin()
    fn = backend.compile(model)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = fn(ids).logits.float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / args.steps
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    report = f"backend {args.backend}: {wall * 1e3:.2f} ms a step (no profiler)\n" + text.getvalue()
    (out / f"{args.backend}.txt").write_text(report)
    print(report[:3000])


if __name__ == "__main__":
    main()
