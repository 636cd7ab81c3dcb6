// run_package: load an Ember AOT package and run it on .npy files, with no Python and no libtorch.
//
//   run_package [--device N] PACKAGE IN.npy... OUT.npy...   (as many of each as the model has)
//   run_package PACKAGE --info                              (describe the inputs and outputs)
//   run_package [--device N] --bench CALLS [--rounds R] PACKAGE IN.npy... [OUT.npy...]
//   run_package [--device N] --generate N [--top-k K] [--temperature T] [--seed S]
//               [--bench CALLS] PACKAGE PROMPT.npy OUT.npy  (ember_generate on a decode step)
//
// --generate: PROMPT.npy holds (B, P) int64 (or int32) token ids; OUT.npy gets the (B, N) int64
// tokens that ember_generate chose (greedy unless --top-k K > 1; see ember_runtime.h). With
// --bench, CALLS more generations after the one that writes OUT.npy, and their median (each
// ember_generate returns with the last logits on the host, so no further synchronisation):
//   generate calls=CALLS median_ms=X tokens_per_s=Y      (Y: B x N tokens over X)
//
// --bench: after the run that writes the outputs (a warm-up), time CALLS more runs, each one
// synchronised (CUDA), and print their median milliseconds; then R rounds (default 10) of CALLS
// back-to-back runs, synchronised once per round, and print the median per-run milliseconds of a
// round (the figure bench/measure.py's per-call overhead timing gives for in-process backends):
//   bench calls=CALLS sync_median_ms=X rounds=R loop_median_ms=Y
//
// numpy has no bfloat16: a bfloat16 input is read from a float32 .npy (rounded to nearest even,
// as torch's .to(torch.bfloat16)) and a bfloat16 output is written as float32 (exact: every
// bfloat16 is a float32).
//
// The exit status is 0 on success, else the EmberStatus of the failure (the message goes to
// stderr): 1 bad arguments, 2 dtype, 3 shape, 4 device, 5 guard, 6 package, 7 version, ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "detail/common.h"
#include "detail/cuda_api.h"
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

bool is_bf16(DLDataType t) { return t.code == kDLBfloat && t.bits == 16 && t.lanes == 1; }
bool is_f32(DLDataType t) { return t.code == kDLFloat && t.bits == 32 && t.lanes == 1; }

// A float32 array as bfloat16, rounded to nearest even (a NaN stays a quiet NaN).
void narrow_to_bf16(ember::NpyArray& a) {
  size_t n = a.data.size() / 4;
  std::vector<uint8_t> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, &a.data[i * 4], 4);
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    uint16_t h = nan ? uint16_t((u >> 16) | 0x40u) : uint16_t(rounded >> 16);
    memcpy(&out[i * 2], &h, 2);
  }
  a.data.swap(out);
  a.dtype = DLDataType{kDLBfloat, 16, 1};
}

// Dense bfloat16 bytes as float32 bytes (exact).
std::vector<uint8_t> widen_bf16(const std::vector<uint8_t>& in) {
  std::vector<uint8_t> out(in.size() * 2);
  for (size_t i = 0; i < in.size() / 2; ++i) {
    uint16_t h;
    memcpy(&h, &in[i * 2], 2);
    uint32_t u = uint32_t(h) << 16;
    memcpy(&out[i * 4], &u, 4);
  }
  return out;
}

