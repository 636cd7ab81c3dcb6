"""GraphedCall's per-replay address check, without a GPU: a replay reads the fixed arguments
where the capture saw them, so one that moved is captured again; numbers never move."""

import torch

from ember.inductor import cudagraphs
from ember.inductor.cudagraphs import GraphedCall


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _captured(args):
    """A GraphedCall as a capture of `args` (all fixed) leaves it, with a stand-in graph."""
    g = GraphedCall(run=lambda a: ["ran"])
    ptrs = [cudagraphs._ptr(a) for a in args]
    g.graph, g.outs, g.inputs, g.copied, g.through = _Graph(), [7], [None] * len(args), [], {}
    g._set_fixed(ptrs, [True] * len(args))
    g.recaptured = []
    g._capture = lambda a, p: g.recaptured.append(p) or ["captured"]
    return g


def test_same_addresses_replay_and_a_moved_tensor_captures_again():
    w, b, x = torch.ones(4), torch.zeros(4), torch.ones(2)
    g = _captured([w, 3, b, x])
    assert g._replay_in_order([w, 3, b, x]) == [7] and g.graph.replays == 1
    assert g._replay_in_order([w, 5, b, x]) == [7]  # a number is fixed by the graph's sizes
    moved = torch.zeros(4)
    assert g._replay_in_order([w, 3, moved, x]) == ["captured"]
    assert g.moving == {2} and g.recaptured[-1][2] == moved.data_ptr()
    g = _captured([w, 3, b, x])
    assert g._replay_in_order([w, 3, 4, x]) == ["captured"] and g.moving == {2}

