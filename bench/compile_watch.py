"""Which generated Triton kernels take long to compile: runs a GPT-2 training step under Ember
(transformers config, random weights, bf16 autocast, dropout as configured) and writes the source
and configs of every kernel whose ahead-of-launch compile passes `--slow` seconds, while it is
still compiling (so a compile that never ends is caught too).

    python bench/compile_watch.py --out $OUT/watch
"""

import argparse
import threading
import time
from pathlib import Path

import _paths  # noqa: F401 - puts the Ember components on sys.path


def main():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import ember
    from ember.inductor import runtime

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/compile_watch")
    p.add_argument("--slow", type=float, default=20.0)
    p.add_argument("--layers", type=int, default=12)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    running = {}  # name -> (start, launcher)
    lock = threading.Lock()
    original = runtime.TritonLauncher.precompile

    def watched(self, dtypes):
        key = f"{self.fn_name}-{id(self)}"
        with lock:
            running[key] = (time.time(), self)
        try:
            return original(self, dtypes)
        finally:
            with lock:
                start, _ = running.pop(key)
            took = time.time() - start
            if took > args.slow:
                print(f"slow compile {key}: {took:.1f} s", flush=True)

    def watch():
        written = set()
        while True:
            time.sleep(2)
            now = time.time()
            with lock:
                items = list(running.items())
            for key, (start, launcher) in items:
                if now - start > args.slow and key not in written:
                    written.add(key)
                    (out / f"{key}.py").write_text(
                        f"# configs {launcher.configs}\n# sizes {launcher.sizes}\n"
                        + launcher.source)
                    print(f"still compiling after {args.slow} s: {key}", flush=True)

    runtime.TritonLauncher.precompile = watched
    threading.Thread(target=watch, daemon=True).start()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers)).cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    fn = ember.compile(model)
    for step in range(2):
        start = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
        print(f"step {step}: {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
