// cuBLAS and cuBLASLt through dlopen, declared here rather than from their headers (which a CPU
// build machine does not have); the values are those of the cuBLAS 12/13 ABI.
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "detail/common.h"
#include "detail/cuda_api.h"

namespace ember {

namespace {

typedef struct cublasContext* cublasHandle_t;
typedef int (*CublasCreate)(cublasHandle_t*);
typedef int (*CublasSetStream)(cublasHandle_t, CUstream);
typedef int (*CublasSetWorkspace)(cublasHandle_t, void*, size_t);
typedef int (*CublasGemmStridedBatchedEx)(
    cublasHandle_t, int transa, int transb, int m, int n, int k, const void* alpha, const void* a,
    int a_type, int lda, long long stride_a, const void* b, int b_type, int ldb, long long stride_b,
    const void* beta, void* c, int c_type, int ldc, long long stride_c, int batch, int compute,
    int algo);
constexpr int kCublasOpN = 0, kCublasOpT = 1;
constexpr int kComputeF32 = 68, kComputeF64 = 70, kGemmDefault = -1;

struct Cublas {
  CublasCreate create;
  CublasSetStream set_stream;
  CublasGemmStridedBatchedEx gemm;
  CublasSetWorkspace set_workspace;  // null before cuBLAS 11.4: its own workspace then
};

// cuBLASLt: a GEMM whose epilogue adds a bias (what torch's addmm runs), chosen by its heuristic.
typedef struct cublasLtContext* LtHandle;
typedef void* LtDesc;
typedef void* LtLayout;
typedef void* LtPref;
struct LtAlgo {
  uint64_t data[8];
};
struct LtHeuristic {
  LtAlgo algo;
  size_t workspace_size;
  int state;
  float waves;
  int reserved[4];
};
constexpr int kLtDescTransA = 3, kLtDescTransB = 4, kLtDescEpilogue = 7, kLtDescBias = 8;
constexpr int kLtLayoutBatchCount = 5, kLtLayoutBatchStride = 6;
constexpr int kLtPrefWorkspace = 1, kLtPrefAlignA = 5;  // B, C, D: 6, 7, 8
constexpr int kLtEpilogueBias = 4;

struct CublasLt {
  int (*create)(LtHandle*);
  int (*desc_create)(LtDesc*, int compute, int scale_type);
  int (*desc_set)(LtDesc, int attr, const void* value, size_t size);
  int (*desc_destroy)(LtDesc);
  int (*layout_create)(LtLayout*, int type, uint64_t rows, uint64_t cols, int64_t ld);
  int (*layout_set)(LtLayout, int attr, const void* value, size_t size);
  int (*layout_destroy)(LtLayout);
  int (*pref_create)(LtPref*);
  int (*pref_set)(LtPref, int attr, const void* value, size_t size);
  int (*pref_destroy)(LtPref);
  int (*heuristic)(LtHandle, LtDesc, LtLayout a, LtLayout b, LtLayout c, LtLayout d, LtPref,
                   int wanted, LtHeuristic* results, int* found);
  int (*matmul)(LtHandle, LtDesc, const void* alpha, const void* a, LtLayout, const void* b,
                LtLayout, const void* beta, const void* c, LtLayout, void* d, LtLayout,
                const LtAlgo* algo, void* workspace, size_t workspace_size, CUstream);
};

// Each thread's handles' workspace, allocated with them and kept for the process (as the handles
// are): cuBLAS then allocates nothing while a stream is captured into a CUDA graph.
constexpr size_t kCublasWorkspace = size_t(32) << 20;

struct Libraries {
  Cublas blas{};
  std::unique_ptr<CublasLt> lt;  // null where libcublasLt or one of its entries is missing
};

template <typename F>
bool find(void* lib, F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
  return slot != nullptr;
}

// libcublasLt is a dependency of libcublas, so it is already loaded: found by its soname, or
// beside the libcublas that was opened.
void* open_lt(void* any_cublas_symbol) {
  for (const char* n : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return h;
  }
  Dl_info info;
  if (dladdr(any_cublas_symbol, &info) && info.dli_fname) {
    std::string path = info.dli_fname;
    size_t at = path.rfind("libcublas.so");
    if (at != std::string::npos) {
      path.replace(at, 12, "libcublasLt.so");
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
  }
  return nullptr;
}

std::unique_ptr<CublasLt> load_lt(void* lib) {
  const char* env = getenv("EMBER_CUBLASLT");  // =0: addmm fills the bias, then a plain GEMM
  if (!lib || (env && std::string(env) == "0")) return nullptr;
  auto lt = std::make_unique<CublasLt>();
  bool ok = find(lib, lt->create, "cublasLtCreate") &&
            find(lib, lt->desc_create, "cublasLtMatmulDescCreate") &&
            find(lib, lt->desc_set, "cublasLtMatmulDescSetAttribute") &&
            find(lib, lt->desc_destroy, "cublasLtMatmulDescDestroy") &&
            find(lib, lt->layout_create, "cublasLtMatrixLayoutCreate") &&
            find(lib, lt->layout_set, "cublasLtMatrixLayoutSetAttribute") &&
            find(lib, lt->layout_destroy, "cublasLtMatrixLayoutDestroy") &&
            find(lib, lt->pref_create, "cublasLtMatmulPreferenceCreate") &&
            find(lib, lt->pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
            find(lib, lt->pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
            find(lib, lt->heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
            find(lib, lt->matmul, "cublasLtMatmul");
  return ok ? std::move(lt) : nullptr;
}

const Libraries& libraries(const char* library_path) {
  static std::mutex mu;
  static std::unique_ptr<Libraries> libs;
  std::lock_guard<std::mutex> lock(mu);
  if (libs) return *libs;
  std::vector<std::string> names;
  if (library_path && *library_path) names.push_back(library_path);
  if (const char* env = getenv("EMBER_CUBLAS_PATH")) names.push_back(env);
  for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) names.push_back(n);
  void* lib = nullptr;
  for (const auto& n : names) {
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
  }
  if (!lib) {
    fail(EMBER_ERR_CUDA,
         "cannot load libcublas (needed for matmul on CUDA): install nvidia-cublas or set "
         "EMBER_CUBLAS_PATH / EmberLoadOptions.cublas_path");
  }
  auto l = std::make_unique<Libraries>();
  Cublas& c = l->blas;
  find(lib, c.create, "cublasCreate_v2");
  find(lib, c.set_stream, "cublasSetStream_v2");
  find(lib, c.gemm, "cublasGemmStridedBatchedEx");
  find(lib, c.set_workspace, "cublasSetWorkspace_v2");
  if (!c.create || !c.set_stream || !c.gemm) fail(EMBER_ERR_CUDA, "libcublas lacks the GEMM API");
  l->lt = load_lt(open_lt(reinterpret_cast<void*>(c.create)));
  libs = std::move(l);
  return *libs;
}

// One cuBLASLt problem (shapes, strides, types, operand alignments) and what the heuristic chose
// for it; `ok` is false where it chose nothing (the plain GEMM runs then).
struct LtPlan {
  LtDesc desc = nullptr;
  LtLayout a = nullptr, b = nullptr, c = nullptr;
  LtAlgo algo{};
  size_t workspace = 0;
  bool ok = false;
};

// A thread's handles on one device. cuBLAS handles are not safe to share between threads.
struct Handles {
  cublasHandle_t blas = nullptr;
  LtHandle lt = nullptr;
  CUdeviceptr workspace = 0;  // 0: cuBLAS's own (cuBLASLt then runs without one)
  std::map<std::array<int64_t, 17>, LtPlan> plans;
};

Handles& handles_for(int device, const Libraries& libs) {
  thread_local std::map<int, Handles> handles;
  Handles& h = handles[device];
  if (!h.blas) {
    if (libs.blas.create(&h.blas) != 0) fail(EMBER_ERR_CUDA, "cublasCreate failed");
    if (libs.blas.set_workspace &&
        cuda_driver().mem_alloc(&h.workspace, kCublasWorkspace) != CUDA_SUCCESS) {
      h.workspace = 0;
    }
    if (libs.lt && libs.lt->create(&h.lt) != 0) h.lt = nullptr;
  }
  return h;
}

int scale_type(int dtype) { return dtype == 1 ? 1 : 0; }  // CUDA_R_64F for fp64, else R_32F

// The largest power of two (up to 256) that divides the address: what the heuristic may assume.
uint32_t alignment(const void* p) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a /= 2;
  return a;
}

// Looked up at every call (a map of a small key, no allocation); planned once per problem.
const LtPlan& plan_lt(const CublasLt& lt, Handles& h, const CublasGemm& g, const void* bias) {
  std::array<uint32_t, 4> align = {alignment(g.a), alignment(g.b), alignment(g.c),
                                   alignment(g.c)};
  const std::array<int64_t, 17> key = {g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc,
                                       g.stride_a, g.stride_b, g.stride_c, g.batch, g.dtype,
                                       align[0], align[1], align[2], alignment(bias)};
  auto it = h.plans.find(key);
  if (it != h.plans.end()) return it->second;
  LtPlan& p = h.plans[key];  // kept (a failed one too: it is not planned again)
  int compute = g.dtype == 1 ? kComputeF64 : kComputeF32;
  bool made = lt.desc_create(&p.desc, compute, scale_type(g.dtype)) == 0;
  int ta = g.trans_a ? kCublasOpT : kCublasOpN, tb = g.trans_b ? kCublasOpT : kCublasOpN;
  int epilogue = kLtEpilogueBias;
  made = made && lt.desc_set(p.desc, kLtDescTransA, &ta, sizeof ta) == 0 &&
         lt.desc_set(p.desc, kLtDescTransB, &tb, sizeof tb) == 0 &&
         lt.desc_set(p.desc, kLtDescEpilogue, &epilogue, sizeof epilogue) == 0 &&
         lt.desc_set(p.desc, kLtDescBias, &bias, sizeof bias) == 0;
  // Column-major: A is (m x k) or its transpose stored (k x m), B likewise, C is (m x n).
  auto layout = [&](LtLayout* out, bool trans, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride) {
    if (trans) std::swap(rows, cols);
    if (lt.layout_create(out, g.dtype, uint64_t(rows), uint64_t(cols), ld) != 0) return false;
    if (g.batch == 1) return true;
    int32_t count = g.batch;
    return lt.layout_set(*out, kLtLayoutBatchCount, &count, sizeof count) == 0 &&
           lt.layout_set(*out, kLtLayoutBatchStride, &stride, sizeof stride) == 0;
  };
  made = made && layout(&p.a, g.trans_a, g.m, g.k, g.lda, g.stride_a) &&
         layout(&p.b, g.trans_b, g.k, g.n, g.ldb, g.stride_b) &&
         layout(&p.c, false, g.m, g.n, g.ldc, g.stride_c);
  LtPref pref = nullptr;
  if (made && lt.pref_create(&pref) == 0) {
    uint64_t ws = h.workspace ? kCublasWorkspace : 0;
    bool set = lt.pref_set(pref, kLtPrefWorkspace, &ws, sizeof ws) == 0;
    for (int i = 0; i < 4; ++i) {
      set = set && lt.pref_set(pref, kLtPrefAlignA + i, &align[size_t(i)], sizeof(uint32_t)) == 0;
    }
    LtHeuristic result{};
    int found = 0;
    if (set && lt.heuristic(h.lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found) == 0 &&
        found > 0 && result.state == 0) {
      p.algo = result.algo;
      p.workspace = result.workspace_size;
      p.ok = true;
    }
    lt.pref_destroy(pref);
  }
  return p;
}

void set_stream(const Cublas& api, Handles& h, CUstream stream) {
  if (api.set_stream(h.blas, stream) != 0) fail(EMBER_ERR_CUDA, "cublasSetStream failed");
  // cublasSetStream puts the handle back on cuBLAS's default workspace pool, which may allocate
  // (and so fail under stream capture): ours is set again after every change of stream.
  if (h.workspace &&
      api.set_workspace(h.blas, reinterpret_cast<void*>(h.workspace), kCublasWorkspace) != 0) {
    cuda_driver().mem_free(h.workspace);  // cuBLAS keeps its own from now on
    h.workspace = 0;
  }
}

}  // namespace

void cublas_gemm(int device, const char* library_path, CUstream stream, const CublasGemm& g) {
  const Libraries& libs = libraries(library_path);
  const Cublas& api = libs.blas;
  Handles& h = handles_for(device, libs);
  set_stream(api, h, stream);
  bool f64 = g.dtype == 1;
  float af = float(g.alpha), bf = float(g.beta);
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : &af;
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : &bf;
  const int ta = g.trans_a ? kCublasOpT : kCublasOpN, tb = g.trans_b ? kCublasOpT : kCublasOpN;
  int st = api.gemm(h.blas, ta, tb, g.m, g.n, g.k, alpha, g.a, g.dtype, int(g.lda), g.stride_a,
                    g.b, g.dtype, int(g.ldb), g.stride_b, beta, g.c, g.dtype, int(g.ldc),
                    g.stride_c, g.batch, f64 ? kComputeF64 : kComputeF32, kGemmDefault);
  if (st != 0) {
    fail(EMBER_ERR_CUDA, "cublasGemmStridedBatchedEx failed (" + std::to_string(st) + ")");
  }
}

bool cublas_gemm_bias(int device, const char* library_path, CUstream stream, const CublasGemm& g,
                      const void* bias) {
  const Libraries& libs = libraries(library_path);
  if (!libs.lt || g.beta != 0.0) return false;
  Handles& h = handles_for(device, libs);
  if (!h.lt) return false;
  const LtPlan& p = plan_lt(*libs.lt, h, g, bias);
  if (!p.ok || p.workspace > (h.workspace ? kCublasWorkspace : 0)) return false;
  if (libs.lt->desc_set(p.desc, kLtDescBias, &bias, sizeof bias) != 0) return false;
  bool f64 = g.dtype == 1;
  float af = float(g.alpha), zero = 0.0f;
  double zero64 = 0.0;
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : &af;
  const void* beta = f64 ? static_cast<const void*>(&zero64) : &zero;
  int st = libs.lt->matmul(h.lt, p.desc, alpha, g.a, p.a, g.b, p.b, beta, g.c, p.c, g.c, p.c,
                           &p.algo, reinterpret_cast<void*>(h.workspace),
                           h.workspace ? kCublasWorkspace : 0, stream);
  if (st != 0) fail(EMBER_ERR_CUDA, "cublasLtMatmul failed (" + std::to_string(st) + ")");
  return true;
}

}  // namespace ember
