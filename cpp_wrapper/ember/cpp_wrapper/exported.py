"""Packages from `ember.export`: an exported program's prim graph compiled into an artifact.

ember.cpp_wrapper imports only ember.ir, so the compiler and the exported-program loader are found
through a registry of "module:attribute" strings, imported at first use (as ember.dynamo finds its
backends). The compiler entry is `ember.inductor.compile_prims(prim_gm, example_inputs)`: the
inductor proper (no aot_autograd around it), which returns a `CompiledGraph` whose `.artifact` is
the `CompiledArtifact` of the graph, inputs named `arg0..argN` in placeholder order. An exported
program's placeholders are its inputs then its constants, so the trailing artifact inputs are the
constants, which `package` freezes into weights. Extern ops the runtime lacks on the target device
(convolution on CUDA, see config.conv_as_matmul) are first rewritten by the registry entry
"decompose_externs" (ember.primtorch) into prims and the matmul externs. The compile runs inside
the registry entry "packaging" (`ember.inductor.config.for_package`), under which inductor lowers
calls the runtime cannot make into kernels of its own where it has them (CUDA attention as
Ember's Triton flash kernel).

An exported program is read by duck typing (`graph_module`, `inputs`, `constants`,
`example_inputs()`), the attributes `ember.dynamo.ExportedProgram` has.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ember.ir import CompiledArtifact, dtype_name

from .config import config
from .errors import UnsupportedArtifactError

_ENTRIES = {
    "compile_prims": "ember.inductor:compile_prims",
    "attach_cubins": "ember.inductor.triton_aot:attach_cubins",
    "compile_kernel": "ember.inductor.triton_aot:compile_kernel",  # the decode packages' kernels
    "buffer_ptr_type": "ember.inductor.codegen_common:buffer_ptr_type",  # and its pointer types
    "decompose_externs": "ember.primtorch:decompose_externs",
    "export": "ember.dynamo:export",  # decode.py exports the user's step itself
    "Dim": "ember.dynamo:Dim",  # and gives a prefill step's new tokens a dynamic length
    "load_exported": "ember.dynamo:load_exported",
    "packaging": "ember.inductor.config:for_package",
}
_RESOLVED: dict[str, Any] = {}

SIGNATURE_FILE = "signature.json"


def resolve_entry(name: str):
    """The callable a registry entry names, imported at first use."""
    if name not in _RESOLVED:
        module_name, attr = _ENTRIES[name].split(":")
        try:
            _RESOLVED[name] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise UnsupportedArtifactError(
                f"packaging an exported program needs {_ENTRIES[name]}, which is not available "
                f"({e}); install that component or pass a CompiledArtifact"
            ) from None
    return _RESOLVED[name]


def is_exported_program(obj) -> bool:
    """Whether `obj` looks like an ExportedProgram (or is a directory one was saved to)."""
    if isinstance(obj, (str, os.PathLike)):
        return (Path(obj) / "program.json").is_file()
    names = ("graph_module", "inputs", "constants", "example_inputs")
    return all(hasattr(obj, n) for n in names) and not hasattr(obj, "artifact")


def load_exported(path: os.PathLike | str):
    """An exported program saved by `ExportedProgram.save` (read by ember.dynamo)."""
    return resolve_entry("load_exported")(path)


def compile_exported(exported, device: str = "cpu") -> tuple[CompiledArtifact, dict]:
    """The artifact for an exported program and its constants keyed by artifact input name."""
    want = torch.device(device).type
    for spec in exported.inputs:
        if torch.device(spec.meta.device).type != want:
            raise ValueError(f"input {spec.name} of the exported program is on "
                             f"{spec.meta.device}; export with {want} tensors to package for "
                             f"{want}")  # fmt: skip
    gm = exported.graph_module
    externs = config.decomposed_externs(want)
    if externs:  # the runtime has no kernel for these on `want`: generated code + matmuls instead
        gm = resolve_entry("decompose_externs")(gm, externs)
    with resolve_entry("packaging")():  # lowerings that replace calls into torch apply
        compiled = resolve_entry("compile_prims")(gm, exported.example_inputs())
    artifact = getattr(compiled, "artifact", compiled)
    if isinstance(artifact, CompiledArtifact) and (want == "cuda" or any(
            k.language == "triton" and not k.binary for k in artifact.kernels)):  # fmt: skip
        # the runtime launches cubins: Ember's kernels and the user's Triton launches
        artifact = resolve_entry("attach_cubins")(compiled)
    if not isinstance(artifact, CompiledArtifact):
        raise UnsupportedArtifactError(f"the compiler returned {type(artifact).__name__}, "
                                       "not a CompiledArtifact")  # fmt: skip
    declared = {s.name: s for s in getattr(exported, "symbols", ())}
    if declared:  # the compiler names the sizes; the export's Dims give their ranges
        artifact = dataclasses.replace(
            artifact, symbols=tuple(declared.get(s.name, s) for s in artifact.symbols))
    n_in, consts = len(exported.inputs), list(exported.constants.values())
    if len(artifact.inputs) != n_in + len(consts):
        raise UnsupportedArtifactError(
            f"the artifact has {len(artifact.inputs)} inputs; the exported program has {n_in} "
            f"inputs and {len(consts)} constants"
        )
    return artifact, dict(zip(artifact.inputs[n_in:], consts))


def write_signature(exported, artifact: CompiledArtifact, path: Path) -> None:
    """signature.json: which package input is which argument, and where the weights came from."""
    n_in = len(exported.inputs)
    doc = {
        "inputs": [{"buffer": b, "name": s.name, "dtype": dtype_name(s.meta.dtype)}
                   for b, s in zip(artifact.inputs[:n_in], exported.inputs)],  # fmt: skip
        "outputs": [{"buffer": b, "index": i} for i, b in enumerate(artifact.outputs)],
        "constants": {b: getattr(exported, "constant_fqns", {}).get(n, n)
                      for b, n in zip(artifact.inputs[n_in:], exported.constants)},  # fmt: skip
    }
    out_spec = getattr(exported, "out_spec", None)
    if out_spec is not None:
        doc["out_spec"] = pytree.treespec_dumps(out_spec)  # the result's structure
    path.write_text(json.dumps(doc, indent=1) + "\n")
