// AOT packages: manifest.json + model.so + weights.bin, verified before anything is mapped.
//
// A package is untrusted input. Order matters: the manifest is parsed and its versions checked;
// each file it names (a plain name inside the package, never a symlink) is opened once, and its
// size and SHA-256 are compared with the manifest through that descriptor; only then is the
// library dlopen'ed (through /proc/self/fd, so what is loaded is the inode that was hashed: a
// truncated or swapped shared object can crash the dynamic loader or run foreign code) and the
// weights mapped. Every field then read is checked against the library's own description (the
// hashed native code is the ground truth): inputs, outputs, and each constant's dtype, shape,
// strides, storage offset and byte range, which must tile weights.bin exactly as the writer
// (package.py) lays it out, so no offset can point a constant at other bytes.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>  // link_map (dlinfo)
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

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
constexpr int64_t kMaxManifest = int64_t(64) << 20;
constexpr int64_t kMaxFile = int64_t(1) << 44;  // 16 TiB: any real size; keeps sums far from overflow
constexpr size_t kMaxEntries = 1 << 16;        // inputs, outputs, constants, symbols
constexpr int64_t kAlign = 64;                 // package.py's ALIGN

[[noreturn]] void bad(const std::string& why) { fail(EMBER_ERR_PACKAGE, "manifest: " + why); }

// A manifest string as messages show it: printable ASCII, at most 80 characters.
std::string shown(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(char(c));
    } else {
      char hex[8];
      snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (s.size() > 80 ? "...'" : "'");
}

const Json& member(const Json& obj, const char* key, Json::Kind kind, const std::string& where) {
  static const char* kinds[] = {"null", "boolean", "number", "string", "array", "object"};
  if (obj.kind() != Json::kObject) bad(where + " must be an object");
  if (!obj.has(key)) bad(where + "." + key + " is missing");
  const Json& v = obj[key];
  if (v.kind() != kind) bad(where + "." + key + " must be a " + kinds[kind]);
  return v;
}

