"""Sources as dict keys: chained sources hash once, and equal chains stay interchangeable."""

import dataclasses
import pickle

from ember.dynamo.source import AttrSource, CellSource, FnSource, ItemSource, LocalSource


def _param(block: int, name: str):
    mod = AttrSource(AttrSource(LocalSource("self", 0), "blocks"), "_modules")
    return ItemSource(AttrSource(ItemSource(mod, str(block)), "_parameters"), name)


def test_equal_chains_are_one_key_and_different_ones_are_not():
    keys = {_param(b, n): (b, n) for b in range(20) for n in ("weight", "bias")}
    assert len(keys) == 40
    for b in range(20):
        for n in ("weight", "bias"):
            assert keys[_param(b, n)] == (b, n)  # a fresh, equal chain finds the entry
    assert _param(1, "weight") != _param(1, "bias")
    assert AttrSource(LocalSource("x", 0), "a") != ItemSource(LocalSource("x", 0), "a")
    assert CellSource(FnSource(), 0) == CellSource(FnSource(), 0)
    assert hash(CellSource(FnSource(), 0)) == hash(CellSource(FnSource(), 0))


def test_the_hash_is_remembered_and_follows_the_fields():
    s = _param(3, "weight")
    h = hash(s)
    assert s.__dict__["_hash"] == h and hash(s) == h
    other = dataclasses.replace(s, key="bias")  # a new object: its own hash
    assert "_hash" not in other.__dict__ and other != s and hash(other) == hash(_param(3, "bias"))


def test_a_pickled_source_does_not_carry_this_process_hash():
    s = _param(3, "weight")
    hash(s)
    back = pickle.loads(pickle.dumps(s))
    assert back == s and "_hash" not in back.__dict__ and hash(back) == hash(s)
