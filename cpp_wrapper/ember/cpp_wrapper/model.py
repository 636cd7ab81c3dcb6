"""Building model libraries from artifacts and running them in process."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
import torch.utils.dlpack as dlpack

from ember.ir import CompiledArtifact, KernelIR, TensorMeta, dumps, toolchain

from . import _build, library_build
from .codegen import generate_wrapper
from .codegen_values import KernelBuild
from .config import config
from .custom_kernels import used_kernels
from .errors import UnsupportedArtifactError
from .library_build import Unit


def artifact_hash(artifact: CompiledArtifact) -> str:
    """A content hash of the artifact (its serialised form plus any compiled kernel binaries)."""
    h = hashlib.sha256(dumps(artifact).encode())
    for k in artifact.kernels:
        if k.language == "triton" and k.binary and Path(k.binary).exists():
            h.update(Path(k.binary).read_bytes())
    for k in used_kernels(artifact):  # user operators' C++ kernels, registered in this process
        h.update(f"{k.op}\0{k.function}\0{k.source}".encode())
    return h.hexdigest()[:32]


def freeze_inputs(artifact: CompiledArtifact, names) -> CompiledArtifact:
    """`artifact` with the named inputs turned into constants (a module's weights, say, which a
    traced graph takes as inputs, baked into a package or bound once at load)."""
    names = set(names)
    unknown = names - set(artifact.inputs)
    if unknown:
        raise KeyError(f"not inputs of the artifact: {sorted(unknown)}")
    if not names:
        return artifact
    buffers = tuple(
        dataclasses.replace(b, kind="constant") if b.name in names else b for b in artifact.buffers
    )
    inputs = tuple(n for n in artifact.inputs if n not in names)
    return dataclasses.replace(artifact, buffers=buffers, inputs=inputs)


def bind_constants(artifact: CompiledArtifact, constants) -> tuple[CompiledArtifact, dict]:
    """Freeze the inputs that `constants` names; returns the artifact and the constants."""
    constants = dict(constants or {})
    return freeze_inputs(artifact, [n for n in constants if n in artifact.inputs]), constants


def _kernel_builds(artifact: CompiledArtifact, standalone: bool) -> dict[str, KernelBuild]:
    builds = {}
    for k in artifact.kernels:
        if k.language == "triton":
            if not k.binary or not Path(k.binary).exists():
                raise UnsupportedArtifactError(
                    f"Triton kernel {k.name} has no cubin at {k.binary!r}"
                )
            cubin = Path(k.binary).read_bytes()
            symbol = "ember_cubin_" + hashlib.sha256(cubin).hexdigest()[:24]
            builds[k.name] = KernelBuild(cubin=cubin, cubin_symbol=symbol)
        elif k.binary and not standalone and k.binary.endswith(".so") and Path(k.binary).exists():
            builds[k.name] = KernelBuild(library=str(Path(k.binary).resolve()))
    return builds


def _named_by_content(kernel: KernelIR) -> KernelIR:
    """A C++ kernel whose entry is named after its source: the same kernel in every layer of a
    model (or in another model) is then one translation unit, compiled once and cached. Unchanged
    when the entry's name is not a word of the source exactly once (its definition)."""
    pattern = re.compile(rf"\b{re.escape(kernel.entry)}\b")
    if len(pattern.findall(kernel.source)) != 1:
        return kernel
    digest = hashlib.sha256(pattern.sub("__ember_kernel__", kernel.source).encode()).hexdigest()
    entry = f"ember_k{digest[:24]}"
    return dataclasses.replace(kernel, entry=entry, source=pattern.sub(entry, kernel.source))


