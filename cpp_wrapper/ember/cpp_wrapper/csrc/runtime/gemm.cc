// CPU GEMM without a BLAS: the operands are packed into MR-row and NR-column slivers (converting
// half types to float on the way, and reading any strides, so transposed and broadcast views cost
// nothing extra), then a register-blocked 6 x (2 vectors) micro-kernel runs over K, written with
// GCC vector extensions and compiled for AVX-512, AVX2+FMA and baseline x86-64 at once (one is
// picked by CPU features at first use), so one build serves every x86 CPU. OpenMP splits the tiles.
//
// Why our own and not a BLAS: a package must not depend on libraries the target may lack, torch's
// MKL/OpenBLAS live inside libtorch (which we never link), and a packed kernel reaches a useful
// fraction of peak for the shapes inductor hands to extern kernels in a few hundred lines.
#pragma GCC optimize("fp-contract=fast")

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "detail/common.h"
#include "detail/cpu_ops.h"


namespace ember {

// ---- scalar conversions -------------------------------------------------------------------

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  return uint16_t(half);
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

namespace {

constexpr int MR = 6;
constexpr int64_t KC = 256;
constexpr int64_t NC = 1024;

template <typename T>
struct Vec {
  typedef T V __attribute__((vector_size(32)));
  static constexpr int L = 32 / sizeof(T);
  static constexpr int NR = 2 * L;
};

enum class Kind { kF32, kF64, kF16, kBF16 };

Kind kind_of(DLDataType t) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return Kind::kF32;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 64) return Kind::kF64;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return Kind::kF16;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return Kind::kBF16;
  fail(EMBER_ERR_UNSUPPORTED, "matmul on CPU supports float32/64/16 and bfloat16, not " +
                                  dtype_name(t));
}

template <typename T>
inline T load(const Mat& m, Kind k, int64_t i, int64_t j) {
  int64_t off = i * m.rs + j * m.cs;
  switch (k) {
    case Kind::kF32: return T(static_cast<const float*>(m.data)[off]);
    case Kind::kF64: return T(static_cast<const double*>(m.data)[off]);
    case Kind::kF16: return T(half_to_float(static_cast<const uint16_t*>(m.data)[off]));
    default: return T(bf16_to_float(static_cast<const uint16_t*>(m.data)[off]));
  }
}

template <typename T>
inline void store(const Mat& m, Kind k, int64_t i, int64_t j, T v) {
  int64_t off = i * m.rs + j * m.cs;
  void* p = const_cast<void*>(m.data);
  switch (k) {
    case Kind::kF32: static_cast<float*>(p)[off] = float(v); break;
    case Kind::kF64: static_cast<double*>(p)[off] = double(v); break;
    case Kind::kF16: static_cast<uint16_t*>(p)[off] = float_to_half(float(v)); break;
    default: static_cast<uint16_t*>(p)[off] = float_to_bf16(float(v)); break;
  }
}

// ---- packing --------------------------------------------------------------------------------

// A[i0:i0+mc, p0:p0+kc] as MR-row slivers: ap[(ir * kc + p) * MR + i], zero-padded.
template <typename T>
void pack_a(const Mat& a, Kind k, int64_t i0, int64_t mc, int64_t p0, int64_t kc, T* ap) {
  int64_t panels = (mc + MR - 1) / MR;
  for (int64_t ir = 0; ir < panels; ++ir) {
    T* dst = ap + ir * kc * MR;
    int64_t rows = std::min<int64_t>(MR, mc - ir * MR);
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t i = 0; i < MR; ++i) {
        dst[p * MR + i] = i < rows ? load<T>(a, k, i0 + ir * MR + i, p0 + p) : T(0);
      }
    }
  }
}

// B[p0:p0+kc, j0:j0+nc] as NR-column slivers: bp[(jr * kc + p) * NR + j], zero-padded.
template <typename T>
void pack_b(const Mat& b, Kind k, int64_t p0, int64_t kc, int64_t j0, int64_t nc, T* bp) {
  constexpr int NR = Vec<T>::NR;
  int64_t panels = (nc + NR - 1) / NR;
  for (int64_t jr = 0; jr < panels; ++jr) {
    T* dst = bp + jr * kc * NR;
    int64_t cols = std::min<int64_t>(NR, nc - jr * NR);
    for (int64_t p = 0; p < kc; ++p) {
      if (cols == NR && k == Kind::kF32 && b.cs == 1 && sizeof(T) == 4) {
        memcpy(dst + p * NR, static_cast<const float*>(b.data) + (p0 + p) * b.rs + j0 + jr * NR,
               NR * sizeof(float));
        continue;
      }
      for (int64_t j = 0; j < NR; ++j) {
        dst[p * NR + j] = j < cols ? load<T>(b, k, p0 + p, j0 + jr * NR + j) : T(0);
      }
    }
  }
}

