"""pytest plugin used by pytest_runner.py: Bazel test sharding and import hygiene.

Sharding: Bazel sets TEST_TOTAL_SHARDS and TEST_SHARD_INDEX when a py_test has
shard_count; shard i of N runs the collected items i, i+N, i+2N, ... It runs
last, so -k/-m selection happens first and every shard sees the same list.
"""
import os
import sys

import pytest


class state:
    sharded = False
    collected = 0  # items collected before sharding


def drop_source_tree_paths():
    """Removes sys.path entries that hold an ember/ package outside the runfiles.

    ./bazelw installs the components editable into .venv (a .pth puts ir/,
    primtorch/, ... on sys.path) and the root conftest.py may add them too. Under
    Bazel a test must import only what its deps put into runfiles, or Bazel would
    not rerun it when an undeclared component changes.
    """
    runfiles = os.environ.get("TEST_SRCDIR") or os.environ.get("RUNFILES_DIR")
    if not runfiles:
        return
    runfiles = os.path.realpath(runfiles) + os.sep

    def foreign(path):
        real = os.path.realpath(path or ".") + os.sep
        if real == runfiles:
            # The runfiles root holds ember/ = this workspace (also named ember):
            # it would make a bare directory pass for the `ember` namespace.
            return True
        return not real.startswith(runfiles) and os.path.isfile(os.path.join(real, "ember", "__init__.py"))

    sys.path[:] = [p for p in sys.path if not foreign(p)]
    ember = sys.modules.get("ember")
    if ember is not None:  # a conftest imported it already: prune its namespace path too
        ember.__path__[:] = [p for p in ember.__path__ if not foreign(os.path.dirname(p))]


def pytest_sessionstart(session):
    # After the initial conftest.py files ran, before any test module is imported.
    drop_source_tree_paths()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    index = int(os.environ.get("TEST_SHARD_INDEX", "0"))
    state.collected = len(items)
    state.sharded = total > 1
    if total <= 1:
        return
    dropped = [item for i, item in enumerate(items) if i % total != index]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = items[index::total]
