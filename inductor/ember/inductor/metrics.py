"""Counters that tests and users read to see what the compiler did."""

generated_kernel_count = 0
cache_hits = 0
cache_misses = 0
fallbacks: list = []


def reset() -> None:
    """Zero every counter."""
    global generated_kernel_count, cache_hits, cache_misses
    generated_kernel_count = cache_hits = cache_misses = 0
    fallbacks.clear()
