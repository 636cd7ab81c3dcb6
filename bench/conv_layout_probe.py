"""cuDNN time of one convolution in channels-last (NHWC) over contiguous (NCHW), by conv class.

Ember runs every 2-D convolution of a CUDA inference graph in NHWC (config.conv_channels_last
"auto"). Grouped convolutions with several channels per group (ResNeXt, RegNet) may be slower
in NHWC; this measures it on the device at hand, per class (bf16, batch 32):
    python bench/conv_layout_probe.py [--dtype bfloat16] [--replays 50]
A ratio above 1 means NHWC is slower for that class. Whole families: compare
`EMBER_CONV_CHANNELS_LAST=0 python bench/family_probe.py --only resnext` with the default run.
"""

from __future__ import annotations

import argparse
import statistics

import torch

# (class, in channels, out channels, kernel, groups, H=W): shapes from the families' real layers
CASES = [
    ("default 3x3", 64, 64, 3, 1, 56),
    ("default 1x1", 256, 64, 1, 1, 56),
    ("in>out 1x1", 512, 128, 1, 1, 28),
    ("small channels", 32, 32, 3, 1, 112),
    ("grouped resnext 32x4d", 128, 128, 3, 32, 56),
    ("grouped resnext 32x8d", 256, 256, 3, 32, 56),
    ("grouped regnet gw8", 64, 64, 3, 8, 56),
    ("grouped regnet gw24", 240, 240, 3, 10, 28),
    ("depthwise 3x3", 144, 144, 3, 144, 56),
    ("depthwise 7x7 convnext", 96, 96, 7, 96, 56),
]


def time_conv(x, w, groups, replays) -> float:
    pad = w.shape[-1] // 2
    for _ in range(5):
        torch.nn.functional.conv2d(x, w, None, 1, pad, 1, groups)
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.nn.functional.conv2d(x, w, None, 1, pad, 1, groups)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--replays", type=int, default=50)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()} {args.dtype} batch {args.batch}")
    for name, cin, cout, k, groups, hw in CASES:
        x = torch.randn(args.batch, cin, hw, hw, device="cuda", dtype=dtype)
        w = torch.randn(cout, cin // groups, k, k, device="cuda", dtype=dtype)
        nchw = time_conv(x, w, groups, args.replays)
        cl = torch.channels_last
        nhwc = time_conv(x.to(memory_format=cl), w.to(memory_format=cl), groups, args.replays)
        print(f"{name:26s} NCHW {nchw:.3f}ms NHWC {nhwc:.3f}ms NHWC/NCHW {nhwc / nchw:.2f}")


if __name__ == "__main__":
    main()
