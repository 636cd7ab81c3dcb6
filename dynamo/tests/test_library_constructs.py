"""Constructs of library code that captured programs run into (torch's record_function, called
by DDP's forward, has both): type annotations built at run time (`Optional[X]`,
`torch.jit.annotate(List[int], [])`, the annotation of `self.x: Optional[T] = v`) are evaluated
while tracing, not traced through typing's internals (an f-string over the form broke the graph);
profiler ranges (`with record_function(...)`) are traced through as if absent."""

from typing import Dict, List, Optional, Union

import pytest
import torch

import ember
import ember.dynamo


class Holder:
    def __init__(self, x):
        self.value: Optional[torch.Tensor] = x  # an attribute's annotation is evaluated
        self.names = torch.jit.annotate(List[str], [])


def annotated(x):
    h = Holder(x * 2)
    opt = torch.jit.annotate(Optional[torch.Tensor], None)
    kinds = (Optional[int], Dict[str, List[torch.Tensor]], Union[int, "Later"])
    return h.value + 1 if opt is None else x, kinds


def test_annotations_are_evaluated_without_breaks():
    x = torch.randn(3)
    explained = ember.dynamo.explain(annotated)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    ember.reset()
    out, kinds = ember.compile(annotated, backend="eager")(x)
    ref, ref_kinds = annotated(x)
    torch.testing.assert_close(out, ref)
    assert kinds == ref_kinds


def test_a_bad_annotation_raises_as_eager():
    def bad(x):
        return x + 1, Optional[int, str]

    with pytest.raises(TypeError):
        bad(torch.randn(2))
    with pytest.raises(TypeError):
        ember.compile(bad, backend="eager")(torch.randn(2))


def ranged(x):
    with torch.autograd.profiler.record_function("first"):
        y = x.sin() * 2
    with torch.profiler.record_function("second"):
        return y + 1


def test_profiler_ranges_are_traced_through():
    x = torch.randn(3)
    explained = ember.dynamo.explain(ranged)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    assert explained.ops_per_graph == [["sin", "mul", "add"]]
    ember.reset()
    torch.testing.assert_close(ember.compile(ranged, backend="eager")(x), ranged(x))


def test_library_code_is_skipped_wherever_the_library_lives(monkeypatch):
    # Bazel runs a //tests target from runfiles under bin/tests/: ember's own modules there are
    # still library code; a test file inside a library's folder is still user code
    from ember.dynamo import convert

    root = "/x/bin/tests/t.runfiles/ember/dynamo/ember/dynamo/"
    monkeypatch.setattr(convert, "_SKIP_DIRS", (root,))

    def code_at(path):
        return compile("def f():\n    return 1\n", path, "exec").co_consts[0]

    assert convert.should_skip(code_at(root + "functional_apply.py"))
    assert not convert.should_skip(code_at(root + "tests/test_x.py"))
    assert not convert.should_skip(code_at("/home/user/project/tests/model.py"))
