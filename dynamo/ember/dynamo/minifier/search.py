"""Delta debugging over the nodes of a failing graph: the smallest sub-graph that still fails."""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import logging
import time
import warnings
from typing import Callable, Optional

import torch.fx as fx
import torch.fx.graph_module  # noqa: F401  (its source cache, see _forgetting_sources)

from .graphs import SubGraphs, count_ops

log = logging.getLogger("ember.dynamo.minifier")


class MinifierError(RuntimeError):
    """The graph cannot be minified (it does not fail, or cannot be rebuilt)."""


@dataclasses.dataclass
class Minified:
    """The smallest failing graph found, its inputs (and their specs), and what it took."""

    gm: fx.GraphModule
    inputs: list
    specs: list
    ops_before: int
    ops_after: int
    tests: int
    seconds: float
    complete: bool  # False: the time budget ran out, a smaller graph may exist


def minify(gm: fx.GraphModule, example_inputs, fails: Callable, *, random_inputs: bool = False,
           max_seconds: Optional[float] = None) -> Minified:  # fmt: skip
    """Shrink `gm` while `fails(gm, inputs)` holds: cut the graph after, then before, the failing
    part (binary searches), then drop chunks of nodes, halving the chunk size down to single
    nodes (ddmin). Nodes cut away become inputs of the same metadata, holding the value they had
    (or random values of that spec, with `random_inputs`, as a repro file makes them); inputs
    nothing reads are dropped, outputs are the values no kept node reads."""
    start = time.monotonic()
    with _forgetting_sources():
        graphs = SubGraphs(gm, list(example_inputs), random_inputs)
        search = _Search(graphs, fails, start + max_seconds if max_seconds else None)
        kept = list(graphs.body)
        if not search.fails(kept):
            raise MinifierError("the graph rebuilt from its nodes does not fail")
        kept = search.shortest_prefix(kept)
        kept = search.shortest_suffix(kept)
        kept = search.ddmin(kept)
    small, inputs, nodes = graphs.build(kept)
    return Minified(small, inputs, [graphs.specs[n] for n in nodes], count_ops(gm),
                    count_ops(small), search.tests, time.monotonic() - start,
                    not search.out_of_time)  # fmt: skip


@contextlib.contextmanager
def _forgetting_sources():
    """torch.fx keeps the source of every GraphModule it builds, for tracebacks, for the life of
    the process (linecache and its loader's cache); the search builds one per try."""
    loader = getattr(torch.fx.graph_module, "_loader", None)
    cache = getattr(loader, "eval_cache", None)
    before = set(cache) if isinstance(cache, dict) else None
    try:
        yield
    finally:
        if before is not None:
            for key in set(cache) - before:
                cache.pop(key, None)
                linecache.cache.pop(key, None)


class _Search:
    def __init__(self, graphs: SubGraphs, fails: Callable, deadline: Optional[float]):
        self.graphs = graphs
        self.predicate = fails
        self.deadline = deadline
        self.seen: dict = {}
        self.tests = 0
        self.out_of_time = False

    def fails(self, kept) -> bool:
        """Whether the sub-graph of `kept` fails (memoised; False once out of time, so every
        search keeps the last graph it saw fail)."""
        key = self.graphs.closure(kept)
        if key in self.seen:
            return self.seen[key]
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.out_of_time = True
            return False
        built = self.graphs.build(key)
        result = False
        if built is not None:
            self.tests += 1
            with warnings.catch_warnings():  # a backend's warnings, once per candidate graph
                warnings.simplefilter("ignore")
                try:
                    result = bool(self.predicate(*built[:2]))
                except Exception:  # noqa: BLE001  (a predicate that breaks: not this failure)
                    log.debug("the failure predicate raised", exc_info=True)
        self.seen[key] = result
        log.debug("minifier: %d nodes -> %s", len(key), "fails" if result else "passes")
        return result

    def shortest_prefix(self, kept: list) -> list:
        """The shortest failing kept[:n] (kept[:hi] always fails)."""
        lo, hi = 0, len(kept)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.fails(kept[:mid]) else (mid, hi)
        return kept[:hi]

    def shortest_suffix(self, kept: list) -> list:
        """The shortest failing kept[n:] (kept[lo:] always fails)."""
        lo, hi = 0, len(kept)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fails(kept[mid:]) else (lo, mid)
        return kept[lo:]

    def ddmin(self, kept: list) -> list:
        """Remove chunks of nodes while the rest still fails, chunks halving down to one node."""
        parts = 2
        while len(kept) >= 2:
            size = -(-len(kept) // parts)
            for i in range(0, len(kept), size):
                rest = kept[:i] + kept[i + size :]
                if rest and self.fails(rest):
                    kept, parts = rest, max(parts - 1, 2)
                    break
            else:
                if size == 1:
                    break
                parts = min(len(kept), parts * 2)
        return kept
