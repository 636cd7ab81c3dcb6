// run_package: load an Ember AOT package and run it on .npy files, with no Python and no libtorch.
//
//   run_package [--device N] PACKAGE IN.npy... OUT.npy...   (as many of each as the model has)
//   run_package PACKAGE --info                              (describe the inputs and outputs)
//
// The exit status is 0 on success, else the EmberStatus of the failure (the message goes to
// stderr): 1 bad arguments, 2 dtype, 3 shape, 4 device, 5 guard, 6 package, 7 version, ...
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "detail/common.h"
#include "detail/npy.h"
#include "ember_runtime.h"

namespace {

int report(EmberStatus status, const std::string& what) {
  fprintf(stderr, "run_package: %s: %s%s%s\n", ember_status_name(status), what.c_str(),
          what.empty() ? "" : ": ", ember_last_error());
  return int(status);
}

void print_info(const EmberTensorInfo& info, const char* kind) {
  printf("%s %s dtype=(%d,%d) shape=[", kind, info.name, info.dtype.code, info.dtype.bits);
  for (int d = 0; d < info.ndim; ++d) {
    if (info.shape[d] < 0) {
      printf("%s%s", d ? ", " : "", info.dim_names[d]);
    } else {
      printf("%s%lld", d ? ", " : "", (long long)info.shape[d]);
    }
  }
  printf("]\n");
}

// A dense host copy of a (possibly strided) host tensor's elements in row-major order.
std::vector<uint8_t> dense_host(const DLTensor& t) {
  int64_t isz = (t.dtype.bits * t.dtype.lanes + 7) / 8, n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  std::vector<uint8_t> out(size_t(n * isz));
  const uint8_t* base = static_cast<const uint8_t*>(t.data) + t.byte_offset;
  std::vector<int64_t> idx(size_t(t.ndim), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0, stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      off += idx[size_t(i)] * (t.strides ? t.strides[i] : stride);
      stride *= t.shape[i];
    }
    memcpy(&out[size_t(e * isz)], base + off * isz, size_t(isz));
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < t.shape[i]) break;
      idx[size_t(i)] = 0;
    }
  }
  return out;
}

void release(std::vector<DLManagedTensor*>& tensors) {
  for (DLManagedTensor* t : tensors) {
    if (t && t->deleter) t->deleter(t);
  }
  tensors.clear();
}

void noop_deleter(DLManagedTensor*) {}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  EmberLoadOptions options;
  ember_load_options_init(&options);
  if (args.size() >= 2 && args[0] == "--device") {
    options.device_id = atoi(args[1].c_str());
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty()) {
    fprintf(stderr, "usage: run_package [--device N] PACKAGE IN.npy... OUT.npy...\n");
    return EMBER_ERR_INVALID_ARGUMENT;
  }
  EmberModel* model = nullptr;
  EmberStatus st = ember_package_load(args[0].c_str(), &options, &model);
  if (st != EMBER_OK) return report(st, "loading " + args[0]);
  size_t n_in = ember_model_num_inputs(model), n_out = ember_model_num_outputs(model);
  if (args.size() == 2 && args[1] == "--info") {
    EmberTensorInfo info;
    for (size_t i = 0; i < n_in; ++i) ember_model_input_info(model, i, &info), print_info(info, "input");
    for (size_t i = 0; i < n_out; ++i) ember_model_output_info(model, i, &info), print_info(info, "output");
    ember_model_free(model);
    return 0;
  }
  if (args.size() != 1 + n_in + n_out) {
    fprintf(stderr, "run_package: the model takes %zu inputs and %zu outputs; give that many .npy paths\n",
            n_in, n_out);
    ember_model_free(model);
    return EMBER_ERR_INVALID_ARGUMENT;
  }
  DLDevice device = ember_model_device(model);
  bool on_cpu = device.device_type == kDLCPU;
  std::vector<ember::NpyArray> arrays(n_in);
  std::vector<DLManagedTensor> host(n_in);
  std::vector<DLManagedTensor*> inputs(n_in), device_inputs, outputs(n_out, nullptr);
  int rc = 0;
  try {
    for (size_t i = 0; i < n_in; ++i) {
      arrays[i] = ember::npy_read(args[1 + i]);
      DLTensor& t = host[i].dl_tensor;
      t = DLTensor{arrays[i].data.data(), DLDevice{kDLCPU, 0}, int32_t(arrays[i].shape.size()),
                   arrays[i].dtype, arrays[i].shape.data(), nullptr, 0};
      host[i].manager_ctx = nullptr;
      host[i].deleter = noop_deleter;
      inputs[i] = &host[i];
      if (!on_cpu) {  // stage the input on the model's GPU
        DLManagedTensor* d = nullptr;
        st = ember_tensor_empty(device, t.dtype, t.ndim, t.shape, &d);
        if (st == EMBER_OK) device_inputs.push_back(d), st = ember_tensor_copy(&t, &d->dl_tensor, nullptr);
        if (st != EMBER_OK) throw st;
        inputs[i] = d;
      }
    }
    st = ember_model_run(model, inputs.data(), n_in, outputs.data(), n_out, nullptr);
    if (st != EMBER_OK) throw st;
    for (size_t i = 0; i < n_out; ++i) {
      DLTensor t = outputs[i]->dl_tensor;
      std::vector<uint8_t> staged;
      DLManagedTensor* h = nullptr;
      if (!on_cpu) {
        st = ember_tensor_empty(DLDevice{kDLCPU, 0}, t.dtype, t.ndim, t.shape, &h);
        if (st == EMBER_OK) st = ember_tensor_copy(&t, &h->dl_tensor, nullptr);
        if (st != EMBER_OK) throw st;
        t = h->dl_tensor;
      }
      staged = dense_host(t);
      std::vector<int64_t> shape(t.shape, t.shape + t.ndim);  // t.shape dies with h
      if (h) h->deleter(h);
      ember::npy_write(args[1 + n_in + i], t.dtype, shape.data(), t.ndim, staged.data());
    }
  } catch (EmberStatus s) {
    rc = report(s, "");
  } catch (const ember::Error& e) {
    fprintf(stderr, "run_package: %s: %s\n", ember_status_name(e.status()), e.what());
    rc = int(e.status());
  }
  release(outputs);
  release(device_inputs);
  ember_model_free(model);
  return rc;
}
