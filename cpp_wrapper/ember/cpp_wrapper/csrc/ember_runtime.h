/* ember_runtime.h: the C ABI of the Ember runtime (one umbrella header; internals in detail/).
 *
 * The runtime loads a compiled Ember model (an AOT package directory, or a model library plus
 * caller-owned constants), describes its inputs and outputs, and runs it on DLPack tensors: CPU
 * kernels from shared libraries, Triton cubins through the CUDA driver API (libcuda is opened at
 * run time, so the runtime builds and runs on machines without a GPU).
 *
 * ABI rules (checked by tests/abi_test.cc and cpp_wrapper/tests/test_abi.py):
 * - EMBER_ABI_VERSION changes whenever a struct layout, an enum value or a signature below changes;
 *   ember_abi_version() returns the version the library was built with.
 * - Every struct's size and field offsets are documented beside it (x86-64 / aarch64 LP64).
 * - Errors: every function that can fail returns an EmberStatus; the message of the calling
 *   thread's last failure is ember_last_error().
 * - Thread safety: one EmberModel may be run from many threads at once.
 */
#ifndef EMBER_RUNTIME_H_
#define EMBER_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

/* DLPack: the real header. Bazel (@local_python//:dlpack) and the Python build helper both expose
 * it as <dlpack/dlpack.h>; a torch install ships it as <ATen/dlpack.h>. */
#if defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#elif __has_include(<ATen/dlpack.h>)
#include <ATen/dlpack.h>
#else
#error "ember_runtime.h needs dlpack/dlpack.h (github.com/dmlc/dlpack) on the include path"
#endif
#else
#include <dlpack/dlpack.h>
#endif

#define EMBER_ABI_VERSION 1

#ifdef __cplusplus
#define EMBER_EXTERN_C extern "C"
#else
#define EMBER_EXTERN_C
#endif
#define EMBER_API EMBER_EXTERN_C __attribute__((visibility("default")))

/* Status codes (int32). Values are part of the ABI. */
typedef enum EmberStatus {
  EMBER_OK = 0,
  EMBER_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, a bad index, a wrong number of tensors */
  EMBER_ERR_DTYPE = 2,            /* an input's dtype differs from the model's */
  EMBER_ERR_SHAPE = 3,            /* an input's rank, sizes or strides differ from the model's */
  EMBER_ERR_DEVICE = 4,           /* an input lives on another device than the model */
  EMBER_ERR_GUARD = 5,            /* a dynamic size is out of range or a shape guard fails */
  EMBER_ERR_PACKAGE = 6,          /* a package is missing, truncated, corrupt or foreign */
  EMBER_ERR_VERSION = 7,          /* a package or model library of another ABI/IR version */
  EMBER_ERR_OUT_OF_MEMORY = 8,
  EMBER_ERR_UNSUPPORTED = 9, /* an op, dtype or device this runtime build cannot run */
  EMBER_ERR_CUDA = 10,       /* libcuda/libcublas missing or a driver call failed */
  EMBER_ERR_RUNTIME = 11     /* any other failure while running */
} EmberStatus;

/* A loaded model (opaque). */
typedef struct EmberModel EmberModel;

/* A caller-given allocator for intermediates and outputs; when set, the runtime's caching pool is
 * not used. `stream` is the stream of the run (NULL on CPU). allocate returns NULL on failure,
 * and otherwise memory aligned to 16 bytes at least (a block that is not fails the run with
 * EMBER_ERR_OUT_OF_MEMORY: CUDA models' kernels are compiled for aligned data).
 * Layout (size 24): ctx @0, allocate @8, release @16. */
typedef struct EmberAllocator {
  void* ctx;
  void* (*allocate)(void* ctx, size_t nbytes, DLDevice device, void* stream);
  void (*release)(void* ctx, void* ptr, size_t nbytes, DLDevice device, void* stream);
} EmberAllocator;

/* Load options; initialise with ember_load_options_init.
 * Layout (size 32): struct_size @0, device_id @4, allocator @8, cublas_path @16, flags @24,
 * reserved @28. */
typedef struct EmberLoadOptions {
  uint32_t struct_size;            /* sizeof(EmberLoadOptions) of the caller's header */
  int32_t device_id;               /* CUDA device ordinal (ignored on CPU); default 0 */
  const EmberAllocator* allocator; /* NULL: the runtime's caching pool; must outlive the model */
  const char* cublas_path;         /* NULL: search libcublas.so.{13,12} on the loader path */
  uint32_t flags;                  /* reserved, 0 */
  uint32_t reserved;
} EmberLoadOptions;

/* The description of one input or output. Pointers stay valid while the model lives.
 * shape[i] is -1 for a dynamic size, whose symbol is dim_names[i] (NULL for a static size).
 * Layout (size 40): name @0, dtype @8, device_type @12, ndim @16, reserved @20, shape @24,
 * dim_names @32. */
typedef struct EmberTensorInfo {
  const char* name;
  DLDataType dtype;
  int32_t device_type; /* DLDeviceType: kDLCPU or kDLCUDA */
  int32_t ndim;
  int32_t reserved;
  const int64_t* shape;
  const char* const* dim_names;
} EmberTensorInfo;

