// .npy files: a magic string, a version, a Python-dict header, then the raw array bytes.
#include "detail/npy.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "detail/common.h"

namespace ember {

namespace {

struct Descr {
  const char* text;
  uint8_t code, bits;
};
constexpr Descr kDescrs[] = {
    {"<f4", kDLFloat, 32}, {"<f8", kDLFloat, 64}, {"<f2", kDLFloat, 16}, {"<i8", kDLInt, 64},
    {"<i4", kDLInt, 32},   {"<i2", kDLInt, 16},   {"|i1", kDLInt, 8},    {"|u1", kDLUInt, 8},
    {"|b1", kDLBool, 8},   {"<c8", kDLComplex, 64}, {"<c16", kDLComplex, 128},
    {"<u2", kDLUInt, 16},  {"<u4", kDLUInt, 32},  {"<u8", kDLUInt, 64},
};

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  fail(EMBER_ERR_INVALID_ARGUMENT, path + ": " + why);
}

// The value text of `key` in the header dict ("'descr': '<f4', ..."), up to its end.
std::string header_value(const std::string& header, const std::string& key,
                         const std::string& path) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) bad(path, "header has no '" + key + "'");
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) bad(path, "malformed header");
  size_t v = header.find_first_not_of(' ', colon + 1);
  if (v == std::string::npos) bad(path, "malformed header");
  if (header[v] == '\'') {
    size_t end = header.find('\'', v + 1);
    if (end == std::string::npos) bad(path, "malformed header");
    return header.substr(v + 1, end - v - 1);
  }
  if (header[v] == '(') {
    size_t end = header.find(')', v);
    if (end == std::string::npos) bad(path, "malformed header");
    return header.substr(v + 1, end - v - 1);
  }
  size_t end = header.find_first_of(",}", v);
  return header.substr(v, end - v);
}

}  // namespace

std::string npy_descr(DLDataType dtype) {
  for (const auto& d : kDescrs) {
    if (d.code == dtype.code && d.bits == dtype.bits && dtype.lanes == 1) return d.text;
  }
  fail(EMBER_ERR_DTYPE, "dtype " + dtype_name(dtype) + " has no .npy type code");
}

NpyArray npy_read(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "rb"), fclose);
  if (!f) bad(path, "cannot open");
  unsigned char pre[10];
  if (fread(pre, 1, 8, f.get()) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) bad(path, "not a .npy file");
  uint32_t header_len = 0;
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f.get()) != 2) bad(path, "truncated header");
    header_len = pre[8] | (uint32_t(pre[9]) << 8);
  } else if (pre[6] == 2 || pre[6] == 3) {
    unsigned char l[4];
    if (fread(l, 1, 4, f.get()) != 4) bad(path, "truncated header");
    header_len = l[0] | (uint32_t(l[1]) << 8) | (uint32_t(l[2]) << 16) | (uint32_t(l[3]) << 24);
  } else {
    bad(path, "unsupported .npy version " + std::to_string(pre[6]));
  }
  if (header_len > (1u << 20)) bad(path, "header too large");
  std::string header(header_len, '\0');
  if (fread(&header[0], 1, header_len, f.get()) != header_len) bad(path, "truncated header");

  NpyArray arr;
  std::string descr = header_value(header, "descr", path);
  if (descr == "<f4" || descr == "=f4") descr = "<f4";
  bool found = false;
  for (const auto& d : kDescrs) {
    std::string t = d.text;
    if (descr == t || (t[0] == '<' && descr == "=" + t.substr(1)) ||
        (t[0] == '|' && (descr == "<" + t.substr(1) || descr == "=" + t.substr(1)))) {
      arr.dtype = DLDataType{d.code, d.bits, 1};
      found = true;
      break;
    }
  }
  if (!found) bad(path, "unsupported dtype '" + descr + "' (little-endian numeric types only)");
  if (header_value(header, "fortran_order", path).find("False") != 0) {
    bad(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  }
  std::string shape = header_value(header, "shape", path);
  size_t pos = 0;
  while (pos < shape.size()) {
    size_t next = shape.find(',', pos);
    std::string item = shape.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (item.find_first_not_of(' ') != std::string::npos) {
      char* end = nullptr;
      long long v = strtoll(item.c_str(), &end, 10);
      if (v < 0) bad(path, "negative size in shape");
      arr.shape.push_back(v);
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  uint64_t n = 1;
  for (int64_t s : arr.shape) n *= uint64_t(s);
  uint64_t nbytes = n * uint64_t(itemsize(arr.dtype));
  arr.data.resize(nbytes);
  if (nbytes && fread(arr.data.data(), 1, nbytes, f.get()) != nbytes) bad(path, "truncated data");
  return arr;
}

void npy_write(const std::string& path, DLDataType dtype, const int64_t* shape, int ndim,
               const void* data) {
  std::string shape_text = "(";
  uint64_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    shape_text += std::to_string(shape[i]) + (ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    n *= uint64_t(shape[i]);
  }
  shape_text += ")";
  std::string header =
      "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "wb"), fclose);
  if (!f) fail(EMBER_ERR_INVALID_ARGUMENT, "cannot write " + path);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           static_cast<unsigned char>(header.size() & 0xff),
                           static_cast<unsigned char>(header.size() >> 8)};
  uint64_t nbytes = n * uint64_t(itemsize(dtype));
  if (fwrite(pre, 1, 10, f.get()) != 10 || fwrite(header.data(), 1, header.size(), f.get()) != header.size() ||
      (nbytes && fwrite(data, 1, nbytes, f.get()) != nbytes)) {
    fail(EMBER_ERR_INVALID_ARGUMENT, "cannot write " + path);
  }
}

}  // namespace ember
