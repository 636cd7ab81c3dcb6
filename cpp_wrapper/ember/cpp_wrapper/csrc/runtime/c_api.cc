// The C ABI (ember_runtime.h): every entry point turns exceptions into status codes.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "detail/common.h"
#include "detail/cuda_api.h"
#include "detail/model.h"

struct EmberModel {
  std::unique_ptr<ember::Model> model;
};

namespace ember {
std::unique_ptr<Model> load_package(const std::string& dir, const EmberLoadOptions& options);
}

namespace {

template <typename Fn>
EmberStatus guarded(Fn fn) {
  try {
    fn();
    ember::set_last_error("");
    return EMBER_OK;
  } catch (const ember::Error& e) {
    ember::set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    ember::set_last_error("out of memory");
    return EMBER_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    ember::set_last_error(e.what());
    return EMBER_ERR_RUNTIME;
  }
}

// Options as this library knows them, whatever size of struct the caller was compiled with.
EmberLoadOptions options_of(const EmberLoadOptions* given) {
  EmberLoadOptions o;
  ember_load_options_init(&o);
  if (given) {
    size_t n = given->struct_size < sizeof(o) ? given->struct_size : sizeof(o);
    memcpy(&o, given, n);
    o.struct_size = sizeof(o);
  }
  return o;
}

void require(bool ok, const char* what) {
  if (!ok) ember::fail(EMBER_ERR_INVALID_ARGUMENT, what);
}

struct EmptyTensor {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
};

void delete_empty(DLManagedTensor* t) {
  auto* e = static_cast<EmptyTensor*>(t->manager_ctx);
  if (t->dl_tensor.device.device_type == kDLCPU) {
    free(t->dl_tensor.data);
  } else {
    try {
      ember::CudaContextScope scope(t->dl_tensor.device.device_id);
      ember::cuda_driver().mem_free(reinterpret_cast<CUdeviceptr>(t->dl_tensor.data));
    } catch (const ember::Error&) {
    }
  }
  delete e;
}

int64_t dense_nbytes(const DLTensor* t) {
  int64_t n = ember::itemsize(t->dtype);
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  if (t->strides) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != s) {
        ember::fail(EMBER_ERR_INVALID_ARGUMENT, "ember_tensor_copy needs dense tensors");
      }
      s *= t->shape[i];
    }
  }
  return n;
}

}  // namespace

EMBER_API uint32_t ember_abi_version(void) { return EMBER_ABI_VERSION; }

EMBER_API const char* ember_status_name(EmberStatus status) {
  switch (status) {
    case EMBER_OK: return "EMBER_OK";
    case EMBER_ERR_INVALID_ARGUMENT: return "EMBER_ERR_INVALID_ARGUMENT";
    case EMBER_ERR_DTYPE: return "EMBER_ERR_DTYPE";
    case EMBER_ERR_SHAPE: return "EMBER_ERR_SHAPE";
    case EMBER_ERR_DEVICE: return "EMBER_ERR_DEVICE";
    case EMBER_ERR_GUARD: return "EMBER_ERR_GUARD";
    case EMBER_ERR_PACKAGE: return "EMBER_ERR_PACKAGE";
    case EMBER_ERR_VERSION: return "EMBER_ERR_VERSION";
    case EMBER_ERR_OUT_OF_MEMORY: return "EMBER_ERR_OUT_OF_MEMORY";
    case EMBER_ERR_UNSUPPORTED: return "EMBER_ERR_UNSUPPORTED";
    case EMBER_ERR_CUDA: return "EMBER_ERR_CUDA";
    case EMBER_ERR_RUNTIME: return "EMBER_ERR_RUNTIME";
  }
  return "EMBER_ERR_UNKNOWN";
}

EMBER_API const char* ember_last_error(void) { return ember::last_error(); }