/* What a user operator's C++ kernel receives (ember.register_cpp_kernel): the generated wrapper
 * calls `int32_t fn(const EmberKernelArgs*)`, compiled into the model library, returning 0 on
 * success (anything else fails the run with EMBER_ERR_RUNTIME). Tensors are DLPack views of the
 * model's device (strides never NULL, byte_offset 0): `inputs` are the op's tensor arguments in
 * schema order (an optional one that is None has data NULL; one the op mutates is a private copy
 * to write in place), `outputs` its results, preallocated with the layouts of its fake kernel.
 * Scalars follow the schema order too: ints and bools (and the items of int lists) in `ints`,
 * floats in `floats`; an optional scalar is a presence flag in `ints` then its value (0 if None).
 * `stream` is the run's CUstream (NULL on CPU). Added in ABI 1 (no existing layout changed).
 * Layout (size 56): inputs @0, num_inputs @8, num_outputs @12, outputs @16, ints @24,
 * floats @32, num_ints @40, num_floats @44, stream @48. */
typedef struct EmberKernelArgs {
  const DLTensor* inputs;
  int32_t num_inputs;
  int32_t num_outputs;
  const DLTensor* outputs;
  const int64_t* ints;
  const double* floats;
  int32_t num_ints;
  int32_t num_floats;
  void* stream;
} EmberKernelArgs;

/* The ABI version this library was built with (EMBER_ABI_VERSION). */
EMBER_API uint32_t ember_abi_version(void);

/* A constant name for a status ("EMBER_ERR_SHAPE"). */
EMBER_API const char* ember_status_name(EmberStatus status);

/* The message of the calling thread's last failure ("" when none). */
EMBER_API const char* ember_last_error(void);

/* Fill `options` with defaults. */
EMBER_API void ember_load_options_init(EmberLoadOptions* options);

/* Load an AOT package directory (manifest.json, model.so, weights.bin), verifying its checksums
 * and sizes before any of it is mapped or run. `options` may be NULL. */
EMBER_API EmberStatus ember_package_load(const char* path, const EmberLoadOptions* options,
                                         EmberModel** out);

/* Load a model library built by ember.cpp_wrapper, with its constants given by the caller (by name,
 * in any order; borrowed: they must stay alive and unchanged while the model lives). */
EMBER_API EmberStatus ember_model_load_library(const char* library_path,
                                               const char* const* constant_names,
                                               const DLTensor* const* constants,
                                               size_t num_constants,
                                               const EmberLoadOptions* options, EmberModel** out);

/* Release a model (NULL is allowed). Outputs already returned stay valid. */
EMBER_API void ember_model_free(EmberModel* model);

EMBER_API size_t ember_model_num_inputs(const EmberModel* model);
EMBER_API size_t ember_model_num_outputs(const EmberModel* model);
EMBER_API DLDevice ember_model_device(const EmberModel* model);
/* Runs of the model since it was loaded: each ember_model_run and each step run of
 * ember_generate (a prefill-capable decode step runs a prompt in chunks). 0 for NULL. For tests
 * and profiling; a new function, no layout changed. */
EMBER_API uint64_t ember_model_run_count(const EmberModel* model);
EMBER_API EmberStatus ember_model_input_info(const EmberModel* model, size_t index,
                                             EmberTensorInfo* out);
EMBER_API EmberStatus ember_model_output_info(const EmberModel* model, size_t index,
                                              EmberTensorInfo* out);

/* Run the model. `inputs` are borrowed (their deleters are never called). On success each
 * outputs[i] is a new tensor owned by the caller, released by calling its deleter; on failure no
 * output is set. `stream` is a CUstream for CUDA models (NULL: the legacy default stream) and is
 * ignored on CPU; work is queued on it and not synchronised.
 *
 * Alignment (CUDA models): the package's Triton kernels are compiled assuming that every input's
 * data pointer (data + byte_offset) is 16-byte aligned, as Triton's own JIT specialises on
 * aligned pointers; this is what gives them vector and asynchronous loads. An input that is not
 * aligned (a view at an odd element offset) is copied, for the run, into aligned memory from the
 * model's pool (the bytes its elements span), and copied back into the caller's tensor after a
 * successful run, so in-place updates (a decode step's caches) still land there; the copies are
 * queued on `stream` like the rest of the run. Aligned inputs cost one pointer check each.
 * Constants given to ember_model_load_library must have storage starting on a 16-byte boundary
 * (EMBER_ERR_INVALID_ARGUMENT at load otherwise); a package's weights are 64-byte aligned. */
EMBER_API EmberStatus ember_model_run(EmberModel* model, DLManagedTensor* const* inputs,
                                      size_t num_inputs, DLManagedTensor** outputs,
                                      size_t num_outputs, void* stream);

/* A new dense row-major tensor (uninitialised) on `device`, released through its deleter. */
EMBER_API EmberStatus ember_tensor_empty(DLDevice device, DLDataType dtype, int32_t ndim,
                                         const int64_t* shape, DLManagedTensor** out);

