"""Ember's generated CPU flash attention against torch's own CPU SDPA (its flash kernel), one
scaled_dot_product_attention call at a time, on the same threads.

    python bench/cpu_attention.py --threads 16 [--batch 1 --heads 16 --length 4096 --head-dim 128
                              --dtype float32,bfloat16 --mask none,causal,float,padding,full]

Both sides get the thread count (OMP_NUM_THREADS, set before torch loads, and
torch.set_num_threads). Ember's side is the traced call compiled by ember.inductor.compile_prims
(the kernel the Python wrapper calls, as compiled programs and packages run it). Per dtype and
mask kind: the best of --repeat calls after warm-up (the least disturbed by other work), in ms,
TFLOP/s (4*B*H*L*S*E flops, half that with a causal mask), the ratio eager/Ember (above 1:
Ember is faster), and the largest difference between the two outputs.
"""

import argparse
import os
import sys
import time


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="float32,bfloat16")
    p.add_argument("--mask", default="none,causal,float")
    p.add_argument("--repeat", type=int, default=10)
    return p.parse_args()


ARGS = _args()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before torch (and libgomp) load

import _paths  # noqa: E402,F401 - puts the Ember components on sys.path
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def best_ms(fn, repeat):
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def case(dtype, mask_kind):
    """(eager function, its arguments) of one attention call."""
    b, h, n, e = ARGS.batch, ARGS.heads, ARGS.length, ARGS.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, e, generator=g).to(dtype) for _ in range(3))
    if mask_kind == "causal":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)
    if mask_kind in ("float", "padding", "full"):  # additive: (L, S), (B, 1, 1, S), (B, H, L, S)
        shape = dict(float=(n, n), padding=(b, 1, 1, n), full=(b, h, n, n))[mask_kind]
        m = torch.randn(shape, generator=g).to(dtype)

        def masked(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

        return masked, (q, k, v, m)
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v)), (q, k, v)


def main():
    from ember.inductor import compile_prims
    from ember.primtorch.trace import trace_to_prims

    torch.set_num_threads(ARGS.threads)
    b, h, n, e = ARGS.batch, ARGS.heads, ARGS.length, ARGS.head_dim
    print(f"B={b} H={h} L=S={n} E={e} threads={ARGS.threads} "
          f"(torch sees {torch.get_num_threads()})", flush=True)  # fmt: skip
    print(f"{'dtype':9} {'mask':7} {'eager ms':>9} {'ember ms':>9} {'eager TF/s':>10} "
          f"{'ember TF/s':>10} {'eager/ember':>11} {'max diff':>9}")  # fmt: skip
    for dtype in (getattr(torch, d) for d in ARGS.dtype.split(",")):
        for mask_kind in ARGS.mask.split(","):
            fn, args = case(dtype, mask_kind)
            with torch.no_grad():
                compiled = compile_prims(trace_to_prims(fn, *args), list(args))
                kernels = [k.name for k in compiled.artifact.kernels]
                if not any(k.startswith("flash_attention_") for k in kernels):
                    print(f"{mask_kind}: Ember did not generate its kernel ({kernels})",
                          file=sys.stderr)  # fmt: skip
                ember_out = compiled(*args)
                ember_out = ember_out[0] if isinstance(ember_out, (tuple, list)) else ember_out
                diff = (ember_out.float() - fn(*args).float()).abs().max().item()
                eager_ms = best_ms(lambda: fn(*args), ARGS.repeat)
                ember_ms = best_ms(lambda: compiled(*args), ARGS.repeat)
            flops = 4 * b * h * n * n * e / (2 if mask_kind == "causal" else 1)
            print(f"{str(dtype)[6:]:9} {mask_kind:7} {eager_ms:9.2f} {ember_ms:9.2f} "
                  f"{flops / eager_ms / 1e9:10.3f} {flops / ember_ms / 1e9:10.3f} "
                  f"{eager_ms / ember_ms:11.2f} {diff:9.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
