"""Peak RSS growth over one model's first training step, in a fresh process (run as a script).

`python first_step_peak.py MODE ARCH` prints a JSON line {"first": MiB, "later": MiB}: how far
the process's resident set rose above where it stood before the step (the kernel's peak, VmHWM,
reset through /proc/self/clear_refs), for forward + loss + backward of ARCH run by MODE
("eager" or "ember"), the first step and the next one.

For "ember", the compiler's own code is warmed first by compiling and stepping a tiny unrelated
model (imports, the C++ runtime, first-use allocations of Python objects): that cost is fixed
per process, not per program, and would otherwise be counted as the program's. The cache
directory is a fresh temporary one, so the model itself compiles cold: capture, trace,
partition, lowering and kernel builds all fall inside the measured step.
"""

import gc
import json
import os
import re
import sys
import tempfile

os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-first-step-")
os.environ.setdefault("EMBER_COMPILE_PROGRESS", "0")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _status(field: str) -> float:
    text = open("/proc/self/status").read()
    return int(re.search(field + r":\s+(\d+)", text).group(1)) / 1024


class Block(nn.Module):
    """A pre-norm transformer block: attention through an explicit softmax, a GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.softmax((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class DenseNet(nn.Module):
    """Densely connected convolutions: each layer reads the concatenation of all before it."""

    def __init__(self, c0: int = 16, growth: int = 16, layers: int = 6):
        super().__init__()
        self.stem = nn.Conv2d(3, c0, 3, padding=1)
        self.layers = nn.ModuleList()
        c = c0
        for _ in range(layers):
            self.layers.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(),
                                             nn.Conv2d(c, growth, 3, padding=1)))  # fmt: skip
            c += growth
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.fc(torch.cat(feats, 1).mean((2, 3)))


def make(arch: str):
    """(model, input) of one architecture."""
    torch.manual_seed(0)
    if arch == "transformer":
        return nn.Sequential(Block(256, 4), Block(256, 4)), torch.randn(8, 256, 256)
    return DenseNet(), torch.randn(32, 3, 32, 32)


def _warm_up(x, w, b, img, k):
    """The kinds of ops both models use, at toy sizes, in code of its own (compiling the
    models' own code at other sizes would make their real compile a dynamic-shape one)."""
    h = F.gelu(F.linear(F.layer_norm(x, (8,)), w, b))
    h = F.softmax(h @ h.transpose(-2, -1), dim=-1) @ h
    c = F.conv2d(F.relu(F.batch_norm(img, None, None, training=True)), k, padding=1)
    return h.pow(2).mean() + torch.cat([c, img], 1).mean()


def step(run, x) -> None:
    run(x).float().pow(2).mean().backward()


def peak_of_step(run, x, params) -> float:
    for p in params:
        p.grad = None
    gc.collect()
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    step(run, x)
    return _status("VmHWM") - before


def main(mode: str, arch: str) -> None:
    torch.set_num_threads(1)
    model, x = make(arch)
    params = list(model.parameters())
    run = model
    if mode == "ember":
        import ember

        warm = ember.compile(_warm_up)
    else:
        warm = _warm_up
    toy = [torch.randn(2, 4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(2, 3, 6, 6),
           torch.randn(3, 3, 3, 3)]  # fmt: skip
    warm(*[t.requires_grad_() for t in toy]).backward()  # the code of each mode, warmed
    if mode == "ember":
        run = ember.compile(model)
    first = peak_of_step(run, x, params)
    later = peak_of_step(run, x, params)
    print(json.dumps({"first": round(first), "later": round(later)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
