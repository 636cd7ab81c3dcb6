"""The C++ wrapper's device check (issue 8): packages of resnet50 and gpt2 against eager, and the
latency of an 8-layer MLP at batch 1 through every way of running it.

    python bench/cpp_wrapper_device.py --out DIR                       (CUDA: the real models)
    python bench/cpp_wrapper_device.py --out DIR --device cpu --small  (CPU smoke run, small models)

(a) timm resnet50 (batch 8, fp32) and HF gpt2 (random weights, 1 x 128 tokens, logits only) are
    exported with ember.export, packaged for the device (convolutions become im2col kernels +
    cuBLAS matmuls on CUDA), run in process (load_package) and by the standalone run_package, and
    compared with eager: max abs error, max error relative to the largest |eager| value, pass when
    that relative error is below TOLERANCE (fp32 on both sides, no TF32).
(b) 8 x (Linear(256, 256) + ReLU) at batch 1: per-call latency of eager, torch.compile,
    ember.compile, ember.compile(options={"cpp_wrapper": True}) and the package under
    `run_package --bench`, each the median over rounds of back-to-back calls synchronised per round
    (measure.py).
gpt2 is built with eager attention (matmul + softmax): the C++ runtime has no SDPA extern yet.
Writes results.md and results.json into --out and prints them. Without CUDA (and without
--device cpu) it writes a skip note instead.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import _paths  # noqa: F401
import numpy as np
import torch
import torch.nn as nn
from measure import Timing, time_steady, warm_up

import ember
from ember.cpp_wrapper import config as cppw_config
from ember.cpp_wrapper import install_run_package, load_package, package
from ember.cpp_wrapper.model import _cublas_path

TOLERANCE = 1e-3  # max |package - eager| / max |eager|, fp32
MLP_TIMING = Timing(warmup=50, iters=20, loop_calls=200)


# --- models ---------------------------------------------------------------------------------------


class LogitsOnly(nn.Module):
    """A causal LM called on input ids, returning only its logits (no cache, no dict)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids, use_cache=False, return_dict=False)[0]


