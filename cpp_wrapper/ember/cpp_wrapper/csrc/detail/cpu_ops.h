// Extern kernels on CPU: GEMM (packed, register-blocked, multithreaded) and convolution
// (im2col + GEMM). Internal; the model ABI reaches them through HostApi::extern_op.
#ifndef EMBER_DETAIL_CPU_OPS_H_
#define EMBER_DETAIL_CPU_OPS_H_

#include <cstdint>

#include "model_abi.h"

namespace ember {

// A 2-D strided operand: element (i, j) lives at data + (i * rs + j * cs) * itemsize(dtype).
struct Mat {
  const void* data;
  DLDataType dtype;
  int64_t rs, cs;
};

// out = alpha * (a @ b) + beta * bias for an m x k `a`, a k x n `b`; `bias` (may be broadcast with
// zero strides) is read only when beta != 0 and bias.data != nullptr. Supported dtypes: float32,
// float64, float16, bfloat16 (half types are computed in float32). `out` may not alias a or b.
void gemm(int64_t m, int64_t n, int64_t k, const Mat& a, const Mat& b, const Mat& out,
          double alpha = 1.0, double beta = 0.0, const Mat* bias = nullptr);

struct ConvParams {
  int64_t stride[2], padding[2], dilation[2];
  int64_t groups;
};

// 1-D and 2-D convolution (NCW / NCHW) with optional bias; out must have the right shape.
void conv_forward(const ember_abi::View& x, const ember_abi::View& w, const ember_abi::View* bias,
                  const ember_abi::View& out, const ConvParams& p);

// Scans along `dim` (scans.cc): out[..., j, ...] = op over in[..., :j+1, ...]. kMax/kMin also
// write the index of the running extreme into `indices` (int64); the others take no indices.
// Float outputs accumulate in double; integer ones in int64 (wrapping).
enum class ScanKind { kSum, kProd, kLogSumExp, kMax, kMin };
void scan_forward(ScanKind kind, const ember_abi::View& in, const ember_abi::View& out,
                  const ember_abi::View* indices, int64_t dim);

// Stable sort along `dim` (NaN above every number), writing the first k (k < 0: all) sorted
// values and their int64 indices: extern.sort (k = -1) and extern.topk.
void sort_forward(const ember_abi::View& in, const ember_abi::View& values,
                  const ember_abi::View& indices, int64_t dim, bool descending, int64_t k);

// Scalar conversions of the half types (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

// dst = src elementwise, converting between float16, bfloat16, float32 and float64; any strides.
void convert_copy(const ember_abi::View& dst, const ember_abi::View& src);

// out[...] = src[...] elementwise between two views of equal shape and dtype.
void strided_copy(const ember_abi::View& dst, const ember_abi::View& src);

}  // namespace ember

#endif  // EMBER_DETAIL_CPU_OPS_H_
