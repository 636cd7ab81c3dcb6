"""Greedy decoding on the GPU: the next token chosen by a Triton kernel of the package.

`ember_generate` on the host reads each step's logits back (a copy and a stream synchronisation),
takes their argmax and uploads the token and the next position: the GPU waits for the host at
every token. A CUDA decode-step package carries `ember_greedy`, which does that on the GPU: for
each batch row, the index of the largest logit (the first of equal ones; the first NaN if
there is one, as torch.argmax) is written as the next step's token input and into the call's
token array, and the position input is advanced by one. Greedy generation then queues its steps
(replays of one CUDA graph, the kernel inside it) without waiting, and reads the tokens once.

One program does every row (decoding batches are small; the batch and the vocabulary are the
package's, compiled in) in chunks of BLOCK logits; the row stride, the prompt's length and the
call's number of new tokens are run-time arguments.
"""

from __future__ import annotations

import dataclasses

from ember.ir import CompiledArtifact

from .cuda_index_copy import cubin_kernel, triton_type

BLOCK = 2048  # logits per chunk
NAME = "ember_greedy"
SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def ember_greedy(LOGITS, TOKENS, POSITIONS, OUT, ROW, FIRST, NEW, B: tl.constexpr,
                 V: tl.constexpr, BLOCK: tl.constexpr):
    # LOGITS (B, V) at row stride ROW: the last step's; TOKENS (B,) the next step's input;
    # POSITIONS[0] the last step's position, advanced here; OUT (B, NEW) the call's tokens, the
    # chosen one written at column POSITIONS[0] + 1 - FIRST (ember_generate passes FIRST = 0)
    pos = tl.load(POSITIONS)
    k = pos + 1 - FIRST
    lanes = tl.arange(0, BLOCK)
    for b in range(B):
        row = LOGITS + b * ROW
        # per lane: its first largest logit, or its first NaN (which beats any number)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        nan = tl.zeros([BLOCK], tl.int1)
        where = tl.zeros([BLOCK], tl.int64)
        for start in range(0, V, BLOCK):
            i = start + lanes
            x = tl.load(row + i, mask=i < V, other=float("-inf")).to(tl.float32)
            # strictly larger: an earlier chunk keeps a tie (a lane of -inf keeps index 0 < V)
            take = ((x != x) & ~nan) | (~nan & (x > best))
            nan = nan | (x != x)
            best = tl.where(take, x, best)
            where = tl.where(take, i.to(tl.int64), where)
        any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
        top = tl.max(tl.where(nan, float("-inf"), best), axis=0)
        pick = tl.where(any_nan, nan, best == top)
        first = tl.min(tl.where(pick, where, V), axis=0)
        tl.store(TOKENS + b, first.to(TOKENS.dtype.element_ty))
        tl.store(OUT + b * NEW + k, first.to(tl.int64))
    tl.store(POSITIONS, pos + 1)
'''


def add_greedy_kernel(artifact: CompiledArtifact, spec: dict, arch=None) -> tuple:
    """`artifact` (a CUDA decode step) with an `ember_greedy` kernel for its logits, tokens and
    positions types, and `spec` (the manifest's "decode" entry) naming it as "greedy_kernel".
    Unchanged where the kernel cannot take those types."""
    metas = [artifact.buffer(artifact.outputs[spec["logits"]]).meta,
             artifact.buffer(artifact.inputs[spec["tokens"]]).meta,
             artifact.buffer(artifact.inputs[spec["positions"]]).meta]  # fmt: skip
    try:
        types = [triton_type(m) for m in metas]
    except NotImplementedError:
        return artifact, spec
    if not types[0].startswith(("fp", "bf")) or types[1] not in ("i32", "i64") or \
            types[2] not in ("i32", "i64"):  # fmt: skip
        return artifact, spec
    batch, vocab = int(metas[1].sizes[0]), int(metas[0].sizes[-1])
    name = f"{NAME}_{'_'.join(types)}"
    arg_types = (*(f"*{t}" for t in types), "*i64", *("i64",) * 3)
    cfg = {"B": batch, "V": vocab, "BLOCK": BLOCK, "num_warps": 8}
    kernel = cubin_kernel(name, SOURCE, NAME, arg_types, cfg, arch)
    artifact = dataclasses.replace(artifact, kernels=(*artifact.kernels, kernel))
    return artifact, {**spec, "greedy_kernel": name}


__all__ = ["BLOCK", "SOURCE", "add_greedy_kernel"]
