"""CUDA graphs for compiled inference graphs: one replay instead of a launch per kernel.

A compiled wrapper launches every kernel and extern from Python; on a large GPU a transformer's
kernels finish faster than the wrapper can launch them, so the call is bound by the CPU. A CUDA
graph records the launches of one call and replays them with one driver call.

`GraphedCall` wraps the wrapper's `call(args)` of an inference graph with static sizes:
- The first calls run as they are (Triton autotuning and lazy cuBLAS setup happen there). An
  argument whose storage stays the same from call to call (a parameter, a buffer) is read in
  place by the graph; the others (the user's inputs) are copied into tensors the graph owns.
- The call after that is captured (after one warm run on a side stream) and then replayed. If
  capture fails (a kernel that synchronizes, say) or an output shares storage with an input, the
  graph is dropped and every call runs the wrapper as before.
- A replay copies the changing arguments in, checks that the in-place ones are still at their
  addresses, and returns copies of the outputs: the graph's own output tensors are overwritten
  by the next replay, and each call's results must stay the caller's. An in-place argument that
  moves (an input that was the same tensor in the first calls) is copied from then on: the
  graph is captured again, at most `RECAPTURES` times, after which the wrapper runs as before.
- Calls take turns (a lock), and each replay's stream waits for the previous replay's output
  copies: threads or streams sharing a compiled model share the graph's tensors.

Training graphs (`alias_from`): a forward's outputs past its first `alias_from` (the activations
it saves for the backward) and all of a backward's (the gradients) are not copied: each call
returns new tensors over the graph's own memory, which the next replay overwrites. So a replay
first checks that no tensor over that memory is left (the backward has consumed the saved
activations, the optimizer has dropped the gradients): a graph's storages are used by nothing
but the graph. If one is still held (gradients accumulated over several backwards, a second
forward before the first's backward), the call runs the wrapper plainly: fresh memory, as
without graphs. Forward and backward share one memory pool; a graph captured later may hold
its outputs where an earlier one keeps temporaries, so before a replay the outputs of every
graph captured after it must be free too. A saved activation that is a graph's output is an
input the backward's graph reads in place, never a copy.

`GraphsBySize` does the same for a program with symbolic sizes: one `GraphedCall` per set of
sizes and strides of the arguments with symbolic sizes (and of the integer arguments), up to
`MAX_SIZES` of them; calls with other sizes run the wrapper. The graphs share one memory pool, one lock and one ordering
event: a replay only leaves its outputs in the pool, and they are copied out before the next
replay, of any size, may run.
"""

from __future__ import annotations

import logging
import threading

import torch

from ember.ir import TensorMeta
from ember.ir.codec import value_from_json
from ember.primtorch.prims.extern import rng_state_of

from . import metrics

log = logging.getLogger("ember.inductor")

WARM_CALLS = 2  # calls run plainly before capture; the one after is captured
RECAPTURES = 2
MIN_GRAPHED_STEPS = 8  # kernel launches and extern calls a program needs to be worth a graph
MAX_SIZES = 32  # graphs a program with symbolic sizes keeps, one per set of sizes


def _ptr(a):
    """A tensor's address; None for a number (a size), which the graph's sizes fix."""
    return a.data_ptr() if isinstance(a, torch.Tensor) else None


_data_ptr = torch.Tensor.data_ptr


def _graphable(a) -> bool:
    return a.is_cuda if isinstance(a, torch.Tensor) else type(a) in (int, bool)


class SharedPool:
    """What graphs that share one memory pool share: the lock their calls take turns on and the
    event recorded after the last replay's output copies."""

    def __init__(self):
        self.lock = threading.RLock()  # a replay may capture again
        self.done = None
        self.pool = None  # None: a pool of the graph's own
        self.graphs: list = []  # training graphs with aliased outputs, in capture order
        self.static: set = set()  # addresses of those outputs (inputs read in place)


def _fixed_storages(inputs, fixed) -> dict:
    """The storage of each argument the graph reads in place: its index."""
    return {_storage(a): j for j, a in enumerate(inputs)
            if isinstance(a, torch.Tensor) and fixed[j]}  # fmt: skip


def _mostly_copies(args, fixed) -> bool:
    """Whether the arguments a replay would copy in outweigh those it reads in place."""
    sizes = [a.numel() * a.element_size() if isinstance(a, torch.Tensor) else 0 for a in args]
    copied = sum(n for n, f in zip(sizes, fixed) if not f)
    return copied > sum(sizes) // 2


