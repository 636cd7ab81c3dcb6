// Internal helpers shared by the runtime's sources: errors and dtypes.
#ifndef EMBER_DETAIL_COMMON_H_
#define EMBER_DETAIL_COMMON_H_

#include <cstdint>
#include <stdexcept>
#include <string>

#include "../ember_runtime.h"

namespace ember {

// Internal failures are exceptions carrying a status; the C ABI turns them into return codes.
class Error : public std::runtime_error {
 public:
  Error(EmberStatus status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  EmberStatus status() const { return status_; }

 private:
  EmberStatus status_;
};

[[noreturn]] inline void fail(EmberStatus status, const std::string& message) {
  throw Error(status, message);
}

// The calling thread's last error message (what ember_last_error returns).
void set_last_error(const std::string& message);
const char* last_error();

inline int64_t itemsize(DLDataType t) { return (int64_t(t.bits) * t.lanes + 7) / 8; }

// "float32", "int64", ... for messages and manifests; "" when unknown.
std::string dtype_name(DLDataType t);
// Inverse of dtype_name; throws EMBER_ERR_DTYPE for an unknown name.
DLDataType dtype_from_name(const std::string& name);

// Does a tensor of dtype `got` satisfy a model that wants `want`? (torch < 2.3 exported bool as
// uint8, so uint8 stands in for bool, never the other way round.)
inline bool dtype_matches(DLDataType got, DLDataType want) {
  if (want.code == kDLBool && got.code == kDLUInt && got.bits == 8 && got.lanes == 1) return true;
  return got.code == want.code && got.bits == want.bits && got.lanes == want.lanes;
}

// CUDA models' Triton kernels are compiled assuming 16-byte aligned tensor data (Triton's
// divisibility hint; see ember_runtime.h): what an input's data pointer must be a multiple of.
constexpr uint64_t kDataAlign = 16;

// Is a tensor's data pointer (data + byte_offset) off a kDataAlign boundary?
inline bool misaligned(const DLTensor& t) {
  return (reinterpret_cast<uintptr_t>(t.data) + t.byte_offset) % kDataAlign != 0;
}

// The bytes a tensor's elements span from its data pointer (0 when it has none; strides NULL
// mean row-major); -1 when a stride of a dimension longer than 1 is negative.
inline int64_t span_bytes(const DLTensor& t) {
  int64_t last = 0, row_major = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] == 0) return 0;
    int64_t stride = t.strides ? t.strides[d] : row_major;
    if (t.shape[d] > 1 && stride < 0) return -1;
    if (t.shape[d] > 1) last += (t.shape[d] - 1) * stride;
    row_major *= t.shape[d];
  }
  return (last + 1) * itemsize(t.dtype);
}

}  // namespace ember

#endif  // EMBER_DETAIL_COMMON_H_
