// ember_generate: greedy and top-k decoding with a decode-step package (the prompt in runs of up
// to max_new_tokens tokens when the step takes a dynamic number of new tokens, else token by
// token; then one token per run), its caches allocated per call and updated in place by each run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
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
Owned empty(DLDevice device, const EmberTensorInfo& info, const std::string& what,
            int64_t t = -1) {
  std::vector<int64_t> shape(info.shape, info.shape + info.ndim);
  for (int64_t& n : shape) {
    if (n < 0 && t < 0) {
      fail(EMBER_ERR_UNSUPPORTED, "ember_generate: the " + what + " input '" + info.name +
                                      "' has a dynamic size; only the new tokens' count may be");
    }
    if (n < 0) n = t;
  }
  DLManagedTensor* out = nullptr;
  EmberStatus st = ember_tensor_empty(device, info.dtype, info.ndim, shape.data(), &out);
  if (st != EMBER_OK) fail(st, ember_last_error());
  return Owned(out);
}

int64_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// `bytes` (host) into `t` (dense, on the model's device).
void upload(const DLTensor& t, const void* bytes, void* stream) {
  if (t.device.device_type == kDLCPU) {
    memcpy(t.data, bytes, size_t(numel(t) * itemsize(t.dtype)));
    return;
  }
  DLTensor host = t;
  host.device = DLDevice{kDLCPU, 0};
  host.data = const_cast<void*>(bytes);
  EmberStatus st = ember_tensor_copy(&host, &t, stream);
  if (st != EMBER_OK) fail(st, ember_last_error());
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

// The one-token steps of one ember_generate call on CUDA as a CUDA graph: the first runs
// plainly (which fills the pool's cache for this call's stream), the second is captured and
// launched, the later ones relaunch it. The step's inputs (the one-token ids and positions, the
// caches) and the pool's blocks keep their addresses: the ids and positions are uploaded before
// each launch, and the blocks of the call's own stream, cached by the pool, are never handed to
// another stream's runs (pool.h). A capture that fails (an op that synchronises, an allocation
// the cache cannot serve) turns the graph off for the call: its steps run plainly.
// EMBER_GENERATE_GRAPHS=0 turns it off; =verbose says whether a call's steps replay a graph,
// and why not.
class StepGraph {
 public:
  explicit StepGraph(const Model& model) : device_(model.device()), pool_(model.pool()) {
    if (device_.device_type != kDLCUDA) return;
    const char* env = getenv("EMBER_GENERATE_GRAPHS");
    if (env && std::string(env) == "0") return;
    verbose_ = env && std::string(env) == "verbose";
    const CudaDriver& cu = cuda_driver();
    if (!cu.has_graphs()) {
      off("the driver lacks the CUDA graph API");
      return;
    }
    CudaContextScope scope(device_.device_id);
    CUresult r = cu.stream_create(&stream_, 1 /* CU_STREAM_NON_BLOCKING */);
    if (r != CUDA_SUCCESS) {
      stream_ = nullptr;
      off("cuStreamCreate: " + std::to_string(int(r)));
    }
  }
  ~StepGraph() {
    if (!stream_) return;
    try {
      const CudaDriver& cu = cuda_driver();
      CudaContextScope scope(device_.device_id);
      cu.stream_synchronize(stream_);
      if (exec_) cu.graph_exec_destroy(exec_);
      if (graph_) cu.graph_destroy(graph_);
      outputs_.clear();  // their blocks go back to the pool, cached for this stream
      pool_->trim_stream(stream_);
      cu.stream_destroy(stream_);
    } catch (const Error&) {
    }
  }
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  bool on() const { return stream_ != nullptr && !failed_; }
  void* stream() const { return stream_; }

  // The logits of one one-token step (plain runs leave their outputs in `plain`).
  const DLTensor& step(Model& model, std::vector<DLManagedTensor*>& in, size_t n_out,
                       size_t logits, std::vector<Owned>* plain) {
    if (exec_) {
      launch();
      model.count_run(1);
      return outputs_[logits]->dl_tensor;
    }
    if (warmed_ && capture(model, in, n_out)) {
      launch();  // this step's run (the capture counted it)
      return outputs_[logits]->dl_tensor;
    }
    warmed_ = true;
    run_plain(model, in, n_out, stream_, plain);
    return (*plain)[logits]->dl_tensor;
  }

 private:
  bool capture(Model& model, std::vector<DLManagedTensor*>& in, size_t n_out) {
    const CudaDriver& cu = cuda_driver();
    CudaContextScope scope(device_.device_id);
    CUresult begun = cu.stream_begin_capture(stream_, 1 /* thread-local */);
    if (begun != CUDA_SUCCESS) {
      off("cuStreamBeginCapture: " + std::to_string(int(begun)));
      return false;
    }
    std::vector<DLManagedTensor*> raw(n_out, nullptr);
    std::string why;
    const uint64_t counted = model.run_count();
    try {
      model.run(in.data(), in.size(), raw.data(), n_out, stream_);
    } catch (const Error& e) {
      why = std::string("the captured run failed: ") + e.what();
    }
    for (DLManagedTensor* r : raw) outputs_.emplace_back(r);
    CUgraph graph = nullptr;
    CUresult ended = cu.stream_end_capture(stream_, &graph);
    CUresult made = CUDA_SUCCESS;
    if (why.empty() && ended == CUDA_SUCCESS && graph &&
        (made = cu.graph_instantiate(&exec_, graph, 0)) == CUDA_SUCCESS) {
      graph_ = graph;
      if (verbose_) fprintf(stderr, "ember_generate: one-token steps replay a CUDA graph\n");
      return true;
    }
    if (why.empty()) {
      why = ended != CUDA_SUCCESS ? "cuStreamEndCapture: " + std::to_string(int(ended))
                                  : "cuGraphInstantiate: " + std::to_string(int(made));
    }
    if (graph) cu.graph_destroy(graph);
    exec_ = nullptr;
    outputs_.clear();
    model.count_run(-int(model.run_count() - counted));  // nothing ran: the step runs plainly
    off(why);
    return false;
  }

  void off(const std::string& why) {
    failed_ = true;
    if (verbose_) fprintf(stderr, "ember_generate: one-token steps run plainly: %s\n", why.c_str());
  }

  void launch() {
    CudaContextScope scope(device_.device_id);
    cuda_check(cuda_driver().graph_launch(exec_, static_cast<CUstream>(stream_)), "cuGraphLaunch");
  }

  DLDevice device_;
  std::shared_ptr<Pool> pool_;
  CUstream stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<Owned> outputs_;  // the captured run's outputs: the graph writes them
  bool warmed_ = false, failed_ = false, verbose_ = false;
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
  StepGraph graph(model);  // destroyed last: after the tensors its launches read
  void* stream = device.device_type == kDLCPU ? nullptr : graph.on() ? graph.stream() : o.stream;
  size_t n_in = size_t(model.desc().num_inputs), n_out = size_t(model.desc().num_outputs);
  std::vector<Owned> inputs(n_in);
  // The prompt runs in chunks of at most `chunk` tokens (the step's max_new_tokens; 1 without
  // a prefill step), positions continuing; then one token per run. The tokens and positions
  // inputs, by length: a full chunk, the prompt's last (shorter) chunk, one token.
  const size_t chunk = prefill ? size_t(spec.max_new_tokens) : 1;
  std::map<size_t, std::pair<Owned, Owned>> by_length;
  auto ids_for = [&](size_t t) -> std::pair<Owned, Owned>& {
    auto& p = by_length[t];
    if (!p.first) {
      p.first = empty(device, tok, "tokens", int64_t(t));
      p.second = empty(device, pos, "positions", int64_t(t));
    }
    return p;
  };
  for (int64_t c : spec.caches) {  // zeros: unwritten slots are masked, and 0 * NaN is NaN
    Owned t = empty(device, model.input_info(size_t(c)), "cache");
    std::vector<char> zeros(size_t(numel(t->dl_tensor) * itemsize(t->dl_tensor.dtype)), 0);
    upload(t->dl_tensor, zeros.data(), stream);
    inputs[size_t(c)] = std::move(t);
  }
  std::vector<DLManagedTensor*> in(n_in);
  for (size_t i = 0; i < n_in; ++i) in[i] = inputs[i].get();
  uint64_t rng = o.seed;
  std::vector<int64_t> current, where;
  std::vector<double> row(static_cast<size_t>(vocab));
  std::vector<char> host;
  auto token_at = [&](size_t b, size_t s) {  // the sequence so far: prompt, then new tokens
    return s < prompt_len ? prompt[b * prompt_len + s] : out_tokens[b * n_new + (s - prompt_len)];
  };
  for (size_t done = 0;;) {  // `done`: positions the caches hold
    size_t t = done < prompt_len ? std::min(chunk, prompt_len - done) : 1;
    DLManagedTensor* tok_in = ids_for(t).first.get();
    DLManagedTensor* pos_in = ids_for(t).second.get();
    current.assign(batch * t, 0);
    where.assign(t, 0);
    for (size_t j = 0; j < t; ++j) {
      where[j] = int64_t(done + j);
      for (size_t b = 0; b < batch; ++b) current[b * t + j] = token_at(b, done + j);
    }
    upload(tok_in->dl_tensor, ids_as(tok, current).data(), stream);
    upload(pos_in->dl_tensor, ids_as(pos, where).data(), stream);
    in[size_t(spec.tokens)] = tok_in;
    in[size_t(spec.positions)] = pos_in;
    std::vector<Owned> outputs;
    const DLTensor* logits = nullptr;
    if (t == 1 && graph.on()) {
      logits = &graph.step(model, in, n_out, size_t(spec.logits), &outputs);
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
}

}  // namespace ember
