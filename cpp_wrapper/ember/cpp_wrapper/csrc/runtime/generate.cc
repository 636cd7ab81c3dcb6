// ember_generate: greedy and top-k decoding with a decode-step package (the prompt in runs of up
// to max_new_tokens tokens when the step takes a dynamic number of new tokens, else token by
// token; then one token per run), its caches allocated per call and updated in place by each run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "detail/common.h"
#include "detail/cpu_ops.h"
#include "detail/model.h"

namespace ember {

namespace {

struct TensorDeleter {
  void operator()(DLManagedTensor* t) const {
    if (t && t->deleter) t->deleter(t);
  }
};
using Owned = std::unique_ptr<DLManagedTensor, TensorDeleter>;

// An uninitialised tensor of `info`'s shape, its dynamic sizes (the new tokens') set to `t`.
Owned empty(const Model& model, void* stream, const EmberTensorInfo& info, const std::string& what,
            int64_t t = -1) {
  std::vector<int64_t> shape(info.shape, info.shape + info.ndim);
  for (int64_t& n : shape) {
    if (n < 0 && t < 0) {
      fail(EMBER_ERR_UNSUPPORTED, "ember_generate: the " + what + " input '" + info.name +
                                      "' has a dynamic size; only the new tokens' count may be");
    }
    if (n < 0) n = t;
  }
  // on CUDA from the pool: a session's tensors reuse the blocks cached for its stream
  if (model.device().device_type == kDLCUDA) return Owned(model.empty(info.dtype, shape, stream));
  DLManagedTensor* out = nullptr;
  EmberStatus st =
      ember_tensor_empty(model.device(), info.dtype, info.ndim, shape.data(), &out);
  if (st != EMBER_OK) fail(st, ember_last_error());
  return Owned(out);
}

int64_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Zeros into `t` (dense): a memset on the device, queued on `stream`.
void zero(const DLTensor& t, void* stream) {
  size_t nbytes = size_t(numel(t) * itemsize(t.dtype));
  if (t.device.device_type == kDLCPU) {
    memset(t.data, 0, nbytes);
    return;
  }
  CudaContextScope scope(t.device.device_id);
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(static_cast<char*>(t.data) + t.byte_offset);
  CUstream st = static_cast<CUstream>(stream);
  if (nbytes % 4 == 0) {
    cuda_check(cuda_driver().memset_d32_async(p, 0, nbytes / 4, st), "cuMemsetD32Async");
  } else if (nbytes % 2 == 0) {
    cuda_check(cuda_driver().memset_d16_async(p, 0, nbytes / 2, st), "cuMemsetD16Async");
  } else {
    std::vector<char> zeros(nbytes, 0);
    DLTensor host = t;
    host.device = DLDevice{kDLCPU, 0};
    host.data = zeros.data();
    host.byte_offset = 0;
    EmberStatus s = ember_tensor_copy(&host, &t, stream);
    if (s != EMBER_OK) fail(s, ember_last_error());
  }
}

// Host bytes queued for copies to the device: kept until the stream has run them (pageable
// memory may be read by the copy after cuMemcpyHtoDAsync returns). The call synchronises its
// stream before it returns; a call that fails synchronises here before freeing them.
class Staged {
 public:
  explicit Staged(void* stream) : stream_(stream) {}
  ~Staged() {
    if (!bytes_.empty() && stream_) cuda_driver().stream_synchronize(static_cast<CUstream>(stream_));
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  const void* keep(std::vector<char> bytes) {
    bytes_.push_back(std::move(bytes));
    return bytes_.back().data();
  }

 private:
  void* stream_;
  std::deque<std::vector<char>> bytes_;  // a deque: the kept vectors' buffers never move
};

// `bytes` (host) into `t` (dense, on the model's device), in `stream`'s order, the host not
// waiting for the stream (ember_tensor_copy would: a stall before each call's first step).
void upload(const DLTensor& t, std::vector<char> bytes, void* stream, Staged& staged) {
  size_t nbytes = size_t(numel(t) * itemsize(t.dtype));
  if (t.device.device_type == kDLCPU) {
    memcpy(t.data, bytes.data(), nbytes);
    return;
  }
  CudaContextScope scope(t.device.device_id);
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(static_cast<char*>(t.data) + t.byte_offset);
  cuda_check(cuda_driver().memcpy_htod_async(p, staged.keep(std::move(bytes)), nbytes,
                                             static_cast<CUstream>(stream)),
             "cuMemcpyHtoDAsync (ember_generate)");
}

// Integer ids as the dtype of `info` (int64 or int32), as host bytes.
std::vector<char> ids_as(const EmberTensorInfo& info, const std::vector<int64_t>& ids) {
  std::vector<char> out(ids.size() * size_t(info.dtype.bits / 8));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (info.dtype.bits == 64) {
      memcpy(out.data() + 8 * i, &ids[i], 8);
    } else {
      int32_t v = int32_t(ids[i]);
      memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

double load_float(const char* p, DLDataType t) {
  if (t.code == kDLBfloat) return bf16_to_float(*reinterpret_cast<const uint16_t*>(p));
  if (t.bits == 16) return half_to_float(*reinterpret_cast<const uint16_t*>(p));
  if (t.bits == 32) return *reinterpret_cast<const float*>(p);
  return *reinterpret_cast<const double*>(p);
}

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The next token from one row of logits (the header documents the rule).
int64_t choose(const std::vector<double>& logits, const EmberGenerateOptions& o, uint64_t* rng) {
  int64_t v = int64_t(logits.size());
  if (o.top_k <= 1) {
    int64_t best = 0;
    for (int64_t i = 1; i < v; ++i) {
      double a = logits[size_t(i)], b = logits[size_t(best)];
      if (!std::isnan(b) && (a > b || std::isnan(a))) best = i;  // NaN wins, as torch.argmax
    }
    return best;
  }
  for (double x : logits) {
    if (std::isnan(x)) fail(EMBER_ERR_RUNTIME, "ember_generate: the logits contain NaN");
  }
  int64_t k = std::min<int64_t>(o.top_k, v);
  std::vector<int64_t> idx(static_cast<size_t>(v));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    double x = logits[size_t(a)], y = logits[size_t(b)];
    return x > y || (x == y && a < b);
  });
  double top = logits[size_t(idx[0])], total = 0;
  std::vector<double> p(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    p[size_t(j)] = std::exp((logits[size_t(idx[size_t(j)])] - top) / double(o.temperature));
    total += p[size_t(j)];
  }
  double u = double(splitmix64(rng) >> 11) * 0x1.0p-53, cdf = 0;
  for (int64_t j = 0; j < k; ++j) {
    cdf += p[size_t(j)] / total;
    if (u < cdf) return idx[size_t(j)];
  }
  return idx[size_t(k - 1)];  // u above the rounded total
}

// Run `model` once on `in`; its outputs into `outputs`.
void run_plain(Model& model, std::vector<DLManagedTensor*>& in, size_t n_out, void* stream,
               std::vector<Owned>* outputs) {
  std::vector<DLManagedTensor*> raw(n_out, nullptr);
  model.run(in.data(), in.size(), raw.data(), n_out, stream);
  outputs->clear();
  for (DLManagedTensor* r : raw) outputs->emplace_back(r);
}

using AfterRun = std::function<void(const DLTensor& logits, void* stream)>;

// Greedy choice on the GPU (cuda_greedy.py's ember_greedy, which the package names): after each
// one-token step the kernel writes the best token of each row into the tokens input and into
// `chosen` (B x (max_positions + 1), int64, on the device) at the column of the step's position
// plus one, and advances the position input, so the steps queue back to back with no copy to
// the host between them. EMBER_GENERATE_GREEDY=host turns it off.
class DeviceGreedy {
 public:
  DeviceGreedy(const Model& model, size_t n_new, const EmberGenerateOptions& o) {
    const DecodeSpec& spec = model.decode();
    const char* env = getenv("EMBER_GENERATE_GREEDY");
    bool on = model.device().device_type == kDLCUDA && spec.greedy_kernel >= 0 &&
              o.top_k <= 1 && n_new >= 2 && !(env && std::string(env) == "host");
    if (on) kernel_ = int(spec.greedy_kernel);
  }
  bool on() const { return kernel_ >= 0; }