def build_model_library(
    artifact: CompiledArtifact,
    *,
    standalone: bool = False,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
) -> Path:
    """Generate the wrapper for `artifact` and compile it with its C++ kernels into one library.

    In process (standalone=False) a CPU kernel whose `binary` names an existing .so is reached
    there by dlopen; a standalone library (for packages) compiles every kernel in from source.
    `include_dirs`/`defines` add to config.kernel_include_dirs/kernel_defines for the kernels.
    Kernels (named by their source) in groups, the wrapper and each cubin are translation units
    compiled in parallel and cached by content; the link is cached too (library_build.py).
    """
    isa = toolchain.cpu_isa()
    builds = _kernel_builds(artifact, standalone)
    digest = artifact_hash(artifact)  # of the artifact as given: the package's manifest says it
    artifact = dataclasses.replace(artifact, kernels=tuple(
        _named_by_content(k) if k.language == "cpp" and not builds.get(k.name) else k
        for k in artifact.kernels))  # fmt: skip
    source = generate_wrapper(artifact, artifact_hash=digest, isa=isa, kernels=builds)
    source = f"// runtime headers {_build.headers_digest()}\n{source}"
    units = [Unit(f"the wrapper of artifact {digest}", source, (library_build.WRAPPER_OPT,),
                  kernel=False)]  # fmt: skip
    kernels = {k.source: k.name for k in artifact.kernels
               if k.language == "cpp" and not builds.get(k.name)}  # fmt: skip
    units += [Unit(f"kernel {name}", src) for src, name in kernels.items()]
    # user operators' C++ kernels: one unit per source (several ops may share one source)
    ops: dict = {}
    for k in used_kernels(artifact):
        ops.setdefault(k.source, []).append(k.op)
    units += [Unit(f"the C++ kernel registered for {', '.join(names)}", src, kernel=False)
              for src, names in ops.items()]  # fmt: skip
    cubins = {b.cubin_symbol: b.cubin for b in builds.values() if b.cubin_symbol}
    units += [library_build.data_unit(sym, data) for sym, data in cubins.items()]
    flags = library_build.compile_flags(
        isa=isa,
        include_dirs=[*_build.include_dirs(), *config.kernel_include_dirs, *include_dirs],
        # the runtime headers' digest: a unit including them is rebuilt when one changes
        defines=[*_build.runtime_defines(), *config.kernel_defines, *defines],
        openmp=True,
    )
    return library_build.build_library("ember_model", units, flags)


def _matches(t: torch.Tensor, meta: TensorMeta) -> bool:
    if tuple(t.shape) != tuple(int(s) for s in meta.sizes):
        return False
    return all(
        size == 1 or stride == int(want)
        for size, stride, want in zip(t.shape, t.stride(), meta.strides)
    )


def materialise_constant(t: torch.Tensor, meta: TensorMeta, device: torch.device) -> torch.Tensor:
    """`t` laid out exactly as `meta` says (dtype, sizes, strides, storage offset) on `device`."""
    if not meta.is_static():
        raise UnsupportedArtifactError("constants with symbolic shapes are not supported")
    t = t.detach()
    if t.dtype != meta.dtype:
        raise TypeError(f"constant has dtype {t.dtype}, the artifact expects {meta.dtype}")
    sizes = tuple(int(s) for s in meta.sizes)
    if tuple(t.shape) != sizes:
        raise ValueError(f"constant has shape {tuple(t.shape)}, the artifact expects {sizes}")
    if t.device == device and _matches(t, meta) and int(meta.storage_offset) == 0:
        return t
    strides = tuple(int(s) for s in meta.strides)
    offset = int(meta.storage_offset)
    span = offset + 1 + sum((s - 1) * st for s, st in zip(sizes, strides)) if all(sizes) else 0
    storage = torch.empty(max(span, 1), dtype=t.dtype, device=device)
    view = storage.as_strided(sizes, strides, offset)
    view.copy_(t)
    return view


