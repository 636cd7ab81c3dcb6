// ember_server: serve an Ember AOT package from N worker threads, through the public C API only.
//
//   ember_server [--threads N] [--model-per-worker] [--device N] PACKAGE
//
// Requests come on stdin, one per line: `ID IN.npy... OUT.npy...` (as many inputs and outputs as
// the model has; paths without spaces). Each request is answered on stdout with one line, in the
// order requests finish: `ID ok` once every output file is written, or `ID error STATUS: message`
// (a malformed line, an unreadable or wrong input, a failed run). A bad request never stops the
// server. At end of input the queue is drained, the workers join, a summary goes to stderr and the
// exit status is 0. Before the first request is read the server prints `ready N_IN N_OUT WORKERS`.
//
// Thread model: a reader thread (main) parses lines into a shared queue; N workers pop requests
// and run them. The runtime lets one EmberModel run from many threads at once (per-call state, a
// thread-safe pool), so workers share one model by default; --model-per-worker loads one model
// per worker (separate pools, weights mapped once per model). On CUDA each worker gets its own
// stream (created through libcuda, opened with dlopen, as the runtime does), so workers' runs
// overlap.
#include <dlfcn.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ember_runtime.h"

namespace {

// A failed request: the status to report and why.
struct RequestError : std::runtime_error {
  EmberStatus status;
  RequestError(EmberStatus s, const std::string& what) : std::runtime_error(what), status(s) {}
};

[[noreturn]] void bad_input(const std::string& what) {
  throw RequestError(EMBER_ERR_INVALID_ARGUMENT, what);
}

// ---- .npy files (little-endian, C order) ---------------------------------------------------

struct NpyType {
  const char* descr;
  uint8_t code, bits;
};
const NpyType kNpyTypes[] = {
    {"<f4", kDLFloat, 32}, {"<f8", kDLFloat, 64}, {"<f2", kDLFloat, 16},
    {"<i8", kDLInt, 64},   {"<i4", kDLInt, 32},   {"<i2", kDLInt, 16},
    {"|i1", kDLInt, 8},    {"|u1", kDLUInt, 8},   {"|b1", kDLBool, 8},
};

struct Array {
  DLDataType dtype{};
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// The value of `key` in numpy's header dict ("{'descr': '<f4', 'fortran_order': False, ...}").
std::string header_field(const std::string& header, const std::string& key,
                         const std::string& path) {
  size_t at = header.find("'" + key + "':");
  if (at == std::string::npos) bad_input(path + ": .npy header has no '" + key + "'");
  at += key.size() + 3;
  while (at < header.size() && header[at] == ' ') ++at;
  size_t end = header[at] == '(' ? header.find(')', at) + 1 : header.find_first_of(",}", at);
  if (end == std::string::npos || end == 0 || end <= at)
    bad_input(path + ": malformed .npy header");
  return header.substr(at, end - at);
}

Array read_npy(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) bad_input("cannot open " + path + ": " + strerror(errno));
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, fclose);
  unsigned char pre[10];
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    bad_input(path + ": not a .npy file (bad magic)");
  }
  uint32_t hlen = pre[8] | (pre[9] << 8);
  if (pre[6] >= 2) {  // versions 2 and 3 have a 4-byte header length
    unsigned char more[2];
    if (fread(more, 1, 2, f) != 2) bad_input(path + ": truncated .npy header");
    hlen |= (uint32_t(more[0]) << 16) | (uint32_t(more[1]) << 24);
  }
  if (hlen > (1u << 20)) bad_input(path + ": .npy header longer than 1 MiB");
  std::string header(hlen, '\0');
  if (fread(&header[0], 1, hlen, f) != hlen) bad_input(path + ": truncated .npy header");
  Array a;
  std::string descr = header_field(header, "descr", path);
  bool known = false;
  for (const NpyType& t : kNpyTypes) {
    if (descr == std::string("'") + t.descr + "'")
      a.dtype = DLDataType{t.code, t.bits, 1}, known = true;
  }
  if (!known) bad_input(path + ": unsupported .npy dtype " + descr);
  if (header_field(header, "fortran_order", path) != "False") {
    bad_input(path + ": Fortran-order .npy arrays are not supported (save a C-contiguous array)");
  }
  std::string shape = header_field(header, "shape", path);
  int64_t count = 1;
  for (size_t i = 1; i + 1 < shape.size();) {
    while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i + 1 >= shape.size()) break;
    size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(shape.substr(i), &used);
    } catch (const std::exception&) {
    }
    if (used == 0 || n < 0 || n > (int64_t(1) << 40)) bad_input(path + ": bad .npy shape " + shape);
    if (a.shape.size() >= 32 || (n && count > (int64_t(1) << 40) / n))
      bad_input(path + ": .npy too large");
    a.shape.push_back(n);
    count *= n;
    i += used;
  }
  size_t bytes = size_t(count) * (a.dtype.bits / 8);
  long start = ftell(f);
  fseek(f, 0, SEEK_END);
  if (ftell(f) - start != long(bytes)) {
    bad_input(path + ": .npy data is " + std::to_string(ftell(f) - start) + " bytes, the shape " +
              shape + " needs " + std::to_string(bytes));
  }
  fseek(f, start, SEEK_SET);
  a.data.resize(bytes);
  if (bytes && fread(a.data.data(), 1, bytes, f) != bytes) bad_input(path + ": short read");
  return a;
}

