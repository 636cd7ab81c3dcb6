"""The contenders: eager, torch.compile (the reference we race) and Ember's entry points.

Each backend compiles a callable into a fresh wrapper, can reset its in-memory caches (so a
second compile measures the warm, on-disk-cache path) and reports graph and graph-break counts
where it exposes them ("n/a" otherwise). Ember is imported lazily: a backend that does not exist
yet fails when it is used, and the harness records that failure against the model.
"""

import importlib

NA = "n/a"


class Backend:
    """Base class: `compile(fn)` returns the callable to run; eager is the identity."""

    name = "eager"
    label = "eager"
    compiles = False  # eager has no compile times
    prepare = True  # run.prepare_caches may compile a one-op function with it
    description = "torch eager"

    def compile(self, fn):
        """Return a fresh compiled wrapper of `fn`."""
        return fn

    def reset(self):
        """Drop in-memory compile caches; False when the backend cannot, so warm compile is n/a."""
        return False

    def begin(self):
        """Called before the cold compile: clears the counters `stats` reads."""

    def stats(self, fn, args, context):
        """Graph and break counts of the compiles since `begin()`, plus backend extras."""
        return {}

    def cache_hits(self):
        """On-disk compile cache hits since `begin()`, where the backend counts them."""
        return


class TorchCompile(Backend):
    """torch.compile with its default mode, or with another backend (e.g. Ember's compile_fx)."""

    compiles = True

    def __init__(self, name, label, backend=None, description="torch.compile (default mode)",
                 mode=None):  # fmt: skip
        self.name, self.label, self.description = name, label, description
        self.backend, self.mode = backend, mode

    def _backend(self):
        if self.backend == "ember_inductor":
            return importlib.import_module("ember.inductor").compile_fx
        return self.backend or "inductor"

    def compile(self, fn):
        import torch

        if self.mode:
            return torch.compile(fn, backend=self._backend(), mode=self.mode)
        return torch.compile(fn, backend=self._backend())

    def reset(self):
        import torch._dynamo

        torch._dynamo.reset()
        if self.backend == "ember_inductor":
            _ember_reset()
        return True

    def begin(self):
        from torch._dynamo.utils import counters

        counters.clear()

    def stats(self, fn, args, context):
        from torch._dynamo.utils import counters

        return {
            "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
            "breaks": int(sum(counters.get("graph_break", {}).values())),
        }

    def cache_hits(self):
        from torch._dynamo.utils import counters

        return int(counters.get("inductor", {}).get("fxgraph_cache_hit", 0))


def _ember():
    return importlib.import_module("ember")


def _ember_reset():
    ember = _ember()
    try:
        reset = ember.reset
    except AttributeError:
        return False
    reset()
    return True


def _count(obj, names):
    """The first of `names` found on `obj` (attribute or key), as an int (len() for lists)."""
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            return len(value)
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return NA


