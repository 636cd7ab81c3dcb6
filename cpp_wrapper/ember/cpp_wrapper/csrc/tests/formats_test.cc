// JSON, SHA-256 and .npy round trips, and the input alignment rule (plain program for Bazel
// cc_test).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "detail/common.h"
#include "detail/json.h"
#include "detail/npy.h"
#include "detail/sha256.h"
#include "check.h"

namespace {
using check::expect;
// What ember_model_run copies before a CUDA run (ember_runtime.h): a data pointer off a
// 16-byte boundary, and the bytes its elements span.
void check_alignment() {
  alignas(64) static char storage[256];
  int64_t shape[2] = {3, 5}, strides[2] = {8, 1};
  DLTensor t{};
  t.data = storage;
  t.ndim = 2;
  t.dtype = DLDataType{kDLBfloat, 16, 1};
  t.shape = shape;
  expect(!ember::misaligned(t), "an aligned pointer");
  t.byte_offset = 2;  // a bf16 view at element 1
  expect(ember::misaligned(t), "byte_offset 2 is misaligned");
  t.byte_offset = 32;
  expect(!ember::misaligned(t), "byte_offset 32 is aligned");
  t.data = storage + 8;
  t.byte_offset = 0;
  expect(ember::misaligned(t), "data 8 bytes in is misaligned");
  expect(ember::span_bytes(t) == 15 * 2, "row-major span");
  t.strides = strides;  // rows of 8 elements, 5 used: (2 * 8 + 4 + 1) elements
  expect(ember::span_bytes(t) == 21 * 2, "strided span");
  shape[0] = 1;
  strides[0] = -8;  // a size-1 dimension's stride never matters
  expect(ember::span_bytes(t) == 5 * 2, "size-1 dimension");
  shape[0] = 2;
  expect(ember::span_bytes(t) == -1, "negative stride");
  shape[1] = 0;
  expect(ember::span_bytes(t) == 0, "empty tensor");
}
}  // namespace

int main() {
  ember::Sha256 h;
  h.update("abc", 3);
  expect(h.hexdigest() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(abc)");
  ember::Sha256 e;
  expect(e.hexdigest() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256('')");

  ember::Json j = ember::Json::parse(R"({"a": [1, -2, 3.5e0], "b": {"c": "x\u00e9\n"}, "t": true, "n": null})");
  expect(j["a"].as_array().size() == 3 && j["a"].as_array()[1].as_int() == -2, "json ints");
  expect(j["a"].as_array()[2].as_number() == 3.5, "json float");
  expect(j["b"]["c"].as_string() == "x\xc3\xa9\n", "json string escapes");
  expect(j["t"].as_bool() && j["n"].is_null(), "json literals");
  bool threw = false;
  try {
    ember::Json::parse(R"({"a": [1, 2)");
  } catch (const ember::Error& err) {
    threw = err.status() == EMBER_ERR_PACKAGE;
  }
  expect(threw, "truncated JSON is EMBER_ERR_PACKAGE");

  const char* dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/ember_formats_test.npy";
  float data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  ember::npy_write(path, DLDataType{kDLFloat, 32, 1}, shape, 2, data);
  ember::NpyArray arr = ember::npy_read(path);
  expect(arr.shape.size() == 2 && arr.shape[0] == 2 && arr.shape[1] == 3, "npy shape");
  expect(arr.dtype.code == kDLFloat && arr.dtype.bits == 32, "npy dtype");
  expect(arr.data.size() == sizeof data && memcmp(arr.data.data(), data, sizeof data) == 0, "npy data");
  int64_t scalar_shape[1] = {0};
  ember::npy_write(path, DLDataType{kDLInt, 64, 1}, scalar_shape, 0, data);
  expect(ember::npy_read(path).shape.empty(), "0-d npy");
  remove(path.c_str());
  check_alignment();
  return check::done("formats_test");
}
