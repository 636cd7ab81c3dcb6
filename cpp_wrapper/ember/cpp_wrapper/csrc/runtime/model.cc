// Loading a model library, binding constants and kernels, and running it with per-call state.
#include "detail/model.h"

#include <dlfcn.h>

#include <cstring>

#include "detail/common.h"
#include "detail/cpu_ops.h"

namespace ember {

using ember_abi::View;

// An allocation handed out as (part of) an output: returned to the pool when the last output
// tensor that shares it is deleted.
struct Storage {
  Storage(std::shared_ptr<Pool> p, void* data, void* s) : pool(std::move(p)), ptr(data), stream(s) {}
  ~Storage() { pool->release(ptr, stream); }
  Storage(const Storage&) = delete;  // a copy would release the block twice
  Storage& operator=(const Storage&) = delete;

  std::shared_ptr<Pool> pool;
  void* ptr;
  void* stream;
};

struct OutputTensor {
  DLManagedTensor managed;
  std::shared_ptr<Storage> storage;
  int64_t shape[EMBER_MAX_DIMS];
  int64_t strides[EMBER_MAX_DIMS];
};

void delete_output(DLManagedTensor* t) { delete static_cast<OutputTensor*>(t->manager_ctx); }

// A tensor over `v`'s elements of `storage`, which it holds until it is deleted.
DLManagedTensor* output_tensor(std::shared_ptr<Storage> storage, const View& v, DLDevice device) {
  auto* out = new OutputTensor();
  out->storage = std::move(storage);
  for (int i = 0; i < v.ndim; ++i) {
    out->shape[i] = v.sizes[i];
    out->strides[i] = v.strides[i];
  }
  DLTensor& t = out->managed.dl_tensor;
  t.data = v.data;
  t.device = device;
  t.ndim = v.ndim;
  t.dtype = v.dtype;
  t.shape = out->shape;
  t.strides = out->strides;
  t.byte_offset = 0;
  out->managed.manager_ctx = out;
  out->managed.deleter = delete_output;
  return &out->managed;
}

}  // namespace ember

// The per-call state behind HostApi: nothing here is shared between concurrent runs.
struct ember_abi::Call {
  struct Alloc {
    void* ptr;
    bool live;
    std::shared_ptr<ember::Storage> escaped;  // set once an output holds it
  };
  const ember::Model* model;
  void* stream;
  std::vector<Alloc> allocs;
  std::vector<DLManagedTensor*> outputs;
  int32_t status = EMBER_OK;
  std::string message;

  Alloc* find(void* ptr) {
    for (auto it = allocs.rbegin(); it != allocs.rend(); ++it) {
      if (it->ptr == ptr && it->live) return &*it;
    }
    return nullptr;
  }
};

namespace ember {

namespace {

using ember_abi::Call;

int32_t record(Call* c, const Error& e) {
  c->status = e.status();
  c->message = e.what();
  return c->status;
}

void* host_alloc(Call* c, uint64_t nbytes) {
  void* p = c->model->pool()->allocate(size_t(nbytes), c->stream);
  if (p) c->allocs.push_back({p, true, nullptr});
  return p;
}

void host_release(Call* c, void* ptr) {
  Call::Alloc* a = c->find(ptr);
  if (!a) return;
  a->live = false;
  if (!a->escaped) c->model->pool()->release(ptr, c->stream);
}

int32_t host_fail(Call* c, int32_t status, const char* message) {
  c->status = status;
  c->message = message;
  return status;
}

int32_t host_launch(Call* c, int32_t index, uint32_t gx, uint32_t gy, uint32_t gz, void** args) {
  try {
    if (gx == 0 || gy == 0 || gz == 0) return 0;  // an empty tensor: nothing to launch
    const auto& k = c->model->desc().kernels[index];
    cuda_check(cuda_driver().launch_kernel(c->model->function(index), gx, gy, gz,
                                           uint32_t(32 * k.num_warps), 1, 1,
                                           uint32_t(k.shared_mem),
                                           static_cast<CUstream>(c->stream), args, nullptr),
               (std::string("launching kernel ") + k.name).c_str());
    return 0;
  } catch (const Error& e) {
    return record(c, e);
  }
}

int32_t host_extern(Call* c, int32_t op, const View* tensors, int32_t nt, const int64_t* ints,
                    int32_t ni, const double* floats, int32_t nf) {
  try {
    run_extern(*c->model, c->stream, op, tensors, nt, ints, ni, floats, nf);
    return 0;
  } catch (const Error& e) {
    return record(c, e);
  } catch (const std::exception& e) {
    return record(c, Error(EMBER_ERR_RUNTIME, e.what()));
  }
}

bool is_dense(const View& v) {
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    if (v.sizes[i] != 1 && v.strides[i] != s) return false;
    s *= v.sizes[i];
  }
  return true;
}

// An output that points into an input or a constant is copied, so outputs never alias memory
// the caller or the model owns.
std::shared_ptr<Storage> copy_out(Call* c, const View& v, View* dense) {
  *dense = v;
  int64_t n = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    dense->strides[i] = n;
    n *= v.sizes[i];
  }
  size_t nbytes = size_t(n * itemsize(v.dtype));
  void* p = c->model->pool()->allocate(nbytes, c->stream);
  if (!p) fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory copying an output");
  auto storage = std::make_shared<Storage>(c->model->pool(), p, c->stream);
  dense->data = p;
  if (c->model->device().device_type == kDLCPU) {
    strided_copy(*dense, v);
  } else if (is_dense(v)) {
    cuda_check(cuda_driver().memcpy_async(reinterpret_cast<CUdeviceptr>(p),
                                          reinterpret_cast<CUdeviceptr>(v.data), nbytes,
                                          static_cast<CUstream>(c->stream)),
               "cuMemcpyAsync");
  } else {
    fail(EMBER_ERR_UNSUPPORTED, "a CUDA output that is a strided view of an input or constant");
  }
  return storage;
}

