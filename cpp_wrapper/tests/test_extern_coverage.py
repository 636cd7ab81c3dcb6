"""Every extern op of the vocabulary is either run by the C++ runtime on the CPU or listed here,
with the reason it is not: a new extern, or one the runtime drops, fails this test.

Inductor calls an extern op it has no lowering for through its reference implementation, so any
extern-tagged op of the opset may appear in a CPU artifact; the in-process wrapper and packages then
need a kernel for it in csrc/runtime (extern_ops.EXTERN_OPS says which ones have one).
"""

import re

import pytest
from ember.ir.ops import golden_opset

from ember.cpp_wrapper import extern_ops
from ember.cpp_wrapper.errors import UnsupportedArtifactError
from ember.cpp_wrapper._build import CSRC

# Externs that inductor records only for CUDA tensors (the kernels behind them are CUDA-only).
CUDA_ONLY = {
    "extern.sdpa_efficient_backward": "memory-efficient attention is a CUDA kernel (training)",
    "extern.sdpa_flash_backward": "flash attention is a CUDA kernel (training)",
}

# Externs that can reach a CPU artifact but have no C++ kernel yet, and why. Shrink this list:
# an entry that gains a kernel must leave it (checked below).
KNOWN_MISSING = {
    "extern.custom_op": "no runtime kernel by design: a torch.library operator is called through "
    "the C++ kernel its user registers (ember.register_cpp_kernel, custom_kernels.py), a user "
    "Triton kernel as a cubin on CUDA (triton_aot.attach_cubins); any other is Python/torch "
    "code with nothing to call without Python (codegen says so and names the op)",
    "extern.nonzero": "a data-dependent output size: the runtime allocates outputs before the "
    "step runs, from sizes the plan knows",
    "extern.masked_select": "a data-dependent output size (as nonzero)",
    "extern.sdpa_flash_cpu_backward": "training only: packages and the C++ wrapper run inference "
    "graphs in practice, and the backward of attention is a large kernel",
    "extern.convolution_backward": "training only (as above); the forward convolution has a kernel",
}


# extern_ops.LOWERED_FOR_PACKAGES: attention that ember.inductor compiles for a package as its own
# flash kernel (C++ on the CPU, a Triton cubin on CUDA), so no runtime kernel is needed for it;
# tests/test_package_attention.py (CPU), tests/test_triton_flash_attention.py (the Triton
# kernel, no GPU) and tests/test_package_attention_cuda.py (a GPU) hold that to account.


def _vocabulary_externs() -> set[str]:
    return {name for name, op in golden_opset()["ops"].items() if "extern" in op["tags"]}


def _cpu_kernels() -> set[str]:
    return {name for name, spec in extern_ops.EXTERN_OPS.items() if "cpu" in spec.devices}


def test_every_extern_has_a_cpu_kernel_or_a_stated_reason():
    externs = _vocabulary_externs()
    assert "extern.mm" in externs and len(externs) > 10, sorted(externs)  # the table is read
    lowered = set(extern_ops.LOWERED_FOR_PACKAGES)
    unaccounted = externs - _cpu_kernels() - set(CUDA_ONLY) - set(KNOWN_MISSING) - lowered
    assert not unaccounted, (
        f"extern ops with neither a CPU kernel in the C++ runtime (csrc/runtime, extern_ops.py) "
        f"nor a reason in KNOWN_MISSING/CUDA_ONLY/LOWERED_FOR_PACKAGES: {sorted(unaccounted)}"
    )


def test_the_lists_only_shrink():
    lowered = set(extern_ops.LOWERED_FOR_PACKAGES)
    implemented = _cpu_kernels() & (set(KNOWN_MISSING) | set(CUDA_ONLY) | lowered)
    assert not implemented, f"implemented on the CPU now: unlist {sorted(implemented)}"
    listed = set(KNOWN_MISSING) | set(CUDA_ONLY) | set(extern_ops.EXTERN_OPS) | lowered
    stale = listed - _vocabulary_externs()
    assert not stale, f"not in the vocabulary (renamed or removed?): {sorted(stale)}"
    assert not set(KNOWN_MISSING) & set(CUDA_ONLY)
    assert not lowered & (set(KNOWN_MISSING) | set(CUDA_ONLY))


def test_an_attention_call_left_in_an_artifact_names_why():
    """Attention the flash kernels do not take stays an extern: the error says so, and what to
    do, on both devices (not the generic 'no C++ runtime implementation')."""
    for target, device in extern_ops.LOWERED_FOR_PACKAGES.items():
        with pytest.raises(UnsupportedArtifactError, match="flash kernel does not take"):
            extern_ops.bind_extern(target, [], {}, device)


def test_the_runtime_switch_knows_every_op_id_the_table_emits():
    """extern_ops.py's op ids are ember_abi::ExternOp values with a CPU case in externs.cc."""
    header = (CSRC / "detail" / "model_abi.h").read_text()
    enum = dict((int(v), k) for k, v in re.findall(r"\b(k\w+)\s*=\s*(\d+),", header))
    switch = (CSRC / "runtime" / "externs.cc").read_text()
    cases = set(re.findall(r"case ember_abi::(k\w+):", switch))
    for name, spec in extern_ops.EXTERN_OPS.items():
        assert spec.op_id in enum, f"{name}: op id {spec.op_id} is not in ember_abi::ExternOp"
        assert enum[spec.op_id] in cases, f"{name}: externs.cc has no case {enum[spec.op_id]}"
