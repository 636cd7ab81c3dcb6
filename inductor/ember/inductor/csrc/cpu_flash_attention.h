// Flash attention on the CPU for ember.inductor (cpu_attention.py pastes this text into a kernel's
// source after ember_cpu.h): out = softmax(q k^T * scale + mask) v, computed per block of query
// rows over blocks of keys with an online softmax (running max and sum), so no (L, S) matrix is
// ever stored. Compile-time constants of the parameter struct P: H, HKV (key/value heads; a query
// head h reads head h / (H / HKV): GQA/MQA), E (query and key head dim), EV (value head dim),
// BQ, BK (block rows of queries and keys), the last-dim strides QS3, KS3, VS3, OS3, MS3, CAUSAL
// (key j masked for query i when j > i), SCALE. Run-time values of `d` (Dims; the entry computes
// them from the program's dynamic sizes, or writes the static ones): B, L, S and the element
// strides of dims 0-2 (B H L/S order; a broadcast mask dim has stride 0).
// T is the storage type of q/k/v/out (float or uint16_t holding bfloat16 or float16 as BF16
// says), MT the mask's (void: no mask). Arithmetic is float32; vectors are ember_cpu.h's.
#ifndef EMBER_CPU_FLASH_ATTENTION_H
#define EMBER_CPU_FLASH_ATTENTION_H
#include <cstdlib>
#include <type_traits>

