"""AOT packages: written by package(), loaded in process and by the standalone run_package."""

import json
import subprocess

import cppw_artifacts as A
import numpy as np
import pytest
import torch

from ember.cpp_wrapper import EmberRuntimeError, install_run_package, load_package, package
from ember.cpp_wrapper.errors import STATUS


@pytest.fixture(scope="module")
def run_package(tmp_path_factory):
    return install_run_package(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    consts = A.small_mlp_constants()
    path = package(A.small_mlp(), tmp_path_factory.mktemp("pkg") / "mlp", constants=consts)
    return path, consts


def run(exe, *args):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)


def test_package_layout_and_manifest(mlp_package):
    path, _ = mlp_package
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "model.so", "weights.bin"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert (
        manifest["format"] == "ember-package"
        and manifest["abi_version"] == 1
        and manifest["ir_version"] == 1
    )
    assert manifest["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [6, 8], "strides": [8, 1]}
    ]
    assert [c["name"] for c in manifest["constants"]] == ["w1", "b1", "w2", "b2"]
    assert all(c["offset"] % 64 == 0 for c in manifest["constants"])
    assert manifest["weights"]["size"] == (path / "weights.bin").stat().st_size


def test_package_runs_in_process(mlp_package):
    path, consts = mlp_package
    x = torch.randn(6, 8)
    torch.testing.assert_close(
        load_package(path)(x)[0], A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4
    )


def test_two_packages_live_in_one_process(mlp_package, tmp_path):
    """Each package's own library runs, though both were opened as /proc/self/fd/N (dlopen
    matches loaded libraries by that name: the second load once got the first's library)."""
    path, consts = mlp_package
    w = torch.randn(8)
    other = package(A.elementwise_reduction(), tmp_path / "ew", constants={"w": w})
    for _ in range(2):  # then again, once the first pair is freed
        mlp, ew = load_package(path), load_package(other)
        x = torch.randn(6, 8)
        torch.testing.assert_close(mlp(x)[0], A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)
        for got, want in zip(ew(x), A.elementwise_reduction_eager(x, w)):
            torch.testing.assert_close(got, want)
        del mlp, ew


def test_run_package_reads_and_writes_npy(mlp_package, run_package, tmp_path):
    path, consts = mlp_package
    x = torch.randn(6, 8)
    np.save(tmp_path / "in.npy", x.numpy())
    r = run(run_package, path, tmp_path / "in.npy", tmp_path / "out.npy")
    assert r.returncode == 0, r.stderr
    out = torch.from_numpy(np.load(tmp_path / "out.npy"))
    torch.testing.assert_close(out, A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)


def test_run_package_bench_times_the_model(mlp_package, run_package, tmp_path):
    path, consts = mlp_package
    x = torch.randn(6, 8)
    np.save(tmp_path / "in.npy", x.numpy())
    r = run(run_package, "--bench", 50, "--rounds", 3, path, tmp_path / "in.npy",
            tmp_path / "out.npy")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fields = dict(f.split("=") for f in r.stdout.split()[1:])
    assert r.stdout.startswith("bench ") and fields["calls"] == "50" and fields["rounds"] == "3"
    assert 0 < float(fields["sync_median_ms"]) < 1000 and 0 < float(fields["loop_median_ms"]) < 1000
    out = torch.from_numpy(np.load(tmp_path / "out.npy"))  # the warm-up run wrote the output
    torch.testing.assert_close(out, A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)
    r = run(run_package, "--bench", 5, path, tmp_path / "in.npy")  # outputs may be left out
    assert r.returncode == 0 and "loop_median_ms=" in r.stdout, r.stderr
    r = run(run_package, path, tmp_path / "in.npy")  # but not without --bench
    assert r.returncode == STATUS["EMBER_ERR_INVALID_ARGUMENT"], r.stderr


def test_run_package_with_dynamic_shapes_and_two_outputs(run_package, tmp_path):
    w = torch.randn(8)
    path = package(A.elementwise_reduction(), tmp_path / "ew", constants={"w": w})
    x = torch.randn(11, 8)
    np.save(tmp_path / "x.npy", x.numpy())
    r = run(run_package, path, tmp_path / "x.npy", tmp_path / "act.npy", tmp_path / "sum.npy")
    assert r.returncode == 0, r.stderr
    act, total = A.elementwise_reduction_eager(x, w)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "act.npy")), act)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "sum.npy")), total)
    info = run(run_package, path, "--info").stdout
    assert (
        "input x dtype=(2,32) shape=[s0, 8]" in info
        and "output out dtype=(2,32) shape=[s0]" in info
    )


