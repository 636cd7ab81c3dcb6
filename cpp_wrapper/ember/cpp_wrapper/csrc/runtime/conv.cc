// CPU convolution as im2col + GEMM (a 1x1, stride-1, unpadded convolution skips im2col and reads
// the input in place), and the generic strided copy.
#include <algorithm>
#include <cstring>
#include <vector>

#include "detail/common.h"
#include "detail/cpu_ops.h"

namespace ember {

using ember_abi::View;

namespace {

bool is_float(DLDataType t) { return t.code == kDLFloat && (t.bits == 32 || t.bits == 64); }

// Element (n, c, h, w) of a 4-D view as T (float32 or float64 views only: others are converted
// by the caller into a dense float buffer first).
template <typename T>
inline T at4(const View& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  int64_t off = n * v.strides[0] + c * v.strides[1] + h * v.strides[2] + w * v.strides[3];
  return v.dtype.bits == 64 ? T(static_cast<const double*>(v.data)[off])
                            : T(static_cast<const float*>(v.data)[off]);
}

// A 3-D (N, C, W) view seen as 4-D (N, C, 1, W).
View as_4d(const View& v) {
  if (v.ndim == 4) return v;
  View r = v;
  r.ndim = 4;
  r.sizes[3] = v.sizes[2];
  r.strides[3] = v.strides[2];
  r.sizes[2] = 1;
  r.strides[2] = 0;
  return r;
}

// A dense float32 view shaped like `v`, backed by `storage` (uninitialised).
View dense_like(const View& v, std::vector<float>& storage) {
  int64_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= v.sizes[i];
  storage.resize(size_t(n));
  View d = v;
  d.data = storage.data();
  d.dtype = DLDataType{kDLFloat, 32, 1};
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    d.strides[i] = s;
    s *= v.sizes[i];
  }
  return d;
}

// A dense float32 copy of a half-precision view (im2col reads float32/float64 only).
View dense_float(const View& v, std::vector<float>& storage) {
  View d = dense_like(v, storage);
  convert_copy(d, v);
  return d;
}

double load_any(const char* p, DLDataType t) {
  if (t.code == kDLFloat && t.bits == 32) return *reinterpret_cast<const float*>(p);
  if (t.code == kDLFloat && t.bits == 64) return *reinterpret_cast<const double*>(p);
  uint16_t h;
  memcpy(&h, p, 2);
  if (t.code == kDLFloat && t.bits == 16) return half_to_float(h);
  if (t.code == kDLBfloat && t.bits == 16) return bf16_to_float(h);
  fail(EMBER_ERR_UNSUPPORTED, "conversion from " + dtype_name(t));
}

void store_any(char* p, DLDataType t, double v) {
  if (t.code == kDLFloat && t.bits == 32) {
    *reinterpret_cast<float*>(p) = float(v);
  } else if (t.code == kDLFloat && t.bits == 64) {
    *reinterpret_cast<double*>(p) = v;
  } else {
    uint16_t h;
    if (t.code == kDLFloat && t.bits == 16) h = float_to_half(float(v));
    else if (t.code == kDLBfloat && t.bits == 16) h = float_to_bf16(float(v));
    else fail(EMBER_ERR_UNSUPPORTED, "conversion to " + dtype_name(t));
    memcpy(p, &h, 2);
  }
}

// Visit every index of `sizes` in row-major order: fn(offset_in_a, offset_in_b), in elements.
template <typename Fn>
void for_each_index(int nd, const int64_t* sizes, const int64_t* sa, const int64_t* sb, Fn fn) {
  int64_t total = 1;
  for (int i = 0; i < nd; ++i) total *= sizes[i];
  int64_t idx[EMBER_MAX_DIMS] = {0};
  int64_t oa = 0, ob = 0;
  for (int64_t e = 0; e < total; ++e) {
    fn(oa, ob);
    for (int i = nd - 1; i >= 0; --i) {
      oa += sa[i];
      ob += sb[i];
      if (++idx[i] < sizes[i]) break;
      oa -= sa[i] * sizes[i];
      ob -= sb[i] * sizes[i];
      idx[i] = 0;
    }
  }
}

template <typename T>
void conv_typed(const View& x, const View& w, const View* bias, const View& out,
                const ConvParams& p) {
  int64_t N = x.sizes[0], C = x.sizes[1], H = x.sizes[2], W = x.sizes[3];
  int64_t CO = w.sizes[0], CIg = w.sizes[1], KH = w.sizes[2], KW = w.sizes[3];
  int64_t HO = out.sizes[2], WO = out.sizes[3], G = p.groups, COg = CO / G;
  if (CIg * G != C || COg * G != CO || out.sizes[0] != N || out.sizes[1] != CO) {
    fail(EMBER_ERR_SHAPE, "convolution: inconsistent input/weight/output shapes or groups");
  }
  int64_t kdim = CIg * KH * KW, cols = HO * WO;
  DLDataType acc = DLDataType{kDLFloat, uint8_t(sizeof(T) * 8), 1};
  // The weight as a (CO, kdim) matrix: mergeable when its last three dims are dense.
  bool w_dense = w.strides[3] * KW == w.strides[2] || KH == 1;
  w_dense = w_dense && w.strides[2] * KH == w.strides[1] && (KW == 1 || w.strides[3] == 1);
  std::vector<T> wbuf;
  Mat wm{w.data, w.dtype, w.strides[0], 1};
  if (!w_dense) {
    wbuf.resize(size_t(CO * kdim));
    for (int64_t o = 0; o < CO; ++o)
      for (int64_t i = 0; i < CIg; ++i)
        for (int64_t a = 0; a < KH; ++a)
          for (int64_t b = 0; b < KW; ++b)
            wbuf[size_t(o * kdim + (i * KH + a) * KW + b)] = at4<T>(w, o, i, a, b);
    wm = Mat{wbuf.data(), acc, kdim, 1};
  }
  bool out_merge = WO == 1 || HO == 1 || out.strides[2] == WO * out.strides[3];
  std::vector<T> obuf;
  bool pointwise = KH == 1 && KW == 1 && p.stride[0] == 1 && p.stride[1] == 1 &&
                   p.padding[0] == 0 && p.padding[1] == 0 && (W == 1 || H == 1 || x.strides[2] == W * x.strides[3]);
  std::vector<T> col;
  if (!pointwise) col.resize(size_t(kdim * cols));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      Mat bm;
      if (pointwise) {
        const char* base = static_cast<const char*>(x.data) +
                           (n * x.strides[0] + g * CIg * x.strides[1]) * itemsize(x.dtype);
        bm = Mat{base, x.dtype, x.strides[1], x.strides[3]};
      } else {
#pragma omp parallel for schedule(static) if (kdim * cols > 65536)
        for (int64_t r = 0; r < kdim; ++r) {
          int64_t ci = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
          T* dst = col.data() + r * cols;
          for (int64_t oh = 0; oh < HO; ++oh) {
            int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
            for (int64_t ow = 0; ow < WO; ++ow) {
              int64_t iw = ow * p.stride[1] - p.padding[1] + kw * p.dilation[1];
              bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
              dst[oh * WO + ow] = in ? at4<T>(x, n, g * CIg + ci, ih, iw) : T(0);
            }
          }
        }
        bm = Mat{col.data(), acc, cols, 1};
      }
      Mat am{static_cast<const char*>(wm.data) + g * COg * wm.rs * itemsize(wm.dtype), wm.dtype,
             wm.rs, 1};
      char* obase = static_cast<char*>(out.data) +
                    (n * out.strides[0] + g * COg * out.strides[1]) * itemsize(out.dtype);
      Mat om{obase, out.dtype, out.strides[1], out.strides[3]};
      if (!out_merge) {
        obuf.resize(size_t(COg * cols));
        om = Mat{obuf.data(), acc, cols, 1};
      }
      Mat bias_m;
      if (bias) {
        bias_m = Mat{static_cast<const char*>(bias->data) +
                         g * COg * bias->strides[0] * itemsize(bias->dtype),
                     bias->dtype, bias->strides[0], 0};
      }
      gemm(COg, cols, kdim, am, bm, om, 1.0, bias ? 1.0 : 0.0, bias ? &bias_m : nullptr);
      if (!out_merge) {
        View src{obuf.data(), acc, 3, {COg, HO, WO}, {cols, WO, 1}};
        View dst{obase, out.dtype, 3, {COg, HO, WO}, {out.strides[1], out.strides[2], out.strides[3]}};
        strided_copy(dst, src);
      }
    }
  }
}

}  // namespace

