"""Runs pytest on one test file as a Bazel py_test (made by ember_py_tests in defs.bzl).

usage: pytest_runner.py <test file, relative to the runfiles root> [pytest args...]
The exit code is pytest's, except that "no tests collected" (5) is an error unless
this is a shard that merely got no tests (more shards than tests).
"""
import os
import sys
import tempfile

import pytest

import pytest_bazel


def main(argv):
    if not argv:
        sys.exit("usage: pytest_runner.py TEST_FILE [pytest args...]")
    pytest_bazel.drop_source_tree_paths()
    # Bazel gives tests no HOME and TMPDIR=/tmp. Point both at the test's private,
    # Bazel-cleaned TEST_TMPDIR, so that compiler and Triton caches and temp files
    # never leak between tests or runs (pass --test_env=HOME to share ~ instead).
    if os.environ.get("TEST_TMPDIR"):
        os.environ.setdefault("HOME", os.environ["TEST_TMPDIR"])
        os.environ["TMPDIR"] = os.environ["TEST_TMPDIR"]
        tempfile.tempdir = None  # recompute from TMPDIR
    # Bazel's sharding protocol: touching this file says "this test can shard".
    if os.environ.get("TEST_SHARD_STATUS_FILE"):
        open(os.environ["TEST_SHARD_STATUS_FILE"], "a").close()
    # The runfiles root is the rootdir, so the root conftest.py applies as in the checkout.
    args = [argv[0], "-q", "-p", "no:cacheprovider", "--rootdir=" + os.getcwd()]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])  # per-case results for Bazel
    rc = int(pytest.main(args + argv[1:], plugins=[pytest_bazel]))
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        if pytest_bazel.state.sharded and pytest_bazel.state.collected:
            rc = 0  # more shards than tests: this shard legitimately has none
        else:
            print("ERROR: no tests collected from %s: an empty test file is a failure" % argv[0],
                  file=sys.stderr)
    sys.exit(rc)


if __name__ == "__main__":
    main(sys.argv[1:])
