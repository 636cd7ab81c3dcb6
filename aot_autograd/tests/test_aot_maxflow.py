"""Max-flow / min-cut against brute force on small random networks."""

import itertools
import random

import pytest

from ember.aot_autograd.maxflow import INF, FlowNetwork


def _brute_min_cut(n, edges):
    best = INF * 4
    inner = list(range(1, n - 1))
    for r in range(len(inner) + 1):
        for subset in itertools.combinations(inner, r):
            side = {0, *subset}
            best = min(best, sum(c for u, v, c in edges if u in side and v not in side))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    edges = [
        (u, v, rng.choice([0, 1, 2, 5, 9, INF]))
        for u in range(n)
        for v in range(n)
        if u != v and rng.random() < 0.4
    ]
    net = FlowNetwork()
    for i in range(n):
        net.vertex(i)
    for u, v, c in edges:
        net.add_edge(u, v, c)
    value, cut = net.min_cut(0, n - 1)
    assert value == _brute_min_cut(n, edges)
    # The reported cut edges carry exactly the flow value.
    caps = {}
    for u, v, c in edges:
        caps[(u, v)] = caps.get((u, v), 0) + c
    assert sum(caps[e] for e in set(cut)) == value


def test_long_chain_has_no_recursion_limit():
    net = FlowNetwork()
    n = 5000
    for i in range(n - 1):
        net.add_edge(i, i + 1, 10 + (i % 7 == 3) * -9)
    value, cut = net.min_cut(0, n - 1)
    assert value == 1
    assert len(cut) == 1


def test_source_side_after_cut():
    net = FlowNetwork()
    net.add_edge("s", "a", 3)
    net.add_edge("a", "t", 1)
    net.add_edge("s", "b", 1)
    net.add_edge("b", "t", 3)
    assert net.max_flow("s", "t") == 2
    assert net.source_side("s") == {"s", "a"}