void conv_forward(const View& x_in, const View& w_in, const View* bias, const View& out_in,
                  const ConvParams& p) {
  if (x_in.ndim != w_in.ndim || x_in.ndim != out_in.ndim || (x_in.ndim != 3 && x_in.ndim != 4)) {
    fail(EMBER_ERR_UNSUPPORTED, "convolution on CPU supports 1-D and 2-D inputs (NCW, NCHW)");
  }
  View x = as_4d(x_in), w = as_4d(w_in), out = as_4d(out_in);
  if (!is_float(out.dtype)) {
    // Half precision: compute in float32 and round into the output once.
    std::vector<float> xs, ws, bs, os;
    View xf = is_float(x.dtype) ? x : dense_float(x, xs);
    View wf = is_float(w.dtype) ? w : dense_float(w, ws);
    View bf;
    if (bias) bf = is_float(bias->dtype) ? *bias : dense_float(*bias, bs);
    View of = dense_like(out, os);
    conv_typed<float>(xf, wf, bias ? &bf : nullptr, of, p);
    convert_copy(out, of);
    return;
  }
  if (!is_float(x.dtype) || !is_float(w.dtype) || x.dtype.bits != out.dtype.bits ||
      w.dtype.bits != out.dtype.bits) {
    fail(EMBER_ERR_DTYPE, "convolution: input, weight and output dtypes differ");
  }
  if (out.dtype.bits == 64) return conv_typed<double>(x, w, bias, out, p);
  conv_typed<float>(x, w, bias, out, p);
}

void strided_copy(const View& dst, const View& src) {
  if (dst.ndim != src.ndim || !dtype_matches(src.dtype, dst.dtype)) {
    fail(EMBER_ERR_SHAPE, "copy between views of different rank or dtype");
  }
  for (int i = 0; i < dst.ndim; ++i) {
    if (dst.sizes[i] != src.sizes[i]) fail(EMBER_ERR_SHAPE, "copy between views of different shape");
  }
  size_t isz = size_t(itemsize(dst.dtype));
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for_each_index(dst.ndim, dst.sizes, dst.strides, src.strides, [&](int64_t od, int64_t os) {
    memcpy(d + od * int64_t(isz), s + os * int64_t(isz), isz);
  });
}

void convert_copy(const View& dst, const View& src) {
  if (dst.ndim != src.ndim) fail(EMBER_ERR_SHAPE, "conversion between views of different rank");
  for (int i = 0; i < dst.ndim; ++i) {
    if (dst.sizes[i] != src.sizes[i]) fail(EMBER_ERR_SHAPE, "conversion between views of different shape");
  }
  int64_t ds = itemsize(dst.dtype), ss = itemsize(src.dtype);
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for_each_index(dst.ndim, dst.sizes, dst.strides, src.strides, [&](int64_t od, int64_t os) {
    store_any(d + od * ds, dst.dtype, load_any(s + os * ss, src.dtype));
  });
}

}  // namespace ember
