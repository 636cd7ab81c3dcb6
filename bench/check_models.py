"""Build each model of a suite and run one eager forward at a tiny size on the CPU: a quick check
that every config still constructs under the installed timm and transformers.

    python bench/check_models.py --suite gpu-broad                 # batch 1, 32 tokens
    python bench/check_models.py --models deberta-v3-base,levit_128 --seq 64

Prints one line per model (ok with the output shape and seconds, or the error) and exits 1 if
any model failed; a model whose package is missing is reported as skipped.
"""

import argparse
import sys
import time
import traceback

import _paths  # noqa: F401 - puts the Ember components on sys.path
import models as model_registry
import suites
import torch


def check(name, batch=1, seq=32):
    """(status, detail) for one eager forward of `name` at batch `batch` (text: `seq` tokens)."""
    spec = model_registry.MODELS[name]
    missing = model_registry.missing_requirements(spec)
    if missing:
        return "skipped", "needs " + ", ".join(missing)
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        model = spec.build()
        if isinstance(model, torch.nn.Module):
            model.eval()
        # Audio keeps its own length (whisper's is fixed); text models get `seq` tokens.
        length = spec.seq if "audio" in spec.tags else (seq if spec.seq else 0)
        if "audio" in spec.tags and spec.seq:
            length = 16000  # one second of audio is enough to run the conv stack
        inputs = spec.make_inputs(batch, length, torch.Generator().manual_seed(1))
        with torch.no_grad():
            out = model(*inputs)
        if not isinstance(out, torch.Tensor):
            return "failed", f"returned {type(out).__name__}, not a tensor"
        if not torch.isfinite(out).all():
            return "failed", f"non-finite output of shape {tuple(out.shape)}"
        return "ok", f"{tuple(out.shape)} in {time.perf_counter() - start:.1f} s"
    except Exception as e:  # noqa: BLE001 - every model is checked, failures reported
        traceback.print_exc(file=sys.stderr)
        return "failed", f"{type(e).__name__}: {str(e)[:300]}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="gpu-broad")
    p.add_argument("--models", help="comma-separated names (default: the suite's)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.models.split(",") if args.models else suites.get(args.suite).models
    failed = 0
    for name in names:
        status, detail = check(name, args.batch, args.seq)
        failed += status == "failed"
        family = model_registry.MODELS[name].family or "-"
        print(f"{status:8} {name:32} {family:26} {detail}", flush=True)
    print(f"{len(names) - failed}/{len(names)} ran (or were skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