// ---- the micro-kernel and the tile loop -----------------------------------------------------

// acc = ap-sliver (MR x kc) @ bp-sliver (kc x NR), in registers.
template <typename T>
__attribute__((always_inline)) inline void micro_body(int64_t kc, const T* __restrict ap,
                                                      const T* __restrict bp, T* __restrict acc) {
  typedef typename Vec<T>::V V;
  constexpr int L = Vec<T>::L;
  V c[MR][2] = {};
  for (int64_t p = 0; p < kc; ++p) {
    V b0, b1;
    memcpy(&b0, bp + p * 2 * L, sizeof(V));
    memcpy(&b1, bp + p * 2 * L + L, sizeof(V));
    for (int i = 0; i < MR; ++i) {
      V ai = V{} + ap[p * MR + i];
      c[i][0] += ai * b0;
      c[i][1] += ai * b1;
    }
  }
  memcpy(acc, c, sizeof(c));
}

// The micro-kernel built three times and chosen once by CPU features (not by CPU model, which is
// what target_clones' arch= clones test, and which misses e.g. AMD CPUs with AVX2).
template <typename T>
void micro_generic(int64_t kc, const T* ap, const T* bp, T* acc) {
  micro_body<T>(kc, ap, bp, acc);
}
#if defined(__x86_64__)
template <typename T>
__attribute__((target("avx2,fma"))) void micro_avx2(int64_t kc, const T* ap, const T* bp, T* acc) {
  micro_body<T>(kc, ap, bp, acc);
}
template <typename T>
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void micro_avx512(int64_t kc, const T* ap,
                                                                         const T* bp, T* acc) {
  micro_body<T>(kc, ap, bp, acc);
}
#endif

template <typename T>
using MicroFn = void (*)(int64_t, const T*, const T*, T*);

template <typename T>
MicroFn<T> pick_micro_kernel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return micro_avx512<T>;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return micro_avx2<T>;
#endif
  return micro_generic<T>;
}

template <typename T>
void micro_kernel(int64_t kc, const T* ap, const T* bp, T* acc) {
  static const MicroFn<T> fn = pick_micro_kernel<T>();
  fn(kc, ap, bp, acc);
}

struct Epilogue {
  const Mat* out;  // T-typed (float or double), any strides
  double alpha, beta;
  const Mat* bias;  // may be null
  Kind bias_kind;
  bool first;  // first K block: overwrite (plus bias) instead of accumulate
};

template <typename T>
void tiles(int64_t mc, int64_t nc, int64_t kc, const T* ap, const T* bp,
                        int64_t i0, int64_t j0, const Epilogue& e) {
  constexpr int NR = Vec<T>::NR;
  int64_t n_ir = (mc + MR - 1) / MR, n_jr = (nc + NR - 1) / NR;
  T* out = static_cast<T*>(const_cast<void*>(e.out->data));
  int64_t rs = e.out->rs, cs = e.out->cs;
  for (int64_t t = 0; t < n_ir * n_jr; ++t) {
    int64_t jr = t / n_ir, ir = t % n_ir;  // consecutive tiles share a B sliver
    alignas(64) T acc[MR * NR];
    micro_kernel<T>(kc, ap + ir * kc * MR, bp + jr * kc * NR, acc);
    int64_t rows = std::min<int64_t>(MR, mc - ir * MR), cols = std::min<int64_t>(NR, nc - jr * NR);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t gi = i0 + ir * MR + i;
      for (int64_t j = 0; j < cols; ++j) {
        int64_t gj = j0 + jr * NR + j;
        T v = T(e.alpha) * acc[i * NR + j];
        T& dst = out[gi * rs + gj * cs];
        if (!e.first) {
          v += dst;
        } else if (e.bias) {
          v += T(e.beta) * load<T>(*e.bias, e.bias_kind, gi, gj);
        }
        dst = v;
      }
    }
  }
}

