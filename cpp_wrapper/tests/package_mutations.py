"""Mutations of an Ember package and of its input .npy files, for test_package_mutations.py.

Each Mutation says what it does to one package (files replaced or removed, a filesystem change,
inputs replaced) and what a correct loader must do: "ok" (the meaning is unchanged: run, and
give the right result), "error" (a clean error code with a message), or "either" (an error, or a
right result for what the mutated input means).
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

PACKAGE_FILES = ("manifest.json", "model.so", "weights.bin")


@dataclass
class Mutation:
    name: str
    expect: str  # "ok" | "error" | "either"
    files: dict = field(default_factory=dict)  # file name -> new bytes, or None to remove it
    inputs: Optional[list] = None  # replacement .npy bytes, one per model input
    setup: Optional[Callable[[Path, Path], None]] = None  # (package dir, base package dir)
    status: Optional[int] = None  # the EmberStatus a failure must have, when it is known


def materialise(base: Path, mutation: Mutation, dst: Path) -> Path:
    """A copy of package `base` at `dst` with `mutation` applied (unchanged files hard-linked)."""
    dst.mkdir(parents=True)
    for f in base.iterdir():
        if f.name in mutation.files:
            continue
        try:
            os.link(f, dst / f.name)
        except OSError:
            (dst / f.name).write_bytes(f.read_bytes())
    for name, data in mutation.files.items():
        if data is not None:
            (dst / name).write_bytes(data)
    if mutation.setup is not None:
        mutation.setup(dst, base)
    return dst


# ---- byte-level mutations ---------------------------------------------------------------------


def truncations(name: str, data: bytes, rng: random.Random, n: int) -> list[Mutation]:
    """`name` cut at n points: the edges (0, 1, len-1) and random ones."""
    cuts = {0, 1, len(data) - 1} | {rng.randrange(len(data)) for _ in range(n - 3)}
    return [Mutation(f"{name} truncated to {c} bytes", "error", {name: data[:c]}) for c in cuts]


def byte_flips(name: str, data: bytes, rng: random.Random, n: int, lo=0, hi=None) -> list[Mutation]:
    """n mutations of `name`, each xor-ing one byte in [lo, hi) with a random non-zero mask."""
    hi = len(data) if hi is None else hi
    out = []
    for _ in range(n):
        i, mask = rng.randrange(lo, hi), rng.randrange(1, 256)
        b = bytearray(data)
        b[i] ^= mask
        out.append(Mutation(f"{name} byte {i} ^= {mask:#04x}", "error", {name: bytes(b)}))
    return out


def resizes(name: str, data: bytes) -> list[Mutation]:
    sparse_gib = lambda pkg, _base: os.truncate(pkg / name, 1 << 30)  # noqa: E731
    return [
        Mutation(f"{name} + 1 zero byte", "error", {name: data + b"\0"}),
        Mutation(f"{name} + 4096 bytes", "error", {name: data + bytes(range(256)) * 16}),
        Mutation(f"{name} - 1 byte", "error", {name: data[:-1]}),
        Mutation(f"{name} empty", "error", {name: b""}),
        Mutation(f"{name} doubled", "error", {name: data + data}),
        Mutation(f"{name} grown to 1 GiB (sparse)", "error", {name: data}, setup=sparse_gib),
    ]


# ---- manifest.json ----------------------------------------------------------------------------

HOSTILE_STRINGS = [
    "../../etc/passwd", "/etc/passwd", "", ".", "..", "model.so/..", "./model.so", "a/b",
    "model.so\u0000.txt", "manifest.json", "weights.bin", "model.so", "x" * 5000, "\udc00",
    "float64", "bool", "cuda", "avx512", "-1", "1e9999",
]  # fmt: skip
HOSTILE_NUMBERS = [
    -1, 0, 1, 2, 63, 65, 2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**63), 2**64, 10**30, 1.5, -0.0,
    1e308, "7", None, True, [], {},
]  # fmt: skip


def _paths(value, path=()):
    """Every (path, value) in a JSON document, the root included."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _set(doc, path, value):
    doc = copy.deepcopy(doc)
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return doc


