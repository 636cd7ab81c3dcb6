"""Build macros shared by the component BUILD files."""

def ember_py_tests(
        name = None,
        srcs = None,
        test_dir = "tests",
        deps = [],
        data = [],
        shard_count = None,
        shard_counts = {},
        size = "medium",
        timeout = None,
        args = [],
        tags = [],
        flaky = None):
    """One py_test per tests/test_*.py file, each running pytest on that file.

    One target per file keeps Bazel's caching fine-grained (a changed test file
    reruns only itself) and lets Bazel run files in parallel.

    Args:
      name: optional test_suite over all the generated tests.
      srcs: test files; default glob([test_dir + "/test_*.py"]). Target name = file stem.
      test_dir: where the tests live, relative to the package ("." for //tests).
      deps: py_library deps (the component under test and what it imports).
      data: extra runtime files. Non-test files under tests/ (helpers, conftest.py,
        goldens) are always added.
      shard_count, size, timeout, tags, flaky: as for py_test; shards split the
        collected pytest items (tools/pytest_bazel.py).
      shard_counts: {target name: shard count} for the files that need more shards than
        shard_count (long files: every target stays within half of its timeout on 2 cores).
      args: extra pytest arguments.
    """
    prefix = "" if test_dir == "." else test_dir + "/"
    if srcs == None:
        srcs = native.glob([prefix + "test_*.py"], allow_empty = True)
    helpers = native.glob(
        [prefix + "**"],
        exclude = [prefix + "**/test_*.py", "**/__pycache__/**", "**/*.pyc", "BUILD.bazel", "BUILD"],
        allow_empty = True,
    )
    tests = []
    for src in srcs:
        test_name = src.rpartition("/")[2][:-len(".py")]
        native.py_test(
            name = test_name,
            srcs = ["//tools:pytest_runner.py", src],
            main = "//tools:pytest_runner.py",
            args = ["$(rootpath %s)" % src] + args,
            deps = deps + ["//tools:pytest_runner"],
            data = data + helpers + [
                "//:pytest_config",
                # Changing the venv's packages must rerun tests: Bazel cannot see into it.
                "@local_python//:venv_manifest.txt",
            ],
            # An __init__.py made by Bazel at the runfiles root would shadow the
            # `ember` namespace package (the workspace is also named ember).
            legacy_create_init = False,
            python_version = "PY3",
            srcs_version = "PY3",
            shard_count = shard_counts.get(test_name, shard_count),
            size = size,
            timeout = timeout,
            tags = tags,
            flaky = flaky,
        )
        tests.append(":" + test_name)
    if name:
        native.test_suite(name = name, tests = tests)

def ember_component(name, deps = [], extra_data = []):
    """The py_library of one component dir (ember/<name>/** plus its data files) and
    a filegroup :metadata (BUILD.bazel, README.md, VERSION, pyproject.toml).

    imports = ["."] puts the component dir on sys.path, where the pkgutil-style
    ember/__init__.py joins all components into one `ember` namespace.
    """
    native.py_library(
        name = name,
        srcs = native.glob(["ember/**/*.py"], allow_empty = True),
        data = native.glob(
            ["ember/**", "csrc/**", "VERSION", "pyproject.toml"],
            # Built extensions are outputs of the compiler driver, not sources.
            exclude = ["**/*.py", "**/__pycache__/**", "**/*.pyc", "**/*.so", "**/*.o"],
            allow_empty = True,
        ) + extra_data,
        imports = ["."],
        deps = deps,
        visibility = ["//visibility:public"],
    )

    # The component's top-level files, for tests that check the repository layout.
    native.filegroup(
        name = "metadata",
        srcs = native.glob(["BUILD.bazel", "README.md", "VERSION", "pyproject.toml"], allow_empty = True),
        visibility = ["//visibility:public"],
    )
