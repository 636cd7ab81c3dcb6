"""The C ABI: the C++ layout/contract tests, and the library driven from ctypes by its documented
layout (a second, independent reading of ember_runtime.h)."""

import ctypes
import subprocess

import cppw_artifacts as A
import pytest
import torch

from ember.cpp_wrapper import _build, package
from ember.cpp_wrapper.errors import STATUS


@pytest.mark.parametrize("name", ["abi_test", "formats_test", "gemm_test", "pool_test"])
def test_cpp_program(name):
    exe = _build.build_cpp_test(name)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout


# ---- ctypes mirror of the documented layout ----------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]

ALLOCATE = ctypes.CFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, DLDevice, ctypes.c_void_p
)
RELEASE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, DLDevice, ctypes.c_void_p
)


class EmberAllocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("allocate", ALLOCATE), ("release", RELEASE)]


class EmberLoadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device_id", ctypes.c_int32),
        ("allocator", ctypes.POINTER(EmberAllocator)),
        ("cublas_path", ctypes.c_char_p),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class EmberTensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", DLDataType),
        ("device_type", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("dim_names", ctypes.POINTER(ctypes.c_char_p)),
    ]


def test_ctypes_mirror_matches_the_documented_sizes():
    assert ctypes.sizeof(EmberAllocator) == 24
    assert ctypes.sizeof(EmberLoadOptions) == 32 and EmberLoadOptions.cublas_path.offset == 16
    assert ctypes.sizeof(EmberTensorInfo) == 40 and EmberTensorInfo.shape.offset == 24
    assert ctypes.sizeof(DLTensor) == 48 and DLManagedTensor.deleter.offset == 56


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(_build.build_runtime_library()))
    lib.ember_abi_version.restype = ctypes.c_uint32
    lib.ember_last_error.restype = ctypes.c_char_p
    lib.ember_status_name.restype = ctypes.c_char_p
    lib.ember_model_num_inputs.restype = ctypes.c_size_t
    lib.ember_model_num_outputs.restype = ctypes.c_size_t
    lib.ember_package_load.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(EmberLoadOptions),
        ctypes.POINTER(ctypes.c_void_p),
    ]
    lib.ember_model_input_info.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.POINTER(EmberTensorInfo),
    ]
    lib.ember_model_run.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.POINTER(DLManagedTensor)),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.POINTER(DLManagedTensor)),
        ctypes.c_size_t,
        ctypes.c_void_p,
    ]
    lib.ember_model_free.argtypes = [ctypes.c_void_p]
    lib.ember_model_num_inputs.argtypes = [ctypes.c_void_p]
    lib.ember_model_num_outputs.argtypes = [ctypes.c_void_p]
    return lib


def test_library_exports_only_the_c_abi(lib):
    path = _build.build_runtime_library()
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.split()[1] in "TDBRtdbr"}
    assert {
        "ember_abi_version",
        "ember_model_run",
        "ember_package_load",
        "ember_last_error",
    } <= names
    assert all(n.startswith("ember_") for n in names if not n.startswith("_")), sorted(names)
    assert lib.ember_abi_version() == 1


def _tensor(t: torch.Tensor, device_type=1):
    shape = (ctypes.c_int64 * t.dim())(*t.shape)
    m = DLManagedTensor()
    m.dl_tensor = DLTensor(
        t.data_ptr(), DLDevice(device_type, 0), t.dim(), DLDataType(2, 32, 1), shape, None, 0
    )
    m.deleter = DELETER(0)
    return m, shape


def _load(lib, path, options=None):
    model = ctypes.c_void_p()
    st = lib.ember_package_load(str(path).encode(), options, ctypes.byref(model))
    assert st == 0, lib.ember_last_error()
    return model


def test_run_through_the_c_abi_with_a_caller_allocator(lib, tmp_path):
    consts = A.small_mlp_constants()
    path = package(A.small_mlp(), tmp_path / "mlp", constants=consts)
    buffers, calls = {}, {"alloc": 0, "release": 0}

    @ALLOCATE
    def allocate(ctx, nbytes, device, stream):
        buf = ctypes.create_string_buffer(max(nbytes, 1) + 64)
        addr = (ctypes.addressof(buf) + 63) // 64 * 64
        buffers[addr] = buf
        calls["alloc"] += 1
        return addr

    @RELEASE
    def release(ctx, ptr, nbytes, device, stream):
        calls["release"] += 1
        del buffers[ptr]

    allocator = EmberAllocator(None, allocate, release)
    options = EmberLoadOptions(
        ctypes.sizeof(EmberLoadOptions), 0, ctypes.pointer(allocator), None, 0, 0
    )
    model = _load(lib, path, ctypes.byref(options))
    info = EmberTensorInfo()
    assert lib.ember_model_input_info(model, 0, ctypes.byref(info)) == 0
    assert info.name == b"x" and info.ndim == 2 and (info.shape[0], info.shape[1]) == (6, 8)

    x = torch.randn(6, 8)
    arg, _shape = _tensor(x)
    inputs = (ctypes.POINTER(DLManagedTensor) * 1)(ctypes.pointer(arg))
    outputs = (ctypes.POINTER(DLManagedTensor) * 1)()
    assert lib.ember_model_run(model, inputs, 1, outputs, 1, None) == 0, lib.ember_last_error()
    out = outputs[0].contents.dl_tensor
    assert (out.ndim, out.shape[0], out.shape[1]) == (2, 6, 4)
    values = torch.frombuffer(
        (ctypes.c_float * 24).from_address(out.data), dtype=torch.float32
    ).reshape(6, 4)
    torch.testing.assert_close(values.clone(), A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)
    outputs[0].contents.deleter(outputs[0])
    lib.ember_model_free(model)
    assert calls["alloc"] >= 2 and calls["release"] == calls["alloc"] and not buffers


def test_a_tensor_on_another_device_is_rejected(lib, tmp_path):
    path = package(A.small_mlp(), tmp_path / "mlp", constants=A.small_mlp_constants())
    model = _load(lib, path)
    arg, _shape = _tensor(torch.randn(6, 8), device_type=2)  # claims to live on CUDA
    inputs = (ctypes.POINTER(DLManagedTensor) * 1)(ctypes.pointer(arg))
    outputs = (ctypes.POINTER(DLManagedTensor) * 1)()
    st = lib.ember_model_run(model, inputs, 1, outputs, 1, None)
    assert st == STATUS["EMBER_ERR_DEVICE"]
    assert b"input 'x' is on cuda:0; the model runs on cpu" in lib.ember_last_error()
    assert lib.ember_status_name(st) == b"EMBER_ERR_DEVICE"
    assert (
        lib.ember_model_run(model, inputs, 0, outputs, 1, None)
        == STATUS["EMBER_ERR_INVALID_ARGUMENT"]
    )
    lib.ember_model_free(model)
