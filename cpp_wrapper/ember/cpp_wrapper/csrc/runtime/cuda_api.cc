// libcuda and libcublas through dlopen: the runtime builds and runs without a GPU.
#include "detail/cuda_api.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <vector>

#include "detail/common.h"

namespace ember {

namespace {

void* open_cuda() {
  for (const char* name : {"libcuda.so.1", "libcuda.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return h;
  }
  return nullptr;
}

template <typename F>
void bind(void* lib, F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
  if (!slot) fail(EMBER_ERR_CUDA, std::string("libcuda has no ") + name + "; is the driver too old?");
}

template <typename F>
void bind_optional(void* lib, F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
}

CudaDriver load_driver() {
  void* lib = open_cuda();
  if (!lib) {
    fail(EMBER_ERR_CUDA,
         "cannot load libcuda.so.1: this model runs on CUDA and no NVIDIA driver is installed");
  }
  CudaDriver d{};
  bind(lib, d.init, "cuInit");
  bind(lib, d.device_get, "cuDeviceGet");
  bind(lib, d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  bind(lib, d.ctx_push, "cuCtxPushCurrent_v2");
  bind(lib, d.ctx_pop, "cuCtxPopCurrent_v2");
  bind(lib, d.module_load_data, "cuModuleLoadData");
  bind(lib, d.module_unload, "cuModuleUnload");
  bind(lib, d.module_get_function, "cuModuleGetFunction");
  bind(lib, d.func_set_attribute, "cuFuncSetAttribute");
  bind(lib, d.launch_kernel, "cuLaunchKernel");
  bind(lib, d.mem_alloc, "cuMemAlloc_v2");
  bind(lib, d.mem_free, "cuMemFree_v2");
  bind(lib, d.memcpy_async, "cuMemcpyAsync");
  bind(lib, d.memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  bind(lib, d.memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  bind(lib, d.memset_d16_async, "cuMemsetD16Async");
  bind(lib, d.memset_d32_async, "cuMemsetD32Async");
  bind(lib, d.stream_synchronize, "cuStreamSynchronize");
  bind(lib, d.get_error_string, "cuGetErrorString");
  bind_optional(lib, d.stream_create, "cuStreamCreate");
  bind_optional(lib, d.stream_destroy, "cuStreamDestroy_v2");
  bind_optional(lib, d.stream_begin_capture, "cuStreamBeginCapture_v2");
  bind_optional(lib, d.stream_end_capture, "cuStreamEndCapture");
  bind_optional(lib, d.graph_instantiate, "cuGraphInstantiateWithFlags");
  bind_optional(lib, d.graph_launch, "cuGraphLaunch");
  bind_optional(lib, d.graph_exec_destroy, "cuGraphExecDestroy");
  bind_optional(lib, d.graph_destroy, "cuGraphDestroy");
  CUresult r = d.init(0);
  if (r != CUDA_SUCCESS) fail(EMBER_ERR_CUDA, "cuInit failed (" + std::to_string(int(r)) + ")");
  return d;
}

}  // namespace

const CudaDriver& cuda_driver() {
  // A failed load is retried on the next call (the error is thrown again, not cached).
  static std::mutex mu;
  static std::unique_ptr<CudaDriver> driver;
  std::lock_guard<std::mutex> lock(mu);
  if (!driver) driver = std::make_unique<CudaDriver>(load_driver());
  return *driver;
}

void cuda_check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* msg = nullptr;
  cuda_driver().get_error_string(r, &msg);
  fail(EMBER_ERR_CUDA, std::string(what) + " failed: " + (msg ? msg : "unknown CUDA error") +
                           " (" + std::to_string(int(r)) + ")");
}

CudaContextScope::CudaContextScope(int device) {
  static std::mutex mu;
  static std::map<int, CUcontext> contexts;  // primary contexts, retained for the process
  const CudaDriver& d = cuda_driver();
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = contexts.find(device);
    if (it == contexts.end()) {
      CUdevice dev;
      cuda_check(d.device_get(&dev, device), "cuDeviceGet");
      cuda_check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      contexts[device] = ctx;
    } else {
      ctx = it->second;
    }
  }
  cuda_check(d.ctx_push(ctx), "cuCtxPushCurrent");
  pushed_ = true;
}

CudaContextScope::~CudaContextScope() {
  if (pushed_) {
    CUcontext ignored;
    cuda_driver().ctx_pop(&ignored);
  }
}

// ---- cuBLAS -----------------------------------------------------------------------------------
// Declared here, not from cublas_api.h (which a CPU build machine does not have); the values are
// those of the cuBLAS 12/13 ABI.

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

// Each handle's workspace, allocated with the handle and kept for the process (as the handles
// are): cuBLAS then allocates nothing while a stream is captured into a CUDA graph.
constexpr size_t kCublasWorkspace = size_t(32) << 20;

const Cublas& cublas(const char* library_path) {
  static std::mutex mu;
  static std::unique_ptr<Cublas> api;
  std::lock_guard<std::mutex> lock(mu);
  if (api) return *api;
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
  Cublas c{};
  c.create = reinterpret_cast<CublasCreate>(dlsym(lib, "cublasCreate_v2"));
  c.set_stream = reinterpret_cast<CublasSetStream>(dlsym(lib, "cublasSetStream_v2"));
  c.gemm = reinterpret_cast<CublasGemmStridedBatchedEx>(dlsym(lib, "cublasGemmStridedBatchedEx"));
  c.set_workspace = reinterpret_cast<CublasSetWorkspace>(dlsym(lib, "cublasSetWorkspace_v2"));
  if (!c.create || !c.set_stream || !c.gemm) fail(EMBER_ERR_CUDA, "libcublas lacks the GEMM API");
  api = std::make_unique<Cublas>(c);
  return *api;
}

}  // namespace

void cublas_gemm(int device, const char* library_path, CUstream stream, const CublasGemm& g) {
  const Cublas& api = cublas(library_path);
  // cuBLAS handles are not safe to share between threads: one per thread and device.
  thread_local std::map<int, cublasHandle_t> handles;
  cublasHandle_t& h = handles[device];
  if (!h) {
    if (api.create(&h) != 0) fail(EMBER_ERR_CUDA, "cublasCreate failed");
    CUdeviceptr ws = 0;
    if (api.set_workspace && cuda_driver().mem_alloc(&ws, kCublasWorkspace) == CUDA_SUCCESS &&
        api.set_workspace(h, reinterpret_cast<void*>(ws), kCublasWorkspace) != 0) {
      cuda_driver().mem_free(ws);  // cuBLAS keeps its own
    }
  }
  if (api.set_stream(h, stream) != 0) fail(EMBER_ERR_CUDA, "cublasSetStream failed");
  bool f64 = g.dtype == 1;
  float af = float(g.alpha), bf = float(g.beta);
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : &af;
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : &bf;
  int st = api.gemm(h, g.trans_a ? kCublasOpT : kCublasOpN, g.trans_b ? kCublasOpT : kCublasOpN,
                    g.m, g.n, g.k, alpha, g.a, g.dtype, int(g.lda), g.stride_a, g.b, g.dtype,
                    int(g.ldb), g.stride_b, beta, g.c, g.dtype, int(g.ldc), g.stride_c, g.batch,
                    f64 ? kComputeF64 : kComputeF32, kGemmDefault);
  if (st != 0) fail(EMBER_ERR_CUDA, "cublasGemmStridedBatchedEx failed (" + std::to_string(st) + ")");
}

}  // namespace ember
