// .npy files: a magic string, a version, a Python-dict header, then the raw array bytes.
#include "detail/npy.h"

#include <sys/stat.h>

#include <cctype>
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

// The header is a Python dict literal as numpy writes it: exactly the keys 'descr' (a string),
// 'fortran_order' (True/False) and 'shape' (a tuple of non-negative ints), then spaces and '\n'.
// Anything else (other keys, structured dtypes, expressions) is rejected rather than guessed at.
struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  Header parse() {
    Header h;
    bool seen[3] = {false, false, false};
    expect('{');
    while (!peek('}')) {
      std::string key = quoted();
      expect(':');
      int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
      if (k < 0 || seen[k]) bad(path_, "header has an unexpected or repeated key '" + key + "'");
      seen[k] = true;
      if (k == 0) h.descr = quoted();
      if (k == 1) h.fortran = boolean();
      if (k == 2) h.shape = tuple();
      if (!peek('}')) expect(',');
    }
    expect('}');
    skip_spaces();
    if (i_ + 1 != s_.size() || s_[i_] != '\n') bad(path_, "header does not end in a newline");
    if (!seen[0] || !seen[1] || !seen[2]) bad(path_, "header lacks descr, fortran_order or shape");
    return h;
  }

 private:
  void skip_spaces() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  bool peek(char c) {
    skip_spaces();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) bad(path_, std::string("malformed header: expected '") + c + "'");
    ++i_;
  }
  std::string quoted() {
    skip_spaces();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) bad(path_, "malformed header");
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string::npos || end - i_ > 64) bad(path_, "malformed header string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_spaces();
    for (bool v : {true, false}) {
      const char* word = v ? "True" : "False";
      if (s_.compare(i_, strlen(word), word) == 0) {
        i_ += strlen(word);
        return v;
      }
    }
    bad(path_, "malformed header: fortran_order is not True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> out;
    bool comma = false;  // after the last size: (6) is an int in Python, (6,) a tuple
    expect('(');
    while (!peek(')')) {
      size_t from = i_;
      int64_t v = 0;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) {
        if (v > (INT64_MAX - 9) / 10) bad(path_, "a size in the shape is too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (i_ == from) bad(path_, "malformed shape (non-negative integers only)");
      if (out.size() == 64) bad(path_, "more than 64 dimensions");
      out.push_back(v);
      comma = !peek(')');
      if (comma) expect(',');
    }
    if (out.size() == 1 && !comma) bad(path_, "malformed shape: (n) is not a tuple; write (n,)");
    expect(')');
    return out;
  }

  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

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
  struct stat st;
  if (fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode)) bad(path, "not a regular file");
  unsigned char pre[10];
  if (fread(pre, 1, 8, f.get()) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) bad(path, "not a .npy file");
  if (pre[7] != 0) bad(path, "unsupported .npy version " + std::to_string(pre[6]) + "." + std::to_string(pre[7]));
  uint32_t header_len = 0, prefix = 10;
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f.get()) != 2) bad(path, "truncated header");
    header_len = pre[8] | (uint32_t(pre[9]) << 8);
  } else if (pre[6] == 2 || pre[6] == 3) {
    unsigned char l[4];
    if (fread(l, 1, 4, f.get()) != 4) bad(path, "truncated header");
    header_len = l[0] | (uint32_t(l[1]) << 8) | (uint32_t(l[2]) << 16) | (uint32_t(l[3]) << 24);
    prefix = 12;
  } else {
    bad(path, "unsupported .npy version " + std::to_string(pre[6]));
  }
  if (header_len > (1u << 20)) bad(path, "header too large");
  if (uint64_t(prefix) + header_len > uint64_t(st.st_size)) bad(path, "truncated header");
  std::string header(header_len, '\0');
  if (header_len && fread(&header[0], 1, header_len, f.get()) != header_len) {
    bad(path, "truncated header");
  }
  Header h = HeaderParser(header, path).parse();

  NpyArray arr;
  std::string descr = h.descr;
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
  if (h.fortran) bad(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  arr.shape = h.shape;
  // The element count and byte size, overflow-checked, must be what the file holds after the
  // header, before anything is allocated for them.
  uint64_t nbytes = uint64_t(itemsize(arr.dtype));
  for (int64_t s : arr.shape) {
    if (__builtin_mul_overflow(nbytes, uint64_t(s), &nbytes)) bad(path, "shape too large");
  }
  uint64_t available = uint64_t(st.st_size) - prefix - header_len;
  if (nbytes > available) {
    bad(path, "truncated data: the shape needs " + std::to_string(nbytes) + " bytes, the file has " +
                  std::to_string(available));
  }
  if (nbytes < available) {
    bad(path, std::to_string(available - nbytes) + " bytes follow the array data");
  }
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