int64_t int_member(const Json& obj, const char* key, int64_t lo, int64_t hi,
                   const std::string& where) {
  const Json& v = member(obj, key, Json::kNumber, where);
  if (!v.is_integer() || v.as_int() < lo || v.as_int() > hi) {
    bad(where + "." + key + " must be an integer in [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  }
  return v.as_int();
}

const std::string& str_member(const Json& obj, const char* key, const std::string& where) {
  const std::string& s = member(obj, key, Json::kString, where).as_string();
  if (s.empty() || s.size() > 4096 || s.find('\0') != std::string::npos) {
    bad(where + "." + key + " must be a non-empty string without NUL, at most 4096 bytes");
  }
  return s;
}

const std::vector<Json>& array_member(const Json& obj, const char* key, size_t max,
                                      const std::string& where) {
  const auto& a = member(obj, key, Json::kArray, where).as_array();
  if (a.size() > max) bad(where + "." + key + " has more than " + std::to_string(max) + " items");
  return a;
}

// An open file of the package: the descriptor its checks were made through.
struct File {
  int fd = -1;
  int64_t size = 0;
  std::string path;
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  // A path that names this very inode (for dlopen), where /proc is mounted. dlopen hands back a
  // loaded library whose name is the same string, whatever file that name points at now: a
  // package's library loaded as /proc/self/fd/5 stays loaded under that name after its descriptor
  // is closed, so the next package opened as fd 5 would get it. The same holds for every name a
  // library was found under later: glibc adds a name that reached an already loaded inode to
  // that library's names (the same package loaded twice, its second descriptor 9, makes
  // /proc/self/fd/9 a name of the first load). So a number that another file's library answers
  // to is swapped for a higher one; failing that, the package's own path is used (the hash
  // check after dlopen refuses a wrong library, never runs it).
  std::string stable_path() {
    for (int tries = 0; tries < 256; ++tries) {
      std::string p = "/proc/self/fd/" + std::to_string(fd);
      if (access(p.c_str(), R_OK) != 0) return path;
      if (loads_this_file(p)) return p;
      int higher = fcntl(fd, F_DUPFD_CLOEXEC, fd + 1);
      if (higher < 0) break;
      ::close(fd);
      fd = higher;
    }
    return path;
  }

 private:
  // Would dlopen(name) give this very file's library? Yes where no loaded library answers to
  // `name` (dlopen then loads the file the name points at: this one), and where the library
  // that answers was mapped from this file, by (st_dev, st_ino): the same package loaded again,
  // whose library is the right one (asking by a new name made it a name of that library, as
  // the dlopen that follows would). No where another file's library answers to it, or where
  // which file that is cannot be told (then a higher number is tried, as for another file).
  bool loads_this_file(const std::string& name) const {
    void* h = dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return true;
    link_map* lm = nullptr;
    bool same = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr &&
                mapped_from_this_file(reinterpret_cast<uintptr_t>(lm->l_ld));
    dlclose(h);
    return same;
  }

  // Is the memory at `address` mapped from the file open as `fd`? A library's names cannot
  // tell which file it is (a package's library is named /proc/self/fd/N, a descriptor closed
  // since and maybe another file's now); /proc/self/maps gives the device and inode of the file
  // each mapping came from (here the one holding the library's dynamic section). Where it
  // disagrees with fstat (an overlay filesystem may show the file beneath), the answer is no.
  bool mapped_from_this_file(uintptr_t address) const {
    struct stat st;
    if (fstat(fd, &st) != 0) return false;
    FILE* maps = fopen("/proc/self/maps", "re");
    if (!maps) return false;
    bool same = false;
    char line[4096];  // "lo-hi perms offset major:minor inode path"
    while (fgets(line, sizeof line, maps)) {
      unsigned long lo, hi, inode;
      unsigned major_, minor_;
      if (sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &lo, &hi, &major_, &minor_, &inode) != 5) {
        continue;  // (the rest of a line longer than the buffer)
      }
      if (address >= lo && address < hi) {
        same = makedev(major_, minor_) == st.st_dev && inode == st.st_ino;
        break;
      }
    }
    fclose(maps);
    return same;
  }
};

// Open `name` in `dir` as a regular file (no symlink, FIFO or device: O_NONBLOCK so a FIFO
// cannot block the open). Returns false when there is no such entry.
bool open_regular(const std::string& dir, const std::string& name, File* f) {
  f->path = dir + "/" + name;
  f->fd = ::open(f->path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f->fd < 0) {
    if (errno == ENOENT) return false;
    fail(EMBER_ERR_PACKAGE, "cannot open package file " + shown(name) + ": " +
                                (errno == ELOOP ? "it is a symlink" : strerror(errno)));
  }
  struct stat st;
  if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    fail(EMBER_ERR_PACKAGE, "package file " + shown(name) + " is not a regular file");
  }
  f->size = int64_t(st.st_size);
  return true;
}

// Read from the descriptor, from its start, exactly `size` bytes into `sink` (chunked).
template <typename Sink>
void read_all(const File& f, int64_t size, Sink sink) {
  std::vector<char> buf(size_t(1) << 20);
  int64_t done = 0;
  while (done < size) {
    size_t want = size_t(std::min<int64_t>(size - done, int64_t(buf.size())));
    ssize_t got = pread(f.fd, buf.data(), want, done);
    if (got <= 0) fail(EMBER_ERR_PACKAGE, f.path + " is truncated or unreadable");
    sink(buf.data(), size_t(got));
    done += got;
  }
}

// A plain file name: it cannot leave the package directory or name a hidden file.
void check_name(const std::string& name, const std::string& where) {
  if (name.size() > 255 || name.find('/') != std::string::npos || name[0] == '.') {
    bad(where + " names an invalid file " + shown(name) + " (a plain name inside the package)");
  }
}

