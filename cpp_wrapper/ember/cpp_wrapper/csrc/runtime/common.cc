// Errors and dtype names.
#include "detail/common.h"

namespace ember {

namespace {
thread_local std::string t_last_error;

struct DtypeName {
  const char* name;
  uint8_t code, bits;
};
constexpr DtypeName kDtypes[] = {
    {"float32", kDLFloat, 32},   {"float64", kDLFloat, 64},  {"float16", kDLFloat, 16},
    {"bfloat16", kDLBfloat, 16}, {"int64", kDLInt, 64},      {"int32", kDLInt, 32},
    {"int16", kDLInt, 16},       {"int8", kDLInt, 8},        {"uint8", kDLUInt, 8},
    {"uint16", kDLUInt, 16},     {"uint32", kDLUInt, 32},    {"uint64", kDLUInt, 64},
    {"bool", kDLBool, 8},        {"complex64", kDLComplex, 64},
    {"complex128", kDLComplex, 128},
    {"float8_e4m3fn", kDLFloat8_e4m3fn, 8}, {"float8_e5m2", kDLFloat8_e5m2, 8},
};
}  // namespace

void set_last_error(const std::string& message) { t_last_error = message; }
const char* last_error() { return t_last_error.c_str(); }

std::string dtype_name(DLDataType t) {
  if (t.lanes == 1) {
    for (const auto& d : kDtypes) {
      if (d.code == t.code && d.bits == t.bits) return d.name;
    }
  }
  return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) +
         ", lanes=" + std::to_string(t.lanes) + ")";
}

DLDataType dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return DLDataType{d.code, d.bits, 1};
  }
  fail(EMBER_ERR_DTYPE, "unknown dtype '" + name + "'");
}

}  // namespace ember
