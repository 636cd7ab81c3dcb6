"""A C++ kernel launcher called from two threads at once passes each call its own arguments.

One compiled program runs on several threads at once, and ctypes releases the GIL while the
kernel runs. The launcher used to keep one pointer array (and one int64 array for dynamic sizes)
for all calls: a second call refilled it while the first call's kernel was still reading it, so
the first caller's kernel wrote into the second caller's output and its own stayed unwritten
(tests/test_threads_inductor.py failed about 2 runs in 20 with all-zero outputs).

The kernel here is a Python callback behind a C function pointer, so the overlap is forced with
events instead of hoped for: the first call's "kernel" waits, inside the call, until the second
call's kernel has started, and only then reads its arguments."""

import ctypes
import threading

import pytest
import torch
from ember.inductor.runtime import CppLauncher, CppSizesLauncher

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_WAIT_S = 10


def _read(args, kinds):
    ptrs = ctypes.cast(args, ctypes.POINTER(ctypes.c_void_p))
    return [
        ctypes.cast(ptrs[i], ctypes.POINTER(ctypes.c_int64))[0] if kind is int else ptrs[i]
        for i, kind in enumerate(kinds)
    ]


def _overlapping_calls(launcher, first_args, second_args):
    """What each call's kernel read, the first call's read after the second call had begun."""
    kinds = [type(a) for a in first_args]
    first_in, second_in = threading.Event(), threading.Event()
    seen, problems = {}, []

    def entry(args):
        name = threading.current_thread().name
        if name == "first":
            first_in.set()
            if not second_in.wait(_WAIT_S):
                problems.append("the second call never reached the kernel")
        else:
            second_in.set()
        seen[name] = _read(args, kinds)

    launcher.fn = _ENTRY(entry)

    def second():
        if first_in.wait(_WAIT_S):
            launcher(*second_args)
        else:
            problems.append("the first call never reached the kernel")

    threads = [
        threading.Thread(target=launcher, args=first_args, name="first", daemon=True),
        threading.Thread(target=second, name="second", daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * _WAIT_S)
    assert not any(t.is_alive() for t in threads), "a launcher call hung"
    assert not problems, problems
    return seen["first"], seen["second"]


def _expected(args):
    return [a if type(a) is int else a.data_ptr() for a in args]


def test_concurrent_calls_of_one_launcher_each_pass_their_own_pointers():
    a = [torch.zeros(4), torch.ones(4), torch.empty(4)]
    b = [torch.zeros(4), torch.ones(4), torch.empty(4)]
    first, second = _overlapping_calls(CppLauncher(3), a, b)
    assert first == _expected(a)
    assert second == _expected(b)


@pytest.mark.parametrize("sizes", [(3, 7), (11, 2)])
def test_concurrent_calls_of_one_sizes_launcher_each_pass_their_own_sizes(sizes):
    a = [torch.zeros(4), torch.empty(4), sizes[0]]
    b = [torch.zeros(4), torch.empty(4), sizes[1]]
    first, second = _overlapping_calls(CppSizesLauncher(3), a, b)
    assert first == _expected(a)
    assert second == _expected(b)