/* Copy between two dense row-major tensors of equal byte size, across host and device. CUDA copies
 * are queued on `stream` and synchronised before returning. */
EMBER_API EmberStatus ember_tensor_copy(const DLTensor* src, const DLTensor* dst, void* stream);

/* ---- Decoding -------------------------------------------------------------------------------
 * A decode-step package (ember.cpp_wrapper.package_decode_step) runs one step of an
 * autoregressive decoder with a static KV cache. Its manifest's "decode" entry says which input
 * holds the token ids (int64 or int32, shape (B, T)), which the positions (int64 or int32, shape
 * (T,)), which are the caches (floating point, static shapes) and which output holds the logits
 * (floating point, shape (B, V) or (B, T, V): the last dimension is the vocabulary); every input
 * is one of those. T is 1, or (when the entry's max_new_tokens is above 1) a dynamic size in
 * [1, max_new_tokens]: ember_generate then runs the prompt in steps of max_new_tokens tokens
 * (the last step takes the rest; positions continue from step to step) and reads the last
 * prompt token's logits; with T = 1 it runs the prompt token by token. One ember_model_run of
 * such a package writes the new tokens' keys and values into the caller's cache tensors in
 * place, at `positions` (O(new tokens), no copy of a cache); `max_positions` is the caches'
 * length. Added in ABI 1 (no existing layout changed).
 *
 * Sampling: top_k <= 1 is greedy (the largest logit; the lowest index among equal ones, as
 * torch.argmax). top_k = k > 1 draws among the k largest logits (ties: lower index first) with
 * probabilities softmax(logit / temperature), computed in double. Each draw takes one number
 * from a splitmix64 generator whose 64-bit state starts at `seed`:
 *   state += 0x9E3779B97F4A7C15; z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 *   z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^= z >> 31;  u = (z >> 11) * 2^-53 in [0, 1)
 * and picks the first candidate whose cumulative probability exceeds u (rows in order, one draw
 * per row and step), so a seed gives the same tokens on every machine.
 * Layout (size 32): struct_size @0, top_k @4, temperature @8, reserved @12, seed @16,
 * stream @24. */
typedef struct EmberGenerateOptions {
  uint32_t struct_size; /* sizeof(EmberGenerateOptions) of the caller's header */
  int32_t top_k;        /* <= 1: greedy (default); k > 1: top-k sampling */
  float temperature;    /* > 0; default 1 */
  uint32_t reserved;
  uint64_t seed; /* default 0 */
  void* stream;  /* CUstream for CUDA models (NULL: the default stream); ignored on CPU */
} EmberGenerateOptions;

/* Fill `options` with defaults (greedy). */
EMBER_API void ember_generate_options_init(EmberGenerateOptions* options);

/* Generate `max_new_tokens` tokens after a prompt with a decode-step package. `prompt` holds
 * batch x prompt_len token ids (row-major; batch must be the package's B, prompt_len >= 1);
 * `out_tokens` receives batch x max_new_tokens ids (row-major). The runtime allocates zeroed
 * caches for the call and feeds the prompt (position p gets prompt[:, p]) one token per step,
 * or with a prefill-capable step (the "decode" entry's max_new_tokens M > 1) in
 * ceil(prompt_len / M) steps of up to M tokens, then each chosen token but the last:
 * ceil(prompt_len / M) + max_new_tokens - 1 runs in all (M = 1 without prefill).
 * prompt_len + max_new_tokens - 1 positions must not exceed max_positions.
 * EMBER_ERR_UNSUPPORTED for a model that is not a decode-step package (no "decode" entry) or
 * whose tokens input is not (B, 1); EMBER_ERR_INVALID_ARGUMENT for a wrong batch, an empty
 * prompt, a prompt token outside the vocabulary or too many positions.
 * `options` may be NULL (greedy). Thread-safe as ember_model_run (each call has its own caches).
 * On CUDA the call runs on a stream of its own (options->stream is unused: the call is
 * synchronous) with caches and one-token inputs that the model keeps for later calls (one set
 * per concurrent call, freed with the model), and replays its one-token steps as a CUDA graph
 * captured at the second one-token step of the first such call and replayed by later calls
 * (the run count counts each replay as a run); a step that cannot be captured (one that
 * synchronises the stream) runs plainly instead. EMBER_GENERATE_GRAPHS=0 in the environment
 * turns the graphs off for the calls made while it is set. Greedy decoding on CUDA with a
 * package that carries a greedy kernel (the "decode" entry's greedy_kernel, as
 * package_decode_step writes for CUDA) chooses the tokens after the first on the GPU (the same
 * rule, NaN included) and reads them back once at the end;
 * EMBER_GENERATE_GREEDY=host makes the host choose each token instead. */
EMBER_API EmberStatus ember_generate(EmberModel* model, const int64_t* prompt, size_t batch,
                                     size_t prompt_len, size_t max_new_tokens,
                                     const EmberGenerateOptions* options, int64_t* out_tokens);

#endif /* EMBER_RUNTIME_H_ */
