// The C ABI's layout and basic contract, checked at compile time and at run time.
// A plain program (returns non-zero on failure) so it works as a Bazel cc_test without gtest.
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "ember_runtime.h"
#include "check.h"

// Documented layout (ember_runtime.h), LP64.
static_assert(EMBER_ABI_VERSION == 1, "bump the documented layouts with the ABI version");
static_assert(sizeof(EmberAllocator) == 24, "EmberAllocator size");
static_assert(offsetof(EmberAllocator, ctx) == 0, "EmberAllocator.ctx");
static_assert(offsetof(EmberAllocator, allocate) == 8, "EmberAllocator.allocate");
static_assert(offsetof(EmberAllocator, release) == 16, "EmberAllocator.release");
static_assert(sizeof(EmberLoadOptions) == 32, "EmberLoadOptions size");
static_assert(offsetof(EmberLoadOptions, struct_size) == 0, "EmberLoadOptions.struct_size");
static_assert(offsetof(EmberLoadOptions, device_id) == 4, "EmberLoadOptions.device_id");
static_assert(offsetof(EmberLoadOptions, allocator) == 8, "EmberLoadOptions.allocator");
static_assert(offsetof(EmberLoadOptions, cublas_path) == 16, "EmberLoadOptions.cublas_path");
static_assert(offsetof(EmberLoadOptions, flags) == 24, "EmberLoadOptions.flags");
static_assert(offsetof(EmberLoadOptions, reserved) == 28, "EmberLoadOptions.reserved");
static_assert(sizeof(EmberTensorInfo) == 40, "EmberTensorInfo size");
static_assert(offsetof(EmberTensorInfo, name) == 0, "EmberTensorInfo.name");
static_assert(offsetof(EmberTensorInfo, dtype) == 8, "EmberTensorInfo.dtype");
static_assert(offsetof(EmberTensorInfo, device_type) == 12, "EmberTensorInfo.device_type");
static_assert(offsetof(EmberTensorInfo, ndim) == 16, "EmberTensorInfo.ndim");
static_assert(offsetof(EmberTensorInfo, shape) == 24, "EmberTensorInfo.shape");
static_assert(offsetof(EmberTensorInfo, dim_names) == 32, "EmberTensorInfo.dim_names");
static_assert(sizeof(EmberKernelArgs) == 56, "EmberKernelArgs size");
static_assert(offsetof(EmberKernelArgs, num_inputs) == 8, "EmberKernelArgs.num_inputs");
static_assert(offsetof(EmberKernelArgs, num_outputs) == 12, "EmberKernelArgs.num_outputs");
static_assert(offsetof(EmberKernelArgs, outputs) == 16, "EmberKernelArgs.outputs");
static_assert(offsetof(EmberKernelArgs, ints) == 24, "EmberKernelArgs.ints");
static_assert(offsetof(EmberKernelArgs, floats) == 32, "EmberKernelArgs.floats");
static_assert(offsetof(EmberKernelArgs, num_ints) == 40, "EmberKernelArgs.num_ints");
static_assert(offsetof(EmberKernelArgs, num_floats) == 44, "EmberKernelArgs.num_floats");
static_assert(offsetof(EmberKernelArgs, stream) == 48, "EmberKernelArgs.stream");
static_assert(sizeof(EmberGenerateOptions) == 32, "EmberGenerateOptions size");
static_assert(offsetof(EmberGenerateOptions, top_k) == 4, "EmberGenerateOptions.top_k");
static_assert(offsetof(EmberGenerateOptions, temperature) == 8, "EmberGenerateOptions.temperature");
static_assert(offsetof(EmberGenerateOptions, reserved) == 12, "EmberGenerateOptions.reserved");
static_assert(offsetof(EmberGenerateOptions, seed) == 16, "EmberGenerateOptions.seed");
static_assert(offsetof(EmberGenerateOptions, stream) == 24, "EmberGenerateOptions.stream");
static_assert(sizeof(EmberStatus) == 4, "EmberStatus is an int32");
static_assert(EMBER_ERR_SHAPE == 3 && EMBER_ERR_PACKAGE == 6 && EMBER_ERR_RUNTIME == 11, "status values");
// DLPack as the ABI uses it (DLPack 1.x, unversioned managed tensor).
static_assert(sizeof(DLDataType) == 4, "DLDataType");
static_assert(sizeof(DLDevice) == 8, "DLDevice");
static_assert(sizeof(DLTensor) == 48, "DLTensor");
static_assert(offsetof(DLManagedTensor, deleter) == 56, "DLManagedTensor.deleter");

