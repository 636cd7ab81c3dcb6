// The caching pool: per-(size, stream) free lists behind one mutex.
#include "detail/pool.h"

#include <algorithm>
#include <cstdlib>

#include "detail/common.h"
#include "detail/cuda_api.h"

namespace ember {

Pool::Pool(DLDevice device, const EmberAllocator* user) : device_(device), user_(user) {}

Pool::~Pool() {
  pinned_.clear();
  trim();
}

size_t Pool::round_size(size_t nbytes) {
  if (nbytes <= 512) return 512;
  if (nbytes <= (size_t(1) << 20)) return (nbytes + 511) & ~size_t(511);
  // Above 1 MiB, round to an eighth of the enclosing power of two: at most 12.5% waste, and
  // sizes that differ a little (dynamic shapes) still share blocks.
  size_t p = size_t(1) << (63 - __builtin_clzll(nbytes));
  size_t step = p / 8;
  return (nbytes + step - 1) / step * step;
}

void* Pool::raw_allocate(size_t nbytes, void* stream) {
  if (user_) {
    void* p = user_->allocate(user_->ctx, nbytes, device_, stream);
    // Triton kernels take pool memory as 16-byte aligned (ember_runtime.h): a block that is not
    // fails the allocation rather than a kernel
    if (p && reinterpret_cast<uintptr_t>(p) % kDataAlign != 0) {
      user_->release(user_->ctx, p, nbytes, device_, stream);
      return nullptr;
    }
    return p;
  }
  if (device_.device_type == kDLCPU) {
    void* p = nullptr;
    return posix_memalign(&p, 64, nbytes) == 0 ? p : nullptr;
  }
  CudaContextScope scope(device_.device_id);
  CUdeviceptr p = 0;
  if (cuda_driver().mem_alloc(&p, nbytes) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<void*>(p);
}

void Pool::raw_release(void* ptr, size_t nbytes, void* stream) {
  if (user_) {
    user_->release(user_->ctx, ptr, nbytes, device_, stream);
  } else if (device_.device_type == kDLCPU) {
    free(ptr);
  } else {
    CudaContextScope scope(device_.device_id);
    cuda_driver().mem_free(reinterpret_cast<CUdeviceptr>(ptr));
  }
}

void* Pool::allocate(size_t nbytes, void* stream) {
  size_t size = round_size(nbytes);
  if (!user_) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find({size, stream});
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= size;
      live_[p] = Block{size, stream};
      return p;
    }
  }
  void* p = raw_allocate(size, stream);
  if (!p) {
    trim();  // give cached blocks of other sizes back, then try once more
    p = raw_allocate(size, stream);
    if (!p) return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_[p] = Block{size, stream};
  return p;
}

void Pool::release(void* ptr, void* stream) {
  (void)stream;  // a block returns to the free list of the stream it was allocated on
  Block block;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    block = it->second;
    live_.erase(it);
    bool pinned = std::find(pinned_.begin(), pinned_.end(), block.stream) != pinned_.end();
    if (!user_ && (cached_ + block.size <= kMaxCachedBytes || pinned)) {
      free_[{block.size, block.stream}].push_back(ptr);
      cached_ += block.size;
      return;
    }
  }
  raw_release(ptr, block.size, block.stream);
}

void Pool::pin_stream(void* stream, bool pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(pinned_.begin(), pinned_.end(), stream);
  if (pinned && it == pinned_.end()) pinned_.push_back(stream);
  if (!pinned && it != pinned_.end()) pinned_.erase(it);
}

void Pool::trim() {
  std::map<std::pair<size_t, void*>, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (std::find(pinned_.begin(), pinned_.end(), it->first.second) != pinned_.end()) {
        ++it;
        continue;
      }
      cached_ -= it->first.first * it->second.size();
      blocks.insert(free_.extract(it++));
    }
  }
  for (auto& [key, ptrs] : blocks) {
    for (void* p : ptrs) raw_release(p, key.first, key.second);
  }
}

void Pool::trim_stream(void* stream) {
  std::vector<std::pair<size_t, std::vector<void*>>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.second == stream) {
        cached_ -= it->first.first * it->second.size();
        blocks.emplace_back(it->first.first, std::move(it->second));
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [size, ptrs] : blocks) {
    for (void* p : ptrs) raw_release(p, size, stream);
  }
}

size_t Pool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace ember