EMBER_API void ember_load_options_init(EmberLoadOptions* options) {
  if (!options) return;
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

EMBER_API EmberStatus ember_package_load(const char* path, const EmberLoadOptions* options,
                                         EmberModel** out) {
  return guarded([&] {
    require(path && out, "ember_package_load: path and out must not be NULL");
    *out = nullptr;
    auto m = std::make_unique<EmberModel>();
    m->model = ember::load_package(path, options_of(options));
    *out = m.release();
  });
}

EMBER_API EmberStatus ember_model_load_library(const char* library_path,
                                               const char* const* constant_names,
                                               const DLTensor* const* constants,
                                               size_t num_constants,
                                               const EmberLoadOptions* options, EmberModel** out) {
  return guarded([&] {
    require(library_path && out, "ember_model_load_library: library_path and out must not be NULL");
    require(num_constants == 0 || (constant_names && constants), "constants are NULL");
    *out = nullptr;
    std::vector<ember::ConstantArg> args;
    for (size_t i = 0; i < num_constants; ++i) {
      require(constant_names[i] && constants[i], "a constant or its name is NULL");
      args.push_back({constant_names[i], *constants[i]});
    }
    auto m = std::make_unique<EmberModel>();
    m->model = ember::Model::open(library_path, args, options_of(options));
    *out = m.release();
  });
}

EMBER_API void ember_model_free(EmberModel* model) { delete model; }

EMBER_API size_t ember_model_num_inputs(const EmberModel* model) {
  return model ? size_t(model->model->desc().num_inputs) : 0;
}

EMBER_API size_t ember_model_num_outputs(const EmberModel* model) {
  return model ? size_t(model->model->desc().num_outputs) : 0;
}

EMBER_API DLDevice ember_model_device(const EmberModel* model) {
  return model ? model->model->device() : DLDevice{kDLCPU, 0};
}

EMBER_API uint64_t ember_model_run_count(const EmberModel* model) {
  return model ? model->model->run_count() : 0;
}

EMBER_API EmberStatus ember_model_input_info(const EmberModel* model, size_t index,
                                             EmberTensorInfo* out) {
  return guarded([&] {
    require(model && out, "model and out must not be NULL");
    require(index < ember_model_num_inputs(model), "input index out of range");
    *out = model->model->input_info(index);
  });
}

EMBER_API EmberStatus ember_model_output_info(const EmberModel* model, size_t index,
                                              EmberTensorInfo* out) {
  return guarded([&] {
    require(model && out, "model and out must not be NULL");
    require(index < ember_model_num_outputs(model), "output index out of range");
    *out = model->model->output_info(index);
  });
}

EMBER_API EmberStatus ember_model_run(EmberModel* model, DLManagedTensor* const* inputs,
                                      size_t num_inputs, DLManagedTensor** outputs,
                                      size_t num_outputs, void* stream) {
  return guarded([&] {
    require(model, "model must not be NULL");
    model->model->run(inputs, num_inputs, outputs, num_outputs, stream);
  });
}

EMBER_API void ember_generate_options_init(EmberGenerateOptions* options) {
  if (!options) return;
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->top_k = 1;
  options->temperature = 1.0f;
}

EMBER_API EmberStatus ember_generate(EmberModel* model, const int64_t* prompt, size_t batch,
                                     size_t prompt_len, size_t max_new_tokens,
                                     const EmberGenerateOptions* options, int64_t* out_tokens) {
  return guarded([&] {
    require(model && prompt && (out_tokens || max_new_tokens == 0),
            "ember_generate: model, prompt and out_tokens must not be NULL");
    EmberGenerateOptions o;  // as this library knows them, whatever the caller's struct size
    ember_generate_options_init(&o);
    if (options) {
      size_t n = options->struct_size < sizeof(o) ? options->struct_size : sizeof(o);
      memcpy(&o, options, n);
      o.struct_size = sizeof(o);
    }
    ember::generate(*model->model, prompt, batch, prompt_len, max_new_tokens, o, out_tokens);
  });
}

EMBER_API EmberStatus ember_tensor_empty(DLDevice device, DLDataType dtype, int32_t ndim,
                                         const int64_t* shape, DLManagedTensor** out) {
  return guarded([&] {
    require(out && (ndim == 0 || shape) && ndim >= 0, "ember_tensor_empty: bad arguments");
    auto e = std::make_unique<EmptyTensor>();
    e->shape.assign(shape, shape + ndim);
    int64_t nbytes = ember::itemsize(dtype);
    for (int64_t s : e->shape) {
      require(s >= 0, "negative size");
      nbytes *= s;
    }
    void* data = nullptr;
    if (device.device_type == kDLCPU) {
      if (posix_memalign(&data, 64, size_t(nbytes ? nbytes : 64)) != 0) {
        ember::fail(EMBER_ERR_OUT_OF_MEMORY, "ember_tensor_empty");
      }
    } else if (device.device_type == kDLCUDA) {
      ember::CudaContextScope scope(device.device_id);
      CUdeviceptr p;
      ember::cuda_check(ember::cuda_driver().mem_alloc(&p, size_t(nbytes ? nbytes : 256)), "cuMemAlloc");
      data = reinterpret_cast<void*>(p);
    } else {
      ember::fail(EMBER_ERR_UNSUPPORTED, "ember_tensor_empty on this device type");
    }
    DLTensor& t = e->managed.dl_tensor;
    t.data = data;
    t.device = device;
    t.ndim = ndim;
    t.dtype = dtype;
    t.shape = e->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    e->managed.manager_ctx = e.get();
    e->managed.deleter = delete_empty;
    *out = &e.release()->managed;
  });
}

EMBER_API EmberStatus ember_tensor_copy(const DLTensor* src, const DLTensor* dst, void* stream) {
  return guarded([&] {
    require(src && dst, "ember_tensor_copy: NULL tensor");
    int64_t n = dense_nbytes(src);
    require(n == dense_nbytes(dst), "ember_tensor_copy: sizes differ");
    char* s = static_cast<char*>(src->data) + src->byte_offset;
    char* d = static_cast<char*>(dst->data) + dst->byte_offset;
    bool s_cpu = src->device.device_type == kDLCPU, d_cpu = dst->device.device_type == kDLCPU;
    if (s_cpu && d_cpu) {
      memcpy(d, s, size_t(n));
      return;
    }
    const ember::CudaDriver& cu = ember::cuda_driver();
    ember::CudaContextScope scope(d_cpu ? src->device.device_id : dst->device.device_id);
    CUstream st = static_cast<CUstream>(stream);
    if (s_cpu) {
      ember::cuda_check(cu.memcpy_htod_async(reinterpret_cast<CUdeviceptr>(d), s, size_t(n), st), "cuMemcpyHtoDAsync");
    } else if (d_cpu) {
      ember::cuda_check(cu.memcpy_dtoh_async(d, reinterpret_cast<CUdeviceptr>(s), size_t(n), st), "cuMemcpyDtoHAsync");
    } else {
      ember::cuda_check(cu.memcpy_async(reinterpret_cast<CUdeviceptr>(d), reinterpret_cast<CUdeviceptr>(s), size_t(n), st), "cuMemcpyAsync");
    }
    ember::cuda_check(cu.stream_synchronize(st), "cuStreamSynchronize");
  });
}