  // Queue the choice from `logits` (B, V), or the last row of (B, T, V), on `stream`.
  void launch(const Model& model, const DLTensor& logits, const DLTensor& tokens,
              const DLTensor& positions, const DLTensor& chosen, void* stream) const {
    auto at = [](const DLTensor& t) {
      return reinterpret_cast<CUdeviceptr>(static_cast<char*>(t.data) + t.byte_offset);
    };
    CUdeviceptr l = at(logits), tok = at(tokens), pos = at(positions), out = at(chosen);
    if (logits.ndim == 3) {
      int64_t stride = logits.strides ? logits.strides[1] : logits.shape[2];
      l += CUdeviceptr((logits.shape[1] - 1) * stride * itemsize(logits.dtype));
    }
    int64_t row = 1;  // the batch and the vocabulary are the kernel's, compiled in
    for (int i = 1; i < logits.ndim; ++i) row *= logits.shape[i];
    if (logits.strides) row = logits.strides[0];
    int64_t first = 0, width = chosen.shape[1];  // column: the position + 1
    void *scratch0 = nullptr, *scratch1 = nullptr;  // Triton >= 3.3's trailing scratch pointers
    void* args[] = {&l, &tok, &pos, &out, &row, &first, &width, &scratch0, &scratch1};
    const auto& k = model.desc().kernels[kernel_];
    CudaContextScope scope(model.device().device_id);
    cuda_check(cuda_driver().launch_kernel(model.function(kernel_), 1, 1, 1,
                                           uint32_t(32 * k.num_warps), 1, 1,
                                           uint32_t(k.shared_mem), static_cast<CUstream>(stream),
                                           args, nullptr),
               "launching ember_greedy");
  }