// The file an entry {file, size, sha256} names, of the recorded size and hash.
void verified_file(const std::string& dir, const Json& manifest, const char* key, File* f) {
  const Json& entry = member(manifest, key, Json::kObject, "manifest");
  std::string where = key;
  const std::string& name = str_member(entry, "file", where);
  check_name(name, where + ".file");
  if (name == "manifest.json") bad(where + ".file names the manifest itself");
  int64_t want = int_member(entry, "size", 0, kMaxFile, where);
  const std::string& digest = str_member(entry, "sha256", where);
  if (!open_regular(dir, name, f)) fail(EMBER_ERR_PACKAGE, "package file " + name + " is missing");
  if (f->size != want) {
    fail(EMBER_ERR_PACKAGE, "package file " + name + " has " + std::to_string(f->size) +
                                " bytes, the manifest says " + std::to_string(want) +
                                " (truncated or replaced?)");
  }
  Sha256 h;
  read_all(*f, want, [&](const char* p, size_t n) { h.update(p, n); });
  if (h.hexdigest() != digest) {
    fail(EMBER_ERR_PACKAGE, "package file " + name + " fails its SHA-256 check (corrupt?)");
  }
}

Json read_manifest(const std::string& dir) {
  File f;
  if (!open_regular(dir, "manifest.json", &f)) {
    fail(EMBER_ERR_PACKAGE, dir + " is not an Ember package (no manifest.json)");
  }
  if (f.size > kMaxManifest) fail(EMBER_ERR_PACKAGE, "manifest.json is implausibly large");
  std::string text;
  read_all(f, f.size, [&](const char* p, size_t n) { text.append(p, n); });
  Json m = Json::parse(text, f.path);
  if (m.kind() != Json::kObject || !m.has("format") || m["format"].kind() != Json::kString ||
      m["format"].as_string() != kFormat) {
    fail(EMBER_ERR_PACKAGE, dir + " is not an Ember package (foreign manifest)");
  }
  auto check = [&](const char* key, int64_t want) {
    int64_t got = int_member(m, key, INT64_MIN, INT64_MAX, "manifest");
    if (got != want) {
      fail(EMBER_ERR_VERSION, std::string("package ") + key + " is " + std::to_string(got) +
                                  "; this runtime reads " + std::to_string(want));
    }
  };
  check("format_version", kFormatVersion);
  check("abi_version", EMBER_ABI_VERSION);
  check("model_abi_version", EMBER_MODEL_ABI_VERSION);
  check("ir_version", kIrVersion);
  if (m.has("ir_version_written_by")) {  // descriptive only: which ember.ir wrote the package
    int_member(m, "ir_version_written_by", 0, INT32_MAX, "manifest");
  }
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

std::shared_ptr<Weights> map_weights(const File& f, bool cuda, int device_id) {
  auto w = std::make_shared<Weights>();
  if (f.size == 0) return w;
  size_t size = size_t(f.size);
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (p == MAP_FAILED) fail(EMBER_ERR_PACKAGE, "cannot map " + f.path);
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

// One dimension list (shape or strides) of a manifest tensor against the library's: static
// entries must be equal integers, symbolic ones (-1) a string (the symbol's name when given).
void check_dims(const Json& t, const char* key, const ember_abi::TensorDesc& want,
                const int64_t* dims, const std::string& where) {
  const auto& got = array_member(t, key, EMBER_MAX_DIMS, where);
  if (int64_t(got.size()) != want.ndim) {
    bad(where + "." + key + " has " + std::to_string(got.size()) + " dimensions; the library's " +
        std::to_string(want.ndim));
  }
  for (int d = 0; d < want.ndim; ++d) {
    const Json& g = got[size_t(d)];
    bool ok = dims[d] >= 0 ? g.is_integer() && g.as_int() == dims[d]
                           : g.kind() == Json::kString && g.as_string().size() <= 4096 &&
                                 (dims != want.shape || !want.dim_names || !want.dim_names[d] ||
                                  g.as_string() == want.dim_names[d]);
    if (!ok) bad(where + "." + key + "[" + std::to_string(d) + "] differs from the library's");
  }
}

// The inputs' or outputs' entries name, in order, the library's tensors with their dtypes,
// shapes and strides.
void check_interface(const Json& manifest, const char* key, const ember_abi::TensorDesc* descs,
                     int32_t n) {
  const auto& list = array_member(manifest, key, kMaxEntries, "manifest");
  if (int64_t(list.size()) != n) {
    bad(std::string(key) + " lists " + std::to_string(list.size()) + " tensors; the library has " +
        std::to_string(n));
  }
  for (int32_t i = 0; i < n; ++i) {
    const Json& t = list[size_t(i)];
    std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    const ember_abi::TensorDesc& want = descs[i];
    if (str_member(t, "name", where) != want.name) bad(where + ".name differs from the library's");
    if (str_member(t, "dtype", where) != dtype_name(want.dtype)) {
      bad(where + ".dtype differs from the library's (" + dtype_name(want.dtype) + ")");
    }
    check_dims(t, "shape", want, want.shape, where);
    check_dims(t, "strides", want, want.strides, where);
  }
}

// Symbols are descriptive (the library enforces the ranges it was compiled with): their form
// is checked, and they must name each symbolic size of the library's inputs exactly once.
void check_symbols(const Json& manifest, const ember_abi::ModelDesc& d) {
  std::vector<std::string> dynamic;  // the library's dynamic size names, each once
  for (int k = 0; k < d.num_inputs; ++k) {
    const auto& t = d.inputs[k];
    for (int j = 0; t.dim_names && j < t.ndim; ++j) {
      if (t.dim_names[j] && std::find(dynamic.begin(), dynamic.end(), t.dim_names[j]) == dynamic.end()) {
        dynamic.push_back(t.dim_names[j]);
      }
    }
  }
  const auto& list = array_member(manifest, "symbols", kMaxEntries, "manifest");
  std::vector<std::string> named;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string where = "symbols[" + std::to_string(i) + "]";
    const std::string& name = str_member(list[i], "name", where);
    int64_t lower = int_member(list[i], "lower", 0, INT64_MAX, where);
    const Json& upper = list[i]["upper"];  // an object: str_member checked it
    if (!upper.is_null() && !(upper.is_integer() && upper.as_int() >= lower)) {
      bad(where + ".upper must be null or an integer >= lower");
    }
    if (std::find(dynamic.begin(), dynamic.end(), name) == dynamic.end()) {
      bad(where + " names " + shown(name) + ", no dynamic size of the library's inputs");
    }
    if (std::find(named.begin(), named.end(), name) != named.end()) bad(where + " repeats " + shown(name));
    named.push_back(name);
  }
  for (const std::string& name : dynamic) {  // sizes like "2*s0" are expressions, not symbols
    bool symbol = std::all_of(name.begin(), name.end(), [](char c) { return isalnum(c) || c == '_'; });
    if (symbol && std::find(named.begin(), named.end(), name) == named.end()) {
      bad("symbols does not list the dynamic size " + shown(name));
    }
  }
}

// The constants' entries, checked against the library and laid over the mapped weights. Each
// names the library's constant of the same index, with its dtype, shape, strides and storage
// offset, and spans exactly its storage bytes at the next 64-byte boundary after the previous
// one; together they end where weights.bin ends. Offsets are then never trusted, only checked.
std::vector<ConstantArg> constants_of(const Json& manifest, const ember_abi::ModelDesc& d,
                                      Weights& w, DLDevice device) {
  const auto& list = array_member(manifest, "constants", kMaxEntries, "manifest");
  if (int64_t(list.size()) != d.num_constants) {
    bad("constants lists " + std::to_string(list.size()) + " tensors; the library has " +
        std::to_string(d.num_constants));
  }
  std::vector<ConstantArg> out;
  w.shapes.assign(list.size(), {});
  w.strides.assign(list.size(), {});
  int64_t end = 0;  // bytes of weights.bin accounted for so far
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& c = list[i];
    const ember_abi::TensorDesc& want = d.constants[i];
    std::string where = "constants[" + std::to_string(i) + "]";
    const std::string& name = str_member(c, "name", where);
    if (name != want.name) bad(where + ".name is " + shown(name) + "; the library's is " + shown(want.name));
    where = "constant '" + name + "'";
    DLDataType dtype = dtype_from_name(str_member(c, "dtype", where));
    if (dtype.code != want.dtype.code || dtype.bits != want.dtype.bits) {
      bad(where + " has dtype " + dtype_name(dtype) + "; the library's is " + dtype_name(want.dtype));
    }
    check_dims(c, "shape", want, want.shape, where);
    check_dims(c, "strides", want, want.strides, where);
    for (int k = 0; k < want.ndim; ++k) {
      w.shapes[i].push_back(want.shape[k]);
      w.strides[i].push_back(want.strides[k]);
    }
    int64_t storage_offset = int_member(c, "storage_offset", 0, kMaxFile, where);
    int64_t offset = int_member(c, "offset", 0, kMaxFile, where);
    int64_t nbytes = int_member(c, "nbytes", 0, kMaxFile, where);
    if (storage_offset != want.storage_offset) bad(where + ": storage_offset differs from the library's");
    if (want.storage_nbytes < 0 || nbytes != want.storage_nbytes) {
      bad(where + " spans " + std::to_string(nbytes) + " bytes; the library reads " +
          std::to_string(want.storage_nbytes));
    }
    int64_t expected = (end + kAlign - 1) / kAlign * kAlign;  // package.py pads before each one
    if (offset != expected) {
      bad(where + " is at byte " + std::to_string(offset) + " of weights.bin; the layout puts it at " +
          std::to_string(expected));
    }
    end = offset + nbytes;  // both below 2^44: no overflow
    if (end > int64_t(w.size)) bad(where + " lies outside weights.bin");
    DLTensor t{};
    char* base = w.device ? reinterpret_cast<char*>(w.device) : static_cast<char*>(w.host);
    t.data = nbytes ? base + offset : base;
    t.device = device;
    t.ndim = want.ndim;
    t.dtype = dtype;
    t.shape = w.shapes[i].data();
    t.strides = w.strides[i].data();
    t.byte_offset = uint64_t(storage_offset) * uint64_t(itemsize(dtype));
    out.push_back({name, t});
  }
  if (end != int64_t(w.size)) {
    bad("the constants cover " + std::to_string(end) + " bytes of weights.bin's " +
        std::to_string(w.size));
  }
  return out;
}