def _delete(doc, path):
    doc = copy.deepcopy(doc)
    target = doc
    for p in path[:-1]:
        target = target[p]
    del target[path[-1]]
    return doc


def _label(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) or "<root>"


def _replacements(value) -> list:
    """Values that put a field of this kind at the edge of, or outside, what it may hold."""
    if isinstance(value, bool):
        return [not value, 0, "true", None]
    if isinstance(value, (int, float)):
        near = [value + 1, value - 1, value * 2 + 1, -value] if isinstance(value, int) else []
        return near + HOSTILE_NUMBERS
    if isinstance(value, str):
        edits = [value + "x", value[:-1]]
        if len(value) == 64:  # a SHA-256: one hex digit changed
            edits.append(value[:-1] + ("0" if value[-1] != "0" else "1"))
        return edits + HOSTILE_STRINGS + [7, None, [value]]
    if isinstance(value, list):
        longer = value + value[-1:] if value else [0]
        return [[], longer, value * 1000 if value else [0] * 1000, value[:-1], {}, "x", None]
    if isinstance(value, dict):
        return [[], "x", 0, None, {}]
    return [0, "x", [], {}]


def manifest_field_mutations(manifest: dict) -> list[Mutation]:
    """Every field of the manifest replaced by hostile values, every key removed."""
    out = []
    for path, value in _paths(manifest):
        if path:
            for new in _replacements(value):
                if new == value and type(new) is type(value):
                    continue
                doc = _set(manifest, path, new)
                shown = repr(new) if len(repr(new)) < 40 else repr(new)[:37] + "..."
                out.append(_manifest_mutation(f"{_label(path)} = {shown}", doc, "error"))
            parent = manifest
            for p in path[:-1]:
                parent = parent[p]
            if isinstance(parent, dict):
                out.append(_manifest_mutation(f"{_label(path)} removed", _delete(manifest, path)))
    return out


def _manifest_mutation(name, doc, expect="error") -> Mutation:
    text = json.dumps(doc, indent=1, allow_nan=True) + "\n"
    return Mutation(f"manifest.json: {name}", expect, {"manifest.json": text.encode()})


# What the loader reads from a manifest (format 1); anything else is ignored. Of these,
# ir_version_written_by and the symbols' ranges are descriptive: the library enforces its ranges.
KNOWN_KEYS = {
    "format", "format_version", "abi_version", "model_abi_version", "ir_version", "device",
    "isa", "artifact_hash", "library", "weights", "inputs", "outputs", "symbols", "constants",
    "file", "size", "sha256", "name", "dtype", "shape", "strides", "storage_offset", "offset",
    "nbytes",
}  # fmt: skip


def _meaningful(doc):
    """The manifest without what the loader ignores or only checks the form of."""
    if isinstance(doc, dict):
        return {k: _meaningful(v) for k, v in doc.items() if k in KNOWN_KEYS}
    if isinstance(doc, list):
        return [_meaningful(v) for v in doc]
    return doc


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def manifest_expectation(original: dict, data: bytes) -> str:
    """What a loader must do with manifest bytes `data`: "ok" for the same document, "either"
    when only ignored or descriptive fields differ, else "error"."""
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        return "error"
    canon = lambda d: json.dumps(d, sort_keys=True)  # noqa: E731 (1 and 1.0 and true differ)
    if canon(doc) == canon(original):
        return "ok"
    if canon(_meaningful(doc)) == canon(_meaningful(original)):
        return "either"
    return "error"


def classify_manifest_mutations(original: dict, mutations: list[Mutation]) -> list[Mutation]:
    """Set the expectation of mutations of manifest.json alone from what their bytes mean."""
    for m in mutations:
        if set(m.files) == {"manifest.json"} and m.files["manifest.json"] is not None:
            m.expect = manifest_expectation(original, m.files["manifest.json"])
    return mutations


