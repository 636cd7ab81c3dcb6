"""ember.export -> ember.cpp_wrapper.package -> a package run without Python, and in process.

Cross-component: dynamo captures, aot_autograd lowers to prims, cpp_wrapper compiles the graph
with ember.inductor (through its registry) and writes the package with the weights frozen in.
"""

import ctypes
import fcntl
import json
import math
import os
import subprocess

import numpy as np
import pytest
import torch

import ember
from ember.cpp_wrapper import EmberRuntimeError, install_run_package, load_package, package

TOL = dict(atol=1e-4, rtol=1e-4)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Tanh(),
            torch.nn.Linear(16, 4),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


def make(name):
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval(), torch.randn(5, 8)
    model = CNN().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(2, 3, 8, 8)


@pytest.fixture(scope="module")
def run_package(tmp_path_factory):
    return install_run_package(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def packaged(request, tmp_path_factory):
    model, x = make(request.param)
    exported = ember.export(model, (x,))
    path = package(exported, tmp_path_factory.mktemp(request.param) / "pkg", device="cpu")
    return model, x, exported, path


def _run(run_package, path, x: np.ndarray, tmp_path):
    np.save(tmp_path / "x.npy", x)
    return subprocess.run(
        [str(run_package), str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True, text=True,
    )  # fmt: skip


def test_package_matches_eager_in_process_and_standalone(packaged, run_package, tmp_path):
    model, x, exported, path = packaged
    y = torch.randn_like(x)  # not the export's example: the weights are frozen, the input is not
    want = model(y).detach()
    torch.testing.assert_close(load_package(path)(y)[0], want, **TOL)
    r = _run(run_package, path, y.numpy(), tmp_path)
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), want, **TOL)
    manifest = json.loads((path / "manifest.json").read_text())
    assert len(manifest["inputs"]) == 1 and len(manifest["constants"]) == len(exported.constants)
    signature = json.loads((path / "signature.json").read_text())
    assert [i["name"] for i in signature["inputs"]] == ["x"]
    assert sorted(signature["constants"].values()) == sorted(exported.constant_fqns.values())


def test_package_links_neither_libtorch_nor_libpython(packaged):
    ldd = subprocess.run(["ldd", str(packaged[3] / "model.so")], capture_output=True, text=True)
    assert ldd.returncode == 0 and "libc.so" in ldd.stdout, ldd.stdout + ldd.stderr
    assert "libtorch" not in ldd.stdout and "libpython" not in ldd.stdout, ldd.stdout


@pytest.mark.parametrize("bad, status, text", [
    ("dtype", 2, "expected float32, got float64"),
    ("shape", 3, "size of dimension"),
    ("rank", 3, "dimensions"),
])  # fmt: skip
def test_wrong_input_is_an_error_code_with_a_message(packaged, run_package, tmp_path, bad, status,
                                                     text):  # fmt: skip
    x = packaged[1]
    wrong = {"dtype": x.double(), "shape": torch.cat([x, x], -1), "rank": x[0]}[bad]
    with pytest.raises(EmberRuntimeError, match=text) as info:
        load_package(packaged[3])(wrong)
    assert info.value.status == status
    r = _run(run_package, packaged[3], wrong.numpy(), tmp_path)
    assert r.returncode == status and text in r.stderr, (r.returncode, r.stderr)


def test_package_from_a_saved_exported_program(tmp_path):
    model, x = make("mlp")
    saved = ember.export(model, (x,)).save(tmp_path / "exported")
    path = package(saved, tmp_path / "pkg")
    torch.testing.assert_close(load_package(path)(x)[0], model(x).detach(), **TOL)


