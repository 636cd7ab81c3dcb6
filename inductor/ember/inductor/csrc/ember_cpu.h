// Runtime helpers for ember.inductor's generated C++ kernels: half/bfloat16 conversion, NaN-aware
// min/max, and a small vector library over GCC vector extensions with explicit AVX2 and AVX512
// paths (EMBER_VEC_WIDTH is 16 for AVX512, 8 for AVX2, 4 for generic SSE2).
#ifndef EMBER_CPU_H_INCLUDED  // a guard, not #pragma once: artifacts inline this text
#define EMBER_CPU_H_INCLUDED
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef EMBER_EXPORT  // ember.ir.toolchain defines it; standalone builds get the same
#define EMBER_EXPORT extern "C" __attribute__((visibility("default")))
#endif

#ifndef EMBER_VEC_WIDTH  // ember.inductor defines it; otherwise follow the compiler's ISA
#if defined(__AVX512F__)
#define EMBER_VEC_WIDTH 16
#elif defined(__AVX2__)
#define EMBER_VEC_WIDTH 8
#else
#define EMBER_VEC_WIDTH 4
#endif
#endif

namespace ember {

// the threads a parallel loop would split its work across (a kernel's `if` clause reads it)
inline int omp_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// --- scalars -----------------------------------------------------------------------------------
inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal
    float v = std::ldexp((float)man, -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f2h(float f) {
  uint32_t u = float_to_bits(f), sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);          // NaN
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);         // overflow -> inf
  if (a < 0x38800000u) {                                          // subnormal or zero
    float v = bits_to_float(a) * 16777216.0f;                       // scale by 2^24
    return (uint16_t)(sign | (uint32_t)std::nearbyint(v));
  }
  uint32_t r = a + 0xfff + ((a >> 13) & 1);                        // round to nearest even
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

inline float bf2f(uint16_t b) { return bits_to_float((uint32_t)b << 16); }
inline uint16_t f2bf(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline float round_half(float f) { return h2f(f2h(f)); }
inline float round_bf16(float f) { return bf2f(f2bf(f)); }

template <class T> inline T max_prop(T a, T b) { return (a != a || a > b) ? a : b; }
template <class T> inline T min_prop(T a, T b) { return (a != a || a < b) ? a : b; }
template <class T> inline T floordiv(T a, T b) {
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <class T> inline T pymod(T a, T b) {
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline float pymod(float a, float b) {
  float r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline double pymod(double a, double b) {
  double r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// The first 32-bit word of Philox4x32-10 at counter `counter` with key `seed` (the counter's and
// the key's low and high words), as ember.primtorch.prims.random defines it and Triton's
// tl.randint computes it, so CPU and GPU kernels draw the same numbers.
inline int64_t philox(int64_t seed, int64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(uint64_t(counter) >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(uint64_t(seed) >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t a = uint64_t(0xD2511F53u) * c0, b = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(b >> 32) ^ c1 ^ k0, n2 = uint32_t(a >> 32) ^ c3 ^ k1;
    c1 = uint32_t(b);
    c3 = uint32_t(a);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return int64_t(c0);
}
template <class T> inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
template <class T> inline T sign(T x) { return (T)((x > T(0)) - (x < T(0))); }
// std::signbit on a float widened from bfloat16 makes GCC 12 fail (an internal compiler error)
// when it vectorizes the loop for AVX512; the sign of copysign(1, x) is the same bit.
template <class T> inline bool signbit(T x) { return std::copysign(T(1), x) < T(0); }
inline float erfinv(float y) {  // Giles' single-precision approximation, then two Newton steps
  if (!(std::fabs(y) < 1.0f))  // the ends (where w below is infinite), outside them, NaN
    return std::fabs(y) == 1.0f ? std::copysign(INFINITY, y) : NAN;
  float w = -std::log((1.0f - y) * (1.0f + y)), x;
  if (w < 5.0f) {
    w -= 2.5f;
    x = 2.81022636e-08f;
    for (float c : {3.43273939e-07f, -3.5233877e-06f, -4.39150654e-06f, 0.00021858087f,
                    -0.00125372503f, -0.00417768164f, 0.246640727f, 1.50140941f})
      x = c + x * w;
  } else {
    w = std::sqrt(w) - 3.0f;
    x = -0.000200214257f;
    for (float c : {0.000100950558f, 0.00134934322f, -0.00367342844f, 0.00573950773f,
                    -0.0076224613f, 0.00943887047f, 1.00167406f, 2.83297682f})
      x = c + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; ++i)
    x -= (std::erf(x) - y) / (1.1283791670955126f * std::exp(-x * x));
  return x;
}
inline double erfinv(double y) {  // from the float result, Newton steps in double
  if (!(std::fabs(y) < 1.0))
    return std::fabs(y) == 1.0 ? std::copysign(INFINITY, y) : NAN;
  double x = erfinv(std::copysign(std::min((float)std::fabs(y), 0.99999994f), (float)y));
  for (int i = 0; i < 8; ++i) {
    double step = (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
    x -= step;
    if (std::fabs(step) <= 1e-15 * std::fabs(x)) break;
  }
  return x;
}

// --- vectors -----------------------------------------------------------------------------------
constexpr int W = EMBER_VEC_WIDTH;
typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vm __attribute__((vector_size(W * 4)));  // lane masks: -1 true, 0 false

inline vf vbcast(float x) { return vf{} + x; }
inline vf vload(const float* p) { vf v; std::memcpy(&v, p, sizeof(vf)); return v; }
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
inline vf viota() { vf v; for (int i = 0; i < W; ++i) v[i] = (float)i; return v; }
inline vf vgather(const float* p, int64_t stride) {
  vf v; for (int i = 0; i < W; ++i) v[i] = p[i * stride]; return v;
}
inline void vscatter(float* p, int64_t stride, vf v) {  // a transpose's store: lane by lane
  for (int i = 0; i < W; ++i) p[i * stride] = v[i];
}
template <class F> inline vf vmap(vf x, F f) { vf r; for (int i = 0; i < W; ++i) r[i] = f(x[i]); return r; }
template <class F> inline vf vmap2(vf x, vf y, F f) {
  vf r; for (int i = 0; i < W; ++i) r[i] = f(x[i], y[i]); return r;
}

// half and bfloat16 storage: explicit F16C/AVX512 conversions where the ISA has them
inline vf vload_h(const uint16_t* p) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__) && EMBER_VEC_WIDTH == 8
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
  vf v; for (int i = 0; i < W; ++i) v[i] = h2f(p[i]); return v;
#endif
}
inline void vstore_h(uint16_t* p, vf v) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__) && EMBER_VEC_WIDTH == 8
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
#else
  for (int i = 0; i < W; ++i) p[i] = f2h(v[i]);
#endif
}
typedef uint16_t vh16 __attribute__((vector_size(W * 2)));
inline vf vload_bf(const uint16_t* p) {
  vh16 h; std::memcpy(&h, p, sizeof(h));
  return (vf)(__builtin_convertvector(h, vm) << 16);
}
inline void vstore_bf(uint16_t* p, vf v) {
  vm u = (vm)v;
  vm r = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
  r = ((u & 0x7fffffff) > 0x7f800000) ? ((u >> 16) | 0x40) : r;
  vh16 h = __builtin_convertvector(r & 0xffff, vh16);
  std::memcpy(p, &h, sizeof(h));
}
inline vf vround_half(vf v) { uint16_t t[W]; vstore_h(t, v); return vload_h(t); }
inline vf vround_bf16(vf v) { uint16_t t[W]; vstore_bf(t, v); return vload_bf(t); }
// 8-bit integers (quantized weights) held exactly in float lanes; their bit operations run on
// int32 lanes, exact for these values. Bytes widen through SSE4.1/AVX2/AVX512 conversions (GCC
// turns a lane-by-lane loop, or __builtin_convertvector from bytes, into one insert per lane).
typedef int32_t vi __attribute__((vector_size(W * 4)));
#if (defined(__AVX512F__) && EMBER_VEC_WIDTH == 16) || (defined(__AVX2__) && EMBER_VEC_WIDTH == 8)
#if EMBER_VEC_WIDTH == 16
inline vf vcvt_u8(__m128i b) { return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
inline vf vcvt_i8(__m128i b) { return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
#else
inline vf vcvt_u8(__m128i b) { return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
inline vf vcvt_i8(__m128i b) { return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }
#endif
inline __m128i vbytes(const void* p, int n) { __m128i b = _mm_setzero_si128(); std::memcpy(&b, p, n); return b; }
inline vf vload_i8(const int8_t* p) { return vcvt_i8(vbytes(p, W)); }
inline vf vload_u8(const uint8_t* p) { return vcvt_u8(vbytes(p, W)); }
// the nibbles of packed int4: lanes p[0], p[0], p[1], p[1], ... (W / 2 bytes read), and the
// shifts that select them: p[0], p[1], p[0], p[1], ...
inline vf vload_u8_dup2(const uint8_t* p) {
  __m128i b = vbytes(p, W / 2); return vcvt_u8(_mm_unpacklo_epi8(b, b));
}
inline vf vload_u8_period2(const uint8_t* p) {
  uint16_t h; std::memcpy(&h, p, 2); return vcvt_u8(_mm_set1_epi16((short)h));
}
#else
inline vf vload_i8(const int8_t* p) { vf v; for (int i = 0; i < W; ++i) v[i] = p[i]; return v; }
inline vf vload_u8(const uint8_t* p) { vf v; for (int i = 0; i < W; ++i) v[i] = p[i]; return v; }
inline vf vload_u8_dup2(const uint8_t* p) { vf v; for (int i = 0; i < W; ++i) v[i] = p[i / 2]; return v; }
inline vf vload_u8_period2(const uint8_t* p) { vf v; for (int i = 0; i < W; ++i) v[i] = p[i % 2]; return v; }
#endif
// lane i from f(i): a load whose index is not affine in the vector variable (a nibble's byte)
template <class F> inline vf vlanes(F f) { vf v; for (int i = 0; i < W; ++i) v[i] = f(i); return v; }
inline vi vf2i(vf x) { return __builtin_convertvector(x, vi); }
inline vf vi2f(vi x) { return __builtin_convertvector(x, vf); }
inline vf vshr(vf a, vf b) { return vi2f(vf2i(a) >> vf2i(b)); }
inline vf vand(vf a, vf b) { return vi2f(vf2i(a) & vf2i(b)); }
inline vf vor(vf a, vf b) { return vi2f(vf2i(a) | vf2i(b)); }
inline vf vload_b(const bool* p) { vf v; for (int i = 0; i < W; ++i) v[i] = p[i]; return v; }
// the lanes of p where m holds, 0 elsewhere; lanes outside m are not read (no fault past a
// buffer's end): a concatenation's load whose which-input test varies across the lanes
inline vf vmaskload(const float* p, vm m) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return (vf)_mm512_maskz_loadu_ps(_mm512_test_epi32_mask((__m512i)m, (__m512i)m), p);
#elif defined(__AVX2__) && EMBER_VEC_WIDTH == 8
  return (vf)_mm256_maskload_ps(p, (__m256i)m);
#else
  vf v; for (int i = 0; i < W; ++i) v[i] = m[i] ? p[i] : 0.0f; return v;
#endif
}
inline vm vmbcast(bool b) { return vm{} + (b ? -1 : 0); }  // a scalar bool in every lane
inline vm vload_mask(const bool* p) { vm v; for (int i = 0; i < W; ++i) v[i] = p[i] ? -1 : 0; return v; }
inline void vstore_mask(bool* p, vm m) { for (int i = 0; i < W; ++i) p[i] = m[i] != 0; }

inline bool hany(vm m) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX2__) && EMBER_VEC_WIDTH == 8
  return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#else
  for (int i = 0; i < W; ++i) if (m[i]) return true;
  return false;
#endif
}
inline vf vwhere(vm m, vf a, vf b) { return m ? a : b; }
inline vf vm2f(vm m) { return m ? vbcast(1.0f) : vbcast(0.0f); }
inline vm vf2m(vf x) { return x != 0; }
inline vf vmax(vf a, vf b) { return (a != a || a > b) ? a : b; }
inline vf vmin(vf a, vf b) { return (a != a || a < b) ? a : b; }
inline vf vabs(vf x) { return (vf)((vm)x & 0x7fffffff); }
inline vf vsqrt(vf x) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return (vf)_mm512_sqrt_ps((__m512)x);
#elif defined(__AVX2__) && EMBER_VEC_WIDTH == 8
  return (vf)_mm256_sqrt_ps((__m256)x);
#else
  return vmap(x, [](float a) { return std::sqrt(a); });
#endif
}
inline vf vfloor(vf x) {
  vf t = __builtin_convertvector(__builtin_convertvector(x, vm), vf);
  t = (t > x) ? t - 1.0f : t;
  return (vabs(x) < 8388608.0f) ? t : x;  // large values (and NaN, inf) are already integral
}

// exp on [-87.3, 88.3]: Cody-Waite range reduction and a degree-6 polynomial (about 1 ulp);
// outside that range its lanes are wrong (the callers below deal with them).
inline vf vexp_in_range(vf x) {
  vm n = __builtin_convertvector(x * 1.44269504088896341f + 128.5f, vm) - 128;  // floor(t + .5)
  vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  vf y = vbcast(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * (vf)((n + 127) << 23);
}

// exp: lanes whose result is below the smallest subnormal (-inf: a masked score) are 0; those
// outside vexp_in_range's range otherwise (overflow, subnormal results) are rare and go to
// std::exp. A causal mask's -inf lanes once took that lane-by-lane path in half its vectors.
#ifndef EMBER_SLOW_EXP  // a test counts the lanes that take it
#define EMBER_SLOW_EXP(a) std::exp(a)
#endif
inline vf vexp(vf x) {
  vf out = vexp_in_range(x);
  vm zero = x < -104.0f;
  vm slow = ((x < -87.3365478515625f) & ~zero) | (x > 88.3762626647949f);
  if (hany(slow)) out = slow ? vmap(x, [](float a) { return EMBER_SLOW_EXP(a); }) : out;
  out = zero ? vbcast(0.0f) : out;
  return (x != x) ? x : out;
}
inline vf vtanh(vf x) {
  vf x2 = x * x;  // near zero, 1 - 2 / (e^2x + 1) cancels: use the odd Taylor series there
  vf small = x + x * x2 * (-0.333333333f + x2 * (0.133333333f - x2 * 0.0539682540f));
  vf big = 1.0f - 2.0f / (vexp(x + x) + 1.0f);
  return (vabs(x) < 0.0625f) ? small : big;
}
inline vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }
inline vf verf(vf x) {  // Abramowitz-Stegun 7.1.26 (absolute error below 1.5e-7)
  vf a = vabs(x), t = 1.0f / (1.0f + 0.3275911f * a);
  vf y = vbcast(1.061405429f);
  y = y * t - 1.453152027f;
  y = y * t + 1.421413741f;
  y = y * t - 0.284496736f;
  y = y * t + 0.254829592f;
  y = 1.0f - y * t * vexp(-a * a);
  return (x < 0.0f) ? -y : y;
}

// horizontal reductions
inline float hsum(vf v) {
#if defined(__AVX512F__) && EMBER_VEC_WIDTH == 16
  return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX2__) && EMBER_VEC_WIDTH == 8
  __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float s = 0; for (int i = 0; i < W; ++i) s += v[i]; return s;
#endif
}
inline float hprod(vf v) { float s = 1; for (int i = 0; i < W; ++i) s *= v[i]; return s; }
inline float hmax(vf v) { float s = v[0]; for (int i = 1; i < W; ++i) s = max_prop(s, v[i]); return s; }
inline float hmin(vf v) { float s = v[0]; for (int i = 1; i < W; ++i) s = min_prop(s, v[i]); return s; }

}  // namespace ember
#endif  // EMBER_CPU_H_INCLUDED
