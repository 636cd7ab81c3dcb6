"""Repository rule @local_python: the venv interpreter as Bazel's Python toolchain,
plus C/C++ header targets found through it (Python, nanobind, pybind11, DLPack, CUDA).

Nothing is downloaded and nothing is copied: the repository holds symlinks to the
installed files and a generated BUILD file.

It is `local = True`, so it is re-run once per Bazel server start (./bazelw shuts
the server down after changing the venv); EMBER_PYTHON and CUDA_HOME changes also re-run it.
"""

def _probe(rctx, python):
    res = rctx.execute([python, rctx.path(Label("//third_party/python:probe.py"))])
    if res.return_code != 0:
        fail("python_configure: %s failed to run probe.py:\n%s" % (python, res.stderr))
    out = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out

def _find_python(rctx):
    if rctx.os.environ.get("EMBER_PYTHON"):
        return rctx.os.environ["EMBER_PYTHON"]
    workspace = rctx.path(Label("//:WORKSPACE")).dirname
    venv_python = rctx.path("%s/.venv/bin/python" % workspace)
    if venv_python.exists:
        # The venv path itself, not its resolved target: the interpreter finds its
        # site-packages through .venv/pyvenv.cfg next to it.
        return str(venv_python)
    python = rctx.which("python3")
    if not python:
        fail("python_configure: no %s and no python3 on PATH; run ./bazelw once" % venv_python)
    print("WARNING: %s not found, using %s from PATH; run ./bazelw to create the venv" % (venv_python, python))
    return str(python)

def _find_cuda_include(rctx):
    candidates = []
    for var in ["CUDA_HOME", "CUDA_PATH"]:
        if rctx.os.environ.get(var):
            candidates.append(rctx.os.environ[var] + "/include")
    nvcc = rctx.which("nvcc")
    if nvcc:
        candidates.append(str(nvcc.dirname) + "/../include")
    candidates.append("/usr/local/cuda/include")
    for inc in candidates:
        if rctx.path(inc + "/cuda.h").exists:
            return inc
    return ""

def _link(rctx, target, name):
    """Symlinks target into the repository as name; returns whether it existed."""
    if target and rctx.path(target).exists:
        rctx.symlink(target, name)
        return True
    return False

def _python_configure_impl(rctx):
    python = _find_python(rctx)
    info = _probe(rctx, python)

    _link(rctx, info["PYTHON_INCLUDE"], "python_include")
    _link(rctx, info["NANOBIND_DIR"], "nanobind")
    _link(rctx, info["PYBIND11_INCLUDE"], "pybind11_include")
    _link(rctx, info["DLPACK_H"], "dlpack_include/dlpack/dlpack.h")
    _link(rctx, _find_cuda_include(rctx), "cuda_include")
    rctx.file("venv_manifest.txt", "python %s at %s\n%s\n" % (
        info["VERSION"],
        python,
        "\n".join(info["MANIFEST"].split(";")),
    ))
    rctx.template("BUILD.bazel", Label("//third_party/python:BUILD.local_python.tpl"), {
        "%{interpreter}": python,
    })

python_configure = repository_rule(
    implementation = _python_configure_impl,
    local = True,
    environ = ["EMBER_PYTHON", "CUDA_HOME", "CUDA_PATH"],
)