// A prefill-capable decode step (max_new_tokens > 1): tokens (B, T) and positions (T,) share one
// dynamic size T whose range is [1, max_new_tokens], so ember_generate may run a prompt in chunks
// of up to max_new_tokens tokens and then single tokens through the same library.
void check_prefill(const Json& manifest, const ember_abi::ModelDesc& d, const DecodeSpec& spec) {
  const std::string where = "manifest.decode.max_new_tokens";
  const ember_abi::TensorDesc& tok = d.inputs[spec.tokens];
  const ember_abi::TensorDesc& pos = d.inputs[spec.positions];
  bool ok = tok.ndim == 2 && pos.ndim == 1 && tok.shape[0] >= 0 && tok.shape[1] < 0 &&
            pos.shape[0] < 0 && tok.dim_names && pos.dim_names && tok.dim_names[1] &&
            pos.dim_names[0] && std::string(tok.dim_names[1]) == pos.dim_names[0];
  if (!ok) {
    bad(where + " > 1 needs tokens (B, T) and positions (T,) sharing a dynamic size T");
  }
  const std::string name = tok.dim_names[1];
  for (const Json& s : array_member(manifest, "symbols", kMaxEntries, "manifest")) {
    if (str_member(s, "name", "symbols") != name) continue;
    const Json& upper = s["upper"];
    if (s["lower"].as_int() > 1 || !upper.is_integer() || upper.as_int() != spec.max_new_tokens) {
      bad(where + ": the range of " + shown(name) + " must be [1, " +
          std::to_string(spec.max_new_tokens) + "]");
    }
    return;
  }
  bad(where + ": symbols does not list " + shown(name));
}