def _view_of(j: int, o) -> tuple:
    """How output `o` views argument j: (j, shape, strides, storage offset)."""
    return j, tuple(o.shape), o.stride(), o.storage_offset()


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


def _use_count(storage) -> int:
    """How many tensors (and storage objects) hold `storage`."""
    return torch._C._storage_Use_Count(storage._cdata)


_SIDE_STREAMS: dict = {}  # device index -> the one stream captures warm up on


def _side_stream(device) -> "torch.cuda.Stream":
    """One warm-up stream per device for every capture. cuBLAS keeps a workspace (32 MiB on
    Hopper) for each stream it has run on, for the life of the process: a new stream per
    capture left one behind for every graph captured."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


class GraphedCall:
    """`call(args: list) -> outputs` of one compiled wrapper, replayed from a CUDA graph."""

    def __init__(self, run, shared=None, alias_from=None):
        self.run = run
        self.shared = shared or SharedPool()
        self.alias_from = alias_from  # training: outputs from here on are not copied (module doc)
        self.kept: list = []  # (position, storage, use count when nothing else holds it)
        self.through: dict = {}  # output position -> (input position, sizes, strides, offset)
        self.calls = 0
        self.seen = None  # the address of each argument at the last plain call
        self.moving: set = set()  # arguments seen at another address than at capture
        self.captures = 0
        self.graph = None
        self.disabled = False

    def __call__(self, args: list):
        if self.disabled:
            return self.run(args)
        # One call at a time: calls from several threads share the graph's tensors.
        with self.shared.lock:
            return self._call_locked(args)

    def _call_locked(self, args: list):
        if self.graph is not None:
            return self._replay(args)
        if self.disabled:
            return self.run(args)
        if not all(_graphable(a) for a in args):
            self._give_up("an argument that is not a CUDA tensor or an integer")
            return self.run(args)
        self.calls += 1
        ptrs = [_ptr(a) for a in args]
        if self.calls <= WARM_CALLS:
            self.seen = ptrs
            return self.run(args)
        return self._capture(args, ptrs)

    def _give_up(self, why: str) -> None:
        self.disabled = True
        log.info("ember.inductor: no CUDA graph for this program: %s", why)
        metrics.cudagraph_skips.append(why[:300])

    def _capture(self, args: list, ptrs: list):
        self.captures += 1
        static = self.shared.static
        fixed = [(p == q or p in static) and i not in self.moving
                 for i, (p, q) in enumerate(zip(ptrs, self.seen))]  # fmt: skip
        if self.alias_from is not None and _mostly_copies(args, fixed):
            # A replay copies each moving argument into a buffer the graph keeps, besides the
            # outputs it keeps: where those copies are most of what it reads, they cost more
            # than the launches saved. A backward whose forward is not replayed (every saved
            # activation), a forward of activations only (a loss over logits, a DDP bucket's
            # piece without parameters), a forward whose parameters move between calls (one
            # program serving every layer of a stack, FSDP's gathered parameters). GPT-2 under
            # DDP (2 x H200): peak 9.71 GiB with such graphs replayed, 7.31 without.
            self._give_up("a training graph whose inputs would mostly be copied in")
            return self.run(args)
        inputs = [a if f else torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                  for a, f in zip(args, fixed)]  # fmt: skip
        for a, s, f in zip(args, inputs, fixed):
            if not f:
                s.copy_(a)
        try:
            side = _side_stream(next(a for a in args if isinstance(a, torch.Tensor)).device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.run(list(inputs))  # warm: allocator and library handles for this stream
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.shared.pool):
                outs = self.run(list(inputs))
        except Exception as e:  # noqa: BLE001  (whatever a capture refuses: run without graphs)
            self._give_up(f"capture failed: {type(e).__name__}: {e}")
            torch.cuda.synchronize()
            return self.run(args)
        if self.alias_from is None:
            if not self._plan_input_views(inputs, fixed, outs):
                return self.run(args)
        elif not self._plan_aliases(inputs, fixed, outs):
            return self.run(args)
        self.graph, self.outs = graph, outs
        # the graph reads the fixed inputs where they are: holding them here would also hold a
        # forward's saved activations (a backward's inputs), which its replays wait to be free
        self.inputs = [None if f else s for s, f in zip(inputs, fixed)]
        self.copied = [i for i, f in enumerate(fixed) if not f]
        self._set_fixed(ptrs, fixed)
        return self._replay(args)

    def _set_fixed(self, ptrs: list, fixed: list) -> None:
        """The tensor arguments a replay reads in place (numbers: the graph's sizes fix them)
        and their addresses at capture, as two lists: the per-replay check is one C-level pass."""
        self.fixed_at = [i for i, f in enumerate(fixed) if f and ptrs[i] is not None]
        self.fixed_ptrs = [ptrs[i] for i in self.fixed_at]

    def _plan_input_views(self, inputs, fixed, outs) -> bool:
        """An inference graph's outputs that are views of an in-place argument (one it wrote:
        input_updates.py) are returned as that view of the caller's tensor; a view of a copied
        argument is the graph's own tensor, copied out as any output. False (graph given up):
        an output that is a view of another output."""
        by_storage = _fixed_storages(inputs, fixed)
        storages = []
        self.through = {}
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            j = by_storage.get(_storage(o))
            if j is not None:
                self.through[i] = _view_of(j, o)
            else:
                storages.append(_storage(o))
        if len(set(storages)) < len(storages):
            self._give_up("an output aliases another output")
            return False
        return True

    def _plan_aliases(self, inputs, fixed, outs) -> bool:
        """A training graph's outputs: a fixed input (or a view of one) a forward returns to save
        it is returned as the caller's tensor, anything else from `alias_from` on over the
        graph's memory, kept free before each replay. False (graph given up): an output of the
        forward's own that is an input."""
        by_storage = _fixed_storages(inputs, fixed)
        self.through, kept = {}, []
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            j = by_storage.get(_storage(o))
            if j is not None:
                if i < self.alias_from:
                    self._give_up("a training graph's output that is its input")
                    return False
                self.through[i] = _view_of(j, o)
            elif i >= self.alias_from:
                kept.append((i, o.untyped_storage()))
        self.kept = [(i, st, _use_count(st)) for i, st in kept]
        self.shared.graphs.append(self)
        self.shared.static.update(outs[i].data_ptr() for i, _, _ in self.kept)
        return True

    def _replay(self, args: list):
        # In order on the GPU too: a replay on another stream must not copy its inputs in
        # before the last one's outputs are copied out.
        stream = torch.cuda.current_stream()
        if self.shared.done is not None:
            stream.wait_event(self.shared.done)
        outs = self._replay_in_order(args)
        self.shared.done = stream.record_event()
        return outs

    def _replay_in_order(self, args: list):
        try:
            same = list(map(_data_ptr, map(args.__getitem__, self.fixed_at))) == self.fixed_ptrs
        except TypeError:  # a number where the capture saw a tensor: moved, as below
            same = False
        moved = [] if same else [
            (i, p) for i, p in zip(self.fixed_at, self.fixed_ptrs) if _ptr(args[i]) != p]
        if self.alias_from is not None and (
            not self._free() or any(p in self.shared.static for _, p in moved)
        ):
            # memory still held, or a saved activation from a forward that ran plainly: fresh
            # memory this once (module doc)
            metrics.cudagraph_plain_calls += 1
            return self.run(args)
        if moved:  # the graph reads these at their old addresses
            if self in self.shared.graphs:  # captured again below, with new outputs
                self.shared.graphs.remove(self)
            self.graph = self.outs = self.inputs = None
            self.moving.update(i for i, _ in moved)
            if self.captures > RECAPTURES:
                self._give_up("arguments kept moving between calls")
                return self.run(args)
            return self._capture(args, [_ptr(a) for a in args])
        inputs = self.inputs
        for i in self.copied:
            inputs[i].copy_(args[i])
        through = {i: args[j].as_strided(*how) for i, (j, *how) in self.through.items()}
        args.clear()  # as the wrapper does: the caller's references are the only ones left
        self.graph.replay()
        metrics.cudagraph_replays += 1
        copied = self.outs[: self.alias_from]
        outs = [through[i] if i in through else o.clone() if isinstance(o, torch.Tensor) else o
                for i, o in enumerate(copied)]  # fmt: skip
        if self.alias_from is not None:  # the rest as new tensors over the graph's memory
            outs += [through[i] if i in through else o.detach() if isinstance(o, torch.Tensor)
                     else o for i, o in enumerate(self.outs) if i >= self.alias_from]  # fmt: skip
        return outs

    def _free(self) -> bool:
        """Whether this graph's aliased outputs, and those of every graph captured after it in
        the same pool, are held by nothing but the graphs (module doc)."""
        graphs = self.shared.graphs
        later = graphs[graphs.index(self):] if self in graphs else [self]
        return all(_use_count(st) == base for g in later for _, st, base in g.kept)


