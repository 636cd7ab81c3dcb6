"""ember.inductor's configuration: every knob in one object, with documented env-var overrides.

Overrides (read once at import):
  EMBER_INDUCTOR_CACHE=0          disable the on-disk compile caches (`cache`)
  EMBER_INDUCTOR_FX_CACHE=0       disable only its torch-level part (`fx_cache`)
  EMBER_INDUCTOR_CPU_BACKEND=...  "cpp" (default) or "triton" (render CPU graphs as Triton, for
                                  testing the Triton renderer with TRITON_INTERPRET=1)
  EMBER_INDUCTOR_AUTOTUNE=0       disable Triton block-size autotuning (`autotune`)
  EMBER_AUTOTUNE_MS=W,R           each config's warm-up and timing budget in ms (`autotune_ms`)
  EMBER_AUTOTUNE_WIDE=1           every candidate launch config of a Triton kernel, not the
                                  two or three likeliest (`autotune_wide`; max-autotune sets it)
  EMBER_TRITON_BINARIES=0         always go through Triton's JIT (`triton_binaries`)
  EMBER_ISA=avx2|avx512|generic   force the C++ vector ISA instead of ember.ir.toolchain.cpu_isa()
  EMBER_LOGS=output_code          print each generated wrapper and its kernels
  EMBER_CONV_CHANNELS_LAST=0|1|auto  `conv_channels_last`
  EMBER_CUDAGRAPHS=0|1|auto       `cudagraphs`: replay CUDA inference graphs from CUDA graphs
  EMBER_CUDAGRAPHS_TRAINING=0|1|auto  `cudagraphs_training`: ... and training graphs
  EMBER_PAD_MM=0|1|auto           `pad_mm`
  EMBER_CONV_BIAS_EPILOGUE=0|1|auto  `conv_bias_epilogue`
  EMBER_SPLIT_REDUCTIONS=0|1|auto  `split_reductions`
  EMBER_CPU_FLASH_ATTENTION=0|1|auto  `cpu_flash_attention`
  EMBER_TRITON_FLASH_ATTENTION=0|1|auto  `triton_flash_attention`
  EMBER_GEMM_FORCE=extern|<i>|measure  `gemm_force`: keep the library call, take template
                                  config i untimed, or time even on the CPU (tests)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional, Union
import os

import torch

from ember.ir import toolchain


@dataclasses.dataclass
class Config:
    """The knobs of the lowering, the scheduler and both code generators."""

    # lowering: a value used more than once is computed into a buffer (not recomputed) when its
    # body reads more than `realize_reads_threshold` buffers or has more ops than this
    realize_reads_threshold: int = 4
    realize_ops_threshold: int = 30
    # a lazily inlined body larger than this is realized, to bound code size
    max_inline_ops: int = 200
    # scheduler
    fuse: bool = True
    reuse_buffers: bool = True
    # A dead buffer stays alive for reuse only if an allocation of its size comes within this many
    # steps; otherwise it is freed at once (peak memory over allocator calls).
    reuse_window: int = 8
    # ... and only if it is this small: saving an allocator call matters for small buffers, while
    # a large one held for later reuse raises the peak (extern kernels allocate their own outputs)
    reuse_max_bytes: int = 1 << 18
    inplace_buffers: bool = True
    # an input the program overwrites (a KV cache) written by its index_put in place, not copied
    # twice per call (input_updates.py)
    inplace_input_updates: bool = True
    # ... and as a kernel that stores the new rows (loop_ir.IndexedWrite), fused with the one
    # computing them, not an extern call (off: the extern index_put_ on the input's view)
    indexed_writes: bool = True
    # A buffer larger than this joins no kernel ahead of an extern call: moved there its
    # allocation would live across the extern's (the backward's conv and matmul outputs).
    hoist_max_bytes: int = 1 << 16
    # products of one or two rows as generated reductions: None = on CUDA only
    small_mm_as_reduction: Optional[bool] = None
    # a product of a few rows (decoding) whose weight is dequantized from int8/int4 in the graph
    # as a generated reduction reading the quantized bytes, on every device; False: GEMM calls
    dequantize_in_kernel: bool = True
    # 2-D convolutions in channels-last (NHWC) end to end: their inputs, weights and outputs, and
    # the pointwise kernels between them, so cuDNN converts no layouts around each conv. "auto":
    # on for inference graphs with a 4-D convolution, on CUDA, and on the CPU in process (not in
    # a package, whose C++ convolution is not tuned for it); True: on for any graph with one.
    conv_channels_last: Union[bool, str] = "auto"
    # CUDA graphs for inference graphs with static sizes on CUDA (cudagraphs.py): "auto" = on
    cudagraphs: Union[bool, str] = "auto"
    # ... and for training graphs (forward and backward; their saved activations and gradients
    # are not copied, see cudagraphs.py): "auto" = on CUDA (when `cudagraphs` is not off)
    cudagraphs_training: Union[bool, str] = "auto"
    # fp16/bf16/fp32 mm and addmm whose output rows are not 16-byte aligned (a vocabulary of
    # 50257 columns) multiply a zero-padded operand into aligned rows and read the first columns
    # back through a view: cuBLAS has only slow kernels for unaligned rows. "auto": on CUDA;
    # True: on any device (for tests); False: off.
    pad_mm: Union[bool, str] = "auto"
    # a convolution is called without its bias, which the kernel reading the output adds
    # (torch's CUDA convolution adds a bias with a separate kernel; the CPU's adds it in the
    # convolution's own loop). "auto": on CUDA; True: on any device (for tests); False: off.
    conv_bias_epilogue: Union[bool, str] = "auto"
    # a reduction of few long rows (a LayerNorm's weight gradient, a batch norm's statistics per
    # channel) as partial reductions over chunks of its rows and a reduction of the partials
    # (split_reduction.py), so it runs on enough programs to fill the GPU. "auto": on CUDA; True:
    # on any device (for tests); False: off.
    split_reductions: Union[bool, str] = "auto"
    # scaled_dot_product_attention on the CPU (extern.sdpa_flash_cpu, torch's flash kernel) as a
    # generated C++ flash-attention kernel (cpu_attention.py): never stores the (L, S) scores and
    # runs in the C++ wrapper and packages, which cannot call torch; in training, its backward
    # too (cpu_attention_backward.py). True: wherever it applies (no dropout, static heads and
    # head dims, fp32/bf16/fp16; else the extern call stays); "auto": the same, except bf16/fp16
    # in process on a CPU that multiplies them in hardware (AMX, AVX512-BF16/FP16), where
    # torch's kernel is faster; False: torch's kernels.
    cpu_flash_attention: Union[bool, str] = "auto"
    # CUDA's attention externs (extern.sdpa_flash, sdpa_efficient, sdpa_cudnn: torch's kernels)
    # as Ember's own Triton flash-attention kernel (triton_attention.py), which packages launch
    # as a cubin where they cannot call torch. "auto": while compiling for a package
    # (`packaging`); True: in-process compiles too (and CPU graphs that render Triton, for
    # tests); False: always torch's kernels.
    triton_flash_attention: Union[bool, str] = "auto"
    # attention written as matmul, scale, bias or mask, softmax, matmul: one
    # scaled_dot_product_attention call (attention_rewrite.py), before aot_autograd traces
    attention_rewrite: bool = os.environ.get("EMBER_ATTENTION_REWRITE", "1") != "0"
    # set while ember.cpp_wrapper compiles a program for a package (`for_package()`)
    packaging: bool = False
    # C++ backend
    cpu_backend: str = "cpp"  # or "triton"
    isa: str = ""  # "" means ember.ir.toolchain.cpu_isa()
    openmp: bool = True
    cpp_pch: bool = True  # precompile ember_cpu.h once per build configuration
    cpp_flags: tuple = ("-O3", "-ffp-contract=fast", "-fno-math-errno")
    # Triton backend
    # Rows this short are reduced in one block (EMBER_PERSISTENT_MAX). A longer row is reduced
    # in a loop, and a value two loops read (a softmax's exp) goes through memory in float32:
    # a bfloat16 softmax over 4096 columns then moved 48% of the copy bandwidth (H100).
    persistent_reduction_max: int = 4096
    # A reduction of at most this many elements per output (split attention's sum over its two
    # or four radix branches) is unrolled into a pointwise value: it fuses as one, and its
    # output takes the layout of what it reads
    unroll_reduction_max: int = 8
    autotune: bool = True
    # At a kernel's first call, (warm-up, timing) milliseconds of launches for its fastest config
    # (trial_timing.plan turns them into rounds in which every config runs). Paid once per kernel
    # and size (the choice is remembered on disk). Each config timed alone by triton's do_bench
    # for (5, 20) cost 10.9 of a cold GPT-2 training compile's 28.9 s on an H100 (session 17).
    autotune_ms: tuple = (2, 10)
    # The candidate launch configs of a Triton kernel (codegen_triton.launch_configs): two (or
    # three) per kind, whose best came within 0.8-3.4% of the wide set's best, summed over the
    # kernel times of ten models' training steps (H200, session 19), or with this on, the wide
    # set (three to five each: each candidate is one more Triton compile). Mode "max-autotune"
    # turns it on.
    autotune_wide: bool = False
    # Matmuls (mm, addmm, bmm, baddbmm) as generated Triton GEMM templates with their pointwise
    # readers fused as an epilogue, each chosen against the library call by timing on the real
    # shapes in a subprocess (gemm_template.py, autotune.py). compile_fx turns it on for
    # mode="max-autotune" / "max-autotune-no-cudagraphs"; off by default.
    max_autotune_gemm: bool = False
    # None: measure (CUDA only; elsewhere the library call stays). "extern": keep the library call;
    # an int i: take template config i untimed; "measure": time even on the CPU, in Triton's
    # interpreter (both for tests).
    gemm_force: Optional[Union[int, str]] = None
    # a Triton kernel's binary is kept in the cache after its first launch, and a later process
    # launches it from there without Triton's JIT (triton_binaries.py)
    triton_binaries: bool = True
    # compile cache: prim-graph entries, and torch-level ones that skip tracing too
    cache: bool = True
    fx_cache: bool = True
    output_code: bool = False


# The "auto" / True / False switches and the variables that set them.
_SWITCHES = (("EMBER_CONV_CHANNELS_LAST", "conv_channels_last"), ("EMBER_CUDAGRAPHS", "cudagraphs"),
             ("EMBER_CUDAGRAPHS_TRAINING", "cudagraphs_training"),
             ("EMBER_PAD_MM", "pad_mm"), ("EMBER_CONV_BIAS_EPILOGUE", "conv_bias_epilogue"),
             ("EMBER_SPLIT_REDUCTIONS", "split_reductions"),
             ("EMBER_CPU_FLASH_ATTENTION", "cpu_flash_attention"),
             ("EMBER_TRITON_FLASH_ATTENTION", "triton_flash_attention"))  # fmt: skip


def _autotune_ms(value: str) -> tuple:
    """EMBER_AUTOTUNE_MS's (warm-up, timing) budget in ms; a malformed value is refused with
    the form expected rather than a bare float() or unpacking error from deep in an import."""
    try:
        budget = tuple(float(part) for part in value.split(","))
    except ValueError:
        budget = ()
    if len(budget) != 2 or not all(math.isfinite(b) and b > 0 for b in budget):
        raise ValueError(f"EMBER_AUTOTUNE_MS must be two positive numbers 'W,R' in milliseconds "
                         f"(warm-up, timing), got {value!r}")  # fmt: skip
    return budget


def _from_env(cfg: Config) -> Config:
    env = os.environ
    if env.get("EMBER_INDUCTOR_CACHE") == "0":
        cfg.cache = False
    if env.get("EMBER_INDUCTOR_FX_CACHE") == "0":
        cfg.fx_cache = False
    if env.get("EMBER_INDUCTOR_CPU_BACKEND"):
        cfg.cpu_backend = env["EMBER_INDUCTOR_CPU_BACKEND"]
    if env.get("EMBER_INDUCTOR_AUTOTUNE") == "0":
        cfg.autotune = False
    if env.get("EMBER_AUTOTUNE_MS"):
        cfg.autotune_ms = _autotune_ms(env["EMBER_AUTOTUNE_MS"])
    if env.get("EMBER_AUTOTUNE_WIDE") == "1":
        cfg.autotune_wide = True
    if env.get("EMBER_TRITON_BINARIES") == "0":
        cfg.triton_binaries = False
    if env.get("EMBER_PERSISTENT_MAX"):
        cfg.persistent_reduction_max = int(env["EMBER_PERSISTENT_MAX"])
    if env.get("EMBER_ISA"):
        cfg.isa = env["EMBER_ISA"]
    for var, field in _SWITCHES:  # "0" / "1" / another mode name such as "auto"
        value = env.get(var)
        if value:
            setattr(cfg, field, {"0": False, "1": True}.get(value, value))
    force = env.get("EMBER_GEMM_FORCE")
    if force:
        cfg.gemm_force = int(force) if force.isdigit() else force
    if "output_code" in env.get("EMBER_LOGS", "").split(","):
        cfg.output_code = True
    return cfg


@contextlib.contextmanager
def for_package():
    """Compile for a package (ember.cpp_wrapper's registry entry "packaging"): lowerings that
    replace calls into torch where a package needs them (triton_flash_attention) apply. Holds
    the compile lock (re-entrant), so a compile on another thread never sees the switch."""
    from ember.ir.locks import COMPILE_LOCK

    with COMPILE_LOCK:
        saved, config.packaging = config.packaging, True
        try:
            yield
        finally:
            config.packaging = saved


def on_for(mode, device) -> bool:
    """An "auto" / True / False switch of this config for `device`: True (or "1", "on",
    "true") everywhere, "auto" on CUDA only, anything else off."""
    if mode is True or mode in ("1", "on", "true"):
        return True
    return mode == "auto" and str(device).startswith("cuda")


config = _from_env(Config())


def fingerprint() -> str:
    """The configuration as text, part of every compile-cache key."""
    fields = dataclasses.asdict(config)
    fields.pop("output_code")
    fields.pop("cudagraphs")  # how a program is run, not what it is
    fields.pop("cudagraphs_training")
    fields.pop("fx_cache")  # which cache levels are on does not change what a compile makes
    fields.pop("triton_binaries")
    fields.pop("autotune_ms")  # how long configs are timed; the choice is kept apart
    # what the host multiplies 16-bit floats with decides who runs CPU attention ("auto")
    fields["cpu_16bit"] = sorted(toolchain.cpu_flags() & set().union(*HARDWARE_16BIT.values()))
    return repr(sorted(fields.items()))


# CPU features with which torch's kernels multiply 16-bit floats in hardware (AMX tiles, or
# AVX512 dot products: oneDNN's), where Ember's CPU attention widens them to float32 FMAs: on an
# AMX host its bf16 attention ran at about 0.3x of torch's (2 cores, L = S = 2048, E = 128).
HARDWARE_16BIT = {torch.bfloat16: frozenset({"amx_bf16", "avx512_bf16"}),
                  torch.float16: frozenset({"amx_fp16", "avx512_fp16"})}  # fmt: skip
