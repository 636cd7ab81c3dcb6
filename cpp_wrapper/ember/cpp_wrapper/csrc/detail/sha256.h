// SHA-256, for package checksums (internal).
#ifndef EMBER_DETAIL_SHA256_H_
#define EMBER_DETAIL_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace ember {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hexdigest();  // finalises

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// The hex SHA-256 of a file's first `size` bytes; throws EMBER_ERR_PACKAGE when it is shorter.
std::string sha256_file(const std::string& path, uint64_t size);

}  // namespace ember

#endif  // EMBER_DETAIL_SHA256_H_