int32_t host_set_output(Call* c, int32_t index, const View* view, void* base) {
  try {
    if (index < 0 || size_t(index) >= c->outputs.size() || c->outputs[size_t(index)]) {
      fail(EMBER_ERR_RUNTIME, "model library set output " + std::to_string(index) + " twice");
    }
    View v = *view;
    std::shared_ptr<Storage> storage;
    if (base) {
      Call::Alloc* a = c->find(base);
      if (!a) fail(EMBER_ERR_RUNTIME, "an output points into memory this call did not allocate");
      if (!a->escaped) {
        a->escaped = std::make_shared<Storage>(c->model->pool(), base, c->stream);
      }
      storage = a->escaped;
    } else {
      storage = copy_out(c, *view, &v);
    }
    c->outputs[size_t(index)] = output_tensor(std::move(storage), v, c->model->device());
    return 0;
  } catch (const Error& e) {
    return record(c, e);
  }
}

// CUDA inputs whose data pointer is off a 16-byte boundary, run from aligned copies: the
// package's Triton kernels assume aligned inputs (ember_runtime.h, ember_model_run). A copy goes
// back into the caller's tensor after a successful run, so what the run writes in place (a
// donated input: a decode step's KV cache) lands where the caller sees it.
class AlignedInputs {
 public:
  AlignedInputs(Pool& pool, void* stream) : pool_(pool), stream_(stream) {}
  ~AlignedInputs() {
    for (const auto& c : copies_) pool_.release(c.temp, stream_);
  }
  AlignedInputs(const AlignedInputs&) = delete;
  AlignedInputs& operator=(const AlignedInputs&) = delete;

  // `t` itself when aligned (or empty), else a tensor of the same layout over an aligned copy.
  const DLTensor* align(const DLTensor* t, const char* name) {
    if (!misaligned(*t)) return t;
    int64_t nbytes = span_bytes(*t);
    if (nbytes == 0) return t;  // no element is read
    if (nbytes < 0) {
      fail(EMBER_ERR_SHAPE, std::string("input '") + name + "' has a negative stride");
    }
    void* temp = pool_.allocate(size_t(nbytes), stream_);
    if (!temp) {
      fail(EMBER_ERR_OUT_OF_MEMORY, std::string("out of memory aligning input '") + name + "'");
    }
    char* original = static_cast<char*>(t->data) + t->byte_offset;
    copies_.push_back({temp, original, size_t(nbytes)});
    copy(temp, original, size_t(nbytes));
    tensors_.push_back(std::make_unique<DLTensor>(*t));
    tensors_.back()->data = temp;
    tensors_.back()->byte_offset = 0;
    return tensors_.back().get();
  }

  void copy_back() {
    for (const auto& c : copies_) copy(c.original, c.temp, c.nbytes);
  }

