// The CUDA driver API and cuBLAS, opened with dlopen at first use (internal).
//
// The runtime never links libcuda or libcublas: a CPU-only machine builds and runs it, and a CUDA
// model fails at load with EMBER_ERR_CUDA when the driver is missing. Types come from <cuda.h>
// when the build has it (Bazel's @local_python//:cuda_headers, /usr/local/cuda/include); otherwise
// from the minimal declarations below, which match the driver's ABI.
#ifndef EMBER_DETAIL_CUDA_API_H_
#define EMBER_DETAIL_CUDA_API_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#if defined(__has_include)
#if __has_include(<cuda.h>)
#include <cuda.h>
#define EMBER_HAVE_CUDA_H 1
#endif
#endif

#ifndef EMBER_HAVE_CUDA_H
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;
typedef int CUfunction_attribute;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
#define CUDA_SUCCESS 0
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#endif

namespace ember {

// Entry points of libcuda.so.1 that the runtime uses (the _v2 ABIs where they exist).
struct CudaDriver {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext*);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_unload)(CUmodule);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*func_set_attribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*memset_d16_async)(CUdeviceptr, unsigned short, size_t, CUstream);
  CUresult (*memset_d32_async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*get_error_string)(CUresult, const char**);
  // CUDA graphs (ember_generate's one-token steps): null where the driver lacks one of them.
  CUresult (*stream_create)(CUstream*, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_begin_capture)(CUstream, int);  // mode: 1 thread-local
  CUresult (*stream_end_capture)(CUstream, CUgraph*);
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
  CUresult (*graph_exec_destroy)(CUgraphExec);
  CUresult (*graph_destroy)(CUgraph);

  bool has_graphs() const {
    return stream_create && stream_destroy && stream_begin_capture && stream_end_capture &&
           graph_instantiate && graph_launch && graph_exec_destroy && graph_destroy;
  }
};

// The driver, opened and initialised once per process; throws EMBER_ERR_CUDA when unavailable.
const CudaDriver& cuda_driver();

// Throw EMBER_ERR_CUDA with the driver's message when `r` is not CUDA_SUCCESS.
void cuda_check(CUresult r, const char* what);

// The primary context of `device`, made current for this scope.
class CudaContextScope {
 public:
  explicit CudaContextScope(int device);
  ~CudaContextScope();
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;

 private:
  bool pushed_ = false;
};

// cuBLAS through dlopen: C = op(A) @ op(B) over a batch, column-major as cuBLAS sees it.
struct CublasGemm {
  bool trans_a, trans_b;
  int m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c;
  int batch;
  int dtype;  // cudaDataType: 0 fp32, 1 fp64, 2 fp16, 14 bf16
  double alpha, beta;
};
void cublas_gemm(int device, const char* library_path, CUstream stream, const CublasGemm& g);
// C = alpha * op(A) @ op(B) + bias, the bias (g.m values, C's dtype) added to every column of the
// column-major C by cuBLASLt's epilogue; g.beta must be 0. False, having run nothing, where
// cuBLASLt is missing (or EMBER_CUBLASLT=0) or its heuristic has no kernel for the problem.
bool cublas_gemm_bias(int device, const char* library_path, CUstream stream, const CublasGemm& g,
                      const void* bias);

}  // namespace ember

#endif  // EMBER_DETAIL_CUDA_API_H_