class CompiledModel:
    """A model loaded into the C++ runtime; call it with tensors, get a list of tensors."""

    def __init__(self, native, keepalive: Sequence = (), input_strides: Sequence = (),
                 mutated_inputs: Sequence[int] = ()):  # fmt: skip
        self._native = native
        self._keepalive = list(keepalive)
        # Static strides the kernels index inputs with (None where symbolic): used to restride.
        self._strides = list(input_strides)
        # Inputs the model writes in place (a decode step's caches): never restrided, since a
        # copy would take the write; the runtime refuses other strides instead.
        self._mutated = frozenset(mutated_inputs)
        info = native.info()
        self.inputs = info["inputs"]
        self.outputs = info["outputs"]
        dev_type, dev_id = info["device"]
        self.device = torch.device("cpu") if dev_type == 1 else torch.device("cuda", dev_id)

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        if len(tensors) != len(self.inputs):
            raise TypeError(f"the model takes {len(self.inputs)} tensors, got {len(tensors)}")
        if config.restride_inputs and self._strides:
            tensors = [t if i in self._mutated else _restride(t, s)
                       for i, (t, s) in enumerate(zip(tensors, self._strides))]  # fmt: skip
        capsules = [dlpack.to_dlpack(t.detach()) for t in tensors]
        stream = 0
        if self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device).cuda_stream
        return [dlpack.from_dlpack(c) for c in self._native.run(capsules, stream)]

    def __repr__(self) -> str:
        names = ", ".join(i["name"] for i in self.inputs)
        return f"<ember.cpp_wrapper.CompiledModel ({names}) on {self.device}>"


def _restride(t: torch.Tensor, strides) -> torch.Tensor:
    """`t` with the compiled strides (a copy only when they differ), as the Python wrapper does."""
    if strides is None or t.dim() != len(strides):
        return t
    if all(
        size <= 1 or want is None or got == want
        for size, got, want in zip(t.shape, t.stride(), strides)
    ):
        return t
    if any(w is None for w in strides):
        return t.contiguous()
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _static_strides(meta: TensorMeta) -> tuple:
    return tuple(int(s) if s.is_Integer else None for s in meta.strides)


def _native():
    from . import _C

    return _C


def load_artifact(
    artifact: CompiledArtifact,
    constants: Optional[Mapping[str, torch.Tensor]] = None,
    *,
    device_index: Optional[int] = None,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
) -> CompiledModel:
    """Compile `artifact`'s C++ wrapper (cached) and load it in process: a callable over tensors.

    `constants` maps each buffer of kind "constant" to its tensor (borrowed without a copy when it
    already has the artifact's dtype, layout and device); naming an input there freezes it (see
    `freeze_inputs`), so the callable then takes only the remaining inputs.
    """
    artifact, constants = bind_constants(artifact, constants)
    device = torch.device(artifact.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device(
            "cuda", device_index if device_index is not None else torch.cuda.current_device()
        )
    names, tensors = [], []
    for b in artifact.buffers:
        if b.kind != "constant":
            continue
        if b.name not in constants:
            raise KeyError(f"the artifact needs constant {b.name!r}; pass it in `constants`")
        names.append(b.name)
        tensors.append(materialise_constant(constants[b.name], b.meta, device))
    library = build_model_library(artifact, include_dirs=include_dirs, defines=defines)
    capsules = [dlpack.to_dlpack(t) for t in tensors]
    native = _native().load_library(
        str(library), names, capsules, device.index or 0, _cublas_path(device)
    )
    strides = [_static_strides(artifact.buffer(n).meta) for n in artifact.inputs]
    return CompiledModel(native, keepalive=tensors, input_strides=strides)


def load_package(path: os.PathLike | str, *, device_index: int = 0) -> CompiledModel:
    """Load an AOT package written by `package` into this process."""
    native = _native().load_package(str(path), device_index, _cublas_path(torch.device("cuda")))
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    strides = [
        tuple(s if isinstance(s, int) else None for s in i["strides"]) for i in manifest["inputs"]
    ]
    return CompiledModel(native, input_strides=strides,
                         mutated_inputs=manifest.get("mutated_inputs", ()))  # fmt: skip


def _cublas_path(device: torch.device) -> str:
    """libcublas from the nvidia-cublas wheel when installed (the runtime searches otherwise)."""
    if device.type != "cuda":
        return ""
    try:
        import nvidia.cublas as cublas_pkg  # noqa: F401  (the wheel torch's CUDA builds depend on)
    except ImportError:
        return ""
    for root in cublas_pkg.__path__:
        for lib in sorted(Path(root, "lib").glob("libcublas.so*")):
            return str(lib)
    return ""
