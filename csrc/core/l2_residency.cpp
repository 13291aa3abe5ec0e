#include "l2_residency.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>

namespace rtindex {
namespace {

constexpr int kMaxDevices = 64;
std::array<std::atomic<int64_t>, kMaxDevices> g_reserved{};  // per device, read by every lookup launch
std::array<std::atomic<int64_t>, kMaxDevices> g_max_window{};

void check_device(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "torch_rtindex: CUDA device index ", device, " out of range");
}

}  // namespace

int64_t l2_reserve(int device, int64_t bytes) {
  check_device(device);
  TORCH_CHECK(bytes >= 0, "the L2 bytes to set aside must be non-negative, got ", bytes);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  int max_persisting = 0, max_window = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&max_persisting, cudaDevAttrMaxPersistingL2CacheSize, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device));
  TORCH_CHECK(bytes == 0 || max_persisting > 0, "CUDA device ", device, " has no persisting L2 cache to set aside");
  C10_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, std::min<int64_t>(bytes, max_persisting)));
  size_t granted = 0;
  C10_CUDA_CHECK(cudaDeviceGetLimit(&granted, cudaLimitPersistingL2CacheSize));
  if (granted == 0) C10_CUDA_CHECK(cudaCtxResetPersistingL2Cache());  // lines marked before go back to normal
  g_max_window[device].store(max_window);
  g_reserved[device].store(static_cast<int64_t>(granted));
  return static_cast<int64_t>(granted);
}

bool l2_window(int device, const void* base, size_t bytes, cudaLaunchAttribute& attribute) {
  if (device < 0 || device >= kMaxDevices) return false;
  const int64_t reserved = g_reserved[device].load(std::memory_order_relaxed);
  if (reserved == 0 || bytes == 0) return false;
  const size_t window = std::min<size_t>(bytes, static_cast<size_t>(g_max_window[device].load(std::memory_order_relaxed)));
  attribute.id = cudaLaunchAttributeAccessPolicyWindow;
  attribute.val.accessPolicyWindow.base_ptr = const_cast<void*>(base);
  attribute.val.accessPolicyWindow.num_bytes = window;
  // A window larger than the set-aside marks only that share of its lines persisting (the rest normal), so that
  // the persisting lines do not evict each other.
  attribute.val.accessPolicyWindow.hitRatio = std::min(1.0f, static_cast<float>(reserved) / static_cast<float>(window));
  attribute.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attribute.val.accessPolicyWindow.missProp = cudaAccessPropertyNormal;
  return true;
}

}  // namespace rtindex
