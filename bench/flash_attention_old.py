# The flash-attention template as of af49e65 (before #29): the baseline of flash_decode_probe.py.
# Not product code: kept so the probe can race old against new on the same GPU.
"""Flash-attention forward as a Triton kernel (the template triton_attention.py renders).

One program computes BLOCK_M query rows of one (batch, head) against every key block it needs,
with an online softmax in float32 (exp2, the scale folded into log2(e)), so the (L, S) scores are
never stored; the grid is cdiv(L, BLOCK_M) * B * H programs. Query head h reads key/value head
h // GROUP (GQA/MQA; GROUP = 1 for plain attention). Head dims are padded to powers of two
(E_PAD, EV_PAD) and masked. An additive mask of any float dtype is read through its strides (0
where it broadcasts); CAUSAL keeps key j <= query i (torch's top-left alignment). Inputs of
float16/bfloat16 multiply in their dtype with float32 accumulation; float32 inputs multiply in
IEEE float32 (no TF32), as eager does. UPCAST (the launcher sets it under Triton's CPU
interpreter only, whose float16/bfloat16 `tl.dot` returns garbage in Triton 3.6) multiplies
float32 copies of the same values instead.

Sizes that may be dynamic (batch, lengths, strides but the last) are run-time arguments; heads,
head dims, last-dim strides, the scale and the flags are compile-time constants. A query row
whose keys are all masked (-inf) gives zeros.
"""

import triton
import triton.language as tl


@triton.jit
def KERNEL_NAME(Q, K, V, M, O, B, L, S, QS0, QS1, QS2, KS0, KS1, KS2, VS0, VS1, VS2, OS0, OS1, OS2,
                MS0, MS1, MS2, H: tl.constexpr, GROUP: tl.constexpr, E: tl.constexpr,
                EV: tl.constexpr, E_PAD: tl.constexpr, EV_PAD: tl.constexpr, QS3: tl.constexpr,
                KS3: tl.constexpr, VS3: tl.constexpr, OS3: tl.constexpr, MS3: tl.constexpr,
                HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, SCALE: tl.constexpr,
                IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    # one flat grid (x allows 2**31 - 1 programs where y allows 65535): the query blocks of one
    # (batch, head) are neighbours, so they share its keys and values in L2
    pid = tl.program_id(0).to(tl.int64)
    n_m = (L + BLOCK_M - 1) // BLOCK_M
    start_m = pid % n_m
    bh = pid // n_m
    b = bh // H
    h = bh % H
    hk = h // GROUP
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    de = tl.arange(0, E_PAD)
    dv = tl.arange(0, EV_PAD)
    q_ptrs = Q + b * QS0 + h * QS1 + rows.to(tl.int64)[:, None] * QS2 + de[None, :] * QS3
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (de[None, :] < E), other=0.0)
    k_base = K + b * KS0 + hk * KS1
    v_base = V + b * VS0 + hk * VS1
    m_base = M + b * MS0 + h * MS1
    qk_scale = SCALE * 1.4426950408889634  # scores in log2 units: exp2 instead of exp
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, EV_PAD], tl.float32)
    end = S
    if CAUSAL:  # key blocks past the block's last query row are masked whole: not visited
        end = tl.minimum(S, (start_m + 1) * BLOCK_M)
    # a while loop: Triton's CPU interpreter cannot take a run-time bound in range()
    start_n = start_m * 0
    while start_n < end:
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        cols64 = cols.to(tl.int64)
        kt = tl.load(k_base + cols64[None, :] * KS2 + de[:, None] * KS3,
                     mask=col_ok[None, :] & (de[:, None] < E), other=0.0)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        elif UPCAST:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        if HAS_MASK:
            bias = tl.load(m_base + rows.to(tl.int64)[:, None] * MS2 + cols64[None, :] * MS3,
                           mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            s = s + bias.to(tl.float32) * 1.4426950408889634
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing kept yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols64[:, None] * VS2 + dv[None, :] * VS3,
                    mask=col_ok[:, None] & (dv[None, :] < EV), other=0.0)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p, v, acc, input_precision="ieee")
        elif UPCAST:
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc,
                         input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        start_n += BLOCK_N
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = O + b * OS0 + h * OS1 + rows.to(tl.int64)[:, None] * OS2 + dv[None, :] * OS3
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < EV))