def varying_inputs(art) -> tuple:
    """(positions, count): of the program's `count` tensor inputs, those whose sizes are
    symbolic, which alone tell one call's sizes from another's."""
    metas = {b.name: b.meta for b in art.buffers}
    static = [isinstance(metas.get(name), TensorMeta) and metas[name].is_static()
              for name in art.inputs]  # fmt: skip
    varying = [i for i, fixed in enumerate(static) if not fixed]
    return tuple(varying), len(art.inputs)


def host_work(art) -> bool:
    """Whether a GPU program has steps that run on the CPU (host_work_reason)."""
    return host_work_reason(art) is not None


def host_work_reason(art):
    """Which step of a GPU program runs on the CPU, and why (None: none does); a CUDA graph's
    replay would skip it. Such steps are an op whose results are all on the host (a scalar a
    model draws with torch.rand([])), a copy between devices (a CPU scalar a kernel reads), or a
    user operator or Triton kernel (extern.custom_op: Python code that may do host work, or
    launch on another stream). A GPU op with a host result besides is one too: the result would
    be the one of the capture at every replay (the memory-efficient attention's philox seed and
    offset, which its backward reads), unless it is random-number state of a call without
    dropout (as the extern declares it: prims.extern.RngState). So is one that reads a host
    tensor (a CPU scalar an ATen kernel takes as eager passes it)."""
    devices = {b.name: str(b.meta.device) for b in art.buffers}
    for step in art.steps:
        if step.kind != "extern":
            continue
        if step.target in ("prims.device_put", "extern.custom_op"):
            return f"{step.target} runs on the host"
        outs = {devices[o] for o in step.outputs if o in devices}
        if outs and str(art.device) not in outs:
            return f"{step.target}'s results are on the host"
        if outs - {str(art.device)} and not _unused_rng_state(step):
            return f"{step.target} has a result on the host"
        # a host tensor an ATen kernel reads where it is (a CPU scalar): read at each call in
        # eager, it would be read once, when the graph was captured
        read = []
        value_from_json([list(step.args), list((step.kwargs or {}).values())], read.append)
        if any(devices.get(name, str(art.device)) != str(art.device) for name in read):
            return f"{step.target} reads a host tensor"
    return None


