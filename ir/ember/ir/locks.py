"""One compile at a time in the process.

A compile (dynamo's capture, aot_autograd's trace on a first call, inductor's lowering and code
generation) reads and writes process-wide state that is not per thread: switches the tracer
flips and restores (`torch.backends.cuda` cuDNN attention), torch's default generator (seeds
drawn while tracing), dynamo's statistics and automatic-dynamic memory, the components' caches
and counters. Compiles are CPU-bound Python, so running them one at a time costs little.

`COMPILE_LOCK` is re-entrant: a compile may run code that compiles in turn (a backend that calls
compiled code, a trace that misses in dynamo's cache). Dynamo's frame hook (C++) takes this same
lock, so there is one lock and no order between locks to get wrong. Code that takes it from
Python must not hold it while waiting for another thread that may compile."""

import threading

COMPILE_LOCK = threading.RLock()

__all__ = ["COMPILE_LOCK"]
