"""Which attention kernel each side runs, and how fast: eager, Ember (with and without cuDNN
attention) and torch.compile(mode="reduce-overhead") on one bf16 SDPA per mask kind.

    python bench/attention_probe.py [--batch 8 --heads 16 --length 512 --head-dim 64]

Per side and mask kind: the median of 50 calls timed with CUDA events (after warm-up; Ember and
torch's reduce-overhead both replay CUDA graphs in inference), and the GPU kernels one call ran
(torch.profiler names), with torch's own choice (`_fused_sdp_choice`, cuDNN as set) printed
first. One device call runs it all.
"""

import argparse
import re

import _paths  # noqa: F401 - puts the Ember components on sys.path
import torch
import torch.nn.functional as F
from measure import event_median_ms

MASK_KINDS = ("none", "causal", "float", "sliding_bool")
WINDOW = 128  # the sliding window (Mistral-style), in keys
# kernels worth naming: attention itself and what a mask costs around it
SHOWN = re.compile(r"flash|fmha|attention|sdpa|cudnn|softmax|triton|kernel\d|where|fill|copy",
                   re.I)


def inputs(kind, b, h, n, e):
    """(args, is_causal) of one attention with this mask kind, bf16 on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, e, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))  # fmt: skip
    i = torch.arange(n, device="cuda")
    window = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < WINDOW)
    if kind == "float":  # an additive mask, per batch (a padding + window bias, say)
        mask = torch.zeros(b, 1, n, n, device="cuda", dtype=torch.bfloat16)
        return (q, k, v, mask.masked_fill(~window, float("-inf"))), False
    if kind == "sliding_bool":
        return (q, k, v, window[None, None].expand(b, 1, n, n)), False
    return (q, k, v, None), kind == "causal"


def make_fn(is_causal, masked):
    """A fresh function per side, so no compiled code is shared between them."""
    if masked:
        return lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def compile_side(side, fn):
    if side == "eager":
        return fn
    if side == "torch":
        return torch.compile(fn, mode="reduce-overhead")
    import ember
    from ember.primtorch.config import config

    config.cudnn_attention = side == "ember"  # "ember-nocudnn": flash / memory-efficient
    return ember.compile(fn)


def kernels(call):
    """The names of the GPU kernels one call ran, with their counts."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and SHOWN.search(e.name):
            names[e.name] = names.get(e.name, 0) + 1
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--sides", default="eager,ember,ember-nocudnn,torch")
    parser.add_argument("--kinds", default=",".join(MASK_KINDS))
    opts = parser.parse_args(argv)
    from ember.primtorch.attention import torch_choice

    dims = (opts.batch, opts.heads, opts.length, opts.head_dim)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, (B, H, L, D) = {dims} bf16")  # fmt: skip
    rows = []
    for kind in opts.kinds.split(","):
        (q, k, v, mask), causal = inputs(kind, *dims)
        args = (q, k, v) if mask is None else (q, k, v, mask)
        picks = torch_choice(q, k, v, mask, 0.0, causal, None, False)
        print(f"\n== {kind}: torch's _fused_sdp_choice picks {picks.name}")
        want = make_fn(causal, mask is not None)(*args)
        for side in opts.sides.split(","):
            with torch.no_grad():
                compiled = compile_side(side, make_fn(causal, mask is not None))
                for _ in range(5):  # compile, record and warm the CUDA graphs
                    out = compiled(*args)
                err = (out.float() - want.float()).abs().max().item()
                us = 1000 * event_median_ms(lambda: compiled(*args), opts.replays)
                names = kernels(lambda: compiled(*args))
            rows.append((kind, side, us))
            print(f"  {side:>14}: {us:9.1f} us  max|err| {err:.3g}")
            for name, count in sorted(names.items(), key=lambda kv: -kv[1]):
                print(f"  {'':>14}    {count} x {name[:110]}")
    print("\nmask kind      " + "".join(f"{s:>15}" for s in opts.sides.split(",")))
    for kind in opts.kinds.split(","):
        times = {s: us for k, s, us in rows if k == kind}
        print(f"{kind:<15}" + "".join(f"{times[s]:>13.1f}us" for s in opts.sides.split(",")))


if __name__ == "__main__":
    main()
