"""ember.dynamo.minifier: shrink a graph that a backend fails on, and write a standalone repro.

`minify(gm, example_inputs, fails)` is the programmatic entry; `python -m ember.dynamo.minifier
FILE` minifies a saved graph; with EMBER_REPRO=error|accuracy, dynamo's backend call
(`hook.call_backend`) saves and minifies every graph that fails.
"""

from .checks import AccuracyError, Failure, accuracy_predicate, check, error_predicate, mismatch
from .graphs import TensorSpec, clone_input, count_ops, make_inputs
from .reprofile import (BackendRef, ReproError, backend_by_name, backend_ref, load_inputs,
                        load_repro, trace, write_repro)  # fmt: skip
from .search import Minified, MinifierError, minify

__all__ = ["AccuracyError", "BackendRef", "Failure", "Minified", "MinifierError", "ReproError",
           "TensorSpec", "accuracy_predicate", "backend_by_name", "backend_ref", "check",
           "clone_input", "count_ops", "error_predicate", "load_inputs", "load_repro",
           "make_inputs", "minify", "mismatch", "trace", "write_repro"]  # fmt: skip
