"""Metadata-only example values: a value's sizes, strides, dtype and device, and no data."""

import pytest
import torch

from ember.ir import TensorMeta
from ember.ir.example import MetadataOnly, example_of, metadata_only, metadata_only_tree


def test_metadata_only_keeps_every_property_a_compiler_reads():
    t = torch.randn(4, 6, requires_grad=True).t()[1:]
    m = metadata_only(t)
    assert type(m) is MetadataOnly
    assert TensorMeta.from_tensor(m) == TensorMeta.from_tensor(t)
    assert (m.shape, m.stride(), m.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
    assert m.device == t.device and m.dtype == t.dtype and m.requires_grad


def test_metadata_only_refuses_to_compute():
    m = metadata_only(torch.ones(3))
    with pytest.raises(RuntimeError, match="has no data"):
        m + 1


def test_example_of_a_meta_and_trees():
    meta = TensorMeta(torch.bfloat16, (2, 3), (3, 1))
    e = example_of(meta)
    assert TensorMeta.from_tensor(e) == meta
    tree = metadata_only_tree((torch.ones(2), [1, torch.zeros(3)]))
    assert type(tree[0]) is MetadataOnly and tree[1][0] == 1 and type(tree[1][1]) is MetadataOnly
