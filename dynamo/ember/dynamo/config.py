"""ember.dynamo's configuration: every knob in one place; env vars are documented overrides."""

import dataclasses
import os


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value not in ("0", "", "false", "False")


@dataclasses.dataclass
class DynamoConfig:
    """Knobs of frame capture. EMBER_DYNAMO_VERBOSE=1 prints each compiled graph and break."""

    # Cache entries holding a graph, per code object, before the frame runs eagerly (with one
    # warning); and entries holding none (a loop's resume function between two calls that run
    # eagerly: one entry per iteration, nothing compiled; 256 covers an 80-layer model sharded
    # layer by layer, whose last iteration's entry holds the head's graph).
    cache_size_limit: int = 8
    graphless_entry_limit: int = 256
    # Print graphs, guards and breaks as they are made.
    verbose: bool = dataclasses.field(
        default_factory=lambda: _env_flag("EMBER_DYNAMO_VERBOSE", False)
    )
    # Guard on torch.is_grad_enabled() (a graph traced with grad on may not be reused with it off).
    guard_grad_mode: bool = True
    # Inline calls deeper than this are treated as unsupported (runaway recursion).
    max_inline_depth: int = 64
    # Instructions one frame may symbolically execute (unrolled loops count) before giving up.
    max_instructions: int = 200_000
    # Repro of a failing backend (minifier/): "error" (compiling or running the graph raises),
    # "accuracy" (the compiled result differs from eager), "" (off). Env EMBER_REPRO.
    repro: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_REPRO", ""))
    # Where repros go (a fresh directory per failing graph). Env EMBER_REPRO_DIR.
    repro_dir: str = dataclasses.field(
        default_factory=lambda: os.environ.get("EMBER_REPRO_DIR", "ember_repro")
    )
    # Minify a failing graph (else only save it, for `python -m ember.dynamo.minifier`).
    # Env EMBER_REPRO_MINIFY=0 turns it off.
    repro_minify: bool = dataclasses.field(
        default_factory=lambda: _env_flag("EMBER_REPRO_MINIFY", True)
    )
    # The minifier keeps the smallest graph found by then.
    repro_max_seconds: float = 600.0
    # Accuracy mode: relative and absolute tolerance (at least 1e-2 for 16-bit floats).
    repro_tolerance: float = 1e-3
    # A capture whose example values came to more bytes than this is collected (gc.collect())
    # once converted: the interpreter's variables and the graph refer to each other, so the
    # values (and the autograd graph they carry, a forward's saved activations) would otherwise
    # stay alive until Python's cyclic collector happens to run, through the compile and the
    # first call. Below it, the collection would cost more time than the memory is worth.
    collect_after_capture_bytes: int = 16 << 20
    # The capture's ops save nothing for backward (convert._SavedNothing): its peak is an
    # inference forward's, not eager training's. Env EMBER_CAPTURE_SAVES_NOTHING=0 turns it off.
    capture_saves_nothing: bool = dataclasses.field(
        default_factory=lambda: _env_flag("EMBER_CAPTURE_SAVES_NOTHING", True)
    )


config = DynamoConfig()
