// Flash attention's backward on the CPU for ember.inductor (cpu_attention_backward.py pastes this
// text into a kernel's source after ember_cpu.h and cpu_flash_attention.h): dq, dk, dv of
// out = softmax(q k^T * scale + mask) v from the output's gradient g, the forward's output o and
// its log-sum-exp per query row, recomputing the probabilities a block of (query, key) pairs at
// a time, so no (L, S) matrix is stored. With s = q k^T * scale + mask, p = exp(s - lse):
// dv = p^T g, dp = g v^T, ds = p (dp - rowsum(g o)), dq = ds k * scale, dk = ds^T q * scale.
// Parallel over batch x key/value heads: a work item owns its dk and dv (the H / HKV query heads
// of a group sum into them: GQA/MQA) and each of its query heads' dq, so no two threads write
// one element. Compile-time constants of P: H, HKV, E, EV, BQ, BK (BK a multiple of W), MS3 (the
// mask's key stride), CAUSAL, SCALE; q, k, v, o, g and the gradients have unit last strides.
#ifndef EMBER_CPU_FLASH_ATTENTION_BACKWARD_H
#define EMBER_CPU_FLASH_ATTENTION_BACKWARD_H

namespace ember {
namespace flash {

// Run-time sizes and element strides of dims 0-2: G the output's gradient, O the output, LS the
// log-sum-exp (B, H, L), DQ/DK/DV the gradients; a broadcast mask dim has stride 0.
struct BwdDims {
  int64_t B, L, S, QS0, QS1, QS2, KS0, KS1, KS2, VS0, VS1, VS2, OS0, OS1, OS2, GS0, GS1, GS2, MS0,
      MS1, MS2, LS0, LS1, LS2, DQS0, DQS1, DQS2, DKS0, DKS1, DKS2, DVS0, DVS1, DVS2;
};

// c[m][n] (+)= sum_k a[m * am + k * ak] * bm[k * ldb + n] for RM rows and RN vectors of n: one
// element of a (broadcast) times a vector of a row of bm, accumulated in registers.
template <int RM, int RN>
inline void gemm_tile(const float* a, int64_t am, int64_t ak, const float* bm, int64_t ldb,
                      float* c, int64_t ldc, int64_t K, bool add) {
  vf t[RM][RN];
  for (int m = 0; m < RM; ++m)
    for (int r = 0; r < RN; ++r) t[m][r] = add ? vload(c + m * ldc + r * W) : vbcast(0.0f);
  for (int64_t k = 0; k < K; ++k) {
    vf bv[RN];
    for (int r = 0; r < RN; ++r) bv[r] = vload(bm + k * ldb + r * W);
    for (int m = 0; m < RM; ++m) {
      const vf x = splat(a[m * am + k * ak]);
      for (int r = 0; r < RN; ++r) t[m][r] += x * bv[r];
    }
  }
  for (int m = 0; m < RM; ++m)
    for (int r = 0; r < RN; ++r) vstore(c + m * ldc + r * W, t[m][r]);
}

template <int RM>
inline void gemm_rows(const float* a, int64_t am, int64_t ak, const float* bm, int64_t ldb,
                      float* c, int64_t ldc, int64_t N, int64_t K, bool add) {
  int64_t n = 0;
  for (; n + 2 * W <= N; n += 2 * W) gemm_tile<RM, 2>(a, am, ak, bm + n, ldb, c + n, ldc, K, add);
  for (; n < N; n += W) gemm_tile<RM, 1>(a, am, ak, bm + n, ldb, c + n, ldc, K, add);
}

// c (M x N, rows ldc apart) (+)= a (M x K, element (m, k) at m * am + k * ak) times bm (K x N,
// rows ldb apart); N a multiple of W
inline void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t am, int64_t ak,
                 const float* bm, int64_t ldb, float* c, int64_t ldc, bool add) {
  constexpr int RM = W >= 16 ? 8 : 4;
  int64_t m = 0;
  for (; m + RM <= M; m += RM)
    gemm_rows<RM>(a + m * am, am, ak, bm, ldb, c + m * ldc, ldc, N, K, add);
  for (; m < M; ++m) gemm_rows<1>(a + m * am, am, ak, bm, ldb, c + m * ldc, ldc, N, K, add);
}

// n elements of a unit-stride row as floats into dst, zeros up to np
template <class T, bool BF16>
inline void row_to_float(const T* src, int64_t n, int64_t np, float* dst) {
  int64_t e = 0;
  for (; e + W <= n; e += W) vstore(dst + e, vld<T, BF16>(src + e));
  for (; e < n; ++e) dst[e] = ld<T, BF16>(src + e);
  for (; e < np; ++e) dst[e] = 0.0f;
}

template <class T, bool BF16>
inline void row_from_float(const float* src, float scale, int64_t n, T* dst) {
  for (int64_t e = 0; e < n; ++e) st<T, BF16>(dst + e, src[e] * scale);
}

template <class P, class T, bool BF16, class MT, bool MBF16>
void attention_backward(const BwdDims d, const T* __restrict g, const T* __restrict q,
                        const T* __restrict k, const T* __restrict v, const T* __restrict o,
                        const float* __restrict lse, const MT* __restrict mask,
                        T* __restrict dq, T* __restrict dk, T* __restrict dv) {
  constexpr int64_t BQ = P::BQ, BK = P::BK, E = P::E, EV = P::EV, GROUP = P::H / P::HKV;
  constexpr int64_t EP = round_up(E, W), EVP = round_up(EV, W);
  constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  static_assert(BK % W == 0, "key blocks are whole vectors");
  const int64_t L = d.L, S = d.S;
  // per thread: a head's queries, output gradients and dq (float rows), its rowsum(g o) and
  // log-sum-exp; a key block as rows and transposed, its values transposed; p and ds of a block
  // pair; the work item's dk and dv
  const int64_t scratch =
      L * (2 * EP + EVP + 2) + BK * (EP + E + EV) + 2 * BQ * BK + S * (EP + EVP);

#pragma omp parallel
  {
    float* qf = static_cast<float*>(std::aligned_alloc(64, round_up(scratch * 4, 64)));
    float* gf = qf + L * EP;
    float* dqa = gf + L * EVP;
    float* drow = dqa + L * EP;
    float* lrow = drow + L;
    float* kf = lrow + L;
    float* kt = kf + BK * EP;
    float* vt = kt + E * BK;
    float* p = vt + EV * BK;
    float* ds = p + BQ * BK;
    float* dka = ds + BQ * BK;
    float* dva = dka + S * EP;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < d.B * P::HKV; ++bk) {
      const int64_t b = bk / P::HKV, hk = bk % P::HKV;
      const T* kh = k + b * d.KS0 + hk * d.KS1;
      const T* vh = v + b * d.VS0 + hk * d.VS1;
      std::fill(dka, dka + S * EP, 0.0f);
      std::fill(dva, dva + S * EVP, 0.0f);
      for (int64_t h = hk * GROUP; h < (hk + 1) * GROUP; ++h) {
        const T* qh = q + b * d.QS0 + h * d.QS1;
        const T* gh = g + b * d.GS0 + h * d.GS1;
        const T* oh = o + b * d.OS0 + h * d.OS1;
        for (int64_t i = 0; i < L; ++i) {
          row_to_float<T, BF16>(qh + i * d.QS2, E, EP, qf + i * EP);
          row_to_float<T, BF16>(gh + i * d.GS2, EV, EVP, gf + i * EVP);
          float dot = 0.0f;
          for (int64_t e = 0; e < EV; ++e) dot += gf[i * EVP + e] * ld<T, BF16>(oh + i * d.OS2 + e);
          drow[i] = dot;
          lrow[i] = lse[b * d.LS0 + h * d.LS1 + i * d.LS2];
        }
        std::fill(dqa, dqa + L * EP, 0.0f);
        for (int64_t k0 = 0; k0 < S; k0 += BK) {
          const int64_t nk = std::min<int64_t>(BK, S - k0);
          for (int64_t j = 0; j < BK; ++j) {
            if (j < nk) {
              row_to_float<T, BF16>(kh + (k0 + j) * d.KS2, E, EP, kf + j * EP);
              const T* vr = vh + (k0 + j) * d.VS2;
              for (int64_t e = 0; e < EV; ++e) vt[e * BK + j] = ld<T, BF16>(vr + e);
            } else {
              std::fill(kf + j * EP, kf + (j + 1) * EP, 0.0f);
              for (int64_t e = 0; e < EV; ++e) vt[e * BK + j] = 0.0f;
            }
            for (int64_t e = 0; e < E; ++e) kt[e * BK + j] = kf[j * EP + e];
          }
          // causal: query i reads key j only when j <= i, so blocks of queries before k0 read none
          for (int64_t q0 = P::CAUSAL ? k0 / BQ * BQ : 0; q0 < L; q0 += BQ) {
            const int64_t nq = std::min<int64_t>(BQ, L - q0);
            gemm(nq, BK, E, qf + q0 * EP, EP, 1, kt, BK, p, BK, false);  // q k^T
            gemm(nq, BK, EV, gf + q0 * EVP, EVP, 1, vt, BK, ds, BK, false);  // g v^T
            for (int64_t i = 0; i < nq; ++i) {
              const int64_t qi = q0 + i;
              const MT* mr = nullptr;
              if constexpr (!std::is_void_v<MT>)
                mr = mask + b * d.MS0 + h * d.MS1 + qi * d.MS2 + k0 * P::MS3;
              const vf li = splat(lrow[i + q0]), di = splat(drow[qi]);
              for (int64_t j = 0; j < BK; j += W) {
                vf s = vload(p + i * BK + j) * P::SCALE;
                if constexpr (!std::is_void_v<MT>) {
                  if (P::MS3 == 1 && j + W <= nk)
                    s += vld<MT, MBF16>(mr + j);
                  else  // the block's last keys, or keys not adjacent in the mask
                    s += vlanes([&](int c) {
                      return j + c < nk ? ld<MT, MBF16>(mr + (j + c) * P::MS3) : 0.0f;
                    });
                }
                // keys past the sequence, and (causal) after the query: probability 0
                const int64_t last = P::CAUSAL ? std::min<int64_t>(nk, qi - k0 + 1) : nk;
                if (j + W > last) s = vwhere(viota() + (float)j < (float)last, s, vbcast(NEG_INF));
                const vf pv = vexp_masked(s - li);
                vstore(p + i * BK + j, pv);
                vstore(ds + i * BK + j, pv * (vload(ds + i * BK + j) - di));
              }
            }
            gemm(nk, EVP, nq, p, 1, BK, gf + q0 * EVP, EVP, dva + k0 * EVP, EVP, true);  // p^T g
            gemm(nk, EP, nq, ds, 1, BK, qf + q0 * EP, EP, dka + k0 * EP, EP, true);  // ds^T q
            gemm(nq, EP, nk, ds, BK, 1, kf, EP, dqa + q0 * EP, EP, true);  // ds k
          }
        }
        T* dqh = dq + b * d.DQS0 + h * d.DQS1;
        for (int64_t i = 0; i < L; ++i)
          row_from_float<T, BF16>(dqa + i * EP, P::SCALE, E, dqh + i * d.DQS2);
      }
      T* dkh = dk + b * d.DKS0 + hk * d.DKS1;
      T* dvh = dv + b * d.DVS0 + hk * d.DVS1;
      for (int64_t j = 0; j < S; ++j) {
        row_from_float<T, BF16>(dka + j * EP, P::SCALE, E, dkh + j * d.DKS2);
        row_from_float<T, BF16>(dva + j * EVP, 1.0f, EV, dvh + j * d.DVS2);
      }
    }
    std::free(qf);
  }
}

}  // namespace flash
}  // namespace ember
#endif  // EMBER_CPU_FLASH_ATTENTION_BACKWARD_H
