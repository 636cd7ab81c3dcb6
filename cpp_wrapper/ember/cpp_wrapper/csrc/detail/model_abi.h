// The contract between the runtime and a generated model library (internal; not for users).
//
// ember.cpp_wrapper generates one C++ wrapper per compiled artifact; compiled with the artifact's
// CPU kernels it becomes a model library that exports a single symbol, EMBER_MODEL_SYMBOL, which
// returns a static ModelDesc: the model's inputs, outputs, constants and kernels, and its `run`
// function. `run` gets a HostApi from the runtime for everything that needs runtime state
// (allocation from the pool, CUDA launches, extern ops, outputs, errors), so a model library
// links neither the runtime nor CUDA. Generated code also uses the inline helpers below.
#ifndef EMBER_DETAIL_MODEL_ABI_H_
#define EMBER_DETAIL_MODEL_ABI_H_

#include <stdint.h>
#include <stdio.h>

#include "../ember_runtime.h"

#define EMBER_MODEL_ABI_VERSION 1
#define EMBER_MODEL_SYMBOL "ember_model_describe_v1"
#define EMBER_MAX_DIMS 8

namespace ember_abi {

// One tensor of the model's interface. shape/strides entries are -1 where symbolic;
// dim_names[i] names the symbol of a dynamic size (nullptr for a static one).
struct TensorDesc {
  const char* name;
  DLDataType dtype;
  int32_t ndim;
  const int64_t* shape;
  const int64_t* strides;
  const char* const* dim_names;
  int64_t storage_offset;  // elements; constants only
  int64_t storage_nbytes;  // bytes a constant's storage spans from offset 0; -1 if symbolic
};

// One kernel. CPU: `fn` is its entry in this library, or `library` names a shared object the
// runtime opens to resolve `entry`. CUDA: `binary` holds the cubin the runtime loads.
struct KernelDesc {
  const char* name;
  const char* language;  // "cpp" or "triton"
  const char* entry;
  void* fn;
  const char* library;
  const unsigned char* binary;
  uint64_t binary_size;
  int32_t num_warps;
  int32_t shared_mem;
};

// A strided view handed to extern ops and outputs: data points at element [0, ..., 0].
struct View {
  void* data;
  DLDataType dtype;
  int32_t ndim;
  int64_t sizes[EMBER_MAX_DIMS];
  int64_t strides[EMBER_MAX_DIMS];
};

// Extern ops the runtime implements (the op's vocabulary name in comments).
enum ExternOp : int32_t {
  kMM = 1,           // extern.mm(a, b) -> out
  kBMM = 2,          // extern.bmm(a, b) -> out
  kAddMM = 3,        // extern.addmm(bias, a, b, beta, alpha) -> out
  kConvolution = 4,  // extern.convolution(x, w, bias?, stride, padding, dilation, transposed,
                     //                    output_padding, groups) -> out
  kCopy = 5,         // strided copy: tensors = {dst, src}
  kBaddBMM = 6,      // extern.baddbmm(bias, a, b, beta, alpha) -> out
  kCumsum = 7,       // extern.cumsum(x) -> out; ints {dim} (the output's dtype is the result's)
  kCumprod = 8,      // extern.cumprod(x) -> out; ints {dim}
  kLogcumsumexp = 9, // extern.logcumsumexp(x) -> out; ints {dim}
  kCummax = 10,      // extern.cummax(x) -> values, indices; ints {dim}
  kCummin = 11,      // extern.cummin(x) -> values, indices; ints {dim}
  kSort = 12,        // extern.sort(x) -> values, indices; ints {dim, descending}
  kTopK = 13,        // extern.topk(x) -> values, indices; ints {k, dim, largest}
  kIndexCopy = 14,   // in place: dst[index[j], ...] = values[j, ...]; tensors = {dst, index,
                     // values} (a donated input's update, see cpp_wrapper/decode.py)
};

struct Call;  // the runtime's per-call state (opaque here)

struct HostApi {
  uint32_t version;
  uint32_t struct_size;
  // Allocation from the model's pool (or the caller's allocator); nullptr on failure.
  void* (*alloc)(Call*, uint64_t nbytes);
  void (*release)(Call*, void* ptr);
  // Record a failure; returns `status` so generated code can `return host->fail(...)`.
  int32_t (*fail)(Call*, int32_t status, const char* message);
  // CUDA: launch kernel `index` of the model on the call's stream.
  int32_t (*launch)(Call*, int32_t index, uint32_t gx, uint32_t gy, uint32_t gz, void** args);
  int32_t (*extern_op)(Call*, int32_t op, const View* tensors, int32_t num_tensors,
                       const int64_t* ints, int32_t num_ints, const double* floats,
                       int32_t num_floats);
  // Hand output `index` to the caller. `base` is what alloc returned for its storage (ownership
  // moves to the output), or nullptr when the view points into an input or a constant (copied).
  int32_t (*set_output)(Call*, int32_t index, const View* view, void* base);
};

struct RunArgs {
  const HostApi* host;
  Call* call;
  void* const* kernels;           // resolved kernel entries (CPU) or nullptr (CUDA), by index
  const DLTensor* const* inputs;  // num_inputs, validated here (device already checked)
  const DLTensor* const* constants;
};

struct ModelDesc {
  uint32_t abi_version;  // EMBER_MODEL_ABI_VERSION
  uint32_t struct_size;
  int32_t ir_version;
  int32_t device_type;  // kDLCPU / kDLCUDA
  const char* artifact_hash;
  const char* isa;  // "avx512", "avx2", "generic": what the CPU kernels were built for
  int32_t num_inputs;
  int32_t num_outputs;
  int32_t num_constants;
  int32_t num_kernels;
  const TensorDesc* inputs;
  const TensorDesc* outputs;
  const TensorDesc* constants;
  const KernelDesc* kernels;
  int32_t (*run)(const RunArgs*);
};

typedef const ModelDesc* (*DescribeFn)();

// ---- helpers used by generated wrappers -------------------------------------------------------

inline int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t ceildiv(int64_t a, int64_t b) { return -floordiv(-a, b); }
inline int64_t pymod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline int64_t ipow(int64_t base, int64_t exp) {
  int64_t r = 1;
  while (exp-- > 0) r *= base;
  return r;
}
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline char* input_ptr(const DLTensor* t) {
  return static_cast<char*>(t->data) + t->byte_offset;
}

inline const char* dtype_str(uint8_t code, uint8_t bits) {
  switch (code * 256 + bits) {
    case kDLFloat * 256 + 32: return "float32";
    case kDLFloat * 256 + 64: return "float64";
    case kDLFloat * 256 + 16: return "float16";
    case kDLBfloat * 256 + 16: return "bfloat16";
    case kDLInt * 256 + 64: return "int64";
    case kDLInt * 256 + 32: return "int32";
    case kDLInt * 256 + 16: return "int16";
    case kDLInt * 256 + 8: return "int8";
    case kDLUInt * 256 + 8: return "uint8";
    case kDLUInt * 256 + 16: return "uint16";
    case kDLUInt * 256 + 32: return "uint32";
    case kDLUInt * 256 + 64: return "uint64";
    case kDLBool * 256 + 8: return "bool";
    case kDLComplex * 256 + 64: return "complex64";
    case kDLComplex * 256 + 128: return "complex128";
    default: return "an unknown dtype";
  }
}

// Check an input's dtype and rank; 0 when it matches.
inline int32_t check_input(const RunArgs* a, const DLTensor* t, const char* name, uint8_t code,
                           uint8_t bits, int32_t ndim) {
  char msg[256];
  bool bool_alias = code == kDLBool && t->dtype.code == kDLUInt && t->dtype.bits == 8;
  if ((t->dtype.code != code && !bool_alias) || t->dtype.bits != bits || t->dtype.lanes != 1) {
    snprintf(msg, sizeof msg, "input '%s': expected %s, got %s (code %d, %d bits, %d lanes)", name,
             dtype_str(code, bits), dtype_str(t->dtype.code, t->dtype.bits), t->dtype.code,
             t->dtype.bits, t->dtype.lanes);
    return a->host->fail(a->call, EMBER_ERR_DTYPE, msg);
  }
  if (t->ndim != ndim) {
    snprintf(msg, sizeof msg, "input '%s': expected %d dimensions, got %d", name, ndim, t->ndim);
    return a->host->fail(a->call, EMBER_ERR_SHAPE, msg);
  }
  return 0;
}

// Check one size of an input against the value the model needs.
inline int32_t check_size(const RunArgs* a, const DLTensor* t, const char* name, int dim,
                          int64_t want) {
  if (t->shape[dim] == want) return 0;
  char msg[256];
  snprintf(msg, sizeof msg, "input '%s': size of dimension %d is %lld, expected %lld", name, dim,
           (long long)t->shape[dim], (long long)want);
  return a->host->fail(a->call, EMBER_ERR_SHAPE, msg);
}

// Check one stride (DLPack's NULL strides mean row-major); size-1 dimensions never matter.
inline int32_t check_stride(const RunArgs* a, const DLTensor* t, const char* name, int dim,
                            int64_t want) {
  if (t->shape[dim] <= 1) return 0;
  int64_t got = 1;
  if (t->strides) {
    got = t->strides[dim];
  } else {
    for (int d = dim + 1; d < t->ndim; ++d) got *= t->shape[d];
  }
  if (got == want) return 0;
  char msg[256];
  snprintf(msg, sizeof msg,
           "input '%s': stride of dimension %d is %lld, expected %lld (pass a contiguous tensor)",
           name, dim, (long long)got, (long long)want);
  return a->host->fail(a->call, EMBER_ERR_SHAPE, msg);
}

inline int32_t check_range(const RunArgs* a, const char* symbol, int64_t value, int64_t lower,
                           int64_t upper) {
  if (value >= lower && (upper < 0 || value <= upper)) return 0;
  char msg[256];
  snprintf(msg, sizeof msg, "dynamic size %s = %lld is outside its range [%lld, inf)", symbol,
           (long long)value, (long long)lower);
  if (upper >= 0) {
    snprintf(msg, sizeof msg, "dynamic size %s = %lld is outside its range [%lld, %lld]", symbol,
             (long long)value, (long long)lower, (long long)upper);
  }
  return a->host->fail(a->call, EMBER_ERR_GUARD, msg);
}

}  // namespace ember_abi

#endif  // EMBER_DETAIL_MODEL_ABI_H_
