// A thread-safe caching allocator for intermediates and outputs (internal).
#ifndef EMBER_DETAIL_POOL_H_
#define EMBER_DETAIL_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../ember_runtime.h"

namespace ember {

// Freed blocks are kept by (rounded size, stream) and handed out again; CUDA blocks are reused
// only on the stream that freed them, so stream order makes reuse safe without events. With a
// caller-given allocator every request goes straight to it. Outputs share the pool through a
// shared_ptr, so a tensor may outlive the model that made it.
class Pool {
 public:
  Pool(DLDevice device, const EmberAllocator* user);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // nullptr when the device is out of memory.
  void* allocate(size_t nbytes, void* stream);
  void release(void* ptr, void* stream);
  // Return every cached block to the device, but those of pinned streams.
  void trim();
  // A pinned stream's cached blocks stay cached through trim() (a CUDA graph captured on the
  // stream uses them as its scratch); trim_stream still returns them.
  void pin_stream(void* stream, bool pinned);
  // Return the blocks cached for `stream` to the device (before the stream is destroyed).
  void trim_stream(void* stream);
  DLDevice device() const { return device_; }
  // False with a caller's allocator: freed blocks go straight back to it.
  bool caches() const { return user_ == nullptr; }
  size_t cached_bytes() const;

  // Blocks above this many cached bytes are given back instead of kept.
  static constexpr size_t kMaxCachedBytes = size_t(2) << 30;

 private:
  struct Block {
    size_t size;
    void* stream;
  };
  void* raw_allocate(size_t nbytes, void* stream);
  void raw_release(void* ptr, size_t nbytes, void* stream);
  static size_t round_size(size_t nbytes);

  DLDevice device_;
  const EmberAllocator* user_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<size_t, void*>, std::vector<void*>> free_;
  std::vector<void*> pinned_;
  size_t cached_ = 0;
};

}  // namespace ember

#endif  // EMBER_DETAIL_POOL_H_