// Write a (possibly strided) host tensor as a C-order .npy file, through a temporary + rename so a
// reader never sees half a file.
void write_npy(const std::string& path, const DLTensor& t) {
  const char* descr = nullptr;
  for (const NpyType& k : kNpyTypes) {
    if (k.code == t.dtype.code && k.bits == t.dtype.bits) descr = k.descr;
  }
  if (!descr) throw RequestError(EMBER_ERR_UNSUPPORTED, "an output dtype .npy cannot hold");
  std::string shape = "(";
  int64_t count = 1;
  for (int i = 0; i < t.ndim; ++i)
    shape += std::to_string(t.shape[i]) + (t.ndim == 1      ? ","
                                           : i + 1 < t.ndim ? ", "
                                                            : ""),
        count *= t.shape[i];
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string tmp = path + ".part";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f) bad_input("cannot write " + path + ": " + strerror(errno));
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, fclose);
  unsigned char pre[10] = {
      0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size()), uint8_t(header.size() >> 8)};
  bool ok =
      fwrite(pre, 1, 10, f) == 10 && fwrite(header.data(), 1, header.size(), f) == header.size();
  size_t isz = t.dtype.bits / 8;
  const char* base = static_cast<const char*>(t.data) + t.byte_offset;
  std::vector<int64_t> idx(size_t(t.ndim), 0);
  for (int64_t e = 0; ok && e < count; ++e) {  // row-major walk over the output's strides
    int64_t off = 0, dense = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      off += idx[size_t(i)] * (t.strides ? t.strides[i] : dense);
      dense *= t.shape[i];
    }
    ok = fwrite(base + off * int64_t(isz), 1, isz, f) == isz;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < t.shape[i]) break;
      idx[size_t(i)] = 0;
    }
  }
  closer.reset();
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0)
    bad_input("cannot write " + path + ": " + strerror(errno));
}

// ---- CUDA streams (only for CUDA packages; libcuda is opened at run time) --------------------

struct Cuda {
  int (*set_current)(void*) = nullptr;               // cuCtxSetCurrent
  int (*stream_create)(void**, unsigned) = nullptr;  // cuStreamCreate
  int (*stream_destroy)(void*) = nullptr;            // cuStreamDestroy_v2
  void* ctx = nullptr;