class Ember(Backend):
    """`ember.compile(fn)` (default backend) or `ember.compile(fn, backend=...)`."""

    compiles = True

    def __init__(self, name, label, backend=None, options=None):
        self.name, self.label, self.backend, self.options = name, label, backend, options
        args = [f"backend={backend!r}"] if backend else []
        args += [f"options={options!r}"] if options else []
        self.description = f"ember.compile({', '.join(args)})" if args else "ember.compile"

    def compile(self, fn):
        ember = _ember()
        kwargs = {"backend": self.backend} if self.backend else {}
        if self.options:
            kwargs["options"] = dict(self.options)
        return ember.compile(fn, **kwargs)

    def reset(self):
        return _ember_reset()

    @staticmethod
    def _capture_stats():
        """ember.dynamo's running capture statistics, if it keeps them (graphs, breaks lists)."""
        try:
            stats = importlib.import_module("ember.dynamo.convert").stats
            last = stats.failures[-1].reason if stats.failures else None
            return len(stats.graphs), len(stats.breaks) + len(stats.failures), last
        except (ImportError, AttributeError, TypeError):
            return None

    @staticmethod
    def _replays():
        """(calls replayed from CUDA graphs so far, why graphs were given up) from ember.inductor's
        counters, if it keeps them."""
        try:
            metrics = importlib.import_module("ember.inductor.metrics")
            return metrics.cudagraph_replays, list(metrics.cudagraph_skips)
        except (ImportError, AttributeError):
            return None

    def begin(self):
        self._start = self._capture_stats()
        self._start_replays = self._replays()

    def stats(self, fn, args, context):
        """Graphs and breaks captured since begin(); else from `ember.explain` (one re-capture).
        With them, how many calls since begin() replayed a CUDA graph."""
        now = self._capture_stats()
        if now is not None and getattr(self, "_start", None) is not None:
            out = {"graphs": now[0] - self._start[0], "breaks": now[1] - self._start[1]}
            if now[2]:
                out["last_failure"] = str(now[2])[:500]
            replays, start = self._replays(), getattr(self, "_start_replays", None)
            if replays is not None and start is not None:
                out["cudagraph_replays"] = max(0, replays[0] - start[0])  # 0 after a reset()
                skips = replays[1][len(start[1]):]
                if skips:
                    out["cudagraph_skipped"] = skips[-1]
            return out
        try:
            explain = _ember().explain
        except AttributeError:
            return {"graphs": NA, "breaks": NA}
        with context():
            try:
                report = explain(fn)(*args)
            except TypeError:
                report = explain(fn, *args)
        return {
            "graphs": _count(report, ("graph_count", "graphs", "num_graphs")),
            "breaks": _count(
                report, ("graph_break_count", "break_count", "breaks", "break_reasons")
            ),
        }


class SelfTest(Backend):
    """Deliberately broken backends that exercise the harness's failure paths (tests/)."""

    compiles = True
    prepare = False

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.name = self.label = f"_selftest_{behaviour}"
        self.description = f"harness self-test: {behaviour}"

    def compile(self, fn):
        import os
        import signal
        import time

        if self.behaviour == "raise":
            raise RuntimeError("self-test backend failed to compile")
        if self.behaviour == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.behaviour == "hang":  # interruptible: the soft timeout ends it
            time.sleep(3600)
        if self.behaviour == "stuck":  # blocks SIGALRM: only the parent's hard kill ends it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if self.behaviour == "wrong":
            return lambda *args: fn(*args) + 1
        return fn  # "fallback": runs eagerly and reports no graph

    def reset(self):
        return True

    def stats(self, fn, args, context):
        return {"graphs": 0 if self.behaviour == "fallback" else 1, "breaks": 0}


SELF_TESTS = {
    b.name: b for b in map(SelfTest, ("raise", "crash", "hang", "stuck", "wrong", "fallback"))
}

BACKENDS = {
    b.name: b
    for b in (
        Backend(),
        TorchCompile("torch_compile", "torch.compile"),
        TorchCompile(
            "torch_compile_cg",
            "torch.compile[reduce-overhead]",
            None,
            "torch.compile(mode='reduce-overhead'): torch's inductor with its CUDA graphs, the "
            "fair race for Ember's CUDA-graph replay on a GPU",
            mode="reduce-overhead",
        ),
        Ember("ember", "ember"),
        Ember("ember_inductor", "ember[inductor]", "inductor"),
        Ember("ember_aot_eager", "ember[aot_eager]", "aot_eager"),
        Ember("ember_eager", "ember[eager]", "eager"),
        Ember("ember_cpp_wrapper", "ember[cpp_wrapper]", options={"cpp_wrapper": True}),
        TorchCompile(
            "torch_ember_inductor",
            "torch.compile+ember.inductor",
            "ember_inductor",
            "torch.compile(backend=ember.inductor.compile_fx)",
        ),
        TorchCompile(
            "torch_eager",
            "torch.compile[eager]",
            "eager",
            "torch.compile(backend='eager'): torch's capture alone, for graph and break counts",
        ),
        TorchCompile(
            "torch_aot_eager",
            "torch.compile[aot_eager]",
            "aot_eager",
            "torch.compile(backend='aot_eager')",
        ),
    )
}


def get(name):
    """The backend called `name`; a clear error listing the known ones otherwise."""
    if name in SELF_TESTS:
        return SELF_TESTS[name]
    if name not in BACKENDS:
        raise SystemExit(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name]
