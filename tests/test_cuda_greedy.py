"""Greedy decoding's choice on the GPU: `ember_greedy` (cuda_greedy.py), the kernel a CUDA
decode-step package carries so that `ember_generate` never waits for the host between tokens.

Without a GPU the kernel runs in Triton's CPU interpreter: the first of the largest logits of
each row (across its chunks), a NaN counting as the largest, written as the next tokens (int64
or int32) and at the new token's column of the call's array, the position advanced by one. The
package-time half is test_cuda_greedy_package.py (a process of its own: compiling this kernel
after interpreting it in the same process fails inside Triton). The GPU run is in
test_decode_package_cuda.py.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process
pytest.importorskip("triton")

from ember.cpp_wrapper import cuda_greedy  # noqa: E402
from ember.inductor.runtime import _load_module  # noqa: E402


def _choose(logits, tokens, position, out, first):
    """One launch, as ember_generate makes it: logits (B, V) dense, tokens (B,) and position
    (1,) the next step's inputs, out (B, NEW) int64."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    kernel = _load_module(cuda_greedy.SOURCE).ember_greedy
    b, v = logits.shape
    kernel[(1,)](logits, tokens, position, out, logits.stride(0), first, out.shape[1], B=b, V=v,
                 BLOCK=cuda_greedy.BLOCK)  # fmt: skip


@pytest.mark.parametrize("ids", [torch.int64, torch.int32])
def test_the_first_largest_logit_of_each_row_across_chunks(ids):
    v = 2 * cuda_greedy.BLOCK + 37  # three chunks, the last partial
    logits = torch.randn(5, v).to(torch.bfloat16)
    logits[0, 5] = logits[0, v - 3] = 100  # a tie across chunks: the first
    logits[1, cuda_greedy.BLOCK + 1] = logits[1, cuda_greedy.BLOCK + 7] = 50  # a tie in a chunk
    logits[2] = float("-inf")  # every logit -inf: index 0, as argmax
    logits[3, 9] = float("nan")  # NaN is the largest
    logits[4, 2], logits[4, cuda_greedy.BLOCK + 2] = float("inf"), float("nan")  # even than inf
    logits[4, v - 1] = float("nan")
    tokens, position = torch.full((5,), -1, dtype=ids), torch.tensor([6])
    out = torch.full((5, 5), -1, dtype=torch.int64)
    _choose(logits, tokens, position, out, first=4)  # position 6: new token 3 (6 + 1 - 4)
    want = [5, cuda_greedy.BLOCK + 1, 0, 9, cuda_greedy.BLOCK + 2]
    assert want == logits.float().argmax(-1).tolist()
    assert tokens.tolist() == want and tokens.dtype == ids
    assert out[:, 3].tolist() == want and (out[:, [0, 1, 2, 4]] == -1).all()
    assert position.tolist() == [7]


def test_it_agrees_with_argmax_on_random_rows():
    logits = torch.randn(3, 1000) * 4
    tokens, position = torch.zeros(3, dtype=torch.int64), torch.tensor([0])
    out = torch.zeros(3, 2, dtype=torch.int64)
    _choose(logits, tokens, position, out, first=0)
    assert tokens.tolist() == logits.argmax(-1).tolist() == out[:, 1].tolist()