  explicit Cuda(int ordinal) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) throw RequestError(EMBER_ERR_CUDA, "a CUDA package needs libcuda.so.1");
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
    auto device_get = reinterpret_cast<int (*)(int*, int)>(dlsym(lib, "cuDeviceGet"));
    auto retain = reinterpret_cast<int (*)(void**, int)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    set_current = reinterpret_cast<decltype(set_current)>(dlsym(lib, "cuCtxSetCurrent"));
    stream_create = reinterpret_cast<decltype(stream_create)>(dlsym(lib, "cuStreamCreate"));
    stream_destroy = reinterpret_cast<decltype(stream_destroy)>(dlsym(lib, "cuStreamDestroy_v2"));
    int device = -1;
    if (!init || !device_get || !retain || !set_current || !stream_create || !stream_destroy ||
        init(0) != 0 || device_get(&device, ordinal) != 0 || retain(&ctx, device) != 0) {
      throw RequestError(EMBER_ERR_CUDA, "cannot retain the CUDA device's primary context");
    }
  }
  void* new_stream() const {  // a non-blocking stream of the primary context, for this thread
    void* s = nullptr;
    if (set_current(ctx) != 0 || stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */) != 0) {
      throw RequestError(EMBER_ERR_CUDA, "cuStreamCreate failed");
    }
    return s;
  }
};

// ---- requests ------------------------------------------------------------------------------

struct Request {
  std::string id;
  std::vector<std::string> paths;  // inputs then outputs
};

struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request> items;
  bool closed = false;

  void push(Request r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      items.push_back(std::move(r));
    }
    cv.notify_one();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed = true;
    }
    cv.notify_all();
  }
  bool pop(Request* r) {  // false once closed and empty
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return closed || !items.empty(); });
    if (items.empty()) return false;
    *r = std::move(items.front());
    items.pop_front();
    return true;
  }
};

std::mutex g_out_mu;
size_t g_served = 0, g_failed = 0;

void answer(const std::string& id, const std::string& text, bool ok) {
  std::lock_guard<std::mutex> lock(g_out_mu);
  std::string line = id + (ok ? " ok" : " error " + text);
  for (char& c : line)
    if (c == '\n') c = ' ';  // one answer, one line
  fprintf(stdout, "%s\n", line.c_str());
  fflush(stdout);
  ++(ok ? g_served : g_failed);
}

void check(EmberStatus st, const std::string& what) {
  if (st != EMBER_OK) throw RequestError(st, what + ": " + ember_last_error());
}

struct Releaser {  // gives back the runtime's tensors of one request, whatever happens
  std::vector<DLManagedTensor*> tensors;
  ~Releaser() {
    for (DLManagedTensor* t : tensors)
      if (t && t->deleter) t->deleter(t);
  }
};

void serve_one(EmberModel* model, void* stream, const Request& r) {
  size_t n_in = ember_model_num_inputs(model), n_out = ember_model_num_outputs(model);
  if (r.paths.size() != n_in + n_out) {
    bad_input("expected " + std::to_string(n_in) + " input and " + std::to_string(n_out) +
              " output .npy paths, got " + std::to_string(r.paths.size()));
  }
  DLDevice device = ember_model_device(model);
  bool cpu = device.device_type == kDLCPU;
  std::vector<Array> arrays(n_in);
  std::vector<DLManagedTensor> host(n_in);
  std::vector<DLManagedTensor*> inputs(n_in), outputs(n_out, nullptr);
  Releaser staged;
  for (size_t i = 0; i < n_in; ++i) {
    arrays[i] = read_npy(r.paths[i]);
    host[i] = DLManagedTensor{};
    host[i].dl_tensor = DLTensor{arrays[i].data.data(),
                                 DLDevice{kDLCPU, 0},
                                 int32_t(arrays[i].shape.size()),
                                 arrays[i].dtype,
                                 arrays[i].shape.data(),
                                 nullptr,
                                 0};
    inputs[i] = &host[i];  // borrowed by the run: no deleter is called
    if (!cpu) {
      DLManagedTensor* d = nullptr;
      check(ember_tensor_empty(device, arrays[i].dtype, host[i].dl_tensor.ndim,
                               arrays[i].shape.data(), &d),
            "staging input " + std::to_string(i));
      staged.tensors.push_back(d);
      check(ember_tensor_copy(&host[i].dl_tensor, &d->dl_tensor, stream), "copying input");
      inputs[i] = d;
    }
  }
  check(ember_model_run(model, inputs.data(), n_in, outputs.data(), n_out, stream), "run");
  Releaser results{outputs};
  for (size_t i = 0; i < n_out; ++i) {
    const DLTensor* t = &outputs[i]->dl_tensor;
    if (!cpu) {  // outputs are dense row-major; the copy synchronises the worker's stream
      DLManagedTensor* h = nullptr;
      check(ember_tensor_empty(DLDevice{kDLCPU, 0}, t->dtype, t->ndim, t->shape, &h),
            "host output");
      staged.tensors.push_back(h);
      check(ember_tensor_copy(t, &h->dl_tensor, stream), "copying output");
      t = &h->dl_tensor;
    }
    write_npy(r.paths[n_in + i], *t);
  }
}

