"""Run by python_configure.bzl with the chosen interpreter; prints KEY=VALUE lines.

Packages are located with importlib.util.find_spec, never imported: this runs on
every Bazel server start, must stay fast, and must work when a package is missing.
"""
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig


def pkg_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return ""
    return list(spec.submodule_search_locations)[0]


def existing(*parts):
    path = os.path.join(*parts) if all(parts) else ""
    return path if path and os.path.exists(path) else ""


torch = pkg_dir("torch")
# Newer torch ships torch/include/dlpack/dlpack.h; torch 2.x ships ATen/dlpack.h.
dlpack = existing(torch, "include", "dlpack", "dlpack.h") or existing(torch, "include", "ATen", "dlpack.h")
# name==version of every installed distribution; it becomes a data dependency of
# every py_test, so changing what is installed reruns the tests.
dists = sorted("%s==%s" % (d.metadata["Name"], d.version) for d in importlib.metadata.distributions())

include = sysconfig.get_paths()["include"]

print("VERSION=%d.%d.%d" % sys.version_info[:3])
print("PYTHON_INCLUDE=" + (include if existing(include, "Python.h") else ""))
print("NANOBIND_DIR=" + pkg_dir("nanobind"))
print("PYBIND11_INCLUDE=" + existing(pkg_dir("pybind11"), "include"))
print("DLPACK_H=" + dlpack)
print("MANIFEST=" + ";".join(dists))