class TinyDecoder(torch.nn.Module):
    """Token and position embeddings, causal self-attention and an MLP, sized by the input."""

    def __init__(self, vocab=50, dim=32, heads=4):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(64, dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, dim))  # fmt: skip
        self.heads = heads

    def forward(self, ids):
        b, t = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        q, k, v = self.qkv(self.norm(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        # (attention written out: the package runtime has no CPU attention kernel)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm(x))


def test_a_package_with_dynamic_sizes_runs_every_size_in_range(run_package, tmp_path):
    """ember.export with Dims -> a package compiled once for every batch and length in range:
    each matches eager, in process and standalone; a size outside a range is an error naming it."""
    Dim = ember.export.Dim
    torch.manual_seed(0)
    model = TinyDecoder().eval()
    batch, seq = Dim("batch", min=2, max=8), Dim("seq", min=2, max=48)
    exported = ember.export(model, (torch.randint(0, 50, (3, 11)),),
                            dynamic_shapes={"ids": {0: batch, 1: seq}})  # fmt: skip
    path = package(exported, tmp_path / "pkg")
    compiled = load_package(path)
    for b, t in ((2, 2), (3, 17), (8, 48), (5, 30)):
        ids = torch.randint(0, 50, (b, t))
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(compiled(ids)[0], want, **TOL)
        torch.testing.assert_close(exported(ids), want, **TOL)
    np.save(tmp_path / "ids.npy", ids.numpy())
    r = subprocess.run([str(run_package), str(path), str(tmp_path / "ids.npy"),
                        str(tmp_path / "out.npy")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "out.npy")), want, **TOL)
    for b, t in ((2, 49), (9, 4)):
        with pytest.raises(EmberRuntimeError, match="outside its range"):
            compiled(torch.randint(0, 50, (b, t)))
    np.save(tmp_path / "long.npy", torch.randint(0, 50, (2, 60)).numpy())
    r = subprocess.run([str(run_package), str(path), str(tmp_path / "long.npy"),
                        str(tmp_path / "out.npy")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and "outside its range" in r.stderr, r.stderr


class ConvNet(torch.nn.Module):
    """Every convolution kind the CUDA runtime gets as im2col + matmul (or a reduction)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 5, stride=2, padding=2, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.pw = torch.nn.Conv2d(8, 16, 1)
        self.down = torch.nn.Conv2d(16, 12, 1, stride=2)
        self.grouped = torch.nn.Conv2d(12, 12, 3, padding=1, groups=3)
        self.c1d = torch.nn.Conv1d(12, 6, 3, padding=1)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.grouped(self.down(torch.relu(self.pw(self.dw(x)))))
        return self.fc(self.c1d(x.flatten(2)).mean(-1))


def test_conv_as_matmul_package_matches_eager(run_package, tmp_path, monkeypatch):
    """What a CUDA package does with convolutions, forced on for the CPU runtime."""
    from ember.cpp_wrapper import config
    from ember.cpp_wrapper.exported import compile_exported

    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(2, 3, 20, 20)
    exported = ember.export(model, (x,))
    monkeypatch.setattr(config, "conv_as_matmul", True)
    externs = [s.target for s in compile_exported(exported, "cpu")[0].steps if s.kind == "extern"]
    assert "extern.convolution" not in externs and externs.count("extern.bmm") == 4, externs
    path = package(exported, tmp_path / "pkg", device="cpu")
    y = torch.randn_like(x)
    want = model(y).detach()
    torch.testing.assert_close(load_package(path)(y)[0], want, **TOL)
    r = _run(run_package, path, y.numpy(), tmp_path)
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), want, **TOL)


def test_a_package_loaded_twice_leaves_no_alias_for_the_next_package(tmp_path):
    """glibc adds a name under which an already loaded library was found to that library's
    names: the second load of one package (through /proc/self/fd/M) made M a name of the first
    library, and the next package opened as fd M got the first package's library (a hash
    mismatch in CI). Each load must get its own package's library."""
    paths = {}
    for name in ("mlp", "cnn"):
        model, x = make(name)
        paths[name] = (model, x, package(ember.export(model, (x,)), tmp_path / name, device="cpu"))
    model, x, path = paths["mlp"]
    first, second = load_package(path), load_package(path)
    for loaded in (first, second):
        torch.testing.assert_close(loaded(x)[0], model(x).detach(), **TOL)
    model, x, path = paths["cnn"]
    torch.testing.assert_close(load_package(path)(x)[0], model(x).detach(), **TOL)


def _numbers_answered_by_a_loaded_library(so_path, count=300):
    """Of `count` free descriptor numbers from the lowest up, made to hold `so_path` (a library
    not loaded), those a loaded library answers to by name: dlopen(RTLD_NOLOAD) finds one."""
    libc = ctypes.CDLL(None)
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    libc.dlclose.argtypes = [ctypes.c_void_p]
    held, answered = [os.open(so_path, os.O_RDONLY | os.O_CLOEXEC)], []
    try:
        for _ in range(count):
            n = held[-1]
            h = libc.dlopen(f"/proc/self/fd/{n}".encode(), os.RTLD_LAZY | os.RTLD_NOLOAD)
            if h:
                answered.append(n)
                libc.dlclose(h)
            held.append(fcntl.fcntl(held[0], fcntl.F_DUPFD_CLOEXEC, n + 1))
    finally:
        for fd in held:
            os.close(fd)
    return answered


def test_a_package_loaded_again_is_found_by_its_file_not_by_new_names(tmp_path):
    """The second load of a package gets the library of the first because it is the same file
    (st_dev, st_ino), not by trying descriptor numbers: asking glibc about each number made it
    a name of that library (glibc adds a name that reached a loaded file), ~256 of them, each
    one the next package opened under had to step over."""
    paths = {}
    for name in ("mlp", "cnn"):
        model, x = make(name)
        paths[name] = (model, x, package(ember.export(model, (x,)), tmp_path / name, device="cpu"))
    model, x, path = paths["mlp"]
    loaded = [load_package(path) for _ in range(3)]
    for one in loaded:
        torch.testing.assert_close(one(x)[0], model(x).detach(), **TOL)
    (so,) = [f for f in path.iterdir() if f.suffix == ".so"]
    (other,) = [f for f in paths["cnn"][2].iterdir() if f.suffix == ".so"]  # not loaded yet
    assert so.stat().st_ino != other.stat().st_ino
    # the names through which the mlp's library was loaded, at most one a load
    assert len(_numbers_answered_by_a_loaded_library(other)) <= len(loaded)
    model, x, path = paths["cnn"]
    torch.testing.assert_close(load_package(path)(x)[0], model(x).detach(), **TOL)
