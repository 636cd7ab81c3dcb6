"""The on-disk compile cache: a compiled program by graph text, inputs, configuration and versions.

An entry is one file written atomically: a JSON header line (its own key, a format version, the
component versions and the SHA-256 of the payload's text), then the payload as JSON text. The
checksum is of the bytes read, so a hit hashes them and parses once. Anything that does not check
out (a corrupt, truncated, foreign or stale entry) is ignored, counted as a miss and recompiled.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import marshal
import sys
import types

import torch
from torch import fx

from ember.ir import cache_files
from ember.ir import (INPUT_UPDATES_META_KEY, NODE_META_KEY, CompiledArtifact, TensorMeta,
                       from_json, target_name, to_json)
from ember.ir.symbols import expr_from_json

from . import metrics
from .codegen_common import KernelSource
from .config import config, fingerprint
from .runtime import cache_dir
from .wrapper import Program

log = logging.getLogger("ember.inductor")
FORMAT = 3  # 3: header line + payload text (2: one JSON object)


def _versions() -> str:
    """What an entry must have been written by: the component versions and, since a version is
    not bumped for every change, a hash of the sources that generate code (a fixed codegen bug
    must not live on in old entries)."""
    import ember.inductor

    from .fx_cache import source_fingerprint

    return (
        f"ir={ember.ir.__version__} inductor={ember.inductor.__version__} torch={torch.__version__}"
        f" sources={source_fingerprint()[:16]}"
    )


def graph_text(gm: fx.GraphModule) -> str:
    """The graph with targets by qualified name and every node's meta: what the key hashes."""
    lines = []
    for n in gm.graph.nodes:
        target = target_name(n.target) if n.op == "call_function" else str(n.target)
        lines.append(
            f"{n.name} = {n.op} {target} {n.args!r} {n.kwargs!r} :: {n.meta.get(NODE_META_KEY)!r}"
        )
    return "\n".join(lines)


def graph_key(gm: fx.GraphModule, example_inputs) -> str:
    """The cache key of compiling `gm` for these inputs with this configuration."""
    metas = [p.meta.get(NODE_META_KEY) for p in gm.graph.find_nodes(op="placeholder")]
    metas += [None] * (len(example_inputs) - len(metas))
    inputs = [_input_key(t, m) for t, m in zip(example_inputs, metas)]
    text = "\n".join([graph_text(gm), repr(inputs), fingerprint(), _versions(), f"format={FORMAT}"])
    updates = gm.meta.get(INPUT_UPDATES_META_KEY)
    if updates:  # outputs the runtime writes into inputs: may be written in place
        text += f"\nupdates={sorted(updates.items())}"
    if config.max_autotune_gemm:  # matmul templates were chosen (and sized) for this GPU
        devices = {str(getattr(t, "device", "")) for t in example_inputs}  # (data or not)
        gpus = sorted(d for d in devices if d.startswith("cuda"))
        text += "".join(f"\n{d}={torch.cuda.get_device_name(d)}" for d in gpus)
    return hashlib.sha256(text.encode()).hexdigest()


def _input_key(t, meta):
    if not isinstance(t, torch.Tensor):
        return repr(t)
    if isinstance(meta, TensorMeta) and not meta.is_static():
        # symbolic sizes (in the graph text): one program for every size, whatever the example's
        return (t.dim(), t.dtype, str(t.device))
    return (tuple(t.shape), t.stride(), t.dtype, str(t.device))


def _path(key: str):
    return cache_dir() / "graphs" / f"{key}.json"


def program_to_json(program: Program) -> dict:
    """A compiled program as JSON-able data (wrapper source, kernels, artifact)."""
    return {
        "source": program.source,
        "num_outputs": program.num_outputs,
        "out_spec": program.out_spec,
        "kernels": [
            dict(
                name=k.name,
                language=k.language,
                source=k.source,
                args=list(k.args),
                arg_types=list(k.arg_types),
                meta=[[name, value] for name, value in k.meta],  # launch configs, numels
            )
            for k in program.kernels
        ],  # fmt: skip
        "artifact": to_json(program.artifact),  # (step sizes as {"expr": ...}: ir's codec)
    }


# "view" and "kernel" steps carry sizes as they are (ints, or sympy expressions with dynamic
# shapes), where the other steps' arguments are JSON already: ir's codec writes their
# expressions as {"expr": ...}, read back here as expressions.
_RAW_STEPS = ("view", "kernel")


