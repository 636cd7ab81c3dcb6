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


@pytest.mark.parametrize("damage", ["truncate", "checksum", "version", "foreign_key"])
def test_bad_entry_is_recompiled(cache_on, damage):
    x = torch.randn(3, 6)
    gm = trace_to_prims(_fn, x)
    compile_prims(gm, [x])
    (path,) = (cache_on / "graphs").glob("*.json")
    text = path.read_text()
    entry = json.loads(text)
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    else:
        if damage == "checksum":
            entry["payload"]["source"] = (
                entry["payload"]["source"].replace("softmax", "x") + "\nraise SystemExit"
            )
        elif damage == "version":
            entry["versions"] = "ir=0 inductor=0"
        else:
            entry["key"] = "0" * 64
        path.write_text(json.dumps(entry))
    metrics.reset()
    again = compile_prims(gm, [x])
    assert metrics.cache_hits == 0 and metrics.cache_misses == 1
    torch.testing.assert_close(again(x), _fn(x))
    assert json.loads(path.read_text())["checksum"] == entry["checksum"] or damage != "checksum"


def test_key_depends_on_config(cache_on, monkeypatch):
    x = torch.randn(3, 6)
    gm = trace_to_prims(_fn, x)
    k1 = cache.graph_key(gm, [x])
    monkeypatch.setattr(config, "fuse", False)
    assert cache.graph_key(gm, [x]) != k1
