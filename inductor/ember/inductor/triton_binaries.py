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
bits, so a binary is only reused for arguments that agree on all of these. `load` rebuilds Triton's
CompiledKernel from the entry, which loads the cubin and Triton's C launcher (cached by Triton by
its source) and nothing else. An entry that fails its checksum or does not load is ignored and the
JIT compiles the kernel again.
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

FORMAT = 1  # of an entry's files; part of every name


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


def save(kernel_key: str, cfg: dict, args, compiled) -> None:
    """Keep `compiled` (Triton's CompiledKernel, just launched with `args`); never raises."""
    spec = specialization(args)
    if spec is None or not enabled():
        return
    from .runtime import atomic_write

    try:
        json_path = next(Path(p) for n, p in compiled.metadata_group.items() if n.endswith(".json"))
        src = compiled.src
        launch = {
            "name": compiled.name,
            "arg_names": list(src.fn.arg_names),
            "signature": [[k, v] for k, v in src.signature.items()],
            "constants": [[list(k) if isinstance(k, tuple) else k, v]
                          for k, v in src.constants.items()],  # fmt: skip
            "cubin_sha256": hashlib.sha256(compiled.kernel).hexdigest(),
        }
        text = json.dumps(launch)  # before writing anything: every part must be JSON
        base = _folder(kernel_key, cfg) / _digest(spec)
        atomic_write(base.with_suffix(".cubin"), compiled.kernel)
        atomic_write(base.with_suffix(".json"), json_path.read_bytes())
        atomic_write(base.with_suffix(".launch"), text)  # last: the entry is whole once it exists
    except Exception as e:  # noqa: BLE001 - the binary is only kept for the next process
        log.debug("ember.inductor: Triton binary of %s not kept: %s", kernel_key, e)


def load(kernel_key: str, cfg: dict, args):
    """Triton's CompiledKernel for these arguments from a stored entry, loaded on the current
    device; None when there is none or it does not check out."""
    spec = specialization(args)
    if spec is None or not enabled():
        return None
    try:
        base = _folder(kernel_key, cfg) / _digest(spec)
        launch_path = base.with_suffix(".launch")
        if not launch_path.exists():
            return None
        launch = json.loads(launch_path.read_text())
        cubin = base.with_suffix(".cubin")
        if hashlib.sha256(cubin.read_bytes()).hexdigest() != launch["cubin_sha256"]:
            raise ValueError("the cubin does not match its checksum")
        from triton.compiler.compiler import CompiledKernel

        src = SimpleNamespace(
            fn=SimpleNamespace(arg_names=launch["arg_names"]),
            signature=dict((k, v) for k, v in launch["signature"]),
            constants={tuple(k) if isinstance(k, list) else k: v for k, v in launch["constants"]},
        )
        name = launch["name"]
        group = {f"{name}.json": str(base.with_suffix(".json")), f"{name}.cubin": str(cubin)}
        compiled = CompiledKernel(src, group, base.name)
        compiled.run  # noqa: B018 - loads the cubin and the launcher now, so a failure falls back
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry: the JIT compiles instead
        log.info("ember.inductor: stored Triton binary of %s not used: %s", kernel_key, e)
        return None
    metrics.triton_binaries_loaded += 1
    return compiled


__all__ = ["enabled", "load", "save", "specialization", "stored"]
