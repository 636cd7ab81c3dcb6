"""Artifacts run in process through ember.cpp_wrapper._C, compared with torch eager."""

import dataclasses

import cppw_artifacts as A
import pytest
import torch
from ember.ir import KernelIR

from ember.cpp_wrapper import (
    EmberRuntimeError,
    UnsupportedArtifactError,
    config,
    generate_wrapper,
    load_artifact,
)
from ember.cpp_wrapper.errors import STATUS


@pytest.fixture(scope="module")
def ew_model():
    w = torch.randn(8)
    return load_artifact(A.elementwise_reduction(), {"w": w}), w


@pytest.mark.parametrize("rows", [2, 5, 33])
def test_elementwise_and_reduction_with_dynamic_rows(ew_model, rows):
    model, w = ew_model
    x = torch.randn(rows, 8)
    got = model(x)
    for g, want in zip(got, A.elementwise_reduction_eager(x, w)):
        torch.testing.assert_close(g, want)
    assert len(got) == 2 and got[1].shape == (rows,)


def test_constants_are_borrowed_not_copied():
    w = torch.zeros(8)
    model = load_artifact(A.elementwise_reduction(), {"w": w})
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x)[0], torch.relu(x))
    w += 1.0  # the runtime reads the caller's tensor in place
    torch.testing.assert_close(model(x)[0], torch.relu(x + 1.0))


def test_model_describes_its_inputs_and_outputs(ew_model):
    model, _ = ew_model
    assert model.inputs == [
        {"name": "x", "dtype": (2, 32, 1), "shape": [None, 8], "dim_names": ["s0", None]}
    ]
    assert [o["name"] for o in model.outputs] == ["act", "out"]
    assert model.device == torch.device("cpu")


@pytest.mark.parametrize(
    "make, status",
    [
        (lambda: torch.randn(3, 8, dtype=torch.float64), "EMBER_ERR_DTYPE"),
        (lambda: torch.randn(3, 7), "EMBER_ERR_SHAPE"),
        (lambda: torch.randn(3, 8, 1), "EMBER_ERR_SHAPE"),
        (lambda: torch.randn(1, 8), "EMBER_ERR_GUARD"),  # s0 >= 2
        (lambda: torch.randn(5000, 8), "EMBER_ERR_GUARD"),  # s0 <= 4096
    ],
)
def test_bad_inputs_are_rejected_with_a_status(ew_model, make, status):
    model, _ = ew_model
    with pytest.raises(EmberRuntimeError) as info:
        model(make())
    assert info.value.status == STATUS[status] and info.value.name == status
    assert "'x'" in info.value.message or "s0" in info.value.message


def test_wrong_number_of_inputs(ew_model):
    with pytest.raises(TypeError, match="takes 1 tensors"):
        ew_model[0](torch.randn(3, 8), torch.randn(3, 8))


def test_strided_inputs_are_restrided_or_rejected(ew_model):
    model, w = ew_model
    x = torch.randn(8, 4).t()  # (4, 8) with strides (1, 4)
    torch.testing.assert_close(model(x)[1], A.elementwise_reduction_eager(x, w)[1])
    config.restride_inputs = False
    try:
        with pytest.raises(EmberRuntimeError, match="stride") as info:
            model(x)
        assert info.value.status == STATUS["EMBER_ERR_SHAPE"]
    finally:
        config.restride_inputs = True


MATMUL_TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 2e-2, torch.bfloat16: 5e-2}


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "baddbmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_extern_matmul(op, dtype):
    art, shapes = A.matmul(op, dtype)
    xs = [torch.randn(s).to(dtype) for s in shapes]
    got = load_artifact(art)(*xs)[0]
    want = A.matmul_eager(op, *[x.double() for x in xs]).to(dtype)
    tol = MATMUL_TOL[dtype]
    torch.testing.assert_close(got, want, atol=tol * 10, rtol=tol)


def test_large_matmul_uses_every_block():
    art, _ = A.matmul("mm", m=130, k=300, n=1100)  # crosses the K, N and M blockings
    a, b = torch.randn(130, 300), torch.randn(300, 1100)
    torch.testing.assert_close(load_artifact(art)(a, b)[0], a @ b, atol=1e-3, rtol=1e-4)


