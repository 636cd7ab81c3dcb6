// libcuda through dlopen: the runtime builds and runs without a GPU (cuBLAS: cublas.cc).
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

}  // namespace ember
