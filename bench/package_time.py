"""Packaging time against in-process compile time: cold compile, cold package, warm package.

    python bench/package_time.py --repeat 3    # CPU: densenet121_narrow, small_resnet, small_gpt2
    python bench/package_time.py --device cuda densenet121 resnet50 --repeat 3
    python bench/package_time.py --components-from ../main   # the same runs on another checkout

Each measurement runs in a fresh process on its own cache directory, seeded only with the Python
extensions (built once, beforehand, so no run pays for them):
- `compile cold`: `ember.compile(model)` and its first call (after an eager call), empty cache;
  `(build)`: its kernel builds, from the first one started to the last one finished;
- `package cold`: `ember.export` + `ember.cpp_wrapper.package`, empty cache; split into export,
  compile (inductor: lowering and code generation; cubins on CUDA) and build (model.so);
- `package warm`: the same in a second process on the cache the cold package filled.
Each package is loaded and run, and checked against eager. Lines show medians over --repeat runs
(each run its own processes and caches) and, where the build layer counts them
(ember.cpp_wrapper.library_build.counters), the translation units compiled and found cached.
The done-when of issue #29: `package cold` <= `compile cold` (DenseNet-121 on an H200).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
COMPONENTS = ("ir", "primtorch", "aot_autograd", "dynamo", "inductor", "cpp_wrapper")


def densenet(blocks=(6, 12, 24, 16), growth=32, stem=64, classes=1000):
    """DenseNet-BC (torchvision's densenet121 at the defaults): BN-ReLU-conv1x1-BN-ReLU-conv3x3
    layers over the concatenated features, transitions halving channels and resolution."""
    import torch
    from torch import nn

    def bn_relu_conv(cin, cout, k):
        return [nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, k, padding=k // 2,
                                                           bias=False)]  # fmt: skip

    class Layer(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.body = nn.Sequential(*bn_relu_conv(cin, 4 * growth, 1),
                                      *bn_relu_conv(4 * growth, growth, 3))  # fmt: skip

        def forward(self, features):
            return self.body(torch.cat(features, 1))

    class Block(nn.Module):
        def __init__(self, cin, n):
            super().__init__()
            self.layers = nn.ModuleList(Layer(cin + i * growth) for i in range(n))

        def forward(self, x):
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            return torch.cat(features, 1)

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            mods, c = [nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem), nn.ReLU(),
                       nn.MaxPool2d(3, 2, 1)], stem  # fmt: skip
            for i, n in enumerate(blocks):
                mods.append(Block(c, n))
                c += n * growth
                if i + 1 < len(blocks):
                    mods += [*bn_relu_conv(c, c // 2, 1), nn.AvgPool2d(2)]
                    c //= 2
            self.features = nn.Sequential(*mods, nn.BatchNorm2d(c), nn.ReLU())
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            return self.fc(self.features(x).mean((2, 3)))

    return DenseNet()


# name -> (build, input shape); densenet121_narrow has DenseNet-121's layers (so its kernels and
# steps) at an eighth of its widths and a 64x64 image, for a CPU.
OWN = {
    "densenet121": (lambda: densenet(), (2, 3, 224, 224)),
    "densenet121_narrow": (lambda: densenet(growth=8, stem=16, classes=10), (2, 3, 64, 64)),
}


def _model(name: str, device: str):
    import torch

    torch.manual_seed(0)
    if name in OWN:
        build, shape = OWN[name]
        model, inputs = build(), (torch.randn(*shape),)
    else:
        from models import MODELS

        spec = MODELS[name]
        model = spec.build()
        inputs = spec.make_inputs(spec.batch, spec.seq, torch.Generator().manual_seed(0))
    for m in model.modules():  # eval BatchNorm with statistics of its own
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval().to(device), tuple(t.to(device) for t in inputs)


def _child(args) -> dict:
    """One measurement in this process (the components on sys.path already)."""
    import torch

    import importlib

    import ember
    import ember.cpp_wrapper as cw

    # the modules (ember.cpp_wrapper's `package` attribute is the function)
    cw_package = importlib.import_module("ember.cpp_wrapper.package")
    cw_exported = importlib.import_module("ember.cpp_wrapper.exported")

    try:
        from ember.cpp_wrapper.library_build import counters
    except ImportError:  # a checkout from before per-unit builds
        counters = None
    torch.set_num_threads(args.threads) if args.threads else None
    model, inputs = _model(args.model, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    with torch.no_grad():
        want = model(*inputs)
        sync()
        out = {}
        if args.phase == "compile":
            from ember.inductor import runtime

            span = []  # the in-process kernel builds: from the first start to the last finish
            start_builds, finish_builds = runtime.Builds.start, runtime.Builds.finish

            def started(self):
                if not span:
                    span.append(time.perf_counter())
                return start_builds(self)

            def finished(self):
                try:
                    return finish_builds(self)
                finally:
                    span[1:] = [time.perf_counter()]

            runtime.Builds.start, runtime.Builds.finish = started, finished
            start = time.perf_counter()
            got = ember.compile(model)(*inputs)
            sync()
            out["total"] = time.perf_counter() - start
            out["build"] = span[-1] - span[0] if len(span) == 2 else None
        else:
            spans = {"compile": 0.0, "build": 0.0, "cubins": 0.0}

            def timed(fn, what):
                def wrapper(*a, **k):
                    start = time.perf_counter()
                    try:
                        return fn(*a, **k)
                    finally:
                        spans[what] += time.perf_counter() - start
                return wrapper

            cw_package.compile_exported = timed(cw_exported.compile_exported, "compile")
            cw_package.build_model_library = timed(cw_package.build_model_library, "build")
            aot = importlib.import_module("ember.inductor.triton_aot")
            aot.attach_cubins = timed(aot.attach_cubins, "cubins")  # within compile
            start = time.perf_counter()
            ep = ember.export(model, inputs)
            out["export"] = time.perf_counter() - start
            path = cw.package(ep, Path(tempfile.mkdtemp()) / "pkg", device=args.device)
            out["total"] = time.perf_counter() - start
            out.update(spans)
            if counters is not None:
                out["units"] = {"compiled": counters.compiled, "cached": counters.cached}
            got = cw.load_package(path)(*inputs)[0]
            sync()
        try:
            from ember.ir.progress import stage_totals
        except ImportError:  # --components-from a checkout from before compile stages
            stage_totals = dict
        out["stages"] = {k: round(v, 2) for k, v in stage_totals().items() if v >= 0.2}
        got = got[0] if isinstance(got, (list, tuple)) else got
        want = want[0] if isinstance(want, (list, tuple)) else want
        out["max_abs_diff"] = float((got.float() - want.float()).abs().max())
    return out


def _run(args, model: str, phase: str, cache: Path) -> dict:
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache), "EMBER_COMPILE_PROGRESS": "0"}
    cmd = [sys.executable, __file__, "--child", phase, "--device", args.device,
           "--threads", str(args.threads), "--components-from", str(args.components_from), model]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dlpack_include(root: Path) -> str:
    """A fixed directory with dlpack/dlpack.h: the runtime extension's build flags name it, so
    with the default (a directory in the cache) every fresh cache would rebuild the extension."""
    import torch

    base = Path(torch.__file__).resolve().parent / "include"
    header = next(p for p in (base / "dlpack" / "dlpack.h", base / "ATen" / "dlpack.h")
                  if p.exists())  # fmt: skip
    (root / "include" / "dlpack").mkdir(parents=True)
    shutil.copy(header, root / "include" / "dlpack" / "dlpack.h")
    return str(root / "include")


def _seed(args, root: Path) -> Path:
    """A cache holding only the Python extensions (built once, with the same compiler)."""
    seed = root / "seed"
    os.environ["EMBER_DLPACK_INCLUDE"] = _dlpack_include(root)  # for the runs too
    env = {**os.environ, "EMBER_CACHE_DIR": str(seed),
           "PYTHONPATH": os.pathsep.join(str(Path(args.components_from) / c) for c in COMPONENTS)}
    subprocess.run([sys.executable, "-m", "ember.ir.toolchain", "build"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return seed


def _fmt(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):7.1f}" if values else "      -"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["densenet121_narrow", "small_resnet",
                                                  "small_gpt2"])  # fmt: skip
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads in each run (0: default)")
    ap.add_argument("--components-from", default=str(BENCH.parent),
                    help="the checkout whose components run (compare before and after)")
    ap.add_argument("--child", choices=("compile", "package"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help="write the results as JSON here too")
    ap.add_argument("--stages", action="store_true",
                    help="also print the seconds of each compile stage (ember.ir.progress)")
    args = ap.parse_args(argv)
    root_components = [str(Path(args.components_from) / c) for c in COMPONENTS]
    sys.path[:0] = [*root_components, str(BENCH)]
    if args.child:
        args.model, args.phase = args.models[0], args.child
        print(json.dumps(_child(args)))
        return 0
    results = {}
    with tempfile.TemporaryDirectory(prefix="ember-package-time-") as tmp:
        seed = _seed(args, Path(tmp))
        print(f"device {args.device}, components from {args.components_from}, medians of "
              f"{args.repeat} (seconds)")  # fmt: skip
        print(f"{'model':22} {'compile':>7} {'(build)':>7} {'package':>7} {'export':>7} "
              f"{'inductor':>8} {'build':>7} {'warm':>7}  units cold/warm (compiled+cached)  "
              "max|diff|")  # fmt: skip
        for model in args.models:
            runs = []
            for i in range(args.repeat):
                caches = [Path(tmp) / f"{model}-{i}-{p}" for p in ("compile", "package")]
                for c in caches:
                    shutil.copytree(seed, c)
                runs.append({"compile": _run(args, model, "compile", caches[0]),
                             "cold": _run(args, model, "package", caches[1]),
                             "warm": _run(args, model, "package", caches[1])})  # fmt: skip
                for c in caches:
                    shutil.rmtree(c, ignore_errors=True)
            results[model] = runs
            errors = [r[p]["error"] for r in runs for p in r if "error" in r[p]]
            if errors:
                print(f"{model:22} failed: {errors[0]}")
                continue

            def col(phase, field):
                return _fmt([r[phase].get(field) for r in runs])

            def units(phase):
                u = runs[-1][phase].get("units")
                return f"{u['compiled']}+{u['cached']}" if u else "-"

            diff = max(r[p]["max_abs_diff"] for r in runs for p in r)
            print(f"{model:22} {col('compile', 'total')} {col('compile', 'build')} "
                  f"{col('cold', 'total')} "
                  f"{col('cold', 'export')} {col('cold', 'compile'):>8} {col('cold', 'build')} "
                  f"{col('warm', 'total')}  {units('cold'):>8} / {units('warm'):<8}"
                  f"{'':17}{diff:.1e}", flush=True)  # fmt: skip
            if args.stages:  # where the seconds went, the last run's, stages of >= 0.2 s
                for phase in ("compile", "cold"):
                    extra = {k: runs[-1][phase][k] for k in ("cubins",) if k in runs[-1][phase]}
                    stages = runs[-1][phase].get("stages", {})
                    print(f"  {phase}: {json.dumps({**extra, **stages})}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