def manifest_text_mutations(text: str) -> list[Mutation]:
    """Malformed JSON, and rewritings that keep the document's meaning (which must run)."""
    doc = json.loads(text)
    ok = lambda name, t: Mutation(f"manifest.json: {name}", "ok", {"manifest.json": t.encode()})  # noqa: E731
    bad = lambda name, t: Mutation(f"manifest.json: {name}", "error", {"manifest.json": t.encode()})  # noqa: E731
    first = next(iter(doc))
    return [
        ok("compact", json.dumps(doc, separators=(",", ":"))),
        ok("indent 4", json.dumps(doc, indent=4)),
        ok("keys sorted", json.dumps(doc, sort_keys=True)),
        ok("keys reversed", json.dumps(dict(reversed(list(doc.items()))))),
        ok("CRLF and tabs", json.dumps(doc, indent="\t").replace("\n", "\r\n")),
        ok("unknown key", json.dumps({**doc, "comment": {"x": [1, 2.5, None, True]}})),
        ok("every character escaped", _escape_strings(json.dumps(doc))),
        bad("empty", ""),
        bad("null", "null"),
        bad("an array", "[" + text + "]"),
        bad("BOM", "\ufeff" + text),
        bad("trailing garbage", text + "}"),
        bad("trailing comma", text.rstrip().rstrip("}") + ",}"),
        bad("comment", "// manifest\n" + text),
        bad("single quotes", text.replace('"', "'")),
        bad("NaN", text.replace('"abi_version": 1', '"abi_version": NaN')),
        bad("leading zero", text.replace('"abi_version": 1', '"abi_version": 01')),
        bad("bare minus", text.replace('"abi_version": 1', '"abi_version": -')),
        bad("1.", text.replace('"abi_version": 1', '"abi_version": 1.')),
        bad("deep nesting", '{"format": ' + "[" * 100000 + "]" * 100000 + "}"),
        bad("unterminated string", text[: text.index('"ember-package"') + 5]),
        bad("bad escape", text.replace('"ember-package"', '"ember\\q"')),
        bad("lone surrogate", text.replace('"ember-package"', '"\\ud800x"')),
        bad("control character", text.replace("ember-package", "ember\u0001package")),
        bad(f"duplicate key {first}", text.replace("{", '{"format": "zip", ', 1)),
        bad("64 MiB of spaces", " " * (64 << 20) + text),
    ]


def _escape_strings(text: str) -> str:
    """Every character of every string written as a \\u escape (the same document)."""
    out, in_string, i = [], False, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            in_string = not in_string
            out.append(c)
        elif in_string and c == "\\":
            out.append(text[i : i + 2])
            i += 1
        elif in_string:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def filesystem_mutations() -> list[Mutation]:
    def replace(name, make):
        def setup(pkg: Path, base: Path):
            (pkg / name).unlink()
            make(pkg / name, base / name)

        return setup

    return [
        Mutation("weights.bin -> /dev/zero", "error", setup=replace("weights.bin", lambda p, b: p.symlink_to("/dev/zero"))),
        Mutation("weights.bin is a directory", "error", setup=replace("weights.bin", lambda p, b: p.mkdir())),
        Mutation("model.so is a directory", "error", setup=replace("model.so", lambda p, b: p.mkdir())),
        Mutation("manifest.json is a directory", "error", setup=replace("manifest.json", lambda p, b: p.mkdir())),
        Mutation("manifest.json is a FIFO", "error", setup=replace("manifest.json", lambda p, b: os.mkfifo(p))),
        Mutation("model.so -> /etc/passwd", "error", setup=replace("model.so", lambda p, b: p.symlink_to("/etc/passwd"))),
        Mutation("model.so dangling symlink", "error", setup=replace("model.so", lambda p, b: p.symlink_to(p.parent / "nowhere"))),
        Mutation("model.so removed", "error", {"model.so": None}),
        Mutation("weights.bin removed", "error", {"weights.bin": None}),
        Mutation("manifest.json removed", "error", {"manifest.json": None}),
    ]  # fmt: skip


# ---- input .npy files -------------------------------------------------------------------------


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npy_with_header(header: str, data: bytes, version: int = 1) -> bytes:
    body = header.encode("latin1")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + data
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(body)) + body + data


def _header(descr="<f4", fortran="False", shape="(6, 8)", extra="", end="\n") -> str:
    text = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, {extra}}}"
    return text + " " * ((64 - (10 + len(text) + 1) % 64) % 64) + end


