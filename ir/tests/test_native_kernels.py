"""ember.ir.native_kernels: registering an operator's C++ kernel checks the op and its schema."""

import pytest
import torch

from ember.ir.native_kernels import cpp_kernel, register_cpp_kernel, unregister_cpp_kernel

_LIB = torch.library.Library("ember_ir_nk", "DEF")
_LIB.define("mix(Tensor x, Tensor? bias, float a, int[] dims, bool flag) -> Tensor")
_LIB.define("fill_(Tensor(a!) x, float v) -> ()")
_LIB.define("named(Tensor x, str how) -> Tensor")
_LIB.define("pair(Tensor x) -> (Tensor, int)")

SRC = 'extern "C" int32_t k(const EmberKernelArgs* a) { return 0; }'


def test_register_records_how_each_argument_is_passed():
    k = register_cpp_kernel("ember_ir_nk::mix", SRC, "k")
    try:
        assert k.op == "ember_ir_nk::mix.default" and cpp_kernel(k.op) is k
        assert k.kinds == ("tensor", "tensor?", "float", "int[]", "int")
        assert (k.mutated, k.num_outputs) == ((), 1)
        m = register_cpp_kernel(torch.ops.ember_ir_nk.fill_, SRC, "k")
        assert (m.op, m.mutated, m.num_outputs) == ("ember_ir_nk::fill_.default", (0,), 0)
    finally:
        unregister_cpp_kernel("ember_ir_nk::mix")
        unregister_cpp_kernel("ember_ir_nk::fill_")
    assert cpp_kernel("ember_ir_nk::mix.default") is None


@pytest.mark.parametrize("op, function, source, error", [
    ("ember_ir_nk::nothing", "k", SRC, "not defined in this process"),
    ("not an op", "k", SRC, "is not an operator"),
    ("ember_ir_nk::mix", "k-1", SRC, "not a C identifier"),
    ("ember_ir_nk::mix", "other", SRC, "does not define 'other'"),
    ("ember_ir_nk::named", "k", SRC, "takes how: str"),
    ("ember_ir_nk::pair", "k", SRC, "returns int"),
])  # fmt: skip
def test_register_refuses_what_a_cpp_kernel_cannot_take(op, function, source, error):
    with pytest.raises((TypeError, ValueError, NotImplementedError), match=error):
        register_cpp_kernel(op, source, function)