// Wait for the work queued on the legacy default stream (the stream runs use) of a CUDA model.
void synchronize(DLDevice device) {
  if (device.device_type == kDLCPU) return;
  ember::CudaContextScope scope(device.device_id);
  ember::cuda_check(ember::cuda_driver().stream_synchronize(nullptr), "cuStreamSynchronize");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// One run whose outputs are released at once; throws the failing status.
void run_once(EmberModel* model, std::vector<DLManagedTensor*>& inputs,
              std::vector<DLManagedTensor*>& outputs) {
  EmberStatus st = ember_model_run(model, inputs.data(), inputs.size(), outputs.data(),
                                   outputs.size(), nullptr);
  if (st != EMBER_OK) throw st;
  size_t n = outputs.size();
  release(outputs);
  outputs.assign(n, nullptr);
}

void bench(EmberModel* model, DLDevice device, std::vector<DLManagedTensor*>& inputs,
           size_t n_out, int calls, int rounds) {
  std::vector<DLManagedTensor*> outputs(n_out, nullptr);
  std::vector<double> each, per_round;
  for (int i = 0; i < calls; ++i) {
    double t0 = now_ms();
    run_once(model, inputs, outputs);
    synchronize(device);
    each.push_back(now_ms() - t0);
  }
  for (int r = 0; r < rounds; ++r) {
    double t0 = now_ms();
    for (int i = 0; i < calls; ++i) run_once(model, inputs, outputs);
    synchronize(device);
    per_round.push_back((now_ms() - t0) / calls);
  }
  printf("bench calls=%d sync_median_ms=%.6f rounds=%d loop_median_ms=%.6f\n", calls,
         median(each), rounds, median(per_round));
}

int generate_main(EmberModel* model, const std::vector<std::string>& args,
                  const EmberGenerateOptions& o, long long n_new, int calls) {
  if (args.size() != 3 || n_new < 0) {
    fprintf(stderr, "usage: run_package --generate N [--top-k K] [--temperature T] [--seed S] "
                    "PACKAGE PROMPT.npy OUT.npy\n");
    return EMBER_ERR_INVALID_ARGUMENT;
  }
  try {
    ember::NpyArray prompt = ember::npy_read(args[1]);
    bool i64 = prompt.dtype.code == kDLInt && prompt.dtype.bits == 64;
    bool i32 = prompt.dtype.code == kDLInt && prompt.dtype.bits == 32;
    if (prompt.shape.size() != 2 || !(i64 || i32)) {
      ember::fail(EMBER_ERR_INVALID_ARGUMENT, args[1] + ": the prompt must be a 2-D int64 array");
    }
    size_t batch = size_t(prompt.shape[0]), len = size_t(prompt.shape[1]);
    std::vector<int64_t> ids(batch * len), out(batch * size_t(n_new));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i64) {
        memcpy(&ids[i], &prompt.data[i * 8], 8);
      } else {
        int32_t v;
        memcpy(&v, &prompt.data[i * 4], 4);
        ids[i] = v;
      }
    }
    EmberStatus st = ember_generate(model, ids.data(), batch, len, size_t(n_new), &o, out.data());
    if (st != EMBER_OK) return report(st, "generating");
    int64_t shape[2] = {int64_t(batch), int64_t(n_new)};
    ember::npy_write(args[2], DLDataType{kDLInt, 64, 1}, shape, 2, out.data());
    std::vector<double> each;
    std::vector<int64_t> again(out.size());
    for (int i = 0; i < calls; ++i) {
      double t0 = now_ms();
      st = ember_generate(model, ids.data(), batch, len, size_t(n_new), &o, again.data());
      if (st != EMBER_OK) return report(st, "generating");
      each.push_back(now_ms() - t0);
    }
    if (calls > 0) {
      double ms = median(each);
      printf("generate calls=%d median_ms=%.6f tokens_per_s=%.2f\n", calls, ms,
             ms > 0 ? 1000.0 * double(batch * size_t(n_new)) / ms : 0.0);
    }
  } catch (const ember::Error& e) {
    fprintf(stderr, "run_package: %s: %s\n", ember_status_name(e.status()), e.what());
    return int(e.status());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  EmberLoadOptions options;
  ember_load_options_init(&options);
  int calls = 0, rounds = 10;
  long long n_new = -1;
  EmberGenerateOptions gen;
  ember_generate_options_init(&gen);
  auto is_option = [](const std::string& a) {
    return a == "--device" || a == "--bench" || a == "--rounds" || a == "--generate" ||
           a == "--top-k" || a == "--temperature" || a == "--seed";
  };
  while (args.size() >= 2 && is_option(args[0])) {
    const char* v = args[1].c_str();
    if (args[0] == "--generate") {
      n_new = atoll(v);
    } else if (args[0] == "--top-k") {
      gen.top_k = atoi(v);
    } else if (args[0] == "--temperature") {
      gen.temperature = float(atof(v));
    } else if (args[0] == "--seed") {
      gen.seed = strtoull(v, nullptr, 10);
    } else {
      (args[0] == "--device" ? options.device_id : args[0] == "--bench" ? calls : rounds) = atoi(v);
    }
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty() || calls < 0 || rounds < 1) {
    fprintf(stderr, "usage: run_package [--device N] [--bench CALLS [--rounds R]] PACKAGE "
                    "IN.npy... OUT.npy...\n");
    return EMBER_ERR_INVALID_ARGUMENT;
  }
  EmberModel* model = nullptr;
  EmberStatus st = ember_package_load(args[0].c_str(), &options, &model);
  if (st != EMBER_OK) return report(st, "loading " + args[0]);
  size_t n_in = ember_model_num_inputs(model), n_out = ember_model_num_outputs(model);
  if (n_new >= 0) {
    int rc = generate_main(model, args, gen, n_new, calls);
    ember_model_free(model);
    return rc;
  }
  if (args.size() == 2 && args[1] == "--info") {
    EmberTensorInfo info;
    for (size_t i = 0; i < n_in; ++i) ember_model_input_info(model, i, &info), print_info(info, "input");
    for (size_t i = 0; i < n_out; ++i) ember_model_output_info(model, i, &info), print_info(info, "output");
    ember_model_free(model);
    return 0;
  }
  bool write = args.size() == 1 + n_in + n_out;  // with --bench the outputs may be left out
  if (!write && !(calls > 0 && args.size() == 1 + n_in)) {
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
      EmberTensorInfo info;
      if (ember_model_input_info(model, i, &info) == EMBER_OK && is_bf16(info.dtype) &&
          is_f32(arrays[i].dtype)) {
        narrow_to_bf16(arrays[i]);
      }
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
    for (size_t i = 0; write && i < n_out; ++i) {
      DLTensor t = outputs[i]->dl_tensor;
      std::vector<uint8_t> staged;
      DLManagedTensor* h = nullptr;
      if (!on_cpu) {
        // The bytes the output spans, as one block (a permuted or row-padded layout is not
        // dense), then its elements read through its strides on the host.
        int64_t numel = 1, span = 1;
        for (int d = 0; d < t.ndim; ++d) numel *= t.shape[d];
        if (t.strides && numel > 0) {
          for (int d = 0; d < t.ndim; ++d) span += (t.shape[d] - 1) * t.strides[d];
        } else {
          span = numel;
        }
        int64_t nbytes = span * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
        DLDataType byte{kDLUInt, 8, 1};
        DLTensor block{t.data, t.device, 1, byte, &nbytes, nullptr, t.byte_offset};
        st = ember_tensor_empty(DLDevice{kDLCPU, 0}, byte, 1, &nbytes, &h);
        if (st == EMBER_OK) st = ember_tensor_copy(&block, &h->dl_tensor, nullptr);
        if (st != EMBER_OK) throw st;
        t = DLTensor{h->dl_tensor.data, DLDevice{kDLCPU, 0}, t.ndim, t.dtype, t.shape, t.strides,
                     0};
      }
      staged = dense_host(t);
      DLDataType written = t.dtype;
      if (is_bf16(t.dtype)) staged = widen_bf16(staged), written = DLDataType{kDLFloat, 32, 1};
      std::vector<int64_t> shape(t.shape, t.shape + t.ndim);  // t.shape dies with h
      if (h) h->deleter(h);
      ember::npy_write(args[1 + n_in + i], written, shape.data(), t.ndim, staged.data());
    }
    release(outputs);
    outputs.assign(n_out, nullptr);
    if (calls > 0) bench(model, device, inputs, n_out, calls, rounds);
  } catch (EmberStatus s) {
    rc = report(s, "");
  } catch (const ember::Error& e) {
    fprintf(stderr, "run_package: %s: %s\n", ember_status_name(e.status()), e.what());
    rc = int(e.status());
  } catch (const std::bad_alloc&) {  // an input larger than memory: a status, never an abort
    fprintf(stderr, "run_package: EMBER_ERR_OUT_OF_MEMORY: out of memory\n");
    rc = EMBER_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    fprintf(stderr, "run_package: EMBER_ERR_RUNTIME: %s\n", e.what());
    rc = EMBER_ERR_RUNTIME;
  }
  release(outputs);
  release(device_inputs);
  ember_model_free(model);
  return rc;
}