def npy_mutations(x: np.ndarray, rng: random.Random, wrong_shapes, good_shapes) -> list[Mutation]:
    """A model's one input x mutated: dtypes, shapes, malformed headers, truncations, flips."""
    good = npy_bytes(x)
    data = x.tobytes()
    shape = str(tuple(x.shape))
    DTYPE, ARG = 2, 1
    out = []
    for dt in (np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_, np.complex64):
        out.append(Mutation(f"input as {np.dtype(dt).name}", "error", inputs=[npy_bytes(x.astype(dt))], status=DTYPE))
    for s, status in wrong_shapes:
        arr = np.resize(x, s).astype(np.float32)
        out.append(Mutation(f"input of shape {s}", "error", inputs=[npy_bytes(arr)], status=status))
    for s in good_shapes:
        arr = np.random.default_rng(len(s) + sum(s)).standard_normal(s).astype(np.float32)
        out.append(Mutation(f"input of shape {s} (in range)", "ok", inputs=[npy_bytes(arr)]))
    malformed = {
        "big-endian": _npy_with_header(_header(descr=">f4", shape=shape), x.astype(">f4").tobytes()),
        "Fortran order": _npy_with_header(_header(fortran="True", shape=shape), data),
        "object dtype": _npy_with_header(_header(descr="|O", shape=shape), data),
        "void dtype": _npy_with_header(_header(descr="|V4", shape=shape), data),
        "structured dtype": _npy_with_header(_header(descr="[('a', '<f4')]", shape=shape), data),
        "shape of letters": _npy_with_header(_header(shape="(a, b)"), data),
        "negative size": _npy_with_header(_header(shape="(-6, -8)"), data),
        "unterminated shape": _npy_with_header(_header(shape="(6, 8"), data),
        "size 2**32 x 2**32": _npy_with_header(_header(shape="(4294967296, 4294967296, 8)"), data),
        "size 2**62 x 8": _npy_with_header(_header(shape="(4611686018427387904, 8)"), data),
        "size 2**31 x 8": _npy_with_header(_header(shape="(2147483648, 8)"), data),
        "size 10**20": _npy_with_header(_header(shape="(100000000000000000000, 8)"), data),
        "nine dimensions": _npy_with_header(_header(shape="(1, 1, 1, 1, 1, 1, 1, 1, 1)"), data),
        "no descr": _npy_with_header("{'fortran_order': False, 'shape': (6, 8), }\n", data),
        "no shape": _npy_with_header("{'descr': '<f4', 'fortran_order': False, }\n", data),
        "extra key": _npy_with_header(_header(shape=shape, extra="'x': 1, "), data),
        "not a dict": _npy_with_header("[1, 2, 3]\n", data),
        "no newline": _npy_with_header(_header(shape=shape, end=" "), data),
        "NUL in header": _npy_with_header(_header(shape=shape).replace(" }", "\0}"), data),
        "header length 0": _npy_with_header("", data),
        "header length 65535": b"\x93NUMPY\x01\x00\xff\xff" + good[10:],
        "header length 2**32-1": b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + good[10:],
        "version 0": b"\x93NUMPY\x00\x00" + good[8:],
        "version 255": b"\x93NUMPY\xff\x00" + good[8:],
        "not numpy": b"\x93NUMPZ" + good[6:],
        "empty file": b"",
        "data 1 byte short": good[:-1],
        "data 4 bytes long": good + b"\0\0\0\0",
        "data doubled": good + data,
    }
    for name, blob in malformed.items():
        # numpy itself reads trailing bytes after the data as nothing: an error or the right result
        expect = "either" if name in ("data 4 bytes long", "data doubled") else "error"
        out.append(Mutation(f"input: {name}", expect, inputs=[blob]))
    header_end = good.index(b"\n") + 1
    for cut in sorted({0, 5, 8, 9, 10, header_end - 1, header_end} | {rng.randrange(len(good)) for _ in range(12)}):
        out.append(Mutation(f"input truncated to {cut} bytes", "error", inputs=[good[:cut]], status=ARG))
    for m in byte_flips("in.npy", good, rng, 40, 0, header_end) + byte_flips("in.npy", good, rng, 8, header_end):
        out.append(Mutation(m.name, "either", inputs=[m.files["in.npy"]]))
    return out  # fmt: skip
