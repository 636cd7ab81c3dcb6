// Extern ops: matmul, convolution, scans and sorting on CPU (gemm.cc, conv.cc, scans.cc), matmul
// on CUDA via cuBLAS.
#include <algorithm>
#include <cstring>
#include <vector>

#include "detail/common.h"
#include "detail/cpu_ops.h"
#include "detail/model.h"

namespace ember {

using ember_abi::View;

namespace {

void need(bool ok, const char* what) {
  if (!ok) fail(EMBER_ERR_INVALID_ARGUMENT, std::string("extern op: ") + what);
}

Mat mat(const View& v, int dim0, int dim1, int64_t batch = 0) {
  int64_t isz = itemsize(v.dtype);
  const char* base = static_cast<const char*>(v.data);
  if (v.ndim == 3) base += batch * v.strides[0] * isz;
  // A size-1 dimension's stride is arbitrary in torch; zero it so packing never strays.
  int64_t rs = v.sizes[dim0] == 1 ? 0 : v.strides[dim0];
  int64_t cs = v.sizes[dim1] == 1 ? 0 : v.strides[dim1];
  return Mat{base, v.dtype, rs, cs};
}

// A bias broadcast to (m, n) (addmm) or (batch, m, n) (baddbmm), as the matrix of one batch:
// dimensions it lacks or has of size 1 get stride 0.
Mat bias_mat(const View& b, int out_ndim, int64_t batch = 0) {
  int64_t st[3] = {0, 0, 0};
  for (int i = 0; i < b.ndim; ++i) {
    int d = out_ndim - b.ndim + i;  // right-aligned, as broadcasting aligns
    if (d >= 0 && b.sizes[i] != 1) st[3 - out_ndim + d] = b.strides[i];
  }
  const char* base = static_cast<const char*>(b.data) + batch * st[0] * itemsize(b.dtype);
  return Mat{base, b.dtype, st[1], st[2]};
}

// kIndexCopy: dst[index[j], ...] = values[j, ...] along dim 0, in place (negative indices count
// from the end, as torch's). `idx` is the index on the host; each row goes as runs of elements
// contiguous in both tensors (a cache's head_dim vectors; single elements at worst), handed to
// `copy(to, from, nbytes)`: memcpy on the CPU, cuMemcpyAsync on CUDA. O(values), not O(dst).
void check_index_copy(const View& dst, const View& index, const View& values) {
  need(dst.ndim >= 1 && index.ndim == 1 && values.ndim == dst.ndim, "index_copy takes dst, a 1-D "
       "index and values of dst's rank");
  need(index.dtype.code == kDLInt && (index.dtype.bits == 64 || index.dtype.bits == 32),
       "index_copy's index is int64 or int32");
  need(values.sizes[0] == index.sizes[0], "index_copy: one row of values per index");
  for (int d = 1; d < dst.ndim; ++d) need(values.sizes[d] == dst.sizes[d], "index_copy shapes");
  need(dtype_matches(values.dtype, dst.dtype), "index_copy: values of another dtype");
}

template <typename Copy>
void index_copy_runs(const View& dst, const std::vector<int64_t>& idx, const View& values,
                     Copy copy) {
  int64_t isz = itemsize(dst.dtype), run = 1;
  int inner = dst.ndim;  // dims [inner, ndim) form one run
  while (inner > 1) {
    int d = inner - 1;
    if (dst.sizes[d] != 1 && (dst.strides[d] != run || values.strides[d] != run)) break;
    run *= dst.sizes[d];
    inner = d;
  }
  bool empty = run == 0;
  for (int d = 1; d < inner; ++d) empty = empty || dst.sizes[d] == 0;
  std::vector<int64_t> at(size_t(inner), 0);  // a position over dims 1..inner-1
  for (size_t j = 0; j < idx.size(); ++j) {
    int64_t i = idx[j] < 0 ? idx[j] + dst.sizes[0] : idx[j];
    if (i < 0 || i >= dst.sizes[0]) {
      fail(EMBER_ERR_RUNTIME, "index " + std::to_string(idx[j]) + " is out of bounds for a cache "
                              "dimension of size " + std::to_string(dst.sizes[0]));
    }
    if (empty) continue;
    std::fill(at.begin(), at.end(), 0);
    for (bool more = true; more;) {
      int64_t doff = i * dst.strides[0], voff = int64_t(j) * values.strides[0];
      for (int d = 1; d < inner; ++d) {
        doff += at[size_t(d)] * dst.strides[d];
        voff += at[size_t(d)] * values.strides[d];
      }
      copy(static_cast<char*>(dst.data) + doff * isz,
           static_cast<const char*>(values.data) + voff * isz, size_t(run * isz));
      more = false;
      for (int d = inner - 1; d >= 1; --d) {
        if (++at[size_t(d)] < dst.sizes[d]) {
          more = true;
          break;
        }
        at[size_t(d)] = 0;
      }
    }
  }
}

void cpu_index_copy(const View& dst, const View& index, const View& values) {
  check_index_copy(dst, index, values);
  std::vector<int64_t> idx(static_cast<size_t>(index.sizes[0]));
  const char* ip = static_cast<const char*>(index.data);
  for (size_t j = 0; j < idx.size(); ++j) {
    const char* at = ip + int64_t(j) * index.strides[0] * (index.dtype.bits / 8);
    idx[j] = index.dtype.bits == 64 ? *reinterpret_cast<const int64_t*>(at)
                                    : *reinterpret_cast<const int32_t*>(at);
  }
  index_copy_runs(dst, idx, values, [](char* to, const char* from, size_t n) {
    memcpy(to, from, n);
  });
}

void cpu_extern(int32_t op, const View* t, int32_t nt, const int64_t* ints, int32_t ni,
                const double* floats, int32_t nf) {
  switch (op) {
    case ember_abi::kMM: {
      need(nt == 3 && t[0].ndim == 2 && t[1].ndim == 2 && t[2].ndim == 2, "mm takes 2-D a, b, out");
      int64_t m = t[0].sizes[0], k = t[0].sizes[1], n = t[1].sizes[1];
      need(t[1].sizes[0] == k && t[2].sizes[0] == m && t[2].sizes[1] == n, "mm shapes");
      gemm(m, n, k, mat(t[0], 0, 1), mat(t[1], 0, 1), mat(t[2], 0, 1));
      return;
    }
    case ember_abi::kBMM: {
      need(nt == 3 && t[0].ndim == 3 && t[1].ndim == 3 && t[2].ndim == 3, "bmm takes 3-D a, b, out");
      int64_t bs = t[0].sizes[0], m = t[0].sizes[1], k = t[0].sizes[2], n = t[1].sizes[2];
      need(t[1].sizes[0] == bs && t[1].sizes[1] == k && t[2].sizes[1] == m && t[2].sizes[2] == n,
           "bmm shapes");
      for (int64_t b = 0; b < bs; ++b) {
        gemm(m, n, k, mat(t[0], 1, 2, b), mat(t[1], 1, 2, b), mat(t[2], 1, 2, b));
      }
      return;
    }
    case ember_abi::kAddMM: {
      need(nt == 4 && nf == 2 && t[1].ndim == 2 && t[2].ndim == 2 && t[3].ndim == 2,
           "addmm takes bias, 2-D a, b, out and (beta, alpha)");
      int64_t m = t[1].sizes[0], k = t[1].sizes[1], n = t[2].sizes[1];
      Mat bias = bias_mat(t[0], 2);
      gemm(m, n, k, mat(t[1], 0, 1), mat(t[2], 0, 1), mat(t[3], 0, 1), floats[1], floats[0], &bias);
      return;
    }
    case ember_abi::kBaddBMM: {
      need(nt == 4 && nf == 2 && t[1].ndim == 3 && t[2].ndim == 3 && t[3].ndim == 3,
           "baddbmm takes bias, 3-D a, b, out and (beta, alpha)");
      int64_t bs = t[1].sizes[0], m = t[1].sizes[1], k = t[1].sizes[2], n = t[2].sizes[2];
      for (int64_t b = 0; b < bs; ++b) {
        Mat bias = bias_mat(t[0], 3, b);
        gemm(m, n, k, mat(t[1], 1, 2, b), mat(t[2], 1, 2, b), mat(t[3], 1, 2, b), floats[1],
             floats[0], &bias);
      }
      return;
    }
    case ember_abi::kConvolution: {
      need(nt == 4 && ni == 8, "convolution takes x, w, bias, out and 8 ints");
      if (ints[6]) fail(EMBER_ERR_UNSUPPORTED, "transposed convolution is not supported by the C++ runtime");
      ConvParams p{{ints[0], ints[1]}, {ints[2], ints[3]}, {ints[4], ints[5]}, ints[7]};
      conv_forward(t[0], t[1], t[2].data ? &t[2] : nullptr, t[3], p);
      return;
    }
    case ember_abi::kCopy:
      need(nt == 2, "copy takes dst, src");
      strided_copy(t[0], t[1]);
      return;
    case ember_abi::kIndexCopy:
      need(nt == 3, "index_copy takes dst, index, values");
      cpu_index_copy(t[0], t[1], t[2]);
      return;
    case ember_abi::kCumsum:
    case ember_abi::kCumprod:
    case ember_abi::kLogcumsumexp: {
      need(nt == 2 && ni == 1, "a cumulative op takes x, out and {dim}");
      ScanKind kind = op == ember_abi::kCumsum    ? ScanKind::kSum
                      : op == ember_abi::kCumprod ? ScanKind::kProd
                                                  : ScanKind::kLogSumExp;
      scan_forward(kind, t[0], t[1], nullptr, ints[0]);
      return;
    }
    case ember_abi::kCummax:
    case ember_abi::kCummin:
      need(nt == 3 && ni == 1, "cummax/cummin take x, values, indices and {dim}");
      scan_forward(op == ember_abi::kCummax ? ScanKind::kMax : ScanKind::kMin, t[0], t[1], &t[2],
                   ints[0]);
      return;
    case ember_abi::kSort:
      need(nt == 3 && ni == 2, "sort takes x, values, indices and {dim, descending}");
      sort_forward(t[0], t[1], t[2], ints[0], ints[1] != 0, -1);
      return;
    case ember_abi::kTopK:
      need(nt == 3 && ni == 3, "topk takes x, values, indices and {k, dim, largest}");
      sort_forward(t[0], t[1], t[2], ints[1], ints[2] != 0, ints[0]);
      return;
    default:
      fail(EMBER_ERR_UNSUPPORTED, "extern op " + std::to_string(op) + " on CPU");
  }
}

// ---- CUDA ------------------------------------------------------------------------------------

int cuda_dtype(DLDataType t) {
  if (t.code == kDLFloat && t.bits == 32) return 0;
  if (t.code == kDLFloat && t.bits == 64) return 1;
  if (t.code == kDLFloat && t.bits == 16) return 2;
  if (t.code == kDLBfloat && t.bits == 16) return 14;
  fail(EMBER_ERR_UNSUPPORTED, "matmul on CUDA for " + dtype_name(t));
}

// A row-major (rows x cols) operand as cuBLAS's column-major transpose: (transposed?, ld).
void operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool* trans, int64_t* ld) {
  if (cols == 1 || cs == 1) {
    *trans = false;
    *ld = rows == 1 ? cols : rs;
    if (*ld < cols) *ld = cols;
  } else if (rows == 1 || rs == 1) {
    *trans = true;
    *ld = cols == 1 ? rows : cs;
    if (*ld < rows) *ld = rows;
  } else {
    fail(EMBER_ERR_UNSUPPORTED, "matmul on CUDA needs operands with a unit stride");
  }
}

// out[b] = alpha * a[b] @ b[b] + beta * out[b] for 2-D (batch 1) or 3-D views, as cuBLAS's
// column-major problem.
CublasGemm gemm_of(const View& a, const View& b, const View& out, double alpha, double beta) {
  int d = a.ndim - 2;
  int64_t m = a.sizes[d], k = a.sizes[d + 1], n = b.sizes[d + 1];
  int64_t batch = d ? a.sizes[0] : 1;
  CublasGemm g{};
  bool out_t;
  int64_t ldc;
  operand(m, n, out.strides[d], out.strides[d + 1], &out_t, &ldc);
  if (out_t && m > 1 && n > 1) fail(EMBER_ERR_UNSUPPORTED, "matmul on CUDA into a transposed output");
  // Row-major C = A @ B is column-major C^T = B^T @ A^T: cuBLAS's A is our b, its B our a.
  operand(k, n, b.strides[d], b.strides[d + 1], &g.trans_a, &g.lda);
  operand(m, k, a.strides[d], a.strides[d + 1], &g.trans_b, &g.ldb);
  g.m = int(n);
  g.n = int(m);
  g.k = int(k);
  g.a = b.data;
  g.b = a.data;
  g.c = out.data;
  g.ldc = ldc;
  g.stride_a = d ? b.strides[0] : 0;
  g.stride_b = d ? a.strides[0] : 0;
  g.stride_c = d ? out.strides[0] : 0;
  g.batch = int(batch);
  g.dtype = cuda_dtype(out.dtype);
  g.alpha = alpha;
  g.beta = beta;
  return g;
}

void cuda_matmul(const Model& model, void* stream, const View& a, const View& b, const View& out,
                 double alpha, double beta) {
  CublasGemm g = gemm_of(a, b, out, alpha, beta);
  if (g.m == 0 || g.n == 0) return;
  cublas_gemm(model.device().device_id, model.cublas_path().c_str(), static_cast<CUstream>(stream), g);
}

// addmm with beta 1 and a dense bias row (a Linear layer): the bias added in the GEMM's
// epilogue by cuBLASLt, as torch's addmm does. False where that does not apply.
bool cuda_addmm_epilogue(const Model& model, void* stream, const View& bias, const View& a,
                         const View& b, const View& out, double beta, double alpha) {
  if (beta != 1.0 || out.ndim != 2 || a.ndim != 2) return false;
  if (!dtype_matches(bias.dtype, out.dtype)) return false;
  int64_t n = out.sizes[1];
  bool row = (bias.ndim == 1 && bias.sizes[0] == n && (bias.strides[0] == 1 || n == 1)) ||
             (bias.ndim == 2 && bias.sizes[0] == 1 && bias.sizes[1] == n &&
              (bias.strides[1] == 1 || n == 1));
  if (!row || out.sizes[0] == 0 || n == 0) return false;
  CublasGemm g = gemm_of(a, b, out, alpha, 0.0);
  return cublas_gemm_bias(model.device().device_id, model.cublas_path().c_str(),
                          static_cast<CUstream>(stream), g, bias.data);
}

// out = beta * broadcast(bias): an outer product with a vector of ones, through cuBLAS.
void cuda_fill_bias(const Model& model, void* stream, const View& bias, const View& out,
                    double beta) {
  int64_t m = out.sizes[0], n = out.sizes[1];
  int64_t isz = itemsize(out.dtype);
  bool row = (bias.ndim == 1 && bias.sizes[0] == n) ||
             (bias.ndim == 2 && bias.sizes[0] == 1 && bias.sizes[1] == n);
  bool col = bias.ndim == 2 && bias.sizes[0] == m && bias.sizes[1] == 1;
  int64_t step = row ? bias.strides[bias.ndim - 1] : col ? bias.strides[0] : 0;
  if ((!row && !col) || (step != 1 && (row ? n : m) > 1) || (isz != 2 && isz != 4)) {
    fail(EMBER_ERR_UNSUPPORTED,
         "addmm on CUDA supports a dense row or column bias in float32/float16/bfloat16");
  }
  int64_t len = row ? m : n;
  void* ones = model.pool()->allocate(size_t(len * isz), stream);
  if (!ones) fail(EMBER_ERR_OUT_OF_MEMORY, "addmm bias");
  struct Release {
    const Model& m;
    void* p;
    void* s;
    ~Release() { m.pool()->release(p, s); }
  } release{model, ones, stream};
  const CudaDriver& cu = cuda_driver();
  CUstream st = static_cast<CUstream>(stream);
  CUdeviceptr o = reinterpret_cast<CUdeviceptr>(ones);
  if (isz == 4) {
    cuda_check(cu.memset_d32_async(o, 0x3f800000u, size_t(len), st), "cuMemsetD32Async");
  } else {
    unsigned short one = out.dtype.code == kDLBfloat ? 0x3f80 : 0x3c00;
    cuda_check(cu.memset_d16_async(o, one, size_t(len), st), "cuMemsetD16Async");
  }
  View ones_v{ones, out.dtype, 2, {row ? m : 1, row ? 1 : n}, {1, 1}};
  View bias_v{bias.data, out.dtype, 2, {row ? 1 : m, row ? n : 1}, {row ? n : 1, 1}};
  if (row) {
    cuda_matmul(model, stream, ones_v, bias_v, out, beta, 0.0);
  } else {
    cuda_matmul(model, stream, bias_v, ones_v, out, beta, 0.0);
  }
}

// kIndexCopy on CUDA with the driver's copies only: the index is read on the host (a stream
// synchronisation), then the runs are queued on the stream. Not yet run on a GPU.
void cuda_index_copy(void* stream, const View& dst, const View& index, const View& values) {
  check_index_copy(dst, index, values);
  const CudaDriver& cu = cuda_driver();
  CUstream st = static_cast<CUstream>(stream);
  int64_t isz = index.dtype.bits / 8;
  std::vector<int64_t> idx(static_cast<size_t>(index.sizes[0]), 0);
  std::vector<int32_t> narrow(idx.size(), 0);
  for (size_t j = 0; j < idx.size(); ++j) {
    const char* at = static_cast<const char*>(index.data) + int64_t(j) * index.strides[0] * isz;
    void* host = isz == 8 ? static_cast<void*>(&idx[j]) : static_cast<void*>(&narrow[j]);
    cuda_check(cu.memcpy_dtoh_async(host, reinterpret_cast<CUdeviceptr>(at), size_t(isz), st),
               "cuMemcpyDtoHAsync (index_copy's index)");
  }
  cuda_check(cu.stream_synchronize(st), "cuStreamSynchronize");
  if (isz == 4) std::copy(narrow.begin(), narrow.end(), idx.begin());
  index_copy_runs(dst, idx, values, [&](char* to, const char* from, size_t n) {
    cuda_check(cu.memcpy_async(reinterpret_cast<CUdeviceptr>(to),
                               reinterpret_cast<CUdeviceptr>(from), n, st),
               "cuMemcpyAsync (index_copy)");
  });
}

void cuda_extern(const Model& model, void* stream, int32_t op, const View* t, int32_t nt,
                 const double* floats, int32_t nf) {
  switch (op) {
    case ember_abi::kIndexCopy:
      need(nt == 3, "index_copy takes dst, index, values");
      return cuda_index_copy(stream, t[0], t[1], t[2]);
    case ember_abi::kMM:
    case ember_abi::kBMM:
      need(nt == 3, "matmul takes a, b, out");
      return cuda_matmul(model, stream, t[0], t[1], t[2], 1.0, 0.0);
    case ember_abi::kAddMM:
      need(nt == 4 && nf == 2, "addmm takes bias, a, b, out and (beta, alpha)");
      if (cuda_addmm_epilogue(model, stream, t[0], t[1], t[2], t[3], floats[0], floats[1])) {
        return;
      }
      cuda_fill_bias(model, stream, t[0], t[3], floats[0]);
      return cuda_matmul(model, stream, t[1], t[2], t[3], floats[1], 1.0);
    case ember_abi::kCopy: {
      need(nt == 2, "copy takes dst, src");
      int64_t n = itemsize(t[0].dtype);
      for (int i = 0; i < t[0].ndim; ++i) n *= t[0].sizes[i];
      cuda_check(cuda_driver().memcpy_async(reinterpret_cast<CUdeviceptr>(t[0].data),
                                            reinterpret_cast<CUdeviceptr>(t[1].data), size_t(n),
                                            static_cast<CUstream>(stream)),
                 "cuMemcpyAsync");
      return;
    }
    default:
      fail(EMBER_ERR_UNSUPPORTED, "extern op " + std::to_string(op) +
                                      " on CUDA (v1 runs mm, bmm and addmm through cuBLAS; "
                                      "convolution needs a Triton template from inductor)");
  }
}

}  // namespace

void run_extern(const Model& model, void* stream, int32_t op, const View* tensors,
                int32_t num_tensors, const int64_t* ints, int32_t num_ints, const double* floats,
                int32_t num_floats) {
  if (model.device().device_type == kDLCPU) {
    cpu_extern(op, tensors, num_tensors, ints, num_ints, floats, num_floats);
  } else {
    cuda_extern(model, stream, op, tensors, num_tensors, floats, num_floats);
  }
}

}  // namespace ember