 private:
  struct Copy {
    void* temp;
    char* original;
    size_t nbytes;
  };
  void copy(void* to, const void* from, size_t nbytes) {
    cuda_check(cuda_driver().memcpy_async(reinterpret_cast<CUdeviceptr>(to),
                                          reinterpret_cast<CUdeviceptr>(from), nbytes,
                                          static_cast<CUstream>(stream_)),
               "cuMemcpyAsync (aligning an input)");
  }

  Pool& pool_;
  void* stream_;
  std::vector<Copy> copies_;
  std::vector<std::unique_ptr<DLTensor>> tensors_;
};

const ember_abi::HostApi kHostApi = {
    EMBER_MODEL_ABI_VERSION, sizeof(ember_abi::HostApi), host_alloc, host_release, host_fail,
    host_launch, host_extern, host_set_output,
};

std::string describe_device(DLDevice d) {
  const char* kind = d.device_type == kDLCPU ? "cpu" : d.device_type == kDLCUDA ? "cuda" : "device";
  return d.device_type == kDLCPU ? "cpu" : std::string(kind) + ":" + std::to_string(d.device_id);
}

}  // namespace

bool cpu_supports_isa(const std::string& isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == "generic" || isa.empty();
}

std::unique_ptr<Model> Model::open(const std::string& library,
                                   const std::vector<ConstantArg>& constants,
                                   const EmberLoadOptions& options, std::shared_ptr<void> keepalive,
                                   const std::string& expected_hash) {
  auto given = [&](const ember_abi::ModelDesc&) { return constants; };
  return open(library, given, options, std::move(keepalive), expected_hash);
}

std::unique_ptr<Model> Model::open(const std::string& library, const ConstantsFor& constants,
                                   const EmberLoadOptions& options, std::shared_ptr<void> keepalive,
                                   const std::string& expected_hash) {
  std::unique_ptr<Model> m(new Model());
  m->keepalive_ = std::move(keepalive);
  m->library_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!m->library_) {
    const char* why = dlerror();
    fail(EMBER_ERR_PACKAGE, "cannot load model library " + library + ": " + (why ? why : "?"));
  }
  auto describe = reinterpret_cast<ember_abi::DescribeFn>(dlsym(m->library_, EMBER_MODEL_SYMBOL));
  if (!describe) fail(EMBER_ERR_PACKAGE, library + " is not an Ember model library");
  m->desc_ = describe();
  const auto& d = *m->desc_;
  if (d.abi_version != EMBER_MODEL_ABI_VERSION || d.struct_size < sizeof(ember_abi::ModelDesc)) {
    fail(EMBER_ERR_VERSION, library + " was built for model ABI " + std::to_string(d.abi_version) +
                                "; this runtime reads " + std::to_string(EMBER_MODEL_ABI_VERSION));
  }
  if (!expected_hash.empty() && expected_hash != d.artifact_hash) {
    fail(EMBER_ERR_PACKAGE, "the model library does not belong to this package (artifact hash " +
                                std::string(d.artifact_hash) + ", manifest says " + expected_hash + ")");
  }
  if (!cpu_supports_isa(d.isa)) {
    fail(EMBER_ERR_UNSUPPORTED, std::string("the model's CPU kernels were built for ") + d.isa +
                                    ", which this CPU lacks");
  }
  if (d.device_type == kDLCUDA) {
    m->device_ = DLDevice{kDLCUDA, options.device_id};
  } else if (d.device_type != kDLCPU) {
    fail(EMBER_ERR_UNSUPPORTED, "model for device type " + std::to_string(d.device_type));
  }
  m->pool_ = std::make_shared<Pool>(m->device_, options.allocator);
  if (options.cublas_path) m->cublas_path_ = options.cublas_path;
  m->bind_constants(constants(d));
  m->resolve_kernels();
  auto info = [&](const ember_abi::TensorDesc& t) {
    return EmberTensorInfo{t.name, t.dtype, d.device_type, t.ndim, 0, t.shape, t.dim_names};
  };
  for (int i = 0; i < d.num_inputs; ++i) m->input_infos_.push_back(info(d.inputs[i]));
  for (int i = 0; i < d.num_outputs; ++i) m->output_infos_.push_back(info(d.outputs[i]));
  return m;
}

