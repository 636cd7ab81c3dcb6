"""Triton kernels' compiled binaries in Ember's cache, launched on a warm start without the JIT.

Triton's JIT finds a compiled kernel in its own cache only after hashing its installation (the
first lookup of a process reads and hashes libtriton and Triton's sources: seconds) and each
kernel's source and dependencies, and then reads every stage's IR back from disk. On an H200 a new
process that found all of efficientnet_b0's ~150 kernels cached still spent 3-6 s there.

After a kernel's first launch through the JIT, `save` keeps what launching it takes: the cubin,
Triton's metadata for it, and the signature its C launcher is generated from. The entry is named by
the launcher's key (its source), the block sizes, the device's architecture, Triton's version and
the specialisation of the arguments: Triton compiles a kernel for its arguments' dtypes, for
pointers aligned to 16 bytes or not, and for integers equal to 1, multiples of 16 or wider than 32
bits, so a binary is only reused for arguments that agree on all of these. `load` loads the cubin
and takes Triton's C launcher for its signature, and nothing else (`_kernel_handles`; on Triton
releases it was not written against, through Triton's CompiledKernel). An entry is a directory
published whole with a manifest of its files' SHA-256s (ember.ir.cache_files); one whose files do
not match it, or that does not load, is set aside and the JIT compiles the kernel again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch

from . import metrics
from .config import config

log = logging.getLogger("ember.inductor")

FORMAT = 2  # of an entry's files; part of every name (2: a directory with a manifest)


def specialization(args) -> Optional[tuple]:
    """What Triton specialises a kernel on, for these launch arguments (None: an argument of a
    kind not handled here)."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            spec.append(("bool", a))
        elif isinstance(a, int):
            spec.append(("int", a == 1, a % 16 == 0, -(2**31) <= a < 2**31))
        elif isinstance(a, float):
            spec.append(("float",))
        else:
            return None
    return tuple(spec)


@functools.lru_cache(maxsize=None)
def _device_key(index: int) -> str:
    import triton

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}-triton{triton.__version__}-cuda{torch.version.cuda}-f{FORMAT}"


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _folder(kernel_key: str, cfg: dict) -> Path:
    """The entries of one kernel at one config, on the current device, one per specialisation."""
    from .runtime import cache_dir

    device = _device_key(torch.cuda.current_device())
    return cache_dir() / "triton_bin" / _digest(kernel_key, cfg, device)


def enabled() -> bool:
    return (config.triton_binaries and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.is_available())  # fmt: skip


def stored(kernel_key: str, cfg: dict) -> bool:
    """Whether some specialisation of this kernel at this config is stored (its background
    precompile is then skipped: the first call most likely loads it)."""
    try:
        return enabled() and _folder(kernel_key, cfg).is_dir()
    except (RuntimeError, OSError):
        return False


# An entry is a directory of these files plus cache_files' manifest (their SHA-256s), published
# whole; it is used only when every file it is loaded from matches the manifest.
_FILES = ("kernel.cubin", "kernel.json", "launch.json")


def _entry(kernel_key: str, cfg: dict, spec: tuple) -> tuple:
    """(the entry directory for this specialisation, the key its manifest must name)."""
    folder = _folder(kernel_key, cfg)
    entry = folder / _digest(spec)
    return entry, f"{folder.name}/{entry.name}"


def save(kernel_key: str, cfg: dict, args, compiled) -> None:
    """Keep `compiled` (Triton's CompiledKernel, just launched with `args`); never raises."""
    spec = specialization(args)
    if spec is None or not enabled():
        return
    from ember.ir import cache_files

    try:
        json_path = next(Path(p) for n, p in compiled.metadata_group.items() if n.endswith(".json"))
        src = compiled.src
        launch = {
            "name": compiled.name,
            "arg_names": list(src.fn.arg_names),
            "signature": [[k, v] for k, v in src.signature.items()],
            "constants": [[list(k) if isinstance(k, tuple) else k, v]
                          for k, v in src.constants.items()],  # fmt: skip
        }
        text = json.dumps(launch)  # before writing anything: every part must be JSON
        entry, key = _entry(kernel_key, cfg, spec)
        files = {"kernel.cubin": compiled.kernel, "kernel.json": json_path.read_bytes(),
                 "launch.json": text}  # fmt: skip
        cache_files.publish_dir(entry, key, files)
    except Exception as e:  # noqa: BLE001 - the binary is only kept for the next process
        log.debug("ember.inductor: Triton binary of %s not kept: %s", kernel_key, e)


# (entry, device) -> the loaded kernel: a program compiled again in this process (after a reset,
# or another graph with the same kernel) launches the module already loaded
_LOADED: dict = {}