namespace {

using check::expect;

struct Field {
  const char* name;
  size_t got, want;
};

}  // namespace

int main() {
  // The same layout as data, so a failure names the field (and a Python test can mirror it).
  const Field fields[] = {
      {"sizeof(EmberAllocator)", sizeof(EmberAllocator), 24},
      {"sizeof(EmberLoadOptions)", sizeof(EmberLoadOptions), 32},
      {"EmberLoadOptions.allocator", offsetof(EmberLoadOptions, allocator), 8},
      {"EmberLoadOptions.cublas_path", offsetof(EmberLoadOptions, cublas_path), 16},
      {"sizeof(EmberTensorInfo)", sizeof(EmberTensorInfo), 40},
      {"EmberTensorInfo.shape", offsetof(EmberTensorInfo, shape), 24},
      {"EmberTensorInfo.dim_names", offsetof(EmberTensorInfo, dim_names), 32},
  };
  for (const Field& f : fields) {
    if (f.got != f.want) {
      fprintf(stderr, "FAIL: %s is %zu, documented %zu\n", f.name, f.got, f.want);
      ++check::failures;
    }
  }
  expect(ember_abi_version() == EMBER_ABI_VERSION, "ember_abi_version matches the header");
  expect(strcmp(ember_status_name(EMBER_ERR_SHAPE), "EMBER_ERR_SHAPE") == 0, "status names");

  EmberLoadOptions opts;
  ember_load_options_init(&opts);
  expect(opts.struct_size == sizeof(EmberLoadOptions) && opts.allocator == nullptr, "option defaults");

  EmberModel* model = reinterpret_cast<EmberModel*>(&opts);
  expect(ember_package_load(nullptr, nullptr, &model) == EMBER_ERR_INVALID_ARGUMENT, "NULL path");
  expect(strlen(ember_last_error()) > 0, "an error message is set");
  expect(ember_package_load("/nonexistent/ember-package", &opts, &model) == EMBER_ERR_PACKAGE,
         "a missing package is EMBER_ERR_PACKAGE");
  expect(model == nullptr, "no model on failure");
  expect(strstr(ember_last_error(), "manifest") != nullptr, "the message names the manifest");
  expect(ember_model_load_library("/nonexistent/model.so", nullptr, nullptr, 0, nullptr, &model) ==
             EMBER_ERR_PACKAGE,
         "a missing library is EMBER_ERR_PACKAGE");
  expect(ember_model_num_inputs(nullptr) == 0, "NULL model has no inputs");
  expect(ember_model_run_count(nullptr) == 0, "NULL model has run no steps");
  ember_model_free(nullptr);

  EmberGenerateOptions gen;
  ember_generate_options_init(&gen);
  expect(gen.struct_size == sizeof(gen) && gen.top_k == 1 && gen.temperature == 1.0f &&
             gen.seed == 0,
         "generate option defaults (greedy)");
  int64_t prompt[1] = {0}, tokens[1] = {0};
  expect(ember_generate(nullptr, prompt, 1, 1, 1, &gen, tokens) == EMBER_ERR_INVALID_ARGUMENT,
         "generate with a NULL model");

  // Tensors made and copied by the runtime.
  int64_t shape[2] = {2, 3};
  DLManagedTensor* a = nullptr;
  DLManagedTensor* b = nullptr;
  DLDataType f32{kDLFloat, 32, 1};
  expect(ember_tensor_empty(DLDevice{kDLCPU, 0}, f32, 2, shape, &a) == EMBER_OK, "tensor_empty");
  expect(ember_tensor_empty(DLDevice{kDLCPU, 0}, f32, 2, shape, &b) == EMBER_OK, "tensor_empty");
  if (a && b) {
    float* pa = static_cast<float*>(a->dl_tensor.data);
    for (int i = 0; i < 6; ++i) pa[i] = float(i);
    expect(ember_tensor_copy(&a->dl_tensor, &b->dl_tensor, nullptr) == EMBER_OK, "tensor_copy");
    expect(static_cast<float*>(b->dl_tensor.data)[5] == 5.0f, "tensor_copy copies");
    a->deleter(a);
    b->deleter(b);
  }
  return check::done("abi_test");
}