def _unused_rng_state(step) -> bool:
    # the extern declares which of its results are random-number state (prims.extern.RngState);
    # without dropout the kernel draws none, so a stale seed and offset at replay are harmless
    state = rng_state_of(step.target)
    return bool(state and state.results) and state.without_dropout(list(step.args), step.kwargs)


class GraphsBySize:
    """`call(args: list) -> outputs` of a compiled wrapper with symbolic sizes: a `GraphedCall`
    per set of argument sizes, strides and integer arguments, all in one memory pool."""

    def __init__(self, run, varying=None):
        self.run = run
        # (positions, count): the arguments whose sizes can change, of `count` tensors (the
        # others' sizes are fixed by the program: GPT-2's 150 parameters made each call's key
        # cost ~0.2 ms). A call with another number of arguments (integer ones) keys on all.
        self.varying = varying
        self.shared = SharedPool()
        self.graphs: dict = {}
        self.full = False
        self.off = False  # a size's graph was given up: the reason holds for every size

    def key(self, args: list) -> tuple:
        """What tells this call's graph: the sizes and strides of the arguments that vary."""
        varying = self.varying
        if varying is None or len(args) != varying[1]:
            picked = args
        else:
            picked = [args[i] for i in varying[0]]
        return tuple(
            (tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else (type(a), a)
            for a in picked
        )

    def __call__(self, args: list):
        if self.off:
            return self.run(args)
        key = self.key(args)
        graphed = self.graphs.get(key)
        if graphed is None:
            if len(self.graphs) >= MAX_SIZES:
                if not self.full:
                    self.full = True
                    log.info("ember.inductor: %d sizes have CUDA graphs; others run plainly",
                             MAX_SIZES)  # fmt: skip
                    metrics.cudagraph_skips.append(f"more than {MAX_SIZES} sizes")
                return self.run(args)
            if self.shared.pool is None and any(
                isinstance(a, torch.Tensor) and a.is_cuda for a in args
            ):
                self.shared.pool = torch.cuda.graph_pool_handle()
            graphed = self.graphs[key] = GraphedCall(self.run, self.shared)
        out = graphed(args)
        if graphed.disabled:
            self.off = True
            self.graphs.clear()
        return out
