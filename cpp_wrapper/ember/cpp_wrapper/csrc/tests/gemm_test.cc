// The CPU GEMM and convolution against naive loops (plain program for Bazel cc_test).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "detail/cpu_ops.h"

namespace {

int failures = 0;

bool gemm_case(int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool with_bias) {
  std::mt19937 rng(unsigned(m * 131 + n * 17 + k));
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  std::vector<float> bias(static_cast<size_t>(n)), out(static_cast<size_t>(m * n));
  for (auto& v : a) v = dist(rng);
  for (auto& v : b) v = dist(rng);
  for (auto& v : bias) v = dist(rng);
  DLDataType f32{kDLFloat, 32, 1};
  // Transposed operands are read through strides: element (i, j) of a at i * rs + j * cs.
  ember::Mat am{a.data(), f32, ta ? 1 : k, ta ? m : 1};
  ember::Mat bm{b.data(), f32, tb ? 1 : n, tb ? k : 1};
  ember::Mat om{out.data(), f32, n, 1};
  ember::Mat biasm{bias.data(), f32, 0, 1};
  ember::gemm(m, n, k, am, bm, om, 0.5, 2.0, with_bias ? &biasm : nullptr);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += double(a[size_t(i * am.rs + p * am.cs)]) * b[size_t(p * bm.rs + j * bm.cs)];
      }
      double want = 0.5 * s + (with_bias ? 2.0 * bias[size_t(j)] : 0.0);
      worst = std::fmax(worst, std::fabs(want - out[size_t(i * n + j)]));
    }
  }
  bool ok = worst < 1e-3 * (1 + std::sqrt(double(k)));
  if (!ok) {
    fprintf(stderr, "FAIL gemm m=%lld n=%lld k=%lld ta=%d tb=%d bias=%d: error %g\n", (long long)m,
            (long long)n, (long long)k, ta, tb, with_bias, worst);
  }
  return ok;
}

bool conv_case(int64_t n, int64_t c, int64_t h, int64_t w, int64_t co, int64_t kh, int64_t stride,
               int64_t pad, int64_t dil, int64_t groups) {
  int64_t ho = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
  int64_t wo = (w + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
  int64_t cig = c / groups, cog = co / groups;
  std::vector<float> x(static_cast<size_t>(n * c * h * w));
  std::vector<float> wt(static_cast<size_t>(co * cig * kh * kh));
  std::vector<float> bias(static_cast<size_t>(co));
  std::vector<float> out(static_cast<size_t>(n * co * ho * wo));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : x) v = dist(rng);
  for (auto& v : wt) v = dist(rng);
  for (auto& v : bias) v = dist(rng);
  DLDataType f32{kDLFloat, 32, 1};
  ember_abi::View xv{x.data(), f32, 4, {n, c, h, w}, {c * h * w, h * w, w, 1}};
  ember_abi::View wv{wt.data(), f32, 4, {co, cig, kh, kh}, {cig * kh * kh, kh * kh, kh, 1}};
  ember_abi::View bv{bias.data(), f32, 1, {co}, {1}};
  ember_abi::View ov{out.data(), f32, 4, {n, co, ho, wo}, {co * ho * wo, ho * wo, wo, 1}};
  ember::ConvParams p{{stride, stride}, {pad, pad}, {dil, dil}, groups};
  ember::conv_forward(xv, wv, &bv, ov, p);
  double worst = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t y = 0; y < ho; ++y)
        for (int64_t z = 0; z < wo; ++z) {
          double s = bias[size_t(o)];
          int64_t g = o / cog;
          for (int64_t i = 0; i < cig; ++i)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kh; ++v) {
                int64_t iy = y * stride - pad + u * dil, iz = z * stride - pad + v * dil;
                if (iy < 0 || iy >= h || iz < 0 || iz >= w) continue;
                s += double(x[size_t(((b * c + g * cig + i) * h + iy) * w + iz)]) *
                     wt[size_t(((o * cig + i) * kh + u) * kh + v)];
              }
          worst = std::fmax(worst, std::fabs(s - out[size_t(((b * co + o) * ho + y) * wo + z)]));
        }
  bool ok = worst < 1e-3;
  if (!ok) fprintf(stderr, "FAIL conv c=%lld k=%lld s=%lld g=%lld: error %g\n", (long long)c, (long long)kh, (long long)stride, (long long)groups, worst);
  return ok;
}

}  // namespace

int main() {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {6, 16, 256}, {33, 47, 300}, {64, 64, 64}, {2, 100, 513}};
  for (const auto& s : sizes) {
    for (int t = 0; t < 8; ++t) {
      failures += !gemm_case(s[0], s[1], s[2], t & 1, t & 2, t & 4);
    }
  }
  failures += !conv_case(2, 3, 9, 9, 4, 3, 1, 1, 1, 1);
  failures += !conv_case(1, 4, 8, 8, 6, 3, 2, 0, 1, 2);
  failures += !conv_case(1, 4, 10, 10, 4, 3, 1, 2, 2, 4);
  failures += !conv_case(2, 8, 5, 5, 3, 1, 1, 0, 1, 1);  // 1x1: no im2col
  if (failures == 0) printf("gemm_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