def load(kernel_key: str, cfg: dict, args):
    """The kernel for these arguments from a stored entry, loaded on the current device (what
    launching it takes: `run`, `function`, `packed_metadata`, as on Triton's CompiledKernel); None
    when there is none or it does not check out."""
    spec = specialization(args)
    if spec is None or not enabled():
        return None
    from ember.ir import cache_files

    try:
        base, key = _entry(kernel_key, cfg, spec)
        device = torch.cuda.current_device()
        loaded = _LOADED.get((base, device))
        if loaded is not None:  # this process loaded it already (a program compiled again)
            metrics.triton_binaries_loaded += 1
            return loaded
        files = cache_files.read_verified(base, key, _FILES)
        if files is None:
            return None
        launch, cubin_bytes = json.loads(files["launch.json"]), files["kernel.cubin"]
        src = SimpleNamespace(
            fn=SimpleNamespace(arg_names=launch["arg_names"]),
            signature=dict((k, v) for k, v in launch["signature"]),
            constants={tuple(k) if isinstance(k, list) else k: v for k, v in launch["constants"]},
        )
        name = launch["name"]
        if _handles_supported():
            compiled = _kernel_handles(src, launch, files["kernel.json"], cubin_bytes, name,
                                       device)  # fmt: skip
        else:
            from triton.compiler.compiler import CompiledKernel

            group = {f"{name}.json": str(base / "kernel.json"),
                     f"{name}.cubin": str(base / "kernel.cubin")}  # fmt: skip
            compiled = CompiledKernel(src, group, base.name)
            compiled.run  # noqa: B018 - loads the cubin and the launcher now: a failure falls back
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry: the JIT compiles instead
        log.info("ember.inductor: stored Triton binary of %s not used: %s", kernel_key, e)
        return None
    metrics.triton_binaries_loaded += 1
    _LOADED[(base, device)] = compiled
    return compiled


# The Triton releases whose CompiledKernel and CUDA launcher `_kernel_handles` follows. For them a
# stored binary is loaded without CompiledKernel, whose constructor defines a namedtuple class per
# kernel, whose launcher generates, hashes and imports its C module per kernel, and which asks the
# driver for all of the device's properties per kernel: ~1.5 ms a kernel on an H200, 0.4 s of
# regnety_016's 1.0 s warm start (284 kernels). Kernels of one signature share one launcher here.
# Other releases, and profilers' load hooks, take CompiledKernel's way.
_HANDLES_FOR = ("3.6.",)
# What Triton 3.6's CudaLauncher reads from a kernel's metadata besides its signature and constants
_LAUNCHER_FIELDS = ("num_ctas", "global_scratch_size", "global_scratch_align",
                    "profile_scratch_size", "profile_scratch_align", "launch_cooperative_grid",
                    "launch_pdl", "tensordesc_meta")  # fmt: skip
_LAUNCHERS: dict = {}


@functools.lru_cache(maxsize=None)
def _handles_for_version() -> bool:
    import triton

    return triton.__version__.startswith(_HANDLES_FOR)


def _handles_supported() -> bool:
    from triton import knobs

    hooks = (knobs.runtime.kernel_load_start_hook, knobs.runtime.kernel_load_end_hook)
    return _handles_for_version() and not any(h is not None and getattr(h, "calls", True)
                                              for h in hooks)  # fmt: skip


@functools.lru_cache(maxsize=None)
def _backend(target):  # a GPUTarget (a frozen dataclass)
    from triton.compiler.compiler import make_backend

    return make_backend(target)


@functools.lru_cache(maxsize=None)
def _max_shared_mem(device: int) -> int:
    # Triton asks the driver for all of a device's properties at each kernel's load: ~1 ms a
    # call on an H200 (284 calls in regnety_016's warm start, twice the cubin loads themselves)
    from triton.runtime.driver import driver

    return driver.active.utils.get_device_properties(device)["max_shared_mem"]


def _kernel_handles(src, launch: dict, metadata: bytes, cubin: bytes, name: str, device: int):
    """What a launch takes (`run`, `function`, `packed_metadata`), as CompiledKernel would have
    them after loading: the cubin loaded on the current device, and Triton's launcher for the
    kernel's signature (one per signature and launch options, shared)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    meta = json.loads(metadata)
    target = meta["target"]
    meta["target"] = GPUTarget(target["backend"], target["arch"], target["warp_size"])
    metadata = SimpleNamespace(**meta)
    packed = _backend(meta["target"]).pack_metadata(metadata)
    options = [meta.get(f) for f in _LAUNCHER_FIELDS]
    key = json.dumps([launch["signature"], launch["constants"], options], default=repr)
    run = _LAUNCHERS.get(key)
    if run is None:
        run = _LAUNCHERS[key] = driver.active.launcher_cls(src, metadata)
    limit = _max_shared_mem(device)
    if metadata.shared > limit:
        raise ValueError(f"needs {metadata.shared} bytes of shared memory; the device has {limit}")
    if (getattr(metadata, "tmem_size", None) or 0) > 512:
        raise ValueError(f"needs {metadata.tmem_size} columns of tensor memory")
    module, function, _, _, max_threads = driver.active.utils.load_binary(
        name, cubin, metadata.shared, device
    )
    if metadata.num_warps * meta["target"].warp_size > max_threads:
        raise ValueError(f"{metadata.num_warps} warps exceed the kernel's {max_threads} threads")
    return SimpleNamespace(run=run, function=function, packed_metadata=packed, module=module,
                           metadata=metadata, name=name, kernel=cubin)  # fmt: skip


__all__ = ["enabled", "load", "save", "specialization", "stored"]
