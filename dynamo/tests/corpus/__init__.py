"""The dynamo corpus: small programs, each with inputs and the graphs and breaks it should give.

Each corpus module registers cases with `@case(...)`; test_corpus.py runs every case compiled with
a counting backend and compares results (and mutated inputs) with eager execution.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

CASES: list["Case"] = []


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    inputs: Callable[[], tuple]
    graphs: int
    breaks: int
    eager_fallback: bool = False
    module: Optional[Callable] = None  # builds an nn.Module; fn is then ignored
    calls: int = 2


def case(inputs, graphs=1, breaks=0, eager_fallback=False, calls=2):
    """Register the decorated function as a corpus case."""

    def register(fn):
        CASES.append(Case(f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}", fn, inputs, graphs,
                          breaks, eager_fallback, calls=calls))  # fmt: skip
        return fn

    return register


def module_case(inputs, graphs=1, breaks=0, eager_fallback=False, calls=2):
    """Register the decorated nn.Module class (built with no arguments) as a corpus case."""

    def register(cls):
        CASES.append(Case(f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}", None, inputs,
                          graphs, breaks, eager_fallback, module=cls, calls=calls))  # fmt: skip
        return cls

    return register
