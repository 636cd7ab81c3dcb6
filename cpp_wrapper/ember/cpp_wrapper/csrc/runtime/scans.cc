// Extern ops along one dimension on CPU: scans (cumsum, cumprod, logcumsumexp, cummax, cummin),
// sort and topk. Any strides and any of the runtime's real dtypes; floats accumulate in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "detail/common.h"
#include "detail/cpu_ops.h"

namespace ember {

using ember_abi::View;

namespace {

bool is_floating(DLDataType t) { return t.code == kDLFloat || t.code == kDLBfloat; }

// Unaligned-safe reads and writes of one element.
template <class T>
T raw(const char* p) {
  T x;
  memcpy(&x, p, sizeof x);
  return x;
}
template <class T>
void put(char* p, T x) {
  memcpy(p, &x, sizeof x);
}

int key(DLDataType t) { return t.code * 1000 + t.bits; }

double load_double(const View& v, int64_t off) {
  const char* p = static_cast<const char*>(v.data) + off * itemsize(v.dtype);
  switch (key(v.dtype)) {
    case kDLFloat * 1000 + 32: return raw<float>(p);
    case kDLFloat * 1000 + 64: return raw<double>(p);
    case kDLFloat * 1000 + 16: return half_to_float(raw<uint16_t>(p));
    case kDLBfloat * 1000 + 16: return bf16_to_float(raw<uint16_t>(p));
  }
  fail(EMBER_ERR_UNSUPPORTED, "a scan or sort on CPU over " + dtype_name(v.dtype));
}

int64_t load_int(const View& v, int64_t off) {
  const char* p = static_cast<const char*>(v.data) + off * itemsize(v.dtype);
  switch (key(v.dtype)) {
    case kDLInt * 1000 + 64: return raw<int64_t>(p);
    case kDLInt * 1000 + 32: return raw<int32_t>(p);
    case kDLInt * 1000 + 16: return raw<int16_t>(p);
    case kDLInt * 1000 + 8: return raw<int8_t>(p);
    case kDLUInt * 1000 + 8: return raw<uint8_t>(p);
    case kDLBool * 1000 + 8: return raw<uint8_t>(p) != 0;
  }
  if (is_floating(v.dtype)) return int64_t(load_double(v, off));
  fail(EMBER_ERR_UNSUPPORTED, "a scan or sort on CPU over " + dtype_name(v.dtype));
}

void store_double(const View& v, int64_t off, double x) {
  char* p = static_cast<char*>(v.data) + off * itemsize(v.dtype);
  switch (key(v.dtype)) {
    case kDLFloat * 1000 + 32: return put(p, float(x));
    case kDLFloat * 1000 + 64: return put(p, x);
    case kDLFloat * 1000 + 16: return put(p, float_to_half(float(x)));
    case kDLBfloat * 1000 + 16: return put(p, float_to_bf16(float(x)));
  }
  fail(EMBER_ERR_UNSUPPORTED, "a scan on CPU into " + dtype_name(v.dtype));
}

void store_int(const View& v, int64_t off, int64_t x) {
  char* p = static_cast<char*>(v.data) + off * itemsize(v.dtype);
  switch (key(v.dtype)) {
    case kDLInt * 1000 + 64: return put(p, x);
    case kDLInt * 1000 + 32: return put(p, int32_t(x));
    case kDLInt * 1000 + 16: return put(p, int16_t(x));
    case kDLInt * 1000 + 8: return put(p, int8_t(x));
    case kDLUInt * 1000 + 8: return put(p, uint8_t(x));
    case kDLBool * 1000 + 8: return put(p, uint8_t(x != 0));
  }
  if (is_floating(v.dtype)) return store_double(v, off, double(x));
  fail(EMBER_ERR_UNSUPPORTED, "a scan on CPU into " + dtype_name(v.dtype));
}

// A 0-d tensor is a line of one element along dimension 0.
View as_1d_if_scalar(View v) {
  if (v.ndim == 0) v.ndim = 1, v.sizes[0] = 1, v.strides[0] = 1;
  return v;
}

int canonical_dim(const View& v, int64_t dim) {
  if (dim < 0) dim += v.ndim;
  if (dim < 0 || dim >= v.ndim) fail(EMBER_ERR_INVALID_ARGUMENT, "extern op: dim out of range");
  return int(dim);
}

// Calls f(offsets) once per line along `dim` of `shape` (which every view matches except along
// dim), with each view's element offset of the line's first element.
template <class F>
void for_each_line(const View& shape, int dim, const std::vector<const View*>& views, F f) {
  int64_t lines = 1;
  for (int i = 0; i < shape.ndim; ++i) lines *= i == dim ? 1 : shape.sizes[i];
  std::vector<int64_t> idx(size_t(shape.ndim), 0), offs(views.size());
  for (int64_t line = 0; line < lines; ++line) {
    for (size_t k = 0; k < views.size(); ++k) {
      offs[k] = 0;
      for (int i = 0; i < shape.ndim; ++i) offs[k] += idx[size_t(i)] * views[k]->strides[i];
    }
    f(offs);
    for (int i = shape.ndim - 1; i >= 0; --i) {
      if (i == dim) continue;
      if (++idx[size_t(i)] < shape.sizes[i]) break;
      idx[size_t(i)] = 0;
    }
  }
}

void same_shape(const View& a, const View& b, const char* op) {
  bool ok = a.ndim == b.ndim;
  for (int i = 0; ok && i < a.ndim; ++i) ok = a.sizes[i] == b.sizes[i];
  if (!ok) fail(EMBER_ERR_SHAPE, std::string(op) + ": output shape differs from the input's");
}

}  // namespace

void scan_forward(ScanKind kind, const View& in_v, const View& out_v, const View* idx_v,
                  int64_t d) {
  View in = as_1d_if_scalar(in_v), out = as_1d_if_scalar(out_v),
       idx = idx_v ? as_1d_if_scalar(*idx_v) : View{};
  int dim = canonical_dim(in, d);
  same_shape(in, out, "scan");
  if (idx_v) same_shape(in, idx, "scan");
  int64_t n = in.sizes[dim], si = in.strides[dim], so = out.strides[dim];
  int64_t sx = idx_v ? idx.strides[dim] : 0;
  bool floating = is_floating(out.dtype) || (idx_v && is_floating(in.dtype));
  for_each_line(in, dim, {&in, &out, &idx}, [&](const std::vector<int64_t>& o) {
    if (kind == ScanKind::kMax || kind == ScanKind::kMin) {
      // torch's rule: a NaN wins and stays; otherwise a new extreme or an equal one moves the
      // index.
      double best = 0;
      int64_t ibest = 0, best_i = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (floating) {
          double x = load_double(in, o[0] + j * si);
          bool take = j == 0 || std::isnan(x) ||
                      (!std::isnan(best) && (kind == ScanKind::kMax ? x >= best : x <= best));
          if (take) best = x, best_i = j;
          store_double(out, o[1] + j * so, best);
        } else {
          int64_t x = load_int(in, o[0] + j * si);
          if (j == 0 || (kind == ScanKind::kMax ? x >= ibest : x <= ibest)) ibest = x, best_i = j;
          store_int(out, o[1] + j * so, ibest);
        }
        store_int(idx, o[2] + j * sx, best_i);
      }
      return;
    }
    if (floating) {
      double acc = kind == ScanKind::kProd ? 1.0 : kind == ScanKind::kLogSumExp ? -INFINITY : 0.0;
      for (int64_t j = 0; j < n; ++j) {
        double x = load_double(in, o[0] + j * si);
        if (kind == ScanKind::kSum) {
          acc += x;
        } else if (kind == ScanKind::kProd) {
          acc *= x;
        } else {  // log(exp(acc) + exp(x)), shifted by the larger so neither overflows
          double hi = std::max(acc, x), lo = std::min(acc, x);
          acc = std::isinf(hi) && hi < 0 ? hi
                : std::isnan(x)          ? x
                                         : hi + std::log1p(std::exp(lo - hi));
        }
        store_double(out, o[1] + j * so, acc);
      }
    } else {
      if (kind == ScanKind::kLogSumExp) fail(EMBER_ERR_DTYPE, "logcumsumexp of an integer tensor");
      uint64_t acc = kind == ScanKind::kProd ? 1 : 0;  // unsigned: wraps as torch's int64 does
      for (int64_t j = 0; j < n; ++j) {
        uint64_t x = uint64_t(load_int(in, o[0] + j * si));
        acc = kind == ScanKind::kProd ? acc * x : acc + x;
        store_int(out, o[1] + j * so, int64_t(acc));
      }
    }
  });
}