class TinyResNet(nn.Module):
    """resnet50's pieces at toy size (stem, max pool, bottleneck with downsample, pool, fc)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))  # fmt: skip
        self.body = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.Conv2d(8, 32, 1, bias=False),
                                  nn.BatchNorm2d(32))  # fmt: skip
        self.down = nn.Sequential(nn.Conv2d(8, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.body(x) + self.down(x))
        return self.fc(x.mean((2, 3)))


class TinyDecoder(nn.Module):
    """gpt2's pieces at toy size (for CPU runs without transformers): embeddings, causal
    attention written with matmuls, GELU MLP, layer norms, tied head."""

    def __init__(self, vocab=100, dim=32, heads=4, layers=2, positions=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.heads = heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim),
                           "proj": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim),
                           "fc": nn.Linear(dim, 4 * dim), "out": nn.Linear(4 * dim, dim)})
            for _ in range(layers)
        )  # fmt: skip
        self.ln = nn.LayerNorm(dim)

    def forward(self, ids):
        b, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        for blk in self.blocks:
            qkv = blk["qkv"](blk["ln1"](x)).view(b, t, 3, self.heads, -1)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + blk["proj"]((att @ v).transpose(1, 2).reshape(b, t, -1))
            h = torch.nn.functional.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh")
            x = x + blk["out"](h)
        return self.ln(x) @ self.wte.weight.t()


def resnet(small):
    if small:
        return "tiny-resnet", TinyResNet(), torch.randn(2, 3, 32, 32)
    import timm

    return "resnet50", timm.create_model("resnet50", pretrained=False), torch.randn(8, 3, 224, 224)


def gpt2(small):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        if not small:
            raise
        return "tiny-decoder (no transformers)", TinyDecoder(), torch.randint(0, 100, (1, 16))
    # Eager attention (matmul + softmax): the C++ runtime has no SDPA extern yet.
    kw = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0,
              eos_token_id=0) if small else {}  # fmt: skip
    cfg = GPT2Config(**kw)
    cfg._attn_implementation = "eager"
    name = "gpt2-tiny" if small else "gpt2"
    tokens = 16 if small else 128
    return name, LogitsOnly(GPT2LMHeadModel(cfg)), torch.randint(0, cfg.vocab_size, (1, tokens))


def mlp():
    layers = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(1, 256)


# --- (a) packages against eager -----------------------------------------------------------------


def compare(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    abs_err = (got - want).abs().max().item()
    rel = abs_err / max(want.abs().max().item(), 1e-30)
    return {"max_abs": abs_err, "max_rel": rel, "pass": bool(rel < TOLERANCE)}


def run_standalone(exe, path, x, work, *extra):
    np.save(work / "in.npy", x.cpu().numpy())
    env = dict(os.environ)
    cublas = _cublas_path(x.device)
    if cublas:
        env.setdefault("EMBER_CUBLAS_PATH", cublas)
    cmd = [str(exe), *map(str, extra), str(path), str(work / "in.npy"), str(work / "out.npy")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"run_package exited {r.returncode}: {r.stderr.strip()}")
    return torch.from_numpy(np.load(work / "out.npy")), r.stdout


def check_model(make, small, device, exe, work):
    row = {}
    t0 = time.perf_counter()
    try:
        name, model, x = make(small)
        row["model"] = name
        torch.manual_seed(0)
        model = model.eval().to(device)
        x = x.to(device)
        with torch.no_grad():
            want = model(x)
            exported = ember.export(model, (x,))
            path = package(exported, work / f"{name.split()[0]}.pkg", device=device)
            row["in_process"] = compare(load_package(path)(x)[0], want)
        row["standalone"] = compare(run_standalone(exe, path, x, work)[0], want)
    except Exception as e:  # noqa: BLE001  (report every model, whichever one fails)
        row["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# --- (b) MLP latency ----------------------------------------------------------------------------


def mlp_latency(device, exe, work):
    model, x = mlp()
    model, x = model.eval().to(device), x.to(device)
    ms = {}
    backends = {
        "eager": lambda: model,
        "torch.compile (default)": lambda: torch.compile(model),
        "ember.compile (default)": lambda: ember.compile(model),
        "ember.compile cpp_wrapper": lambda: ember.compile(model, options={"cpp_wrapper": True}),
    }
    with torch.no_grad():
        for label, build in backends.items():
            try:
                fn = build()
                fn(x)
                warm_up(lambda: fn(x), device, MLP_TIMING.warmup)
                ms[label] = time_steady(lambda: fn(x), device, MLP_TIMING)[0]
            except Exception as e:  # noqa: BLE001
                ms[label] = f"{type(e).__name__}: {e}"
        try:
            path = package(ember.export(model, (x,)), work / "mlp.pkg", device=device)
            calls, rounds = MLP_TIMING.loop_calls, MLP_TIMING.iters
            _, out = run_standalone(exe, path, x, work, "--bench", calls, "--rounds", rounds)
            fields = dict(f.split("=") for f in out.split("bench", 1)[1].split())
            ms["run_package --bench (rounds)"] = float(fields["loop_median_ms"])
            ms["run_package --bench (each call synchronised)"] = float(fields["sync_median_ms"])
        except Exception as e:  # noqa: BLE001
            ms["run_package --bench (rounds)"] = f"{type(e).__name__}: {e}"
    return ms


# --- report ---------------------------------------------------------------------------------------


def _fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def markdown(res):
    lines = [f"# cpp_wrapper device check ({res['device_name']})", "",
             f"torch {res['torch']}; tolerance: max |package - eager| / max |eager| < {TOLERANCE}",
             "", "| model | run | max abs err | max rel err | pass | seconds |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in res["models"]:
        if "error" in row:
            lines.append(f"| {row.get('model', '?')} | - | - | - | FAIL: {row['error']} | "
                         f"{row['seconds']} |")  # fmt: skip
        for run in ("in_process", "standalone"):
            if run in row:
                c = row[run]
                verdict = "pass" if c["pass"] else "FAIL"
                lines.append(f"| {row['model']} | {run} | {c['max_abs']:.3g} | "
                             f"{c['max_rel']:.3g} | {verdict} | {row['seconds']} |")  # fmt: skip
    lines += ["", "8-layer MLP (256 wide), batch 1, fp32: ms per call, " + MLP_TIMING.describe(
        res["device"]), "", "| backend | ms/call |", "|---|---|"]  # fmt: skip
    lines += [f"| {k} | {_fmt(v)} |" for k, v in res["mlp_ms"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--small", action="store_true", help="small stand-in models (CPU smoke run)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        msg = "skip: no CUDA device here; run on the GPU host, or --device cpu --small on CPU"
        (args.out / "results.md").write_text(msg + "\n")
        (args.out / "results.json").write_text(json.dumps({"skipped": msg}) + "\n")
        print(msg)
        return 0
    if args.small:  # exercise what CUDA packages do with convolutions on the CPU runtime too
        cppw_config.conv_as_matmul = True
    work = Path(tempfile.mkdtemp(prefix="cppw-device-"))
    exe = install_run_package(work / "bin")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    res = {"device": args.device, "device_name": name, "torch": torch.__version__}
    res["models"] = [check_model(m, args.small, args.device, exe, work) for m in (resnet, gpt2)]
    res["mlp_ms"] = mlp_latency(args.device, exe, work)
    md = markdown(res)
    (args.out / "results.md").write_text(md)
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(md)
    ok = all("error" not in r and r["in_process"]["pass"] and r["standalone"]["pass"]
             for r in res["models"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