void Model::bind_constants(const std::vector<ConstantArg>& given) {
  const auto& d = *desc_;
  for (int i = 0; i < d.num_constants; ++i) {
    const auto& want = d.constants[i];
    const ConstantArg* found = nullptr;
    for (const auto& g : given) {
      if (g.name == want.name) found = &g;
    }
    std::string what = std::string("constant '") + want.name + "'";
    if (!found) fail(EMBER_ERR_INVALID_ARGUMENT, what + " was not given");
    const DLTensor& t = found->tensor;
    if (!dtype_matches(t.dtype, want.dtype)) {
      fail(EMBER_ERR_DTYPE, what + " is " + dtype_name(t.dtype) + ", expected " + dtype_name(want.dtype));
    }
    if (t.device.device_type != device_.device_type ||
        (device_.device_type == kDLCUDA && t.device.device_id != device_.device_id)) {
      fail(EMBER_ERR_DEVICE, what + " is not on " + describe_device(device_));
    }
    if (t.ndim != want.ndim) fail(EMBER_ERR_SHAPE, what + " has the wrong number of dimensions");
    int64_t expect_stride = 1;
    for (int k = t.ndim - 1; k >= 0; --k) {
      if (t.shape[k] != want.shape[k]) fail(EMBER_ERR_SHAPE, what + " has the wrong shape");
      int64_t stride = t.strides ? t.strides[k] : expect_stride;
      if (t.shape[k] != 1 && stride != want.strides[k]) {
        fail(EMBER_ERR_SHAPE, what + " has strides other than the compiled ones");
      }
      expect_stride *= t.shape[k];
    }
    // The wrapper points at a constant's storage start (data - storage_offset elements), which
    // its Triton kernels take as 16-byte aligned (a package's weights are 64-byte aligned).
    uint64_t start = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset -
                     uint64_t(want.storage_offset) * uint64_t(itemsize(want.dtype));
    if (device_.device_type == kDLCUDA && start % kDataAlign != 0) {
      fail(EMBER_ERR_INVALID_ARGUMENT,
           what + ": its storage does not start on a 16-byte boundary (pass a tensor with "
                  "storage of its own, e.g. a clone)");
    }
    constants_.push_back(t);
  }
  for (const auto& t : constants_) constant_ptrs_.push_back(&t);
}

void Model::resolve_kernels() {
  const auto& d = *desc_;
  std::unique_ptr<CudaContextScope> scope;
  for (int i = 0; i < d.num_kernels; ++i) {
    const auto& k = d.kernels[i];
    void* fn = nullptr;
    CUfunction function = nullptr;
    if (std::strcmp(k.language, "cpp") == 0) {
      fn = k.fn;
      if (!fn && k.library && *k.library) {
        void* lib = dlopen(k.library, RTLD_NOW | RTLD_LOCAL);
        if (!lib) fail(EMBER_ERR_PACKAGE, std::string("cannot load kernel library ") + k.library);
        kernel_libraries_.push_back(lib);
        fn = dlsym(lib, k.entry);
      }
      if (!fn) fail(EMBER_ERR_PACKAGE, std::string("kernel ") + k.name + ": entry " + k.entry + " not found");
    } else if (std::strcmp(k.language, "triton") == 0) {
      if (device_.device_type != kDLCUDA) fail(EMBER_ERR_UNSUPPORTED, "a Triton kernel in a CPU model");
      if (!scope) scope = std::make_unique<CudaContextScope>(device_.device_id);
      const CudaDriver& cu = cuda_driver();
      CUmodule module;
      cuda_check(cu.module_load_data(&module, k.binary), "cuModuleLoadData");
      modules_.push_back(module);
      cuda_check(cu.module_get_function(&function, module, k.entry), "cuModuleGetFunction");
      if (k.shared_mem > 49152) {
        cuda_check(cu.func_set_attribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         k.shared_mem),
                   "cuFuncSetAttribute");
      }
    } else {
      fail(EMBER_ERR_UNSUPPORTED, std::string("kernel language ") + k.language);
    }
    kernel_fns_.push_back(fn);
    functions_.push_back(function);
  }
}

DLManagedTensor* Model::empty(DLDataType dtype, const std::vector<int64_t>& shape,
                              void* stream) const {
  if (shape.size() > size_t(EMBER_MAX_DIMS)) fail(EMBER_ERR_UNSUPPORTED, "too many dimensions");
  View v{nullptr, dtype, int32_t(shape.size()), {}, {}};
  int64_t n = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.sizes[i] = shape[size_t(i)];
    v.strides[i] = n;
    n *= shape[size_t(i)];
  }
  size_t nbytes = size_t(n * itemsize(dtype));
  v.data = pool_->allocate(nbytes ? nbytes : 1, stream);
  if (!v.data) fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory for a tensor of the model's pool");
  return output_tensor(std::make_shared<Storage>(pool_, v.data, stream), v, device_);
}