void worker(EmberModel* model, const Cuda* cuda, Queue* queue) {
  void* stream = nullptr;
  try {
    if (cuda) stream = cuda->new_stream();
  } catch (const RequestError& e) {
    fprintf(stderr, "ember_server: %s\n", e.what());
  }
  Request r;
  while (queue->pop(&r)) {
    try {
      serve_one(model, stream, r);
      answer(r.id, "", true);
    } catch (const RequestError& e) {
      answer(r.id, std::string(ember_status_name(e.status)) + ": " + e.what(), false);
    } catch (const std::exception& e) {  // e.g. std::bad_alloc for a huge input
      answer(r.id, std::string("EMBER_ERR_RUNTIME: ") + e.what(), false);
    }
  }
  if (stream) cuda->stream_destroy(stream);
}

int usage() {
  fprintf(stderr, "usage: ember_server [--threads N] [--model-per-worker] [--device N] PACKAGE\n");
  return EMBER_ERR_INVALID_ARGUMENT;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 4;
  bool per_worker = false;
  EmberLoadOptions options;
  ember_load_options_init(&options);
  std::string package;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--threads" || a == "--device") && i + 1 < argc) {
      (a == "--threads" ? threads : options.device_id) = atoi(argv[++i]);
    } else if (a == "--model-per-worker") {
      per_worker = true;
    } else if (package.empty() && a.rfind("--", 0) != 0) {
      package = a;
    } else {
      return usage();
    }
  }
  if (package.empty() || threads < 1 || threads > 256) return usage();
  std::vector<EmberModel*> models(per_worker ? size_t(threads) : 1, nullptr);
  for (EmberModel*& m : models) {
    EmberStatus st = ember_package_load(package.c_str(), &options, &m);
    if (st != EMBER_OK) {
      fprintf(stderr, "ember_server: %s: loading %s: %s\n", ember_status_name(st), package.c_str(),
              ember_last_error());
      for (EmberModel* loaded : models) ember_model_free(loaded);
      return int(st);
    }
  }
  std::unique_ptr<Cuda> cuda;
  if (ember_model_device(models[0]).device_type == kDLCUDA) {
    try {
      cuda.reset(new Cuda(options.device_id));
    } catch (const RequestError& e) {
      fprintf(stderr, "ember_server: %s\n", e.what());
      return int(e.status);
    }
  }
  printf("ready %zu %zu %d\n", ember_model_num_inputs(models[0]),
         ember_model_num_outputs(models[0]), threads);
  fflush(stdout);
  Queue queue;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(worker, models[per_worker ? size_t(t) : 0], cuda.get(), &queue);
  }
  std::string line;
  size_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    std::istringstream words(line);
    Request r;
    if (!(words >> r.id)) continue;  // blank lines are ignored
    for (std::string w; words >> w;) r.paths.push_back(w);
    queue.push(std::move(r));
  }
  queue.close();
  for (std::thread& t : pool) t.join();
  for (EmberModel* m : models) ember_model_free(m);
  fprintf(stderr, "ember_server: %zu requests served, %zu failed, %d workers (%s)\n", g_served,
          g_failed, threads, per_worker ? "a model per worker" : "one shared model");
  return 0;
}
