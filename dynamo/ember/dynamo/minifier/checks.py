"""What "still fails" means: the same exception (error mode) or a result unlike eager's
(accuracy mode), for a backend compiling a graph and running it once."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional

import torch
import torch.utils._pytree as pytree

from .graphs import clone_input, copy_graph

MODES = ("error", "accuracy")


class AccuracyError(AssertionError):
    """The compiled graph's result differs from eager's."""


@dataclasses.dataclass(frozen=True)
class Failure:
    """An exception as a repro expects it: its type's name and the first line of its message.
    Two failures match when the types are the same and the messages are equal once numbers and
    addresses are masked (a message naming `add_57` or a shape still matches)."""

    type_name: str
    message: str

    @classmethod
    def of(cls, e: BaseException) -> "Failure":
        return cls(type(e).__qualname__, _first_line(str(e)))

    @property
    def key(self) -> tuple:
        """What two matching failures have in common."""
        return self.type_name, _masked(self.message)

    def matches(self, e: BaseException) -> bool:
        return Failure.of(e).key == self.key

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _masked(text: str) -> str:
    return re.sub(r"\d+", "#", re.sub(r"0x[0-9a-fA-F]+", "0x#", text))


def _rng_devices() -> list:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []


def compile_and_run(backend: Callable, gm, inputs):
    """Compile (a copy of) `gm` with `backend` on copies of `inputs` and run the result once;
    the caller's random-number state is left as it was, and every run starts from the same seed."""
    compiled = backend(copy_graph(gm), [clone_input(x) for x in inputs])
    return run_seeded(compiled, inputs)


def run_seeded(fn: Callable, inputs, seed: int = 0):
    """`fn` on copies of `inputs` from `seed`, restoring the random-number state afterwards."""
    with torch.random.fork_rng(devices=_rng_devices()):
        torch.manual_seed(seed)
        return fn(*[clone_input(x) for x in inputs])


def mismatch(expected, actual, tolerance: float) -> Optional[str]:
    """Where `actual` differs from `expected` (None when they agree): structure, shapes,
    dtypes, integer values exactly, floating values within `tolerance` (relative and absolute;
    at least 1e-2 for 16-bit floats); NaNs agree with NaNs."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"the results have different structures ({exp_spec} vs {act_spec})"
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor):
            if e != a:
                return f"output {i}: {a!r} instead of {e!r}"
            continue
        e, a = e.detach(), a.detach()
        if e.shape != a.shape or e.dtype != a.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} instead of {e.dtype}{list(e.shape)}"
        if e.is_floating_point() or e.is_complex():
            tol = max(tolerance, 1e-2) if e.element_size() <= 2 else tolerance
            if not torch.allclose(a.cpu(), e.cpu(), rtol=tol, atol=tol, equal_nan=True):
                diff = (a.cpu().double() - e.cpu().double()).abs().nan_to_num(float("inf")).max()
                return f"output {i}: max abs difference {diff.item():.3g} (tolerance {tol:g})"
        elif not torch.equal(a.cpu(), e.cpu()):
            return f"output {i}: {int((a.cpu() != e.cpu()).sum())} elements differ"
    return None


def eager_reference(gm, inputs, tolerance: float):
    """The eager result of `gm`, or None when it draws random numbers (its result changes with
    the seed): a backend may draw them differently, so results cannot be compared."""
    reference = run_seeded(gm, inputs)
    if mismatch(reference, run_seeded(gm, inputs, seed=1), tolerance) is not None:
        return None
    return reference


def error_predicate(backend: Callable, expected: Failure) -> Callable:
    """fails(gm, inputs): compiling or running `gm` with `backend` raises `expected`."""

    def fails(gm, inputs) -> bool:
        try:
            compile_and_run(backend, gm, inputs)
        except Exception as e:  # noqa: BLE001  (any exception may be the one we look for)
            return expected.matches(e)
        return False

    return fails


def accuracy_predicate(backend: Callable, tolerance: float) -> Callable:
    """fails(gm, inputs): `gm` runs eagerly and compiled, and the results differ."""

    def fails(gm, inputs) -> bool:
        try:
            reference = eager_reference(gm, inputs, tolerance)
            if reference is None:
                return False
            result = compile_and_run(backend, gm, inputs)
        except Exception:  # noqa: BLE001  (another failure, not the mismatch we look for)
            return False
        return mismatch(reference, result, tolerance) is not None

    return fails


def check(mode: str, gm, inputs, backend: Callable, expected: Optional[Failure] = None,
          tolerance: float = 1e-3) -> bool:  # fmt: skip
    """Reproduce a failure: in error mode the backend's exception propagates; in accuracy mode
    AccuracyError says where the results differ. False (and a line on stdout) when the graph
    compiles and runs correctly: the failure did not reproduce. `expected`: a Failure or a
    repro file's (type name, message)."""
    if isinstance(expected, (tuple, list)):
        expected = Failure(*expected)
    if mode == "error":
        try:
            compile_and_run(backend, gm, inputs)
        except Exception as e:
            if expected is not None and not expected.matches(e):
                print(f"note: a different failure than the one recorded ({expected})")
            raise
        print("the graph compiled and ran without error: the failure did not reproduce")
        return False
    if mode != "accuracy":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    reference = run_seeded(gm, inputs)
    result = compile_and_run(backend, gm, inputs)
    where = mismatch(reference, result, tolerance)
    if where is not None:
        raise AccuracyError(f"the compiled graph's result differs from eager: {where}")
    print("the compiled graph's result matches eager: the failure did not reproduce")
    return False
