// JSON, SHA-256 and .npy round trips (plain program for Bazel cc_test).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "detail/common.h"
#include "detail/json.h"
#include "detail/npy.h"
#include "detail/sha256.h"

namespace {
int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s\n", what);
    ++failures;
  }
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
  if (failures == 0) printf("formats_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