@pytest.mark.parametrize(
    "array, status, words",
    [
        (np.zeros((6, 8), np.float64), "EMBER_ERR_DTYPE", "expected float32, got float64"),
        (np.zeros((6, 9), np.float32), "EMBER_ERR_SHAPE", "dimension 1 is 9, expected 8"),
        (np.zeros((6,), np.float32), "EMBER_ERR_SHAPE", "expected 2 dimensions"),
    ],
)
def test_run_package_reports_wrong_inputs(mlp_package, run_package, tmp_path, array, status, words):
    np.save(tmp_path / "in.npy", array)
    r = run(run_package, mlp_package[0], tmp_path / "in.npy", tmp_path / "out.npy")
    assert r.returncode == STATUS[status], r.stderr
    assert status in r.stderr and words in r.stderr
    assert not (tmp_path / "out.npy").exists()


def _copy_package(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _truncate(path, name):
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])


def _flip_byte(path, name):
    data = bytearray((path / name).read_bytes())
    data[len(data) // 3] ^= 0xFF
    (path / name).write_bytes(bytes(data))


def _edit_manifest(path, **changes):
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    (path / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "damage, status, words",
    [
        (lambda p: _truncate(p, "model.so"), "EMBER_ERR_PACKAGE", "truncated"),
        (lambda p: _truncate(p, "weights.bin"), "EMBER_ERR_PACKAGE", "truncated"),
        (lambda p: _flip_byte(p, "model.so"), "EMBER_ERR_PACKAGE", "SHA-256"),
        (lambda p: _flip_byte(p, "weights.bin"), "EMBER_ERR_PACKAGE", "SHA-256"),
        (lambda p: _truncate(p, "manifest.json"), "EMBER_ERR_PACKAGE", "not valid JSON"),
        (
            lambda p: (p / "manifest.json").write_text('{"name": "resnet", "version": 3}'),
            "EMBER_ERR_PACKAGE",
            "foreign",
        ),
        (lambda p: (p / "model.so").unlink(), "EMBER_ERR_PACKAGE", "missing"),
        (lambda p: (p / "manifest.json").unlink(), "EMBER_ERR_PACKAGE", "no manifest"),
        (lambda p: _edit_manifest(p, abi_version=99), "EMBER_ERR_VERSION", "abi_version is 99"),
        (lambda p: _edit_manifest(p, ir_version=2), "EMBER_ERR_VERSION", "ir_version is 2"),
        (
            lambda p: _edit_manifest(p, library={"file": "../model.so", "size": 1, "sha256": ""}),
            "EMBER_ERR_PACKAGE",
            "invalid file",
        ),
    ],
)
def test_damaged_or_foreign_packages_are_rejected(
    mlp_package, run_package, tmp_path, damage, status, words
):
    path = _copy_package(mlp_package[0], tmp_path / "pkg")
    damage(path)
    with pytest.raises(EmberRuntimeError, match=words) as info:
        load_package(path)
    assert info.value.status == STATUS[status]
    np.save(tmp_path / "in.npy", np.zeros((6, 8), np.float32))
    r = run(run_package, path, tmp_path / "in.npy", tmp_path / "out.npy")
    assert r.returncode == STATUS[status] and words in r.stderr


def test_a_foreign_shared_object_is_not_a_model(mlp_package, tmp_path):
    """A package whose model.so is another library (checksums made to match) is still rejected."""
    path = _copy_package(mlp_package[0], tmp_path / "pkg")
    other = package(A.alias_output(), tmp_path / "other")
    (path / "model.so").write_bytes((other / "model.so").read_bytes())
    library = json.loads((other / "manifest.json").read_text())["library"]
    _edit_manifest(path, library=library)
    with pytest.raises(EmberRuntimeError, match="does not belong to this package"):
        load_package(path)


def test_package_links_neither_libtorch_nor_libpython(mlp_package, run_package):
    for binary in (run_package, mlp_package[0] / "model.so"):
        libs = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        assert "not found" not in libs
        for forbidden in ("libtorch", "libc10", "libpython"):
            assert forbidden not in libs, f"{binary.name} links {forbidden}:\n{libs}"


def test_package_refuses_to_overwrite_other_directories(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.txt").write_text("...")
    with pytest.raises(FileExistsError):
        package(A.small_mlp(), tmp_path / "precious", constants=A.small_mlp_constants())


def test_package_from_an_exported_like_object(tmp_path):
    class Exported:  # what ember.export will hand over: an artifact and its constants
        artifact = A.small_mlp()
        constants = A.small_mlp_constants()

    path = package(Exported(), tmp_path / "exported")
    x = torch.randn(6, 8)
    torch.testing.assert_close(
        load_package(path)(x)[0], A.small_mlp_eager(x, Exported.constants), atol=1e-4, rtol=1e-4
    )