  // The new tokens of each row (chosen after positions prompt_len - 1 ..) into `out_tokens`.
  static void read(const DLTensor& chosen, size_t prompt_len, size_t n_new, int64_t* out_tokens,
                   void* stream) {
    int64_t batch = chosen.shape[0], width = chosen.shape[1];
    std::vector<int64_t> host(size_t(batch * width));
    DLTensor h = chosen;
    h.device = DLDevice{kDLCPU, 0};
    h.data = host.data();
    h.byte_offset = 0;
    h.strides = nullptr;
    EmberStatus st = ember_tensor_copy(&chosen, &h, stream);  // synchronises
    if (st != EMBER_OK) fail(st, ember_last_error());
    for (int64_t b = 0; b < batch; ++b) {
      for (size_t k = 0; k < n_new; ++k) {
        out_tokens[size_t(b) * n_new + k] = host[size_t(b * width) + prompt_len + k];
      }
    }
  }

 private:
  int kernel_ = -1;
};

// ember_generate's state on CUDA, kept by the model between calls (Model::take_session): a
// stream of its own; the caches, the one-token ids and positions and the greedy kernel's token
// array, allocated once from the pool on that stream (their addresses fixed); and the one-token
// step as a CUDA graph. The first one-token step of the session's first call runs plainly
// (which fills the pool's cache for the stream), the second is captured and launched, and every
// later one, of this call and of the next ones, relaunches it. Its intermediates are blocks the
// pool keeps for the stream, never handed to another stream's runs (pool.h); a later call's
// prompt runs may use them between replays, in stream order. A capture that fails turns the
// graph off for the rest of the call (its steps run plainly; the next call tries again);
// EMBER_GENERATE_GRAPHS=0, read at each call, turns it off for the call; =verbose says whether
// a call's steps replay a graph, and why not.
class Session {
 public:
  explicit Session(Model& model) : model_(model), device_(model.device()) {
    CudaContextScope scope(device_.device_id);
    cuda_check(cuda_driver().stream_create(&stream_, 1 /* CU_STREAM_NON_BLOCKING */),
               "cuStreamCreate (ember_generate)");
    if (!cuda_driver().has_graphs()) {
      never_ = "the driver lacks the CUDA graph API";
    } else if (!model.pool()->caches()) {  // the graph's scratch would go back to the caller
      never_ = "the model allocates through the caller's allocator";
    }
  }

