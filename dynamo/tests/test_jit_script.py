"""A torch.jit.script'ed function called from compiled code is traced through the Python function
it was compiled from (transformers' DeBERTa-v2 scripts its attention-scale and position helpers;
a call to the ScriptFunction was a graph break in every layer)."""

import torch

import ember
import ember.dynamo


@torch.jit.script
def scaled_size_sqrt(query: torch.Tensor, scale_factor: int):
    return torch.sqrt(torch.tensor(query.size(-1), dtype=torch.float) * scale_factor)


@torch.jit.script
def expand_like(index: torch.Tensor, query: torch.Tensor, rel: torch.Tensor):
    return index.expand([query.size(0), query.size(1), rel.size(-1)])


def attention_scale(x):
    return x / scaled_size_sqrt(x, 3).to(x.dtype)


def gather_positions(scores, index, query, rel):
    return torch.gather(scores, -1, expand_like(index, query, rel))


def test_scripted_function_is_one_graph_and_matches_eager():
    ember.dynamo.reset()
    x = torch.randn(4, 8)
    report = ember.dynamo.explain(attention_scale)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    compiled = ember.compile(attention_scale, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), attention_scale(x))


def test_scripted_function_with_tensor_arguments():
    ember.dynamo.reset()
    scores, query, rel = torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    index = torch.randint(0, 5, (1, 3, 5))
    args = (scores, index, query, rel)
    compiled = ember.compile(gather_positions, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), gather_positions(*args))
