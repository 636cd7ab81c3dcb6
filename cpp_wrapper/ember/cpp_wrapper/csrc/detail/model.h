// A loaded model: its library, constants, resolved kernels and pool (internal).
#ifndef EMBER_DETAIL_MODEL_H_
#define EMBER_DETAIL_MODEL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../ember_runtime.h"
#include "cuda_api.h"
#include "model_abi.h"
#include "pool.h"

namespace ember {

struct ConstantArg {
  std::string name;
  DLTensor tensor;  // borrowed
};

// The constants for a library, made once its description is known (a package checks its
// manifest against the library before it points any tensor into its weights).
using ConstantsFor = std::function<std::vector<ConstantArg>(const ember_abi::ModelDesc&)>;

// Which inputs and output of a decode-step package are which (its manifest's "decode" entry,
// checked against the library by package.cc); what ember_generate reads.
struct DecodeSpec {
  bool present = false;
  int64_t tokens = -1, positions = -1, logits = -1;
  std::vector<int64_t> caches;
  int64_t max_positions = 0;  // the caches' length: positions run from 0 to this - 1
  // The most new tokens one run takes: 1 for a static one-token step (prompts go token by
  // token); more for a step whose tokens (B, T) and positions (T,) share a dynamic size T in
  // [1, max_new_tokens] (a prompt goes in runs of up to that many tokens).
  int64_t max_new_tokens = 1;
  // The model's ember_greedy kernel (cuda_greedy.py), by its index among the model's kernels:
  // greedy generation on CUDA chooses each token on the GPU. -1: none (the host chooses).
  int64_t greedy_kernel = -1;
};

class Model {
 public:
  // Open a model library and bind its constants (by name). `keepalive` owns whatever the
  // constants point into (package weights); `expected_hash`, when given, must equal the
  // library's artifact hash (a package's manifest names the library it was written with).
  static std::unique_ptr<Model> open(const std::string& library,
                                     const std::vector<ConstantArg>& constants,
                                     const EmberLoadOptions& options,
                                     std::shared_ptr<void> keepalive = nullptr,
                                     const std::string& expected_hash = "");
  // The same, with the constants made from the library's description; `expected_hash` must
  // then be given (a package always names its library).
  static std::unique_ptr<Model> open(const std::string& library, const ConstantsFor& constants,
                                     const EmberLoadOptions& options,
                                     std::shared_ptr<void> keepalive,
                                     const std::string& expected_hash);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Runs started since the model was loaded (ember_model_run and each step of ember_generate).
  uint64_t run_count() const { return run_count_.load(std::memory_order_relaxed); }
  // A run that `run` did not count (a CUDA graph's replay), or one it counted that did not run
  // (a capture): +1 or -1.
  void count_run(int delta) {
    if (delta >= 0) {
      run_count_.fetch_add(uint64_t(delta), std::memory_order_relaxed);
    } else {
      run_count_.fetch_sub(uint64_t(-delta), std::memory_order_relaxed);
    }
  }

  // Run once; thread-safe. Throws Error.
  void run(DLManagedTensor* const* inputs, size_t num_inputs, DLManagedTensor** outputs,
           size_t num_outputs, void* stream);

  const ember_abi::ModelDesc& desc() const { return *desc_; }
  DLDevice device() const { return device_; }
  const EmberTensorInfo& input_info(size_t i) const { return input_infos_.at(i); }
  const EmberTensorInfo& output_info(size_t i) const { return output_infos_.at(i); }

  // For the host API.
  const std::shared_ptr<Pool>& pool() const { return pool_; }
  CUfunction function(int i) const { return functions_.at(size_t(i)); }
  const std::string& cublas_path() const { return cublas_path_; }
  const DecodeSpec& decode() const { return decode_; }
  void set_decode(DecodeSpec spec) { decode_ = std::move(spec); }

  // A dense tensor of the model's pool, allocated for `stream` and given back to the pool
  // (cached for that stream) when deleted.
  DLManagedTensor* empty(DLDataType dtype, const std::vector<int64_t>& shape, void* stream) const;
  // ember_generate's sessions (generate.cc), kept between calls: an idle one (nullptr if none)
  // for a call, given back when the call returns.
  std::shared_ptr<void> take_session();
  void give_session(std::shared_ptr<void> session);

 private:
  Model() = default;
  void bind_constants(const std::vector<ConstantArg>& constants);
  void resolve_kernels();

  void* library_ = nullptr;
  const ember_abi::ModelDesc* desc_ = nullptr;
  DLDevice device_{kDLCPU, 0};
  std::shared_ptr<Pool> pool_;
  std::shared_ptr<void> keepalive_;
  std::vector<DLTensor> constants_;
  std::vector<const DLTensor*> constant_ptrs_;
  std::vector<void*> kernel_fns_;
  std::vector<void*> kernel_libraries_;
  std::vector<CUmodule> modules_;
  std::vector<CUfunction> functions_;
  std::vector<EmberTensorInfo> input_infos_, output_infos_;
  std::string cublas_path_;
  DecodeSpec decode_;
  std::atomic<uint64_t> run_count_{0};
  std::mutex sessions_mu_;
  std::vector<std::shared_ptr<void>> idle_sessions_;
};

// Extern ops (externs.cc): run `op` for `model` on the call's stream. Throws Error.
void run_extern(const Model& model, void* stream, int32_t op, const ember_abi::View* tensors,
                int32_t num_tensors, const int64_t* ints, int32_t num_ints, const double* floats,
                int32_t num_floats);

// ember_generate (generate.cc): decode with a decode-step package. Throws Error.
void generate(Model& model, const int64_t* prompt, size_t batch, size_t prompt_len, size_t n_new,
              const EmberGenerateOptions& options, int64_t* out_tokens);

// The CPU features a model library's ISA needs are present (package.cc and model.cc check it).
bool cpu_supports_isa(const std::string& isa);

}  // namespace ember

#endif  // EMBER_DETAIL_MODEL_H_
