"""Live tensor bytes through a training step on CPU, for eager and compiled models alike.

`LiveBytes` is a TorchDispatchMode that sees every op's output (eager ops, autograd's, and inside
a compiled wrapper its `empty_strided` buffers and extern calls). Each new storage is recorded with
its size and a weak reference; after every op the bytes of the storages still alive are summed, so
the peak is taken right after each allocation, and a storage counts as freed once nothing holds it
(the autograd engine releasing a saved tensor included). Storages alive before the mode started
(parameters, optimizer state, the input) are the base and are not counted.

`step_profile` runs forward, loss and backward under it and returns the live bytes after the
forward (the saved set plus outputs) and the peak of the forward and of the whole step.

`wrapper_peak` is the static counterpart for one generated Python wrapper: it replays the
wrapper's `empty_strided(...)`, `reinterpret(...)` and `del` lines and returns the live-bytes peak
of the buffers it allocates (externs' own outputs are not in the text, so not counted).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Tracks storages created while active; `peak` / `live()` in bytes above the base."""

    def __init__(self):
        super().__init__()
        self.tracked: dict[int, tuple[StorageWeakRef, int]] = {}  # storage key -> (ref, nbytes)
        # Storages that existed before (parameters, the input), seen through an op's inputs:
        # a view of one (a transposed weight) allocates nothing.
        self.base: dict[int, StorageWeakRef] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._prune()
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                s = t.untyped_storage()
                if s._cdata not in self.tracked and s._cdata not in self.base:
                    self.base[s._cdata] = StorageWeakRef(s)
        out = func(*args, **(kwargs or {}))
        self._prune()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        self.peak = max(self.peak, self.current)
        return out

    def _track(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        key = s._cdata
        if key in self.tracked or key in self.base or s.nbytes() == 0:
            return
        self.tracked[key] = (StorageWeakRef(s), s.nbytes())
        self.current += s.nbytes()

    def _prune(self) -> None:
        # A freed storage's address may come back for a new one: forget it as soon as it dies.
        dead = [k for k, (ref, _) in self.tracked.items() if ref.expired()]
        for k in dead:
            self.current -= self.tracked.pop(k)[1]
        for k in [k for k, ref in self.base.items() if ref.expired()]:
            del self.base[k]

    def live(self) -> int:
        """Bytes of tracked storages alive now."""
        self._prune()
        return self.current


@dataclasses.dataclass
class StepMemory:
    after_forward: int  # live bytes once the forward (and loss) returned: saved set + outputs
    peak_forward: int
    peak_step: int  # the whole step, backward included

    def mib(self) -> str:
        m = 1 << 20
        return (f"after fw {self.after_forward / m:.2f} MiB, peak fw {self.peak_forward / m:.2f}, "
                f"peak step {self.peak_step / m:.2f}")  # fmt: skip


def step_profile(model: Callable, inputs: tuple, loss_fn: Callable, params,
                 autocast: torch.dtype | None = None) -> StepMemory:  # fmt: skip
    """Live bytes of one forward + loss + backward (gradients start as None)."""
    for p in params:
        p.grad = None
    mode = LiveBytes()
    with mode:
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = loss_fn(model(*inputs))
        after_fw, peak_fw = mode.live(), mode.peak
        loss.backward()
        del loss
    return StepMemory(after_fw, peak_fw, mode.peak)


_ALLOC = re.compile(r"^\s*(\w+) = empty_strided\(\((.*?)\), \((.*?)\), (torch\.\w+), '([^']*)'\)")
_REUSE = re.compile(r"^\s*(\w+) = reinterpret\((\w+),")
_DEL = re.compile(r"^\s*del (.+)$")


def wrapper_peak(source: str) -> int:
    """Live-bytes peak of the buffers a generated wrapper allocates (inputs not counted)."""
    owner: dict[str, str] = {}  # variable -> the allocation it holds
    refs: dict[str, int] = {}  # allocation -> variables holding it
    size: dict[str, int] = {}
    live = peak = 0
    for line in source.splitlines():
        if m := _ALLOC.match(line):
            name, sizes, strides, dtype = m.group(1), m.group(2), m.group(3), m.group(4)
            sz = [int(x) for x in sizes.split(",") if x.strip()]
            st = [int(x) for x in strides.split(",") if x.strip()]
            numel = 1 + sum((a - 1) * b for a, b in zip(sz, st)) if all(sz) else 0
            size[name] = numel * getattr(torch, dtype.split(".")[1]).itemsize
            owner[name], refs[name] = name, 1
            live += size[name]
            peak = max(peak, live)
        elif (m := _REUSE.match(line)) and m.group(2) in owner:
            owner[m.group(1)] = owner[m.group(2)]
            refs[owner[m.group(2)]] += 1
        elif m := _DEL.match(line):
            for var in (v.strip() for v in m.group(1).split(",")):
                alloc = owner.pop(var, None)
                if alloc is not None:
                    refs[alloc] -= 1
                    if refs[alloc] == 0:
                        live -= size[alloc]
    return peak


_ASSIGN = re.compile(r"^    (\w+(?:, \w+)*) = ")
_RETURN = re.compile(r"^    return \((.*)\)")


def unreleased(source: str) -> list[str]:
    """Variables of a generated wrapper's `call` that hold a value to the end of the graph
    without being returned: each pins its memory for the rest of the call."""
    body = source[source.index("def call(args):"):].splitlines()[1:]
    assigned, released = [], set()
    for line in body:
        if m := _ASSIGN.match(line):
            assigned += [v for v in m.group(1).split(", ") if v not in assigned]
        elif m := _DEL.match(line):
            released.update(v.strip() for v in m.group(1).split(","))
        elif m := _RETURN.match(line):
            released.update(v.strip() for v in m.group(1).split(",") if v.strip())
    return [v for v in assigned if v not in released]
