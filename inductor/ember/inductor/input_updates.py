"""Index writes into a graph's own inputs, in place: a KV cache updated by a few rows per call.

An inference program that writes one of its inputs (`cache.index_copy_(2, pos, k)`,
`cache[:, :, pos] = v`) is traced functionally: `index_put(view(x), [index], values)`, viewed
back to x's shape, is returned as x's new value, which aot_autograd's runtime then copies into
the caller's tensor (gm.meta[INPUT_UPDATES_META_KEY] says which outputs are which inputs' new
values). Run as traced, every call copies the whole cache twice (the index_put's reference
clones it; the runtime copies the result back) however few rows change, and a decoder step
makes two such copies per layer.

`mark_in_place_updates` finds each such output that is `index_put(v, [index], values)` with
accumulate off, seen through views only, where `v` is x seen through views only and nothing
else reads x: the old value has no other reader, so the write may land in x itself. It marks
the index_put (node.meta[IN_PLACE_META]); its lowering then calls `index_put_` on x's view and
returns it; a layout copy on the way to the output (SAME_LAYOUT_VIEW_META) is the view itself
where the layouts agree, so the output is x's memory, and the runtime copies nothing onto
itself. The values
never read x (x has one reader), so running the program twice writes the same elements twice:
a CUDA graph's warm-up run before its capture is harmless.
"""

from __future__ import annotations

import torch.fx as fx

from ember.ir import INPUT_UPDATES_META_KEY, lookup, target_name, vocabulary

IN_PLACE_META = "ember_index_put_in_place"
# a layout copy between such an index_put and the output: the view itself when the layouts agree
SAME_LAYOUT_VIEW_META = "ember_copy_strided_may_view"
# the vocabulary's views, but those that do not address x's elements one to one (a broadcast, a
# view by strides, a reinterpreted dtype)
_NOT_ONE_TO_ONE = frozenset({"prims.broadcast_in_dim", "prims.as_strided",
                             "prims.view_element_type"})  # fmt: skip


def _is_view(name: str) -> bool:
    return name not in _NOT_ONE_TO_ONE and name in vocabulary() and "view" in lookup(name).tags


def _name(n) -> str:
    return target_name(n.target) if isinstance(n, fx.Node) and n.op == "call_function" else ""


def _index_put_behind(n) -> tuple:
    """(the index_put `n` is, seen through views and layout copies, or None; the copies)."""
    copies = []
    while _is_view(_name(n)) or _name(n) == "prims.copy_strided":
        if _name(n) == "prims.copy_strided":
            copies.append(n)
        n = n.args[0]
    return (n if _name(n) == "prims.index_put" else None), copies


def _only_reader_chain(x: fx.Node, end) -> bool:
    """Is `end` x seen through single-reader views, and the index_put the only reader of it?"""
    n = end
    while n is not x:
        if not _is_view(_name(n)) or len(n.users) != 1:
            return False
        n = n.args[0]
    return len(x.users) == 1  # (each node from `end` down had one reader: the loop)


def mark_in_place_updates(gm: fx.GraphModule) -> None:
    """Mark the index_puts that may write into their graph input (module doc)."""
    updates = gm.meta.get(INPUT_UPDATES_META_KEY) or {}
    if not updates:
        return
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    (output,) = gm.graph.find_nodes(op="output")
    outs = output.args[0]
    if not isinstance(outs, (list, tuple)):
        return
    for pos, i in sorted(updates.items()):
        if not (0 <= pos < len(outs) and 0 <= i < len(placeholders)):
            continue
        node, copies = _index_put_behind(outs[pos])
        if node is None or len(node.args) < 3 or IN_PLACE_META in node.meta:
            continue
        a, indices, _values, *rest = node.args
        accumulate = rest[0] if rest else node.kwargs.get("accumulate", False)
        if accumulate is not False or not isinstance(indices, (list, tuple)):
            continue
        if len(indices) != 1 or not isinstance(indices[0], fx.Node):
            continue
        if _only_reader_chain(placeholders[i], a):
            node.meta[IN_PLACE_META] = True
            for c in copies:  # the output is then the input's own memory, not a copy of it
                c.meta[SAME_LAYOUT_VIEW_META] = True


__all__ = ["IN_PLACE_META", "SAME_LAYOUT_VIEW_META", "mark_in_place_updates"]