void sort_forward(const View& in_v, const View& values_v, const View& indices_v, int64_t d,
                  bool descending, int64_t k) {
  View in = as_1d_if_scalar(in_v), values = as_1d_if_scalar(values_v);
  View indices = as_1d_if_scalar(indices_v);
  int dim = canonical_dim(in, d);
  int64_t n = in.sizes[dim];
  if (k < 0) k = n;
  if (k > n) fail(EMBER_ERR_INVALID_ARGUMENT, "topk: k is larger than the dimension");
  if (!dtype_matches(in.dtype, values.dtype) || indices.dtype.code != kDLInt ||
      indices.dtype.bits != 64) {
    fail(EMBER_ERR_DTYPE, "sort/topk: values must have the input's dtype and indices int64");
  }
  bool ok = values.ndim == in.ndim && indices.ndim == in.ndim;
  for (int i = 0; ok && i < in.ndim; ++i) {
    int64_t want = i == dim ? k : in.sizes[i];
    ok = values.sizes[i] == want && indices.sizes[i] == want;
  }
  if (!ok) fail(EMBER_ERR_SHAPE, "sort/topk: output shapes do not match the input's");
  bool floating = is_floating(in.dtype);
  int64_t isz = itemsize(in.dtype), si = in.strides[dim];
  int64_t sv = values.strides[dim], sx = indices.strides[dim];
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::vector<double> fkeys(floating ? size_t(n) : 0);
  std::vector<int64_t> ikeys(floating ? 0 : size_t(n));
  for_each_line(in, dim, {&in, &values, &indices}, [&](const std::vector<int64_t>& o) {
    for (int64_t j = 0; j < n; ++j) {
      if (floating)
        fkeys[size_t(j)] = load_double(in, o[0] + j * si);
      else
        ikeys[size_t(j)] = load_int(in, o[0] + j * si);
    }
    std::iota(order.begin(), order.end(), 0);
    // NaN sorts above every number, as in torch; equal keys keep their order (stable).
    auto before = [&](int64_t a, int64_t b) {
      if (!floating)
        return descending ? ikeys[size_t(a)] > ikeys[size_t(b)]
                          : ikeys[size_t(a)] < ikeys[size_t(b)];
      double x = fkeys[size_t(a)], y = fkeys[size_t(b)];
      if (std::isnan(x) || std::isnan(y))
        return descending ? std::isnan(x) && !std::isnan(y) : !std::isnan(x) && std::isnan(y);
      return descending ? x > y : x < y;
    };
    std::stable_sort(order.begin(), order.end(), before);
    const char* src = static_cast<const char*>(in.data);
    char* dst = static_cast<char*>(values.data);
    for (int64_t j = 0; j < k; ++j) {  // values are copied bit for bit
      memcpy(dst + (o[1] + j * sv) * isz, src + (o[0] + order[size_t(j)] * si) * isz, size_t(isz));
      store_int(indices, o[2] + j * sx, order[size_t(j)]);
    }
  });
}

}  // namespace ember
