"""The benchmark suites: which models, modes, backends, devices and timings each one runs.

`SUITES[name]` is a `Suite`; the first of its modes is the default. `parts` says into how many
`--part i/n` pieces each mode splits so that one piece finishes in under 9 minutes on an H100
(compile times included); README.md lists the resulting commands.
"""

from dataclasses import dataclass, field

import models_broad
from measure import Timing

GPU_CORE = (
    "resnet50",
    "vit_base_patch16_224",
    "bert-base-uncased",
    "gpt2",
    "mobilenetv3_large_100",
    "efficientnet_b0",
    "convnext_tiny",
    "swin_tiny_patch4_window7_224",
    "deit_small_patch16_224",
    "regnety_016",
    "mobilevit_s",
    "efficientformer_l1",
    "distilbert-base-uncased",
    "roberta-base",
    "t5-small",
    "bart-base",
    "llama-4l-1024",
    "albert-base-v2",
    "electra-small",
)
SMALL = ("small_resnet", "small_vit", "small_bert", "small_gpt2")
CPU_CORE = SMALL + (
    "hf_bert",
    "hf_gpt2",
    "hf_distilbert",
    "hf_t5",
    "hf_bart",
    "hf_llama",
    "resnet18",
    "mobilenetv3_small_050",
    "deit_tiny",
)
# gpu-core's 19 models, then the held-out ones (models_broad.py); parts take every n-th model,
# so vision and text models spread over the parts.
GPU_BROAD = (
    GPU_CORE
    + tuple(name for name, *_ in models_broad.TIMM)
    + tuple(models_broad.HF)
    + ("wav2vec2-base", "whisper-base-encoder")
)
ROOFLINE = ("pointwise_x2_plus_y", "row_sum", "softmax", "layer_norm")


@dataclass(frozen=True)
class Suite:
    """One suite: its models, modes (first = default), default backends, device and timing."""

    name: str
    models: tuple
    modes: tuple
    backends: tuple
    timing: Timing
    description: str
    device: str = "cuda"  # the device it is meant for ("cuda" falls back to cpu with a warning)
    unit: str = "ms"  # "us": latencies shown in microseconds per call (the overhead suite)
    model_timeout: float = 240.0  # seconds per (model, backend), compile included
    smoke: tuple = ()  # --smoke: this subset ...
    smoke_timing: Timing = None  # ... with this timing
    smoke_backends: tuple = ()  # ... and these default backends
    cpu_shapes: dict = field(default_factory=dict)  # model -> (batch, seq) when run on the CPU
    parts: dict = field(default_factory=dict)  # mode -> number of --part pieces on an H100
    threads: int = None  # CPU threads in the workers (None: torch's default)
    subsets: dict = field(default_factory=dict)  # --core etc.: a named subset of the models
    warm_compile: bool = True  # time a warm (cache-hit) compile per backend (--warm-compile)


SUITES = {
    s.name: s
    for s in (
        Suite(
            "gpu-core",
            GPU_CORE,
            ("infer-bf16", "infer-fp32", "train-amp", "train-fp32"),
            ("eager", "torch_compile", "ember"),
            Timing(warmup=3, iters=20, max_seconds=2.0),
            "timm and transformers models at inference-benchmark batch sizes",
            model_timeout=180.0,
            parts={"infer-bf16": 5, "infer-fp32": 5, "train-amp": 7, "train-fp32": 7},
            subsets={"core": GPU_CORE},  # --core means the same here as on gpu-broad
        ),
        Suite(
            "gpu-broad",
            GPU_BROAD,
            ("infer-bf16", "infer-fp32", "train-amp"),
            ("eager", "torch_compile_cg", "torch_compile", "ember"),
            Timing(warmup=3, iters=20, max_seconds=2.0),
            "gpu-core plus 45 timm and transformers models Ember was never tuned on, "
            "raced against torch.compile's CUDA graphs (mode='reduce-overhead')",
            # A stuck compile costs at most this; measured gpu-core compiles take 20-60 s.
            model_timeout=150.0,
            # On a 4-GPU host with --gpus 4 --jobs 3 (compiles overlap on its 64 cores): two
            # parts of ~32 models, ~8 per GPU, each part under 9 minutes (README, "Parts").
            # train-amp's opponent is torch.compile's default mode (--backends
            # torch_compile,ember); Ember's default replays training graphs as CUDA graphs.
            parts={"infer-bf16": 2, "infer-fp32": 2, "train-amp": 4},
            subsets={"core": GPU_CORE},
            # The race is latency: the warm recompiles (timed with the GPU's other workers
            # stopped, ~20-30 s a model over four backends) would not fit two parts.
            warm_compile=False,
        ),
        Suite(
            "overhead",
            ("add_one", "mlp8_w256_b1"),
            ("infer-fp32",),
            ("eager", "torch_compile", "ember"),
            Timing(warmup=20, iters=7, loop_calls=1000),
            "per-call cost of a one-op function and a small MLP (microseconds per call)",
            unit="us",
            parts={"infer-fp32": 1},
        ),
        Suite(
            "roofline",
            ROOFLINE,
            ("infer-fp32", "infer-bf16"),
            ("eager", "torch_compile", "ember"),
            Timing(warmup=3, iters=20, max_seconds=2.0),
            "memory-bound kernels: achieved GB/s against the device's copy bandwidth",
            cpu_shapes={k: (4096, 4096) for k in ROOFLINE},
            parts={"infer-fp32": 1, "infer-bf16": 1},
        ),
        Suite(
            "cpu-core",
            CPU_CORE,
            ("infer-fp32", "train-fp32"),
            ("eager", "torch_compile", "ember"),
            Timing(warmup=2, iters=10, max_seconds=2.0),
            "the suite's architectures in small configs, float32 on the CPU",
            device="cpu",
            threads=1,  # shared 2-core machines: more threads make OpenMP barriers stall
            model_timeout=300.0,
            smoke=SMALL,
            smoke_timing=Timing(warmup=1, iters=3, max_seconds=1.0),
            smoke_backends=("eager", "ember"),
            parts={"infer-fp32": 3, "train-fp32": 4},  # on the device host's CPU, 16 threads
        ),
    )
}


def get(name):
    """The suite called `name`; exits with the list of suites otherwise."""
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return SUITES[name]


def part_of(models, part):
    """The models of part 'i/n' (1-based): every n-th model starting at the i-th, so heavy and
    light models spread evenly over the parts."""
    if not part:
        return list(models)
    i, n = (int(x) for x in part.split("/"))
    if not 1 <= i <= n:
        raise SystemExit(f"--part {part}: need 1 <= i <= n")
    return list(models[i - 1 :: n])