def test_linear_through_a_view_step():
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(4, 8)
    torch.testing.assert_close(
        load_artifact(A.linear_view())(w, b, x)[0], torch.nn.functional.linear(x, w, b)
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2, "padding": 0},
        {"groups": 2, "co": 4},
        {"dilation": 2, "padding": 2, "bias": False},
        {"k": 1, "padding": 0},
        {"dim": 1, "stride": 2},
        {"channels_last": True, "stride": 2},
    ],
)
def test_extern_convolution(kw):
    art, shapes = A.convolution(**kw)
    xs = [torch.randn(s) for s in shapes]
    dim = kw.get("dim", 2)
    conv = torch.nn.functional.conv2d if dim == 2 else torch.nn.functional.conv1d
    want = conv(
        xs[0],
        xs[1],
        xs[2] if len(xs) > 2 else None,
        stride=kw.get("stride", 1),
        padding=kw.get("padding", 1),
        dilation=kw.get("dilation", 1),
        groups=kw.get("groups", 1),
    )
    got = load_artifact(art)(*xs)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    if kw.get("channels_last"):
        assert got.stride(1) == 1  # written in the planned NHWC layout


def test_output_that_aliases_an_input_is_copied():
    x = torch.randn(3, 4)
    (y,) = load_artifact(A.alias_output())(x)
    torch.testing.assert_close(y, x.t())
    x.zero_()
    assert y.abs().sum() > 0  # the output does not share the input's memory


def test_mlp_with_constants():
    consts = A.small_mlp_constants()
    model = load_artifact(A.small_mlp(), consts)
    x = torch.randn(6, 8)
    torch.testing.assert_close(model(x)[0], A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)


def test_freezing_an_input_into_a_constant():
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(4, 8)
    model = load_artifact(A.linear_view(), {"w": w, "b": b})
    assert [i["name"] for i in model.inputs] == ["x"]
    torch.testing.assert_close(model(x)[0], torch.nn.functional.linear(x, w, b))


def test_generated_wrapper_reads_like_the_plan():
    src = generate_wrapper(A.elementwise_reduction(), artifact_hash="abc", isa="generic")
    assert "EMBER_EXPORT const ember_abi::ModelDesc* ember_model_describe_v1()" in src
    assert "const int64_t s_s0 = in0->shape[0];" in src
    assert 'ember_abi::check_range(a, "s0", s_s0, 2, 4096)' in src
    assert "reinterpret_cast<void (*)(void**)>(a->kernels[1])(args);  // k_row_sum" in src
    assert src.index("k_add_relu") < src.index("k_row_sum")


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: dataclasses.replace(a, ir_version=2), "IR version 2"),
        (
            lambda a: dataclasses.replace(
                a, steps=(A.extern("extern.nonzero", [A.node("x")], "out"),)
            ),
            "no C\\+\\+ runtime",
        ),
        (
            lambda a: dataclasses.replace(
                a, kernels=(KernelIR("k_add_relu", "triton", "", "k", ("*fp32",)), a.kernels[1])
            ),
            "Triton kernel",
        ),
        (lambda a: dataclasses.replace(a, inputs=()), "appear in no input"),
    ],
)
def test_unsupported_artifacts_raise_clearly(mutate, match):
    with pytest.raises(UnsupportedArtifactError, match=match):
        generate_wrapper(mutate(A.elementwise_reduction()))


@pytest.mark.parametrize("target", ["extern.sdpa_efficient", "extern.sdpa_cudnn"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cuda_attention_externs_raise_the_same_clear_error(target, device):
    # a call Ember's own flash kernels did not take (they replace these externs when packaging)
    # stays a call into torch, which the C++ runtime cannot make: packaging it says so
    from ember.cpp_wrapper.extern_ops import bind_extern

    with pytest.raises(UnsupportedArtifactError,
                       match=f"{target}: an attention call that Ember's own flash kernel does "
                             "not take.*run it with the Python wrapper"):  # fmt: skip
        bind_extern(target, [A.node("q"), A.node("k"), A.node("v"), None], {}, device)
    step = A.extern(target, [A.node("x"), A.node("x"), A.node("x")], "out")
    with pytest.raises(UnsupportedArtifactError, match=f"{target}: an attention call"):
        generate_wrapper(dataclasses.replace(A.elementwise_reduction(), steps=(step,)))


def test_outputs_outlive_their_model():
    consts = A.small_mlp_constants()
    model = load_artifact(A.small_mlp(), consts)
    x = torch.randn(6, 8)
    kept = [model(x)[0] for _ in range(3)]
    del model  # frees the model and closes its library; the outputs keep the pool alive
    for y in kept:
        torch.testing.assert_close(y, A.small_mlp_eager(x, consts), atol=1e-4, rtol=1e-4)
    assert len({y.data_ptr() for y in kept}) == 3  # live outputs never share a block
