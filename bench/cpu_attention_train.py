"""Ember's CPU flash attention forward + backward (a training step's attention) against eager's
(torch's CPU flash kernel and its backward), on the same threads.

    python bench/cpu_attention_train.py --threads 2 [--batch 4 --heads 8 --length 1024
                                                    --head-dim 64 --mask none,causal,float]

Ember's side is `ember.compile` of the attention call; each side runs forward then backward of
(out * grad).sum(). Per dtype and mask kind: the median and best of --repeat steps after
warm-up, in ms, the ratio eager/Ember of the medians (above 1: Ember is faster) and the largest
difference between the gradients.
"""

import argparse
import os
import statistics
import time


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32,bfloat16")
    p.add_argument("--mask", default="none,causal,float")
    p.add_argument("--repeat", type=int, default=7)
    return p.parse_args()


ARGS = _args()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before torch (and libgomp) load

import _paths  # noqa: E402,F401 - puts the Ember components on sys.path
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def step_ms(fn, args, grad, repeat):
    """(median, best) ms of forward + backward."""
    def step():
        for t in args[:3]:
            t.grad = None
        fn(*args).backward(grad)

    step()
    step()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main():
    import ember

    torch.set_num_threads(ARGS.threads)
    b, h, n, e = ARGS.batch, ARGS.heads, ARGS.length, ARGS.head_dim
    print(f"B={b} H={h} L=S={n} E={e} threads={ARGS.threads}", flush=True)
    print(f"{'dtype':9} {'mask':7} {'eager ms':>15} {'ember ms':>15} {'eager/ember':>11} "
          f"{'grad diff':>9}")  # fmt: skip
    for dtype in (getattr(torch, d) for d in ARGS.dtype.split(",")):
        for kind in ARGS.mask.split(","):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(b, h, n, e, generator=g).to(dtype).requires_grad_()
                       for _ in range(3))  # fmt: skip
            m = torch.randn(n, n, generator=g).to(dtype) if kind == "float" else None
            grad = torch.randn(b, h, n, e, generator=g).to(dtype)

            def fn(q, k, v, m):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                      is_causal=kind == "causal")  # fmt: skip

            compiled = ember.compile(fn)
            args = (q, k, v, m)
            compiled(*args).backward(grad)
            got = [t.grad.clone() for t in (q, k, v)]
            for t in (q, k, v):
                t.grad = None
            fn(*args).backward(grad)
            diff = max((a.float() - t.grad.float()).abs().max().item()
                       for a, t in zip(got, (q, k, v)))  # fmt: skip
            eager = step_ms(fn, args, grad, ARGS.repeat)
            ember_ = step_ms(compiled, args, grad, ARGS.repeat)
            print(f"{str(dtype)[6:]:9} {kind:7} {eager[0]:7.1f}/{eager[1]:7.1f} "
                  f"{ember_[0]:7.1f}/{ember_[1]:7.1f} {eager[0] / ember_[0]:11.2f} {diff:9.2e}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
