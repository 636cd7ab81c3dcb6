"""Hand-written attention layers compiled with Ember's attention rewrite on and off, against eager
and torch.compile, on one device in one process.

    python bench/attention_rewrite.py [--device cuda --dtype bfloat16 --batch 8 --length 512
                                       --width 1024 --heads 16 --threads N]

Two layers spell attention out (ember.inductor.attention_rewrite folds both into one
scaled_dot_product_attention call): an MPT-style one (pre-transposed keys, a scale, an ALiBi
bias, masked_fill with the dtype's minimum, an upcast softmax) and a BLOOM-style one (baddbmm
over batch x heads with the bias as its input, a four-dimensional view for the mask, softmax in
float32, bmm). Inference under torch.no_grad (bf16/fp16: autocast). On CUDA the opponent is
torch.compile(mode="reduce-overhead"), as Ember replays CUDA graphs; on the CPU, its default
mode. Per layer: median ms a call (CUDA events, or the host clock on the CPU) and the largest
difference of each output from eager's in float64.
"""

import argparse
import math
import os
import statistics
import time


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    return p.parse_args()


ARGS = _args()
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))

import _paths  # noqa: E402,F401 - puts the Ember components on sys.path
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.inductor import config  # noqa: E402


class Mpt(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x, bias, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, -1).transpose(1, 2)
        k = k.view(b, t, self.heads, -1).permute(0, 2, 3, 1)
        v = v.view(b, t, self.heads, -1).transpose(1, 2)
        w = q.matmul(k) * (1 / math.sqrt(d // self.heads)) + bias
        w = w.masked_fill(mask, torch.finfo(w.dtype).min)
        w = torch.softmax(w.float(), dim=-1).to(v.dtype)
        return self.out(torch.matmul(w, v).transpose(1, 2).reshape(b, t, d))


class Bloom(Mpt):
    def forward(self, x, alibi, mask):
        b, t, d = x.shape
        h, hd = self.heads, d // self.heads
        q, k, v = self.qkv(x).view(b, t, h, 3, hd).unbind(3)
        q = q.transpose(1, 2).reshape(b * h, t, hd)
        k = k.permute(0, 2, 3, 1).reshape(b * h, hd, t)
        v = v.transpose(1, 2).reshape(b * h, t, hd)
        w = alibi.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=1 / math.sqrt(hd))
        w = torch.masked_fill(w.view(b, h, t, -1), mask, torch.finfo(w.dtype).min)
        p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        ctx = torch.bmm(p.view(b * h, t, -1), v).view(b, h, t, hd)
        return self.out(ctx.permute(0, 2, 1, 3).reshape(b, t, d))


def inputs(kind, device):
    g = torch.Generator().manual_seed(0)
    b, t, d, h = ARGS.batch, ARGS.length, ARGS.width, ARGS.heads
    x = torch.randn(b, t, d, generator=g)
    bias = torch.randn(1, h, 1, t, generator=g) if kind == "mpt" else torch.randn(
        b * h, 1, t, generator=g)  # fmt: skip
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return tuple(a.to(device) for a in (x, bias, mask))


def main():
    torch.set_num_threads(ARGS.threads)
    device, dtype = torch.device(ARGS.device), getattr(torch, ARGS.dtype)
    amp = dtype != torch.float32
    opponent = "reduce-overhead" if device.type == "cuda" else "default"
    gpu = torch.cuda.get_device_name() + ", " if device.type == "cuda" else ""
    print(f"device {ARGS.device} ({gpu}{os.cpu_count()} cpus, {ARGS.threads} threads), "
          f"{ARGS.dtype}, batch {ARGS.batch}, "
          f"length {ARGS.length}, width {ARGS.width}, heads {ARGS.heads}; "
          f"torch.compile mode={opponent}")  # fmt: skip
    for kind, cls in (("mpt", Mpt), ("bloom", Bloom)):
        torch.manual_seed(0)
        model = cls(ARGS.width, ARGS.heads).to(device).eval()
        args = inputs(kind, device)
        with torch.no_grad():
            ref = cls(ARGS.width, ARGS.heads).double().to(device)
            ref.load_state_dict(model.state_dict())
            expected = ref(args[0].double(), args[1].double(), args[2])
        runs = [("eager", lambda: model)]
        for on in (False, True):
            runs.append((f"ember rewrite={'on' if on else 'off'}", _ember(model, on)))
        if not ARGS.no_torch:
            runs.append((f"torch.compile {opponent}",
                         lambda: torch.compile(model, mode=opponent)))  # fmt: skip
        for name, make in runs:
            fn = make()

            def call():
                with torch.no_grad(), torch.autocast(device.type, dtype, enabled=amp):
                    return fn(*args)

            err = (call().double() - expected).abs().max().item()
            ms = _median_ms(call, device)
            print(f"  {kind:6s} {name:28s} {ms:9.3f} ms   max |err| vs float64 {err:.2e}")


def _median_ms(call, device):
    for _ in range(3):  # warm: compile, build, record the CUDA graph
        call()
    times = []
    for _ in range(ARGS.calls):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _ember(model, on):
    def make():
        config.attention_rewrite = on
        ember.reset()
        return ember.compile(model)

    return make


if __name__ == "__main__":
    main()
