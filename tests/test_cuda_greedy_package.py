"""Greedy decoding's choice on the GPU, at package time: a CUDA decode step's artifact carries an
`ember_greedy` kernel for its logits, tokens and positions types (compiled to an sm_90 cubin,
without a GPU) and the decode entry names it; the step's own launches are unchanged. The
kernel's behaviour is test_cuda_greedy.py's; the GPU run is in test_decode_package_cuda.py.
"""

import pathlib

import pytest
import torch

pytest.importorskip("triton")

import ember.cpp_wrapper as cw  # noqa: E402
from decode_model import BATCH, LAYERS, zero_caches  # noqa: E402
from decode_model import model  # noqa: E402,F401  (a fixture)
from ember.cpp_wrapper import cuda_greedy  # noqa: E402


def test_a_cuda_decode_step_carries_the_kernel_and_names_it(model):
    example = (torch.tensor([[1]] * BATCH), torch.tensor([0]), *zero_caches())
    art, _, spec = cw.decode.decode_step_artifact(model, example, tokens=0, positions=1,
                                                  caches=range(2, 2 + 2 * LAYERS))  # fmt: skip
    assert "greedy_kernel" not in spec  # a CPU step: the host chooses
    art2, spec2 = cuda_greedy.add_greedy_kernel(art, spec, arch=90)
    assert spec2 == {**spec, "greedy_kernel": "ember_greedy_fp32_i64_i64"}
    (kernel,) = [k for k in art2.kernels if k.name.startswith(cuda_greedy.NAME)]
    assert kernel.name == spec2["greedy_kernel"] and len(art2.kernels) == len(art.kernels) + 1
    assert pathlib.Path(kernel.binary).read_bytes()[:4] == b"\x7fELF"  # an sm_90 cubin
    assert art2.steps == art.steps  # launched by ember_generate, not by the step
