"""The prim recorder stack is per thread, and lent to autograd's own worker threads while a
backward is traced (they run a CUDA backward; Python's thread-locals do not reach them)."""

import _thread
import threading

from ember.primtorch.prims import core


class Recorder:
    recording = True


def _seen_from(start):
    """current_recorder() as a thread started by `start` sees it."""
    seen, done = [], threading.Event()

    def body():
        seen.append(core.current_recorder())
        done.set()

    start(body)
    assert done.wait(10)
    return seen[0]


def _engine_like(body):  # a thread started outside threading, as autograd's C++ workers are
    _thread.start_new_thread(body, ())


def _program_thread(body):
    threading.Thread(target=body).start()


def test_recorder_is_lent_to_engine_threads_only_while_a_backward_is_traced():
    recorder = Recorder()
    core.push_recorder(recorder)
    try:
        assert core.current_recorder() is recorder
        assert _seen_from(_engine_like) is None  # not lent: another thread's calls stay its own
        with core.lent_to_autograd_workers():
            assert _seen_from(_engine_like) is recorder
            assert _seen_from(_program_thread) is None  # a thread of the program never sees it
        assert _seen_from(_engine_like) is None
    finally:
        core.pop_recorder(recorder)
    assert core.current_recorder() is None


def test_lending_without_a_recorder_is_a_no_op():
    with core.lent_to_autograd_workers():
        assert _seen_from(_engine_like) is None