namespace ember {
namespace flash {

template <class T, bool BF16> inline float ld(const T* p) {
  if constexpr (sizeof(T) == 4) return *p;
  else if constexpr (BF16) return bf2f(*p);
  else return h2f(*p);
}
// W consecutive elements as floats
template <class T, bool BF16> inline vf vld(const T* p) {
  if constexpr (sizeof(T) == 4) return vload(p);
  else if constexpr (BF16) return vload_bf(p);
  else return vload_h(p);
}
template <class T, bool BF16> inline void st(T* p, float v) {
  if constexpr (sizeof(T) == 4) *p = v;
  else if constexpr (BF16) *p = f2bf(v);
  else *p = f2h(v);
}
// x in every lane. (vbcast(x) is vf{} + x, an addition GCC must keep, since +0 + -0 is +0: a
// scalar add before every broadcast, in the inner loops a third of the instructions.)
inline vf splat(float x) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return (vf)_mm512_set1_ps(x);
#elif defined(__AVX__) && EMBER_VEC_WIDTH == 8
  return (vf)_mm256_set1_ps(x);
#else
  return vbcast(x);
#endif
}
// exp of a score minus its row's max (or log-sum-exp): at most about 0, exactly 0 far below
// the range (a masked score, -inf; exp(-87) is 1.6e-38, below which eager's results are
// subnormal too). vexp's reduction and polynomial without its lanes for NaN inputs, overflow
// and subnormal results, which cost a compare, a test and a blend per vector in the softmax.
// (A NaN score stays NaN: the reduction and the polynomial carry it.)
inline vf vexp_masked(vf x) {
  const vm dead = x < -87.0f;
  return vwhere(dead, vbcast(0.0f), vexp_in_range(vmax(x, vbcast(-87.0f))));
}

#if defined(__AVX2__)
// 8 consecutive elements of a mask as floats (AVX512 builds use it too: a mask tile is 8 x 8)
template <class MT, bool MBF16> inline __m256 load8(const MT* p) {
  if constexpr (sizeof(MT) == 4) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (!MBF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
// r[i][j] <- r[j][i] for an 8 x 8 tile in registers
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

// The mask's (nq, nk) block at m (rows ms2 apart, keys MS3 apart) written transposed into the
// scores' layout, t[j * BQP + i], columns nq..nqt zero; the score tiles then start from it.
// Added in place, key after key for each query, the stores ran BQP floats apart: 64 keys a row,
// all in a few L1 sets (BQP * 4 bytes is a multiple of 1 KiB), so nearly every add missed. A
// mask broadcast over queries (ms2 == 0, a padding mask) is one value per key; otherwise 8 x 8
// tiles are loaded as rows and transposed in registers (AVX2), or copied 8 queries at a time.
template <class MT, bool MBF16, int64_t MS3, int64_t BQP>
inline void mask_block(const MT* m, int64_t ms2, int64_t nq, int64_t nqt, int64_t nk, float* t) {
  if (ms2 == 0) {
    for (int64_t j = 0; j < nk; ++j) {
      const vf x = splat(ld<MT, MBF16>(m + j * MS3));
      for (int64_t i = 0; i < nqt; i += W) vstore(t + j * BQP + i, x);
    }
    return;
  }
  int64_t i0 = 0;
#if defined(__AVX2__)
  if constexpr (MS3 == 1) {
    for (; i0 + 8 <= nq; i0 += 8) {
      int64_t j0 = 0;
      for (; j0 + 8 <= nk; j0 += 8) {
        __m256 r[8];
        for (int ii = 0; ii < 8; ++ii) r[ii] = load8<MT, MBF16>(m + (i0 + ii) * ms2 + j0);
        transpose8(r);
        for (int jj = 0; jj < 8; ++jj) _mm256_storeu_ps(t + (j0 + jj) * BQP + i0, r[jj]);
      }
      for (int64_t j = j0; j < nk; ++j)
        for (int ii = 0; ii < 8; ++ii)
          t[j * BQP + i0 + ii] = ld<MT, MBF16>(m + (i0 + ii) * ms2 + j);
    }
  }
#endif
  for (; i0 < nq; i0 += 8) {
    const int64_t n = std::min<int64_t>(8, nq - i0);
    for (int64_t j = 0; j < nk; ++j)
      for (int64_t ii = 0; ii < n; ++ii)
        t[j * BQP + i0 + ii] = ld<MT, MBF16>(m + (i0 + ii) * ms2 + j * MS3);
  }
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = nq; i < nqt; ++i) t[j * BQP + i] = 0.0f;
}

struct Dims {
  int64_t B, L, S, QS0, QS1, QS2, KS0, KS1, KS2, VS0, VS1, VS2, OS0, OS1, OS2, MS0, MS1, MS2,
      LS0, LS1, LS2;
};

constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
constexpr int RI = W >= 16 ? 8 : 4;  // keys per score tile, queries per p*V tile (AVX512: 8)

// OT: the output's storage type (T, or float where a training graph's half-precision output
// is rounded by a kernel of its own); lse: the log-sum-exp of each query row's scores (B, H, L
// at strides LS0-2) for the backward, or null.
template <class P, class T, bool BF16, class MT, bool MBF16, class OT = T>
void attention(const Dims d, const T* __restrict q, const T* __restrict k,
               const T* __restrict v, const MT* __restrict mask, OT* __restrict out,
               float* __restrict lse = nullptr) {
  constexpr int64_t BQ = P::BQ, BK = P::BK, E = P::E, EV = P::EV;
  constexpr int64_t EVP = round_up(EV, W);     // value rows padded to whole vectors
  constexpr int RQ = 2;                        // query vectors per register tile of scores
  constexpr int64_t BQP = round_up(BQ, RQ * W);  // query columns of the transposed scores
  constexpr int RE = (EVP / W) % 2 == 0 ? 2 : 1;  // value vectors per register tile
  const int64_t QBLOCKS = (d.L + BQ - 1) / BQ;
  constexpr int64_t GROUP = P::H / P::HKV;
  constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  static_assert(BK % RI == 0 && BQP % RI == 0, "blocks are whole register tiles");
  // Scores are kept transposed, (key, query): the tile multiplies a key element (broadcast) by a
  // vector of queries, so the queries are transposed once per query block, keys are read as they
  // lie, and the softmax's row statistics are vectors over queries (no horizontal reductions).
  // Per thread: queries transposed (scaled), keys, values, scores, accumulators, statistics.
  constexpr int64_t SCRATCH = E * BQP + BK * E + BK * EVP + BK * BQP + BQP * EVP + 3 * BQP;

#pragma omp parallel
  {
    float* scratch = static_cast<float*>(std::aligned_alloc(64, round_up(SCRATCH * 4, 64)));
    float* qt = scratch;
    float* kf = qt + E * BQP;
    float* vp = kf + BK * E;
    float* sc = vp + BK * EVP;
    float* acc = sc + BK * BQP;
    float* mrow = acc + BQP * EVP;
    float* lrow = mrow + BQP;
    float* corr = lrow + BQP;
    std::fill(vp, vp + BK * EVP, 0.0f);  // padding lanes of values stay zero
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < d.B * P::H; ++bh) {
      for (int64_t qb = 0; qb < QBLOCKS; ++qb) {
        const int64_t b = bh / P::H, h = bh % P::H, hk = h / GROUP;
        const int64_t q0 = qb * BQ, nq = std::min<int64_t>(BQ, d.L - q0);
        const int64_t nqt = round_up(nq, RQ * W);  // query columns the tiles compute
        const T* qh = q + b * d.QS0 + h * d.QS1;
        const T* kh = k + b * d.KS0 + hk * d.KS1;
        const T* vh = v + b * d.VS0 + hk * d.VS1;
        for (int64_t i = 0; i < BQP; ++i) {
          for (int64_t e = 0; e < E; ++e)
            qt[e * BQP + i] =
                i < nq ? ld<T, BF16>(qh + (q0 + i) * d.QS2 + e * P::QS3) * P::SCALE : 0.0f;
          mrow[i] = NEG_INF;
          lrow[i] = 0.0f;
          corr[i] = 1.0f;
        }
        std::fill(acc, acc + BQP * EVP, 0.0f);
        // causal: keys after the block's last query are masked for every row of it
        const int64_t s_end = P::CAUSAL ? std::min<int64_t>(d.S, q0 + nq) : d.S;
        for (int64_t k0 = 0; k0 < s_end; k0 += BK) {
          const int64_t nk = std::min<int64_t>(BK, s_end - k0);
          // keys and values as float32 rows, a vector at a time where rows are contiguous
          constexpr int64_t EW = P::KS3 == 1 ? E / W * W : 0, EVW = P::VS3 == 1 ? EV / W * W : 0;
          for (int64_t j = 0; j < nk; ++j) {
            const T* kr = kh + (k0 + j) * d.KS2;
            for (int64_t e = 0; e < EW; e += W) vstore(kf + j * E + e, vld<T, BF16>(kr + e));
            for (int64_t e = EW; e < E; ++e) kf[j * E + e] = ld<T, BF16>(kr + e * P::KS3);
            const T* vr = vh + (k0 + j) * d.VS2;
            for (int64_t e = 0; e < EVW; e += W) vstore(vp + j * EVP + e, vld<T, BF16>(vr + e));
            for (int64_t e = EVW; e < EV; ++e) vp[j * EVP + e] = ld<T, BF16>(vr + e * P::VS3);
          }
          const int64_t nkt = round_up(nk, RI);
          std::fill(kf + nk * E, kf + nkt * E, 0.0f);
          constexpr bool MASKED = !std::is_void_v<MT>;
          if constexpr (MASKED) {  // the mask first: the score tiles add to it
            const MT* mb = mask + b * d.MS0 + h * d.MS1 + q0 * d.MS2 + k0 * P::MS3;
            if (k0 + BK < s_end)  // rows of the mask stride far apart: fetch the next block's
              for (int64_t i = 0; i < (d.MS2 ? nq : 1); ++i) {
                const char* next = reinterpret_cast<const char*>(mb + i * d.MS2 + BK * P::MS3);
                for (int64_t c = 0; c < BK * P::MS3 * (int64_t)sizeof(MT); c += 64)
                  __builtin_prefetch(next + c);
              }
            mask_block<MT, MBF16, P::MS3, BQP>(mb, d.MS2, nq, nqt, nk, sc);
          }
          // scores: a tile of RI keys by RQ vectors of queries, over the head dim
          for (int64_t j0 = 0; j0 < nkt; j0 += RI) {
            for (int64_t i0 = 0; i0 < nqt; i0 += RQ * W) {
              vf t[RI][RQ];
              for (int jj = 0; jj < RI; ++jj)
                for (int r = 0; r < RQ; ++r)
                  t[jj][r] = MASKED && j0 + jj < nk ? vload(sc + (j0 + jj) * BQP + i0 + r * W)
                                                    : vbcast(0.0f);
              for (int64_t e = 0; e < E; ++e) {
                vf qv[RQ];
                for (int r = 0; r < RQ; ++r) qv[r] = vload(qt + e * BQP + i0 + r * W);
                for (int jj = 0; jj < RI; ++jj) {
                  const vf kv = splat(kf[(j0 + jj) * E + e]);
                  for (int r = 0; r < RQ; ++r) t[jj][r] += kv * qv[r];
                }
              }
              for (int jj = 0; jj < RI; ++jj)
                for (int r = 0; r < RQ; ++r) vstore(sc + (j0 + jj) * BQP + i0 + r * W, t[jj][r]);
            }
          }
          // the causal cut and the block's padding keys
          if (P::CAUSAL && k0 + nk - 1 > q0)  // a block crossing the diagonal
            for (int64_t j = 0; j < nk; ++j)
              for (int64_t i = 0; i < std::min<int64_t>(nq, k0 + j - q0); ++i)
                sc[j * BQP + i] = NEG_INF;
          for (int64_t j = nk; j < nkt; ++j)
            for (int64_t i = 0; i < nqt; i += W) vstore(sc + j * BQP + i, vbcast(NEG_INF));
          // the online softmax, a vector of queries at a time: running max and sum
          for (int64_t i = 0; i < nqt; i += W) {
            vf mx = vbcast(NEG_INF);
            for (int64_t j = 0; j < nk; ++j) mx = vmax(mx, vload(sc + j * BQP + i));
            const vf m_old = vload(mrow + i), m_new = vmax(m_old, mx);
            const vm dead = m_new == NEG_INF;  // no key reached yet: p = 0
            const vf m_use = vwhere(dead, vbcast(0.0f), m_new);
            vf sum = vbcast(0.0f);
            for (int64_t j = 0; j < nkt; ++j) {
              const vf p = vexp_masked(vload(sc + j * BQP + i) - m_use);
              vstore(sc + j * BQP + i, p);
              sum += p;
            }
            const vf c = vwhere(m_old == NEG_INF, vbcast(0.0f), vexp_masked(m_old - m_use));
            vstore(corr + i, c);
            vstore(lrow + i, vload(lrow + i) * c + sum);
            vstore(mrow + i, m_new);
          }
          // acc = acc * corr + p v: a tile of RI queries by RE vectors of the value dim
          for (int64_t i0 = 0; i0 < nq; i0 += RI) {
            for (int64_t e0 = 0; e0 < EVP; e0 += RE * W) {
              vf a[RI][RE];
              for (int ii = 0; ii < RI; ++ii) {
                const vf cb = splat(corr[i0 + ii]);
                for (int r = 0; r < RE; ++r)
                  a[ii][r] = vload(acc + (i0 + ii) * EVP + e0 + r * W) * cb;
              }
              for (int64_t j = 0; j < nk; ++j) {
                vf vv[RE];
                for (int r = 0; r < RE; ++r) vv[r] = vload(vp + j * EVP + e0 + r * W);
                for (int ii = 0; ii < RI; ++ii) {
                  const vf pb = splat(sc[j * BQP + i0 + ii]);
                  for (int r = 0; r < RE; ++r) a[ii][r] += pb * vv[r];
                }
              }
              for (int ii = 0; ii < RI; ++ii)
                for (int r = 0; r < RE; ++r) vstore(acc + (i0 + ii) * EVP + e0 + r * W, a[ii][r]);
            }
          }
        }
        // a row no key reaches (every score masked) is zero, as eager's kernel gives
        OT* oh = out + b * d.OS0 + h * d.OS1;
        for (int64_t i = 0; i < nq; ++i) {
          const float inv = lrow[i] > 0.0f ? 1.0f / lrow[i] : 0.0f;
          for (int64_t e = 0; e < EV; ++e)
            st<OT, BF16>(oh + (q0 + i) * d.OS2 + e * P::OS3, acc[i * EVP + e] * inv);
          if (lse)  // such a row's is 0, as eager's (its backward then gives it no gradient)
            lse[b * d.LS0 + h * d.LS1 + (q0 + i) * d.LS2] =
                lrow[i] > 0.0f ? mrow[i] + std::log(lrow[i]) : 0.0f;
        }
      }
    }
    std::free(scratch);
  }
}

}  // namespace flash
}  // namespace ember
#endif  // EMBER_CPU_FLASH_ATTENTION_H
