"""One loaded model run from 8 threads at once: per-call state only, a thread-safe pool."""

import threading

import cppw_artifacts as A
import torch

from ember.cpp_wrapper import load_artifact, load_package, package


def _hammer(model, make_input, eager, threads=8, iters=25):
    errors, results = [], {}

    def worker(tid):
        try:
            g = torch.Generator().manual_seed(tid)
            for i in range(iters):
                x = make_input(g)
                results[(tid, i)] = (x, model(x))
        except BaseException as e:  # surfaced below: a thread must not fail silently
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    assert len(results) == threads * iters
    for x, got in results.values():
        for g, want in zip(got, eager(x)):
            torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)


def test_eight_threads_share_one_in_process_model():
    w = torch.randn(8)
    model = load_artifact(A.elementwise_reduction(), {"w": w})
    # Different dynamic sizes per call, so the pool hands out blocks of many sizes concurrently.
    _hammer(
        model,
        lambda g: torch.randn(int(torch.randint(2, 200, (), generator=g)), 8, generator=g),
        lambda x: A.elementwise_reduction_eager(x, w),
    )


def test_eight_threads_share_one_package(tmp_path):
    consts = A.small_mlp_constants()
    model = load_package(package(A.small_mlp(), tmp_path / "mlp", constants=consts))
    _hammer(
        model, lambda g: torch.randn(6, 8, generator=g), lambda x: [A.small_mlp_eager(x, consts)]
    )
