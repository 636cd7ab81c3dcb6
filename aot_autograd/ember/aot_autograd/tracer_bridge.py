"""The one place that knows the API of ember.primtorch's tracer (and extends it for RNG)."""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ember.ir import RECOMPUTE_META_KEY
from ember.primtorch import Tracer
from ember.primtorch.decomp._random import counters_used

SEED_PREFIX = "rng_seed"


class AOTTracer(Tracer):
    """primtorch's Tracer, with random ops keyed on a seed that is a graph input (one per device).

    primtorch's random decompositions ask the recorder for `rng_key(count, device)`: we answer
    with a seed placeholder (its trace-time value is a fixed 0, so tracing consumes none of torch's
    random numbers) and an offset that advances by each call's counters, so every random op of one
    program reads distinct counters and the runtime only has to feed one fresh seed per call.
    """

    def __init__(self, **options):
        super().__init__(**options)
        self.seeds: dict[str, tuple[torch.Tensor, int]] = {}  # device -> (seed tensor, offset)

    @property
    def seed_devices(self) -> list[str]:
        return list(self.seeds)

    def rng_key(self, count, device):
        device = str(torch.device(device))
        if device not in self.seeds:
            with untraced():
                seed = torch.zeros((), dtype=torch.int64, device=device)
            placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
            primals = [n for n in placeholders if not n.name.startswith("tangents")]
            where = (
                self.graph.inserting_after(primals[-1])
                if primals
                else self.graph.inserting_before()
            )
            with where:
                self.placeholder(seed, f"{SEED_PREFIX}_{len(self.seeds)}")
            self.seeds[device] = (seed, 0)
        seed, offset = self.seeds[device]
        self.seeds[device] = (seed, offset + counters_used(count))
        return seed, offset

    def dispatch(self, func, args, kwargs):
        """Record one ATen call; inside a recompute region, its nodes carry the region's tag."""
        if not getattr(_region, "recompute", False):
            return super().dispatch(func, args, kwargs)
        # iter(): torch 2.11's reversed node list is not an iterator itself
        last = next(iter(reversed(self.graph.nodes)), None)
        out = super().dispatch(func, args, kwargs)
        for node in reversed(self.graph.nodes):  # the nodes this call appended
            if node is last:
                break
            if node.op == "call_function":
                node.meta[RECOMPUTE_META_KEY] = True
        return out


_region = threading.local()


@contextlib.contextmanager
def recompute_region(on: bool):
    """Ops traced inside (by this thread) are tagged to be recomputed in the backward."""
    prev = getattr(_region, "recompute", False)
    _region.recompute = bool(on)
    try:
        yield
    finally:
        _region.recompute = prev


def new_tracer() -> AOTTracer:
    """A fresh tracer that decomposes into prims as it records."""
    # Tensors the program closes over become inputs, not get_attr constants: graphs that cross a
    # component boundary hold only placeholders and vocabulary calls.
    return AOTTracer(unknown_tensors="placeholder")


def untraced():
    """A context in which tensor ops run without being recorded (making tangent values)."""
    return _disable_current_modes()