  // At the start of each call: EMBER_GENERATE_GRAPHS, read again.
  void begin_call() {
    const char* env = getenv("EMBER_GENERATE_GRAPHS");
    disabled_ = env && std::string(env) == "0";
    verbose_ = env && std::string(env) == "verbose";
    said_ = false;
    failed_ = !never_.empty();  // a capture that failed in an earlier call is tried again
    if (failed_) say("one-token steps run plainly: " + never_);
  }
  ~Session() {
    try {
      const CudaDriver& cu = cuda_driver();
      CudaContextScope scope(device_.device_id);
      cu.stream_synchronize(stream_);
      drop_graph();
      model_.pool()->pin_stream(stream_, false);
      caches_.clear();  // their blocks go back to the pool, cached for this stream
      tokens_.reset();
      positions_.reset();
      chosen_.reset();
      model_.pool()->trim_stream(stream_);  // before the stream goes
      cu.stream_destroy(stream_);
    } catch (const Error&) {
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool graphs() const { return !failed_ && !disabled_; }
  void* stream() const { return stream_; }

  // The session's tensors, made at first use: the caches (in the order of spec.caches), the
  // one-token ids and positions, and the tokens chosen on the GPU.
  std::vector<Owned>& caches() { return caches_; }
  Owned& tokens() { return tokens_; }
  Owned& positions() { return positions_; }
  Owned& chosen() { return chosen_; }

  // The logits of one one-token step (plain runs leave their outputs in `plain`). `after`, if
  // given, queues work on the step's stream after each run that reads its logits (captured
  // with it into the graph); a graph captured with other `after` work is captured again.
  const DLTensor& step(std::vector<DLManagedTensor*>& in, size_t n_out, size_t logits,
                       std::vector<Owned>* plain, const AfterRun* after) {
    if (exec_ && with_after_ != (after != nullptr)) drop_graph();
    if (exec_ && graphs()) {
      launch();
      model_.count_run(1);
      return outputs_[logits]->dl_tensor;
    }
    if (warmed_ && graphs() && capture(in, n_out, logits, after)) {
      launch();  // this step's run (the capture counted it)
      return outputs_[logits]->dl_tensor;
    }
    warmed_ = true;
    run_plain(model_, in, n_out, stream_, plain);
    if (after) (*after)((*plain)[logits]->dl_tensor, stream_);
    return (*plain)[logits]->dl_tensor;
  }

 private:
  bool capture(std::vector<DLManagedTensor*>& in, size_t n_out, size_t logits,
               const AfterRun* after) {
    const CudaDriver& cu = cuda_driver();
    CudaContextScope scope(device_.device_id);
    CUresult begun = cu.stream_begin_capture(stream_, 1 /* thread-local */);
    if (begun != CUDA_SUCCESS) {
      off("cuStreamBeginCapture: " + std::to_string(int(begun)));
      return false;
    }
    std::vector<DLManagedTensor*> raw(n_out, nullptr);
    std::string why;
    const uint64_t counted = model_.run_count();
    try {
      model_.run(in.data(), in.size(), raw.data(), n_out, stream_);
    } catch (const Error& e) {
      why = std::string("the captured run failed: ") + e.what();
    }
    for (DLManagedTensor* r : raw) outputs_.emplace_back(r);
    try {
      if (why.empty() && after) (*after)(outputs_[logits]->dl_tensor, stream_);
    } catch (const Error& e) {
      why = std::string("the captured greedy kernel failed: ") + e.what();
    }
    CUgraph graph = nullptr;
    CUresult ended = cu.stream_end_capture(stream_, &graph);
    CUresult made = CUDA_SUCCESS;
    if (why.empty() && ended == CUDA_SUCCESS && graph &&
        (made = cu.graph_instantiate(&exec_, graph, 0)) == CUDA_SUCCESS) {
      graph_ = graph;
      with_after_ = after != nullptr;
      model_.pool()->pin_stream(stream_, true);  // the graph's scratch stays cached for it
      return true;
    }
    if (why.empty()) {
      why = ended != CUDA_SUCCESS ? "cuStreamEndCapture: " + std::to_string(int(ended))
                                  : "cuGraphInstantiate: " + std::to_string(int(made));
    }
    if (graph) cu.graph_destroy(graph);
    exec_ = nullptr;
    outputs_.clear();
    model_.count_run(-int(model_.run_count() - counted));  // nothing ran: the step runs plainly
    off(why);
    return false;
  }

  void drop_graph() {  // the stream is idle or its queued launches no longer need the graph
    const CudaDriver& cu = cuda_driver();
    if (exec_) cu.graph_exec_destroy(exec_);
    if (graph_) cu.graph_destroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    outputs_.clear();
  }

  void off(const std::string& why) {
    failed_ = true;
    warmed_ = false;  // the next call warms the stream's blocks again before it captures
    say("one-token steps run plainly: " + why);
  }

  void say(const std::string& what) {
    if (verbose_ && !said_) fprintf(stderr, "ember_generate: %s\n", what.c_str());
    said_ = true;
  }

  void launch() {
    say("one-token steps replay a CUDA graph");
    CudaContextScope scope(device_.device_id);
    cuda_check(cuda_driver().graph_launch(exec_, static_cast<CUstream>(stream_)), "cuGraphLaunch");
  }

  Model& model_;
  DLDevice device_;
  CUstream stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<Owned> outputs_;  // the captured run's outputs: the graph writes them
  std::vector<Owned> caches_;
  Owned tokens_, positions_, chosen_;
  std::string never_;  // why this session never captures, if it does not
  bool warmed_ = false, failed_ = false, with_after_ = false;
  bool disabled_ = false, verbose_ = false, said_ = false;  // this call's
};

}  // namespace

void generate(Model& model, const int64_t* prompt, size_t batch, size_t prompt_len, size_t n_new,
              const EmberGenerateOptions& o, int64_t* out_tokens) {
  const DecodeSpec& spec = model.decode();
  if (!spec.present) {
    fail(EMBER_ERR_UNSUPPORTED, "ember_generate: the model is not a decode-step package (its "
                                "manifest has no \"decode\" entry); package it with "
                                "ember.cpp_wrapper.package_decode_step");
  }
  const EmberTensorInfo& tok = model.input_info(size_t(spec.tokens));
  const EmberTensorInfo& pos = model.input_info(size_t(spec.positions));
  const EmberTensorInfo& lg = model.output_info(size_t(spec.logits));
  const bool prefill = spec.max_new_tokens > 1;  // package.cc checked the shapes then
  if (!prefill && (tok.ndim != 2 || tok.shape[1] != 1 || pos.ndim != 1 || pos.shape[0] != 1)) {
    fail(EMBER_ERR_UNSUPPORTED, "ember_generate feeds one token per step: the package's tokens "
                                "input must be (B, 1) and its positions (1,); export the step "
                                "with one new token");
  }
  bool logits_ok = lg.ndim == 2 || (lg.ndim == 3 && (lg.shape[1] == 1 || prefill));
  logits_ok = logits_ok && lg.shape[lg.ndim - 1] > 0;
  if (!logits_ok) {
    fail(EMBER_ERR_UNSUPPORTED, "ember_generate: the logits output must be (B, V) or (B, T, V)");
  }
  if (int64_t(batch) != tok.shape[0]) {
    fail(EMBER_ERR_INVALID_ARGUMENT, "ember_generate: batch " + std::to_string(batch) +
                                         ", the package was exported for " +
                                         std::to_string(tok.shape[0]));
  }
  if (prompt_len == 0) fail(EMBER_ERR_INVALID_ARGUMENT, "ember_generate: the prompt is empty");
  if (n_new == 0) return;
  size_t limit = size_t(spec.max_positions);  // checked first: the sum below cannot wrap
  size_t needed = prompt_len > limit || n_new > limit ? limit + 1 : prompt_len + n_new - 1;
  if (needed > limit) {
    fail(EMBER_ERR_INVALID_ARGUMENT,
         "ember_generate: " + std::to_string(prompt_len) + " prompt tokens and " +
             std::to_string(n_new) + " new ones need one position less than that (the last "
             "new token is not run); the caches hold " + std::to_string(spec.max_positions) +
             " positions");
  }
  if (!(o.temperature > 0) || !std::isfinite(o.temperature)) {
    fail(EMBER_ERR_INVALID_ARGUMENT, "ember_generate: temperature must be positive and finite");
  }
  int64_t vocab = lg.shape[lg.ndim - 1];
  for (size_t i = 0; i < batch * prompt_len; ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      fail(EMBER_ERR_INVALID_ARGUMENT, "ember_generate: prompt token " + std::to_string(prompt[i]) +
                                           " is outside the vocabulary [0, " +
                                           std::to_string(vocab) + ")");
    }
  }
  DLDevice device = model.device();
  // On CUDA the call runs in a session of the model's (a new one if none is idle), given back
  // when the call returns; a call that fails drops its session.
  std::shared_ptr<Session> session;
  if (device.device_type == kDLCUDA) {
    session = std::static_pointer_cast<Session>(model.take_session());
    if (!session) session = std::make_shared<Session>(model);
    session->begin_call();
  }
  struct GiveBack {
    Model& model;
    std::shared_ptr<Session>& session;
    ~GiveBack() {
      if (session && std::uncaught_exceptions() == 0) model.give_session(std::move(session));
    }
  } give_back{model, session};
  void* stream = session ? session->stream() : nullptr;
  Staged staged(stream);  // after give_back: synchronised while the session's stream exists
  const DeviceGreedy greedy(model, n_new, o);
  size_t n_in = size_t(model.desc().num_inputs), n_out = size_t(model.desc().num_outputs);
  std::vector<Owned> inputs(n_in);  // on the CPU, the call's caches
  std::vector<DLManagedTensor*> in(n_in);
  std::vector<Owned>* caches = session ? &session->caches() : nullptr;
  for (size_t j = 0; j < spec.caches.size(); ++j) {
    size_t c = size_t(spec.caches[j]);
    if (!caches) {
      inputs[c] = empty(model, stream, model.input_info(c), "cache");
      in[c] = inputs[c].get();
      continue;
    }
    if (caches->size() == j) caches->push_back(empty(model, stream, model.input_info(c), "cache"));
    in[c] = (*caches)[j].get();
  }
  for (int64_t c : spec.caches) {  // zeros: unwritten slots are masked, and 0 * NaN is NaN
    zero(in[size_t(c)]->dl_tensor, stream);
  }
  // The prompt runs in chunks of at most `chunk` tokens (the step's max_new_tokens; 1 without
  // a prefill step), positions continuing; then one token per run. The tokens and positions
  // inputs, by length: a full chunk, the prompt's last (shorter) chunk, one token (the
  // session's, which its graph reads).
  const size_t chunk = prefill ? size_t(spec.max_new_tokens) : 1;
  std::map<size_t, std::pair<Owned, Owned>> by_length;
  auto ids_for = [&](size_t t) -> std::pair<DLManagedTensor*, DLManagedTensor*> {
    Owned* ids = nullptr;
    Owned* at = nullptr;
    if (session && t == 1) {
      ids = &session->tokens();
      at = &session->positions();
    } else {
      ids = &by_length[t].first;
      at = &by_length[t].second;
    }
    if (!*ids) {
      *ids = empty(model, stream, tok, "tokens", int64_t(t));
      *at = empty(model, stream, pos, "positions", int64_t(t));
    }
    return {ids->get(), at->get()};
  };
  uint64_t rng = o.seed;
  std::vector<int64_t> current, where;
  std::vector<double> row(static_cast<size_t>(vocab));
  std::vector<char> host;
  auto token_at = [&](size_t b, size_t s) {  // the sequence so far: prompt, then new tokens
    return s < prompt_len ? prompt[b * prompt_len + s] : out_tokens[b * n_new + (s - prompt_len)];
  };
  // Greedy on the GPU (DeviceGreedy): every token is chosen there, the first (from the prompt's
  // last logits) too; one-token runs, the prompt's included, replay the session's graph with
  // the kernel in it, and nothing waits for the host until the tokens are read.
  DLManagedTensor* one_tok = nullptr;
  DLManagedTensor* one_pos = nullptr;
  Owned* chosen = nullptr;
  if (greedy.on()) {
    std::tie(one_tok, one_pos) = ids_for(1);
    chosen = &session->chosen();
    if (!*chosen) {
      chosen->reset(model.empty(DLDataType{kDLInt, 64, 1},
                                {int64_t(batch), spec.max_positions + 1}, stream));
    }
  }
  const AfterRun choose_next = [&](const DLTensor& logits, void* s) {
    greedy.launch(model, logits, one_tok->dl_tensor, one_pos->dl_tensor, (*chosen)->dl_tensor, s);
  };
  for (size_t done = 0;;) {  // `done`: positions the caches hold
    size_t t = done < prompt_len ? std::min(chunk, prompt_len - done) : 1;
    auto [tok_in, pos_in] = ids_for(t);
    current.assign(batch * t, 0);
    where.assign(t, 0);
    for (size_t j = 0; j < t; ++j) {
      where[j] = int64_t(done + j);
      for (size_t b = 0; b < batch; ++b) current[b * t + j] = token_at(b, done + j);
    }
    upload(tok_in->dl_tensor, ids_as(tok, current), stream, staged);
    upload(pos_in->dl_tensor, ids_as(pos, where), stream, staged);
    in[size_t(spec.tokens)] = tok_in;
    in[size_t(spec.positions)] = pos_in;
    std::vector<Owned> outputs;
    if (greedy.on()) {  // the kernel writes the next run's token and position, which later
      if (t == 1) {     // prompt runs overwrite
        session->step(in, n_out, size_t(spec.logits), &outputs, &choose_next);
      } else {
        const bool last = done + t == prompt_len;
        if (last) {  // its last position, for the kernel
          where.assign(1, int64_t(prompt_len - 1));
          upload(one_pos->dl_tensor, ids_as(pos, where), stream, staged);
        }
        run_plain(model, in, n_out, stream, &outputs);
        if (last) choose_next(outputs[size_t(spec.logits)]->dl_tensor, stream);
      }
      done += t;
      if (done == prompt_len) break;
      continue;
    }
    const DLTensor* logits = nullptr;
    if (t == 1 && session) {
      logits = &session->step(in, n_out, size_t(spec.logits), &outputs, nullptr);
    } else {
      run_plain(model, in, n_out, stream, &outputs);
      logits = &outputs[size_t(spec.logits)]->dl_tensor;
    }
    done += t;
    if (done < prompt_len) continue;  // a prompt chunk before the last: its logits unused
    const DLTensor& l = *logits;
    const char* base = static_cast<const char*>(l.data) + l.byte_offset;
    std::vector<int64_t> strides(static_cast<size_t>(l.ndim), 1);  // dense row-major
    for (int i = l.ndim - 2; i >= 0; --i) {
      strides[size_t(i)] = strides[size_t(i + 1)] * l.shape[i + 1];
    }
    if (l.device.device_type == kDLCPU && l.strides) strides.assign(l.strides, l.strides + l.ndim);
    if (l.device.device_type != kDLCPU) {  // to the host, dense
      host.resize(size_t(numel(l) * itemsize(l.dtype)));
      DLTensor h = l;
      h.device = DLDevice{kDLCPU, 0};
      h.data = host.data();
      h.byte_offset = 0;
      h.strides = nullptr;
      EmberStatus st = ember_tensor_copy(&l, &h, stream);
      if (st != EMBER_OK) fail(st, ember_last_error());
      base = host.data();
    }
    int64_t isz = itemsize(l.dtype), vs = strides[size_t(l.ndim - 1)];
    if (l.ndim == 3) base += (l.shape[1] - 1) * strides[1] * isz;  // the last new token's row
    size_t k = done - prompt_len;  // the new token these logits choose
    for (size_t b = 0; b < batch; ++b) {
      const char* r = base + int64_t(b) * strides[0] * isz;
      for (int64_t v = 0; v < vocab; ++v) row[size_t(v)] = load_float(r + v * vs * isz, l.dtype);
      out_tokens[b * n_new + k] = choose(row, o, &rng);
    }
    if (k + 1 == n_new) return;
  }
  // Greedy on the GPU, after the prompt: each run reads the token and position the kernel wrote
  in[size_t(spec.tokens)] = one_tok;
  in[size_t(spec.positions)] = one_pos;
  for (size_t k = 1; k < n_new; ++k) {
    std::vector<Owned> outputs;
    session->step(in, n_out, size_t(spec.logits), &outputs, &choose_next);
  }
  DeviceGreedy::read((*chosen)->dl_tensor, prompt_len, n_new, out_tokens, stream);
}

}  // namespace ember
