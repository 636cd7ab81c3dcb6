// AOT packages: manifest.json + model.so + weights.bin, verified before anything is mapped.
//
// Order matters: the manifest is parsed and its versions checked, then both files' sizes and
// SHA-256 are compared with the manifest, and only then is the library dlopen'ed (a truncated
// shared object can crash the dynamic loader) and the weights mapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "detail/common.h"
#include "detail/json.h"
#include "detail/model.h"
#include "detail/sha256.h"

namespace ember {

std::unique_ptr<Model> load_package(const std::string& dir, const EmberLoadOptions& options);

namespace {

constexpr const char* kFormat = "ember-package";
constexpr int64_t kFormatVersion = 1;
constexpr int64_t kIrVersion = 1;  // the IR versions whose artifacts this runtime runs

int64_t file_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return int64_t(st.st_size);
}

// A file named by the manifest: a plain name inside the package, of the recorded size and hash.
std::string verified_file(const std::string& dir, const Json& entry) {
  const std::string& name = entry["file"].as_string();
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    fail(EMBER_ERR_PACKAGE, "manifest names an invalid file '" + name + "'");
  }
  std::string path = dir + "/" + name;
  int64_t want = entry["size"].as_int(), got = file_size(path);
  if (got < 0) fail(EMBER_ERR_PACKAGE, "package file " + name + " is missing");
  if (got != want) {
    fail(EMBER_ERR_PACKAGE, "package file " + name + " has " + std::to_string(got) +
                                " bytes, the manifest says " + std::to_string(want) +
                                " (truncated or replaced?)");
  }
  if (sha256_file(path, uint64_t(want)) != entry["sha256"].as_string()) {
    fail(EMBER_ERR_PACKAGE, "package file " + name + " fails its SHA-256 check (corrupt?)");
  }
  return path;
}

Json read_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  int64_t size = file_size(path);
  if (size < 0) fail(EMBER_ERR_PACKAGE, dir + " is not an Ember package (no manifest.json)");
  if (size > (int64_t(64) << 20)) fail(EMBER_ERR_PACKAGE, "manifest.json is implausibly large");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  Json m = Json::parse(ss.str(), path);
  if (m.kind() != Json::kObject || !m.has("format") || m["format"].kind() != Json::kString ||
      m["format"].as_string() != kFormat) {
    fail(EMBER_ERR_PACKAGE, dir + " is not an Ember package (foreign manifest)");
  }
  auto check = [&](const char* key, int64_t want) {
    int64_t got = m[key].as_int();
    if (got != want) {
      fail(EMBER_ERR_VERSION, std::string("package ") + key + " is " + std::to_string(got) +
                                  "; this runtime reads " + std::to_string(want));
    }
  };
  check("format_version", kFormatVersion);
  check("abi_version", EMBER_ABI_VERSION);
  check("model_abi_version", EMBER_MODEL_ABI_VERSION);
  check("ir_version", kIrVersion);
  return m;
}

// Weights mapped read-only from the file (CPU) or copied into one device allocation (CUDA).
struct Weights {
  void* host = nullptr;
  size_t size = 0;
  CUdeviceptr device = 0;
  int device_id = 0;
  std::vector<std::vector<int64_t>> shapes, strides;
  ~Weights() {
    if (host) munmap(host, size);
    if (device) {
      try {
        CudaContextScope scope(device_id);
        cuda_driver().mem_free(device);
      } catch (const Error&) {
      }
    }
  }
};

std::shared_ptr<Weights> map_weights(const std::string& path, size_t size, bool cuda,
                                     int device_id) {
  auto w = std::make_shared<Weights>();
  if (size == 0) return w;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(EMBER_ERR_PACKAGE, "cannot open " + path);
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(EMBER_ERR_PACKAGE, "cannot map " + path);
  w->host = p;
  w->size = size;
  if (cuda) {
    CudaContextScope scope(device_id);
    const CudaDriver& cu = cuda_driver();
    cuda_check(cu.mem_alloc(&w->device, size), "cuMemAlloc (weights)");
    w->device_id = device_id;
    cuda_check(cu.memcpy_htod_async(w->device, p, size, nullptr), "cuMemcpyHtoD (weights)");
    cuda_check(cu.stream_synchronize(nullptr), "cuStreamSynchronize");
  }
  return w;
}

std::vector<ConstantArg> constants_of(const Json& manifest, Weights& w, DLDevice device) {
  std::vector<ConstantArg> out;
  const auto& list = manifest["constants"].as_array();
  w.shapes.resize(list.size());
  w.strides.resize(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& c = list[i];
    DLDataType dtype = dtype_from_name(c["dtype"].as_string());
    for (const Json& s : c["shape"].as_array()) w.shapes[i].push_back(s.as_int());
    for (const Json& s : c["strides"].as_array()) w.strides[i].push_back(s.as_int());
    int64_t offset = c["offset"].as_int(), nbytes = c["nbytes"].as_int();
    int64_t storage_offset = c["storage_offset"].as_int();
    if (offset < 0 || nbytes < 0 || uint64_t(offset + nbytes) > w.size ||
        w.shapes[i].size() != w.strides[i].size() || storage_offset < 0) {
      fail(EMBER_ERR_PACKAGE, "constant '" + c["name"].as_string() + "' lies outside weights.bin");
    }
    DLTensor t{};
    char* base = w.device ? reinterpret_cast<char*>(w.device) : static_cast<char*>(w.host);
    t.data = nbytes ? base + offset : base;
    t.device = device;
    t.ndim = int32_t(w.shapes[i].size());
    t.dtype = dtype;
    t.shape = w.shapes[i].data();
    t.strides = w.strides[i].data();
    t.byte_offset = uint64_t(storage_offset * itemsize(dtype));
    out.push_back({c["name"].as_string(), t});
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> load_package(const std::string& dir, const EmberLoadOptions& options) {
  Json manifest = read_manifest(dir);
  std::string library = verified_file(dir, manifest["library"]);
  std::string weights_path = verified_file(dir, manifest["weights"]);
  const std::string& isa = manifest["isa"].as_string();
  if (!cpu_supports_isa(isa)) {
    fail(EMBER_ERR_UNSUPPORTED, "the package was built for " + isa + ", which this CPU lacks");
  }
  const std::string& device_name = manifest["device"].as_string();
  bool cuda = device_name == "cuda";
  if (!cuda && device_name != "cpu") fail(EMBER_ERR_UNSUPPORTED, "package device " + device_name);
  DLDevice device{cuda ? kDLCUDA : kDLCPU, cuda ? options.device_id : 0};
  auto weights = map_weights(weights_path, size_t(manifest["weights"]["size"].as_int()), cuda,
                             options.device_id);
  auto constants = constants_of(manifest, *weights, device);
  return Model::open(library, constants, options, weights, manifest["artifact_hash"].as_string());
}

}  // namespace ember
