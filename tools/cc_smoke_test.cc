// Proves the C++ toolchain builds and runs a cc_test offline, and that the
// DLPack and (when installed) CUDA header targets resolve.
#include <dlpack/dlpack.h>
#if __has_include(<cuda.h>)
#include <cuda.h>
#endif
#include <cstdio>

int main() {
  DLDataType t{kDLFloat, 32, 1};
  if (t.bits != 32) return 1;
#ifdef CUDA_VERSION
  std::printf("cuda.h: CUDA_VERSION=%d\n", CUDA_VERSION);
#endif
  std::printf("DLPack %d.%d ok\n", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
  return 0;
}