std::shared_ptr<void> Model::take_session() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  if (idle_sessions_.empty()) return nullptr;
  std::shared_ptr<void> s = std::move(idle_sessions_.back());
  idle_sessions_.pop_back();
  return s;
}

void Model::give_session(std::shared_ptr<void> session) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  idle_sessions_.push_back(std::move(session));
}

Model::~Model() {
  idle_sessions_.clear();  // first: a session gives its tensors back to the pool
  if (!modules_.empty()) {
    try {
      CudaContextScope scope(device_.device_id);
      for (CUmodule m : modules_) cuda_driver().module_unload(m);
    } catch (const Error&) {
    }
  }
  pool_.reset();  // outputs still alive keep the pool through their storage
  constants_.clear();
  keepalive_.reset();
  for (void* lib : kernel_libraries_) dlclose(lib);
  // Outputs that outlive the model need only the runtime (their deleters and the pool live here),
  // so the model library can go; reopening a rewritten library at the same path then sees it anew.
  if (library_) dlclose(library_);
}

void Model::run(DLManagedTensor* const* inputs, size_t num_inputs, DLManagedTensor** outputs,
                size_t num_outputs, void* stream) {
  const auto& d = *desc_;
  if (num_inputs != size_t(d.num_inputs) || num_outputs != size_t(d.num_outputs)) {
    fail(EMBER_ERR_INVALID_ARGUMENT,
         "the model takes " + std::to_string(d.num_inputs) + " inputs and returns " +
             std::to_string(d.num_outputs) + " outputs; got " + std::to_string(num_inputs) +
             " and room for " + std::to_string(num_outputs));
  }
  if (num_outputs && !outputs) fail(EMBER_ERR_INVALID_ARGUMENT, "outputs is NULL");
  std::vector<const DLTensor*> in(num_inputs);
  for (size_t i = 0; i < num_inputs; ++i) {
    if (!inputs || !inputs[i]) fail(EMBER_ERR_INVALID_ARGUMENT, "input " + std::to_string(i) + " is NULL");
    in[i] = &inputs[i]->dl_tensor;
    DLDevice dev = in[i]->device;
    bool ok = dev.device_type == device_.device_type &&
              (device_.device_type == kDLCPU || dev.device_id == device_.device_id);
    if (!ok) {
      fail(EMBER_ERR_DEVICE, std::string("input '") + d.inputs[i].name + "' is on " +
                                 describe_device(dev) + "; the model runs on " +
                                 describe_device(device_));
    }
  }
  run_count_.fetch_add(1, std::memory_order_relaxed);
  ember_abi::Call call;
  call.model = this;
  call.stream = device_.device_type == kDLCPU ? nullptr : stream;
  call.outputs.assign(num_outputs, nullptr);
  std::unique_ptr<CudaContextScope> scope;
  AlignedInputs aligned(*pool_, call.stream);
  if (device_.device_type == kDLCUDA) {
    scope = std::make_unique<CudaContextScope>(device_.device_id);
    for (size_t i = 0; i < num_inputs; ++i) in[i] = aligned.align(in[i], d.inputs[i].name);
  }
  ember_abi::RunArgs args{&kHostApi, &call, kernel_fns_.data(), in.data(), constant_ptrs_.data()};
  int32_t status = d.run(&args);
  if (status == EMBER_OK) {
    try {
      aligned.copy_back();
    } catch (const Error& e) {
      status = e.status();
      call.message = e.what();
    }
  }
  if (status == EMBER_OK) {
    for (size_t i = 0; i < num_outputs; ++i) {
      if (!call.outputs[i]) {
        status = EMBER_ERR_RUNTIME;
        call.message = "the model library did not set output " + std::to_string(i);
      }
    }
  }
  for (auto& a : call.allocs) {
    if (a.live && !a.escaped) pool_->release(a.ptr, call.stream);
  }
  if (status != EMBER_OK) {
    for (DLManagedTensor* t : call.outputs) {
      if (t) t->deleter(t);
    }
    fail(EmberStatus(status), call.message.empty() ? "model run failed" : call.message);
  }
  for (size_t i = 0; i < num_outputs; ++i) outputs[i] = call.outputs[i];
}

}  // namespace ember
