"""Maximum flow and minimum s-t cut (Dinic's algorithm) on a small integer-capacity network.

The partitioner builds one network per joint graph (two vertices per fx node), so graphs of a few
thousand nodes must cut in well under a second in pure Python: the search is iterative (joint
graphs are deep chains that would overflow Python's recursion limit) and works on flat lists.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable

# Capacity of an edge that must never be cut. Larger than any sum of tensor sizes we will meet, and
# an int so that all arithmetic stays exact.
INF = 1 << 62


class FlowNetwork:
    """A directed graph with integer edge capacities, vertices named by any hashable key."""

    def __init__(self):
        self._index: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._adj: list[list[int]] = []
        self._to: list[int] = []
        self._cap: list[int] = []
        self._orig: list[int] = []

    def vertex(self, key: Hashable) -> int:
        """The index of vertex `key`, created on first use."""
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = len(self._keys)
            self._keys.append(key)
            self._adj.append([])
        return idx

    def add_edge(self, u: Hashable, v: Hashable, capacity: int) -> None:
        """Add edge u -> v (with its zero-capacity residual twin at index ^ 1)."""
        if capacity < 0:
            raise ValueError("capacities must be non-negative")
        a, b = self.vertex(u), self.vertex(v)
        for src, dst, cap in ((a, b, capacity), (b, a, 0)):
            self._adj[src].append(len(self._to))
            self._to.append(dst)
            self._cap.append(cap)
            self._orig.append(cap)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self._keys)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if self._cap[e] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if level[t] >= 0 else None

    def _augment(self, s: int, t: int, level: list[int], cursor: list[int]) -> int:
        """Push flow along one shortest augmenting path of the level graph; 0 when none is left."""
        stack, path = [s], []
        adj, to, cap = self._adj, self._to, self._cap
        while stack:
            u = stack[-1]
            if u == t:
                pushed = min(cap[e] for e in path)
                for e in path:
                    cap[e] -= pushed
                    cap[e ^ 1] += pushed
                return pushed
            edges = adj[u]
            while cursor[u] < len(edges):
                e = edges[cursor[u]]
                v = to[e]
                if cap[e] > 0 and level[v] == level[u] + 1:
                    stack.append(v)
                    path.append(e)
                    break
                cursor[u] += 1
            else:
                # Dead end: never enter u again in this phase, and skip the edge that led here.
                level[u] = -1
                stack.pop()
                if path:
                    path.pop()
                    cursor[stack[-1]] += 1
        return 0

    def max_flow(self, source: Hashable, sink: Hashable) -> int:
        """The value of a maximum flow from `source` to `sink` (the residual graph keeps it)."""
        s, t = self.vertex(source), self.vertex(sink)
        total = 0
        while (level := self._levels(s, t)) is not None:
            cursor = [0] * len(self._keys)
            while pushed := self._augment(s, t, level, cursor):
                total += pushed
        return total

    def source_side(self, source: Hashable) -> set[Hashable]:
        """Keys of the vertices reachable from `source` in the residual graph (after max_flow)."""
        s = self.vertex(source)
        seen = {s}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if self._cap[e] > 0 and v not in seen:
                    seen.add(v)
                    queue.append(v)
        return {self._keys[i] for i in seen}

    def min_cut(
        self, source: Hashable, sink: Hashable
    ) -> tuple[int, list[tuple[Hashable, Hashable]]]:
        """(cut value, the saturated edges from the source side to the sink side)."""
        value = self.max_flow(source, sink)
        side = {self._index[k] for k in self.source_side(source)}
        cut = []
        for u in side:
            for e in self._adj[u]:
                if self._orig[e] > 0 and self._to[e] not in side:
                    cut.append((self._keys[u], self._keys[self._to[e]]))
        return value, cut