def _decode_sizes(v):
    if isinstance(v, dict) and set(v) == {"expr"}:
        return expr_from_json(v["expr"])
    return [_decode_sizes(x) for x in v] if isinstance(v, list) else v


def _sizes_as_json(artifact: dict, convert) -> dict:
    for step in artifact.get("steps", ()):
        if step.get("kind") in _RAW_STEPS:
            step["args"] = convert(step["args"])
    return artifact


def program_from_json(payload: dict) -> Program:
    """The inverse of `program_to_json` (KeyError/TypeError/ValueError on malformed data)."""
    kernels = [KernelSource(k["name"], k["language"], k["source"], tuple(k["args"]),
                            tuple(k["arg_types"]), meta=tuple(tuple(m) for m in k["meta"]))
               for k in payload["kernels"]]  # fmt: skip
    artifact = from_json(CompiledArtifact, _sizes_as_json(payload["artifact"], _decode_sizes))
    return Program(payload["source"], kernels, artifact, payload["num_outputs"],
                   payload["out_spec"])  # fmt: skip


def write_entry(path, key: str, payload: dict) -> None:
    """Write `payload` under `key` atomically, after a header with its format, versions and
    checksum."""
    body = json.dumps(payload, sort_keys=True)  # escapes newlines: the header is the first line
    header = {"format": FORMAT, "key": key, "versions": _versions(),
              "checksum": hashlib.sha256(body.encode()).hexdigest()}  # fmt: skip
    # a read-only or full cache must not fail the compile: one warning a process
    cache_files.try_write_atomic(path, json.dumps(header, sort_keys=True) + "\n" + body)


def read_entry(path, key: str) -> dict:
    """The payload stored at `path` for `key`; FileNotFoundError when absent, ValueError (or
    KeyError/TypeError/OSError) when it is not trustworthy."""
    head, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    ok = (isinstance(header, dict) and header.get("format") == FORMAT
          and header.get("key") == key and header.get("versions") == _versions()
          and header.get("checksum") == hashlib.sha256(body).hexdigest())  # fmt: skip
    if not ok:
        raise ValueError("checksum, key or version mismatch")
    return json.loads(body)


def store(key: str, program: Program) -> None:
    """Write `program` under `key` (atomically)."""
    if config.cache:
        try:
            write_entry(_path(key), key, program_to_json(program))
        except (TypeError, ValueError) as e:  # what cannot be written is compiled again
            log.warning("ember.inductor: a program is not cached: %s", e)


def load(key: str) -> Program | None:
    """The program stored under `key`, or None when absent or not trustworthy."""
    if not config.cache:
        return None
    path = _path(key)
    try:
        program = program_from_json(read_entry(path, key))
    except FileNotFoundError:
        metrics.cache_misses += 1
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ember.inductor: ignoring a bad compile cache entry %s (%s)", path.name, e)
        metrics.cache_misses += 1
        return None
    metrics.cache_hits += 1
    return program


# Wrappers' code objects, marshalled as .pyc files are: by interpreter (its magic number and
# cache tag) and by the whole source's hash. Compiling a wrapper (one line per buffer and kernel
# launch, kernel sources inlined) is most of what loading a cached program costs.
_CODE_TAG = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"


def wrapper_code(source: str) -> types.CodeType:
    """`compile(source)` of a wrapper, loaded from disk when an earlier compile of the very same
    source (in any process of this interpreter) left it there; each file carries the SHA-256
    of its bytes, and one that does not check out is compiled again."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    filename = f"<ember.inductor wrapper {digest[:12]}>"
    if not config.cache:
        return compile(source, filename, "exec")
    path = cache_dir() / "wrappers" / f"{digest}.{_CODE_TAG}.bin"
    try:
        data = path.read_bytes()
        body = data[32:]
        if data[:32] != hashlib.sha256(body).digest():
            raise ValueError("checksum mismatch")
        code = marshal.loads(body)
        if not isinstance(code, types.CodeType) or code.co_filename != filename:
            raise ValueError("not this wrapper's code")
        return code
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, TypeError) as e:
        log.warning("ember.inductor: ignoring a bad wrapper code file %s (%s)", path.name, e)
    code = compile(source, filename, "exec")
    body = marshal.dumps(code)
    cache_files.try_write_atomic(path, hashlib.sha256(body).digest() + body)
    return code
