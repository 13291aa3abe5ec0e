// Small helpers every CUDA kernel file uses: the current stream, grid sizing, launch checks.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <initializer_list>

namespace rtindex {

constexpr int kBlock = 256;

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// Grid-stride loops: enough blocks to fill the GPU, never more than the work needs.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535LL * 8)));
}

// Storages a caller has already recorded on `stream` itself, for the length of one operator call on this thread:
// record_uses skips them. A BoundLookups (csrc/bound_lookups.cpp) records its index's tensors once per stream
// they are used on and holds them, so they cannot be freed in between; that keeps the allocator's locks off
// the eager per-call path.
struct RecordedUses {
  static constexpr int kMax = 4;
  cudaStream_t stream = nullptr;
  const c10::StorageImpl* storages[kMax] = {};
  int n = 0;

  bool covers(const at::Tensor& t, cudaStream_t s) const {
    if (s != stream) return false;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    return std::find(storages, storages + n, impl) != storages + n;
  }
};
inline thread_local const RecordedUses* t_recorded_uses = nullptr;

// Announces `uses` (a copy) to record_uses for the scope's length, then restores what was there.
class RecordedUsesScope {
 public:
  explicit RecordedUsesScope(const RecordedUses& uses) : uses_(uses), previous_(t_recorded_uses) {
    t_recorded_uses = &uses_;
  }
  ~RecordedUsesScope() { t_recorded_uses = previous_; }
  RecordedUsesScope(const RecordedUsesScope&) = delete;
  RecordedUsesScope& operator=(const RecordedUsesScope&) = delete;

 private:
  const RecordedUses uses_;
  const RecordedUses* previous_;
};

// Stream safety that costs the caller nothing: every tensor a lookup reads (queries, values, the index's own
// structures) is marked as used on the current stream, so memory its owner frees right after the call (a batch
// made on another stream, an index rebuilt or dropped) is not handed out again before the lookup has run. For
// a tensor allocated on this stream, or memory the caching allocator does not own, this returns at once.
inline void record_uses(std::initializer_list<const at::Tensor*> tensors) {
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  const RecordedUses* done = t_recorded_uses;
  for (const at::Tensor* t : tensors)
    if (t && t->defined() && t->has_storage() && t->is_cuda() && !(done && done->covers(*t, stream.stream())))
      c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), stream);
}

#define RTX_CHECK_LAUNCH() C10_CUDA_KERNEL_LAUNCH_CHECK()

}  // namespace rtindex
