"""AOT packages: a directory with the model library, its weights and a manifest.

    PACKAGE/
      manifest.json   format, versions, device, ISA, the artifact hash, inputs/outputs, constants
                      (name, dtype, shape, strides, storage offset, byte offset and size in
                      weights.bin) and each file's size and SHA-256
      model.so        the generated wrapper with every CPU kernel compiled in (Triton cubins
                      embedded); links neither libtorch nor libpython
      weights.bin     each constant's storage bytes, little-endian, 64-byte aligned

The C++ loader (csrc/runtime/package.cc) verifies versions, sizes and checksums before it maps
anything, so a truncated or foreign package is an error, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from ember.ir import IR_VERSION, CompiledArtifact, TensorMeta, dtype_name, toolchain

from .codegen_values import itemsize
from .exported import (SIGNATURE_FILE, compile_exported, is_exported_program, load_exported,
                       write_signature)  # fmt: skip
from .model import artifact_hash, bind_constants, build_model_library, materialise_constant

FORMAT = "ember-package"
FORMAT_VERSION = 1
ABI_VERSION = 1  # EMBER_ABI_VERSION of csrc/ember_runtime.h
MODEL_ABI_VERSION = 1  # EMBER_MODEL_ABI_VERSION of csrc/detail/model_abi.h
ALIGN = 64


def _dim(expr) -> Any:
    return int(expr) if expr.is_Integer else str(expr)


def _meta_json(name: str, meta: TensorMeta) -> dict:
    return {
        "name": name,
        "dtype": dtype_name(meta.dtype),
        "shape": [_dim(s) for s in meta.sizes],
        "strides": [_dim(s) for s in meta.strides],
    }


def _file_entry(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"file": path.name, "size": path.stat().st_size, "sha256": h.hexdigest()}


def _storage_bytes(t: torch.Tensor, meta: TensorMeta) -> bytes:
    """The bytes of `t`'s storage span from offset 0, as `meta` lays it out."""
    sizes = [int(s) for s in meta.sizes]
    if not all(sizes):
        return b""
    span = (
        int(meta.storage_offset) + 1 + sum((s - 1) * int(st) for s, st in zip(sizes, meta.strides))
    )
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset() - int(meta.storage_offset))
    return flat.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _unpack(exported_or_artifact, constants) -> tuple[CompiledArtifact, dict]:
    """Accept an artifact (+ constants), an (artifact, constants) pair, or an object with
    `.artifact` and `.constants` (what ember.export will produce)."""
    obj = exported_or_artifact
    if isinstance(obj, CompiledArtifact):
        return obj, dict(constants or {})
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], CompiledArtifact):
        return obj[0], {**dict(obj[1] or {}), **dict(constants or {})}
    if hasattr(obj, "artifact") and isinstance(obj.artifact, CompiledArtifact):
        return obj.artifact, {
            **dict(getattr(obj, "constants", None) or {}),
            **dict(constants or {}),
        }
    raise TypeError(
        "package() takes a CompiledArtifact (with constants=...), an (artifact, constants) pair, "
        f"or an object with .artifact and .constants; got {type(obj).__name__}"
    )


def package(
    exported_or_artifact,
    path: os.PathLike | str,
    device: str = "cpu",
    *,
    constants: Optional[Mapping[str, torch.Tensor]] = None,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
) -> Path:
    """Write an AOT package directory for a compiled artifact and its constants; returns its path.

    Takes an exported program (`ember.export`'s result, or the directory it was saved to: its
    graph is compiled by ember.inductor and its constants frozen in; see exported.py), a
    CompiledArtifact with `constants` (buffer name -> tensor), an (artifact, constants) pair, or
    an object with `.artifact` and `.constants`. A constant may name an artifact input
    (a weight a traced graph takes as input): it is frozen into the package. `include_dirs` and
    `defines` are passed to the kernels' compilation (see config.kernel_include_dirs)."""
    exported = None
    if is_exported_program(exported_or_artifact):
        exported = exported_or_artifact
        if isinstance(exported, (str, os.PathLike)):
            exported = load_exported(exported)
        exported_or_artifact = compile_exported(exported, device)
    artifact, consts = bind_constants(*_unpack(exported_or_artifact, constants))
    if torch.device(artifact.device).type != torch.device(device).type:
        raise ValueError(f"the artifact was compiled for {artifact.device}, not {device}")
    path = Path(path)
    if path.exists() and not (
        path.is_dir() and (not any(path.iterdir()) or (path / "manifest.json").exists())
    ):
        raise FileExistsError(
            f"{path} exists and is not an Ember package; refusing to overwrite it"
        )
    library = build_model_library(
        artifact, standalone=True, include_dirs=include_dirs, defines=defines
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        shutil.copy2(library, staging / "model.so")
        entries = _write_weights(artifact, consts, staging / "weights.bin")
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "abi_version": ABI_VERSION,
            "model_abi_version": MODEL_ABI_VERSION,
            "ir_version": artifact.ir_version,
            "ir_version_written_by": IR_VERSION,
            "device": torch.device(device).type,
            "isa": toolchain.cpu_isa(),  # what build_model_library compiled for
            "artifact_hash": artifact_hash(artifact),
            "library": _file_entry(staging / "model.so"),
            "weights": _file_entry(staging / "weights.bin"),
            "inputs": [_meta_json(n, artifact.buffer(n).meta) for n in artifact.inputs],
            "outputs": [_meta_json(n, artifact.buffer(n).meta) for n in artifact.outputs],
            "symbols": [
                {"name": s.name, "lower": s.lower, "upper": s.upper} for s in artifact.symbols
            ],
            "constants": entries,
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if exported is not None:
            write_signature(exported, exported_or_artifact[0], staging / SIGNATURE_FILE)
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _write_weights(
    artifact: CompiledArtifact, consts: Mapping[str, torch.Tensor], path: Path
) -> list[dict]:
    entries = []
    offset = 0
    with open(path, "wb") as f:
        for b in artifact.buffers:
            if b.kind != "constant":
                continue
            if b.name not in consts:
                raise KeyError(f"the artifact needs constant {b.name!r}; pass it in `constants`")
            t = materialise_constant(consts[b.name], b.meta, torch.device("cpu"))
            data = _storage_bytes(t, b.meta)
            pad = (-offset) % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            entry = _meta_json(b.name, b.meta)
            entry.update(storage_offset=int(b.meta.storage_offset), offset=offset, nbytes=len(data))
            assert len(data) % itemsize(b.meta.dtype) == 0
            f.write(data)
            offset += len(data)
            entries.append(entry)
    return entries
