"""Device probe for #29: Ember's Triton flash-attention template on decode shapes against torch.

Times (CUDA events, median of many calls) the template launched directly through Triton for
decode shapes (B=1, H=32, H_kv=8, E=64/128, L in {1, 4, 16}, S in {256, 1024, 4096}, bf16, an
additive mask or none) and one prefill shape (L=S=1024, causal), against
F.scaled_dot_product_attention (cuDNN/flash), and checks each output against torch's (max abs
error). Variants: new = the template with the static-L config; dyn = the dynamic-L kernel (as
a package with dynamic lengths builds it). Any variant that fails prints its error instead of a
time. (Session 22, call 3, also timed the template before #29 and the kernels compiled with no
divisibility specialisation, as packages then were: bench/RESULTS.md.)

    python bench/flash_decode_probe.py            # under a minute on an H200
"""

import argparse
import sys
import time

import _paths  # noqa: F401  (puts the components on sys.path)
import torch
import torch.nn.functional as F
import triton

from ember.inductor import triton_attention
from measure import event_median_ms

def variant(kind, q, k, v, mask, causal):
    """A zero-argument callable running one variant."""
    return lambda: triton_attention.run(q, k, v, mask, causal, dynamic=kind == "dyn")


def kernel_us(fn, reps):
    """The kernel alone: time a CUDA graph of `fn` replayed (launch overhead of Python gone)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1000 * event_median_ms(g.replay, reps, warm=3)


def inputs(b, h, hkv, length, source, e, masked, causal=False):
    gen = torch.Generator(device="cuda").manual_seed(length * 7 + source)
    q = torch.randn(b, h, length, e, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, source, e, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, source, e, device="cuda", dtype=torch.bfloat16, generator=gen)
    mask = None
    if masked:  # a decode step's mask: keys up to each query's position, additive
        pos = torch.arange(source - length, source, device="cuda")
        keep = torch.arange(source, device="cuda")[None, :] <= pos[:, None]
        mask = torch.zeros(1, 1, length, source, device="cuda", dtype=torch.bfloat16)
        mask.masked_fill_(~keep, float("-inf"))
    return q, k, v, mask


def row(shape, kinds, reps):
    b, h, hkv, length, source, e, masked, causal = shape
    q, k, v, mask = inputs(b, h, hkv, length, source, e, masked, causal)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=True)  # fmt: skip

    def eager():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=True)  # fmt: skip

    cells = [f"{kernel_us(eager, reps):7.1f}"]
    errs = []
    for kind in kinds:
        try:
            fn = variant(kind, q, k, v, mask, causal)
            got = fn()
            torch.cuda.synchronize()
            errs.append((got.float() - want.float()).abs().max().item())
            cells.append(f"{kernel_us(fn, reps):7.1f}")
        except Exception as exc:  # one variant failing must not stop the probe
            cells.append(f"{'ERR':>7}")
            errs.append(float("nan"))
            print(f"  {kind} {shape}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[-1][:200] if str(exc) else ''}", file=sys.stderr)
    what = "mask" if masked else "causal" if causal else "-"
    tag = f"E={e:<3} L={length:<4} S={source:<5} {what:6}"
    print(f"{tag} {' '.join(cells)}  err {max(errs):.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    start = time.time()
    kinds = ["new", "dyn"]
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    print("B=1 H=32 H_kv=8 bf16; kernel time in us (CUDA graph replay, median of "
          f"{args.reps}); err: the worst variant's max abs error against torch")
    head = ["torch", *kinds]
    print(f"{'shape':33} {' '.join(f'{c:>7}' for c in head)}")
    shapes = [(1, 32, 8, length, source, e, masked, False)
              for e, masks in ((64, (True, False)), (128, (True,)))
              for masked in masks for length in (1, 4, 16) for source in (256, 1024, 4096)]
    shapes.append((1, 32, 8, 1024, 1024, 64, False, True))  # prefill
    for shape in shapes:
        row(shape, kinds, args.reps)
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
