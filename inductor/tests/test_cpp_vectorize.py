"""The C++ vector loop over index arithmetic and gathers: uniform scalars and integer lanes."""

import ctypes
import hashlib
import re

import torch
import torch.nn.functional as F
from inductor_helpers import check


def _vector_loops(source):
    return source.count("+ ember::W <=")


def test_causal_mask_softmax_runs_in_the_vector_loop():
    """A causal mask built from aranges (column > row) compares index lanes in float lanes, so
    the masked softmax's loops are vector loops, not scalar ones."""

    def masked_softmax(s):
        n = s.shape[-1]
        mask = torch.arange(n)[None, :] > torch.arange(n)[:, None]
        return torch.softmax(s.masked_fill(mask, float("-inf")) / 4, -1)

    compiled = check(masked_softmax, torch.randn(6, 64, 64), atol=1e-6, rtol=1e-5)
    assert "ember::viota()" in compiled.source
    assert "ember::vwhere" in compiled.source and "ember::vexp" in compiled.source


def test_gather_by_token_id_runs_in_the_vector_loop():
    """An embedding row picked by a token id (a uniform scalar of the vector loop), added to a
    position row and layer-normed: the rows are read with vector loads."""
    w, pos = torch.randn(50, 64), torch.randn(16, 64)
    ids = torch.randint(0, 50, (3, 16))

    def embed(w, pos, ids):
        x = F.embedding(ids, w) + pos[torch.arange(ids.shape[1])]
        return F.layer_norm(x, (64,))

    compiled = check(embed, w, pos, ids, atol=1e-5, rtol=1e-5)
    assert re.search(r"ember::vload\(in_ptr\d+ \+ [^;]*tmp\d+", compiled.source), compiled.source


def test_concatenation_along_an_outer_dim_runs_in_the_vector_loop():
    """A class token concatenated before the patches (a ViT): which input a row comes from is a
    uniform mask of the vector loop, so the rows are vector loads taken only where it holds."""
    cls, x, pos = torch.randn(1, 1, 32), torch.randn(3, 9, 32), torch.randn(1, 10, 32)

    def embed(cls, x, pos):
        return F.layer_norm(torch.cat([cls.expand(3, 1, 32), x], 1) + pos, (32,))

    compiled = check(embed, cls, x, pos, atol=1e-5, rtol=1e-5)
    assert "[&]() -> ember::vf {" in compiled.source, compiled.source


def test_concatenation_along_the_vector_dim_takes_masked_loads():
    """RoPE's rotate_half (the row's halves swapped, one negated) and a pad of the last dim: the
    which-input test varies across the lanes, so each input is read with a masked vector load
    (no lane outside its input is read) and the mask picks between them."""
    x, cos, sin = torch.randn(2, 3, 5, 32), torch.randn(5, 32), torch.randn(5, 32)

    def rope(x, cos, sin):
        half = torch.cat([-x[..., 16:], x[..., :16]], -1)
        return x * cos + half * sin

    compiled = check(rope, x, cos, sin, atol=1e-6, rtol=1e-5)
    assert "ember::vmaskload" in compiled.source, compiled.source
    padded = check(lambda a: F.pad(a, (3, 5), value=-2.0).exp(), torch.randn(7, 40))
    assert "ember::vmaskload" in padded.source, padded.source


def test_a_transposed_output_keeps_the_others_vectorized():
    """Splitting an attention projection into q, k^T and v: k^T's store is strided in the loop
    the others store contiguously, and is scattered lane by lane inside the vector loop rather
    than sending the whole kernel to the scalar loop."""

    def split(x):
        q, k, v = x.view(4, 8, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
        return q.contiguous(), k.transpose(-1, -2).contiguous(), v.contiguous()

    compiled = check(split, torch.randn(32, 96))
    assert "ember::vscatter" in compiled.source and "ember::vstore" in compiled.source


def test_index_lanes_past_float_precision_stay_exact():
    """Index values beyond 2**24 are not exact in float lanes: such a comparison keeps the
    scalar loop's integer math (2**25 + 1 > 2**25 holds; in float it would not)."""
    a = torch.randn(64)
    check(lambda a: torch.where(torch.arange(64) * 2**20 + 1 > 2**25, a, -a), a)
    check(lambda a: a * (torch.arange(64) - 20).clamp(min=0), a)


def test_exp_of_masked_lanes_takes_the_vector_path():
    """exp of -inf (a masked score) and of values below the smallest subnormal is 0 in the
    vector code, not a lane-by-lane std::exp (which made a causal softmax 2x slower): a build
    of ember_cpu.h that counts the lanes taking std::exp sees only the subnormal band's."""
    from ember.inductor.runtime import CSRC
    from ember.ir import toolchain

    code = """
        static int slow_lanes = 0;
        #define EMBER_SLOW_EXP(a) (++slow_lanes, std::exp(a))
        #include "ember_cpu.h"
        EMBER_EXPORT int count(const float* x, float* out, int n) {
          for (int i = 0; i + ember::W <= n; i += ember::W)
            ember::vstore(out + i, ember::vexp(ember::vload(x + i)));
          return slow_lanes;
        }"""
    header = hashlib.sha256((CSRC / "ember_cpu.h").read_bytes()).hexdigest()[:16]
    so = toolchain.compile_shared("vexp_count", code=code, include_dirs=(str(CSRC),),
                                  defines=(f"EMBER_CPU_H={header}",))  # cached by the header too
    lib = ctypes.CDLL(str(so))
    x = torch.tensor([float("-inf"), -200.0, -104.5, -1e30] * 8 + [-95.0] * 16 + [1.0] * 16)
    out = torch.empty_like(x)
    slow = lib.count(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), x.numel())
    assert slow == 16  # the 16 lanes of -95 (a subnormal result) only
    torch.testing.assert_close(out, torch.exp(x), atol=0, rtol=1e-6)


def test_a_loop_is_split_by_its_work_per_thread():
    """A kernel's loop is split across OpenMP's team only when each thread gets
    PARALLEL_MIN_PER_THREAD elements: a 16K-element kernel asks at run time (on 2 threads it
    is split, on 16 it is not), a tiny one has no parallel loop, a huge one always splits."""
    from ember.inductor.codegen_cpp import PARALLEL_ALWAYS, PARALLEL_MIN

    mid = check(lambda a: a.sigmoid() * 2, torch.randn(128, 128))  # 16384 elements
    assert "if((16384) >= 2048 * ember::omp_threads())" in mid.source, mid.source
    tiny = check(lambda a: a.sigmoid() * 2, torch.randn(PARALLEL_MIN // 2))
    assert "omp parallel" not in tiny.source
    huge = check(lambda a: a * 2, torch.randn(PARALLEL_ALWAYS))
    assert "#pragma omp parallel for\n" in huge.source