// The optional "decode" entry (package_decode_step): input and output indices in range, distinct,
// and of the kinds ember_generate needs (integer tokens/positions, floating caches and logits).
DecodeSpec decode_spec(const Json& manifest, const ember_abi::ModelDesc& d) {
  DecodeSpec spec;
  if (!manifest.has("decode")) return spec;
  const std::string where = "manifest.decode";
  const Json& e = member(manifest, "decode", Json::kObject, "manifest");
  spec.present = true;
  spec.tokens = int_member(e, "tokens", 0, d.num_inputs - 1, where);
  spec.positions = int_member(e, "positions", 0, d.num_inputs - 1, where);
  spec.logits = int_member(e, "logits", 0, d.num_outputs - 1, where);
  spec.max_positions = int_member(e, "max_positions", 1, int64_t(1) << 40, where);
  std::vector<bool> seen(size_t(d.num_inputs), false);
  seen[size_t(spec.tokens)] = true;
  if (seen[size_t(spec.positions)]) bad(where + ": tokens and positions are the same input");
  seen[size_t(spec.positions)] = true;
  for (const Json& c : array_member(e, "caches", size_t(d.num_inputs), where)) {
    bool ok = c.is_integer() && c.as_int() >= 0 && c.as_int() < d.num_inputs;
    if (!ok || seen[size_t(c.as_int())]) {
      bad(where + ".caches must list other inputs, each once");
    }
    seen[size_t(c.as_int())] = true;
    spec.caches.push_back(c.as_int());
  }
  for (int i = 0; i < d.num_inputs; ++i) {
    if (!seen[size_t(i)]) bad(where + " does not say what input " + std::to_string(i) + " is");
  }
  auto is_int = [](DLDataType t) { return t.code == kDLInt && (t.bits == 64 || t.bits == 32); };
  auto is_float = [](DLDataType t) { return t.code == kDLFloat || t.code == kDLBfloat; };
  if (!is_int(d.inputs[spec.tokens].dtype) || !is_int(d.inputs[spec.positions].dtype)) {
    bad(where + ": tokens and positions must be int64 or int32 inputs");
  }
  for (int64_t c : spec.caches) {
    if (!is_float(d.inputs[c].dtype)) bad(where + ": cache inputs must be floating point");
  }
  if (!is_float(d.outputs[spec.logits].dtype)) bad(where + ": the logits must be floating point");
  if (e.has("max_new_tokens")) {
    spec.max_new_tokens = int_member(e, "max_new_tokens", 1, spec.max_positions, where);
  }
  if (spec.max_new_tokens > 1) check_prefill(manifest, d, spec);
  if (e.has("greedy_kernel")) {
    const std::string& name = str_member(e, "greedy_kernel", where);
    for (int i = 0; i < d.num_kernels && spec.greedy_kernel < 0; ++i) {
      bool triton = std::string(d.kernels[i].language) == "triton";
      if (triton && name == d.kernels[i].name) spec.greedy_kernel = i;
    }
    if (spec.greedy_kernel < 0) bad(where + ".greedy_kernel: no Triton kernel " + shown(name));
  }
  return spec;
}

}  // namespace