template <typename T>
void gemm_typed(int64_t m, int64_t n, int64_t k, const Mat& a, const Mat& b, const Mat& out,
                double alpha, double beta, const Mat* bias) {
  constexpr int NR = Vec<T>::NR;
  Kind ka = kind_of(a.dtype), kb = kind_of(b.dtype);
  Epilogue e{&out, alpha, beta, bias, bias ? kind_of(bias->dtype) : Kind::kF32, true};
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        T v = bias ? T(beta) * load<T>(*bias, e.bias_kind, i, j) : T(0);
        static_cast<T*>(const_cast<void*>(out.data))[i * out.rs + j * out.cs] = v;
      }
    }
    return;
  }
  thread_local std::vector<T> abuf, bbuf;
  int64_t mpad = (m + MR - 1) / MR * MR;
  for (int64_t j0 = 0; j0 < n; j0 += NC) {
    int64_t nc = std::min(NC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
      int64_t kc = std::min(KC, k - p0);
      abuf.resize(size_t(mpad * kc));
      bbuf.resize(size_t((nc + NR - 1) / NR * NR * kc));
      pack_b<T>(b, kb, p0, kc, j0, nc, bbuf.data());
      pack_a<T>(a, ka, 0, m, p0, kc, abuf.data());
      e.first = p0 == 0;
      tiles<T>(m, nc, kc, abuf.data(), bbuf.data(), 0, j0, e);
    }
  }
}

// The same product with rows (or columns) split over OpenMP threads: one fork and join a call,
// each thread running the serial blocked GEMM on its own slab with its own packing buffers. No
// barriers inside, which matters on a busy machine where a descheduled thread stalls the rest.
const char* advance(const Mat& x, int64_t rows, int64_t cols) {
  return static_cast<const char*>(x.data) + (rows * x.rs + cols * x.cs) * itemsize(x.dtype);
}

template <typename T>
void gemm_parallel(int64_t m, int64_t n, int64_t k, const Mat& a, const Mat& b, const Mat& out,
                   double alpha, double beta, const Mat* bias) {
  bool split_n = n >= m;
  int64_t extent = split_n ? n : m, unit = split_n ? Vec<T>::NR : MR;
  int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  threads = std::min(threads, std::max<int64_t>(1, extent / (4 * unit)));
  if (m * n * k < (int64_t(1) << 20)) threads = 1;
  kind_of(a.dtype), kind_of(b.dtype);  // throw before any thread starts
  if (bias) kind_of(bias->dtype);
  if (threads <= 1) return gemm_typed<T>(m, n, k, a, b, out, alpha, beta, bias);
#pragma omp parallel num_threads(int(threads))
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t chunks = (extent + unit - 1) / unit;
    int64_t lo = std::min(extent, chunks * t / nt * unit);
    int64_t hi = std::min(extent, chunks * (t + 1) / nt * unit);
    if (lo < hi) {
      Mat sa = a, sb = b, so = out, sbias = bias ? *bias : Mat{};
      if (split_n) {
        sb.data = advance(b, 0, lo);
        so.data = advance(out, 0, lo);
        if (bias) sbias.data = advance(*bias, 0, lo);
        gemm_typed<T>(m, hi - lo, k, sa, sb, so, alpha, beta, bias ? &sbias : nullptr);
      } else {
        sa.data = advance(a, lo, 0);
        so.data = advance(out, lo, 0);
        if (bias) sbias.data = advance(*bias, lo, 0);
        gemm_typed<T>(hi - lo, n, k, sa, sb, so, alpha, beta, bias ? &sbias : nullptr);
      }
    }
  }
}

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, const Mat& a, const Mat& b, const Mat& out,
          double alpha, double beta, const Mat* bias) {
  if (m <= 0 || n <= 0) return;
  if (bias && (beta == 0.0 || bias->data == nullptr)) bias = nullptr;
  Kind ko = kind_of(out.dtype);
  if (ko == Kind::kF32) return gemm_parallel<float>(m, n, k, a, b, out, alpha, beta, bias);
  if (ko == Kind::kF64) return gemm_parallel<double>(m, n, k, a, b, out, alpha, beta, bias);
  // Half outputs: accumulate into a dense float32 matrix, then round once.
  std::vector<float> tmp(size_t(m * n));
  Mat t{tmp.data(), DLDataType{kDLFloat, 32, 1}, n, 1};
  gemm_parallel<float>(m, n, k, a, b, t, alpha, beta, bias);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) store<float>(out, ko, i, j, tmp[size_t(i * n + j)]);
  }
}

}  // namespace ember
