"""The compile cache: a second compile hits; a corrupt or foreign entry is recompiled."""

import json

import pytest
import torch
from ember.inductor import cache, compile_prims, config, metrics
from ember.primtorch.trace import trace_to_prims


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "cache_dir", lambda: tmp_path)
    config.cache = True
    return tmp_path


def _fn(a):
    return torch.softmax(a * 3.0, -1) + 1


def test_second_compile_hits_and_runs(cache_on):
    x = torch.randn(4, 10)
    gm = trace_to_prims(_fn, x)
    first = compile_prims(gm, [x])
    assert (metrics.cache_hits, metrics.cache_misses) == (0, 1)
    second = compile_prims(trace_to_prims(_fn, x), [x])
    assert metrics.cache_hits == 1 and second.source == first.source
    torch.testing.assert_close(second(x), _fn(x))


def _unsigned(x, seed):
    return (x * 2).to(torch.uint64), seed[:1], (x > 0).to(torch.uint32)


def test_unsigned_values_are_cached(cache_on):
    # Flash attention's forward returns its philox seed and offset as uint64 tensors, which a
    # training graph saves for the backward: a program with them must store and load.
    x, seed = torch.rand(8) * 10, torch.tensor([3, 5], dtype=torch.uint64)
    compile_prims(trace_to_prims(_unsigned, x, seed), [x, seed])
    again = compile_prims(trace_to_prims(_unsigned, x, seed), [x, seed])
    assert metrics.cache_hits == 1
    for got, want in zip(again(x, seed), _unsigned(x, seed)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def read_entry_file(path):
    """(header, payload) of an entry file: a JSON header line, then the payload's JSON."""
    head, _, body = path.read_text().partition("\n")
    return json.loads(head), json.loads(body)


def write_entry_file(path, header, payload):
    path.write_text(json.dumps(header) + "\n" + json.dumps(payload, sort_keys=True))


@pytest.mark.parametrize("damage", ["truncate", "checksum", "version", "foreign_key", "old_format"])
def test_bad_entry_is_recompiled(cache_on, damage):
    x = torch.randn(3, 6)
    gm = trace_to_prims(_fn, x)
    compile_prims(gm, [x])
    (path,) = (cache_on / "graphs").glob("*.json")
    text = path.read_text()
    header, payload = read_entry_file(path)
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "old_format":  # format 2: one JSON object with the payload inside
        path.write_text(json.dumps({**header, "format": 2, "payload": payload}))
    else:
        if damage == "checksum":
            payload["source"] = payload["source"].replace("softmax", "x") + "\nraise SystemExit"
        elif damage == "version":
            header["versions"] = "ir=0 inductor=0"
        else:
            header["key"] = "0" * 64
        write_entry_file(path, header, payload)
    metrics.reset()
    again = compile_prims(gm, [x])
    assert metrics.cache_hits == 0 and metrics.cache_misses == 1
    torch.testing.assert_close(again(x), _fn(x))
    assert path.read_text() == text  # rewritten whole


def test_entry_checksum_is_of_the_payload_text(cache_on):
    x = torch.randn(3, 6)
    compile_prims(trace_to_prims(_fn, x), [x])
    (path,) = (cache_on / "graphs").glob("*.json")
    head, _, body = path.read_text().partition("\n")
    header = json.loads(head)
    assert header["checksum"] == cache.hashlib.sha256(body.encode()).hexdigest()
    # the same payload written another way (another key order) is not the text checksummed
    path.write_text(head + "\n" + json.dumps(json.loads(body), sort_keys=False, indent=1))
    metrics.reset()
    compile_prims(trace_to_prims(_fn, x), [x])
    assert (metrics.cache_hits, metrics.cache_misses) == (0, 1)


def test_key_depends_on_config(cache_on, monkeypatch):
    x = torch.randn(3, 6)
    gm = trace_to_prims(_fn, x)
    k1 = cache.graph_key(gm, [x])
    monkeypatch.setattr(config, "fuse", False)
    assert cache.graph_key(gm, [x]) != k1


def _counting_compile(monkeypatch):
    compiled = []

    def counting(source, filename, mode, *a, **k):
        compiled.append(filename)
        return compile(source, filename, mode, *a, **k)

    monkeypatch.setattr(cache, "compile", counting, raising=False)
    return compiled


def test_wrapper_code_is_compiled_once_and_loaded_after(cache_on, monkeypatch):
    compiled = _counting_compile(monkeypatch)
    x = torch.randn(4, 10)
    first = compile_prims(trace_to_prims(_fn, x), [x])
    assert len(compiled) == 1 and compiled[0].startswith("<ember.inductor wrapper ")
    (code_file,) = (cache_on / "wrappers").glob("*.bin")
    second = compile_prims(trace_to_prims(_fn, x), [x])
    assert len(compiled) == 1  # the marshalled code, not a compile
    torch.testing.assert_close(second(x), _fn(x))
    torch.testing.assert_close(first(x), _fn(x))
    # a different program compiles (its own file)
    compile_prims(trace_to_prims(lambda a: a.sin() * 2, x), [x])
    assert len(compiled) == 2 and len(list((cache_on / "wrappers").glob("*.bin"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "other_code"])
def test_bad_wrapper_code_is_compiled_again(cache_on, monkeypatch, damage):
    x = torch.randn(4, 10)
    compile_prims(trace_to_prims(_fn, x), [x])
    (code_file,) = (cache_on / "wrappers").glob("*.bin")
    data = code_file.read_bytes()  # a good file
    if damage == "truncate":
        code_file.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        code_file.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    else:  # a valid, checksummed file holding another wrapper's code
        import hashlib
        import marshal

        body = marshal.dumps(compile("def call(args):\n    raise SystemExit\n", "<x>", "exec"))
        code_file.write_bytes(hashlib.sha256(body).digest() + body)
    compiled = _counting_compile(monkeypatch)
    again = compile_prims(trace_to_prims(_fn, x), [x])
    assert len(compiled) == 1
    torch.testing.assert_close(again(x), _fn(x))
    # rewritten whole: the next compile loads it
    compile_prims(trace_to_prims(_fn, x), [x])
    assert len(compiled) == 1


def test_wrapper_code_without_the_cache_compiles(cache_on, monkeypatch):
    config.cache = False
    compiled = _counting_compile(monkeypatch)
    x = torch.randn(4, 10)
    for _ in range(2):
        torch.testing.assert_close(compile_prims(trace_to_prims(_fn, x), [x])(x), _fn(x))
    assert len(compiled) == 2 and not (cache_on / "wrappers").exists()


def test_a_dynamic_program_is_cached_for_every_size(cache_on):
    """A program with symbolic sizes is stored once and loaded for any first size: its view and
    kernel steps keep their size expressions through the entry."""
    from ember.inductor import compile_fx
    from inductor_helpers import dynamic_gm

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    first, other = torch.randn(3, 5, 8), torch.randn(2, 11, 8)
    with torch.no_grad():
        compiled = compile_fx(dynamic_gm(model, [first], [{0: "s0", 1: "s1"}]), [first])
        compiled(first)
        assert metrics.cache_misses >= 1 and metrics.cache_hits == 0
        metrics.reset()
        again = compile_fx(dynamic_gm(model, [other], [{0: "s0", 1: "s1"}]), [other])
        assert metrics.cache_hits >= 1 and metrics.cache_misses == 0
        for x in (first, other, torch.randn(7, 2, 8)):
            torch.testing.assert_close(again(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_program_that_cannot_be_written_is_still_compiled(cache_on, monkeypatch):
    monkeypatch.setattr(cache, "program_to_json", lambda program: {"bad": object()})
    x = torch.randn(4, 10)
    compiled = compile_prims(trace_to_prims(_fn, x), [x])
    torch.testing.assert_close(compiled(x), _fn(x))
    assert not list(cache_on.glob("graphs/*.json"))
