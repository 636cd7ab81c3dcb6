// Reading and writing .npy files (format 1.0/2.0/3.0, little-endian, C order), internal.
#ifndef EMBER_DETAIL_NPY_H_
#define EMBER_DETAIL_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "../ember_runtime.h"

namespace ember {

struct NpyArray {
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // dense, C order
};

// Throws EMBER_ERR_INVALID_ARGUMENT on unsupported or malformed files (big-endian, Fortran order,
// object arrays, truncated data).
NpyArray npy_read(const std::string& path);
void npy_write(const std::string& path, DLDataType dtype, const int64_t* shape, int ndim,
               const void* data);
// The .npy descr string of a dtype ("<f4"); throws for dtypes numpy has no code for.
std::string npy_descr(DLDataType dtype);

}  // namespace ember

#endif  // EMBER_DETAIL_NPY_H_
