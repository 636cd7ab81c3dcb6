"""Counters that tests and users read to see what the compiler did."""

generated_kernel_count = 0
cache_hits = 0
cache_misses = 0
fx_cache_hits = 0  # the torch-level cache (fx_cache.py): a hit skips tracing and lowering
fx_cache_misses = 0
fallbacks: list = []
cudagraph_replays = 0  # calls of compiled graphs replayed from a CUDA graph (cudagraphs.py)
cudagraph_plain_calls = 0  # training calls run plainly while a graph's memory was still held
triton_binaries_loaded = 0  # Triton kernels launched from a stored binary (triton_binaries.py)
gemm_templates = 0  # matmuls compiled as generated templates (max-autotune: gemm_template.py)
gemm_autotune_runs = 0  # matmul choices timed in a subprocess (autotune.py)
gemm_autotune_hits = 0  # ... and read back from the cache instead
cudagraph_skips: list = []  # why a program's CUDA graph was given up, one line each


def reset() -> None:
    """Zero every counter."""
    global generated_kernel_count, cache_hits, cache_misses, fx_cache_hits, fx_cache_misses
    global cudagraph_replays, cudagraph_plain_calls, triton_binaries_loaded
    global gemm_templates, gemm_autotune_runs, gemm_autotune_hits
    gemm_templates = gemm_autotune_runs = gemm_autotune_hits = 0
    generated_kernel_count = cache_hits = cache_misses = fx_cache_hits = fx_cache_misses = 0
    cudagraph_replays = cudagraph_plain_calls = triton_binaries_loaded = 0
    cudagraph_skips.clear()
    fallbacks.clear()