std::unique_ptr<Model> load_package(const std::string& dir, const EmberLoadOptions& options) {
  Json manifest = read_manifest(dir);
  File library, weights_file;
  verified_file(dir, manifest, "library", &library);
  verified_file(dir, manifest, "weights", &weights_file);
  if (str_member(manifest["library"], "file", "library") ==
      str_member(manifest["weights"], "file", "weights")) {
    bad("library and weights name the same file");
  }
  const std::string& isa = str_member(manifest, "isa", "manifest");
  if (!cpu_supports_isa(isa)) {
    fail(EMBER_ERR_UNSUPPORTED, "the package was built for " + shown(isa) + ", which this CPU lacks");
  }
  const std::string& device_name = str_member(manifest, "device", "manifest");
  bool cuda = device_name == "cuda";
  if (!cuda && device_name != "cpu") fail(EMBER_ERR_UNSUPPORTED, "package device " + shown(device_name));
  const std::string& hash = str_member(manifest, "artifact_hash", "manifest");
  DLDevice device{cuda ? kDLCUDA : kDLCPU, cuda ? options.device_id : 0};
  auto weights = map_weights(weights_file, cuda, options.device_id);
  auto constants = [&](const ember_abi::ModelDesc& d) {
    if (isa != d.isa) bad("isa " + shown(isa) + " differs from the library's (" + d.isa + ")");
    if ((d.device_type == kDLCUDA) != cuda) bad("device differs from the library's");
    check_interface(manifest, "inputs", d.inputs, d.num_inputs);
    check_interface(manifest, "outputs", d.outputs, d.num_outputs);
    check_symbols(manifest, d);
    return constants_of(manifest, d, *weights, device);
  };
  // The descriptor stays open until the library is loaded: /proc/self/fd/N names the hashed inode.
  auto model = Model::open(library.stable_path(), constants, options, weights, hash);
  model->set_decode(decode_spec(manifest, model->desc()));
  return model;
}

}  // namespace ember
