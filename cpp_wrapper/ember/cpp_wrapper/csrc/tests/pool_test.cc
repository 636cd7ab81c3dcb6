// The caching pool on the CPU: blocks reused per (size, stream), trim() giving cached blocks
// back except those of pinned streams (a CUDA graph's scratch), trim_stream() giving back even
// those (plain program for Bazel cc_test).
#include <cstdio>

#include "detail/pool.h"
#include "check.h"

namespace {
using check::expect;
}  // namespace

int main() {
  ember::Pool pool(DLDevice{kDLCPU, 0}, nullptr);
  void* a = reinterpret_cast<void*>(0x10);  // streams are only keys on the CPU
  void* b = reinterpret_cast<void*>(0x20);
  void* p = pool.allocate(4096, a);
  void* q = pool.allocate(4096, b);
  pool.release(p, a);
  pool.release(q, b);
  expect(pool.cached_bytes() == 2 * 4096, "both blocks cached");
  expect(pool.allocate(4096, a) == p, "a's block serves a again");
  pool.release(p, a);
  pool.pin_stream(a, true);
  pool.trim();
  expect(pool.cached_bytes() == 4096, "trim keeps the pinned stream's block");
  expect(pool.allocate(4096, a) == p, "and it is still a's");
  pool.release(p, a);
  pool.pin_stream(a, false);
  pool.trim();
  expect(pool.cached_bytes() == 0, "unpinned, trim gives it back");
  p = pool.allocate(512, a);
  pool.release(p, a);
  pool.pin_stream(a, true);
  pool.trim_stream(a);
  expect(pool.cached_bytes() == 0, "trim_stream gives back a pinned stream's blocks");
  return check::done("pool_test");
}
