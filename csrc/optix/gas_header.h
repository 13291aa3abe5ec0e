// The header of a GAS structure (host and device). A geometry acceleration structure (GAS) over a triangle list, kept in one uint8 tensor from PyTorch's
// caching allocator: a 128-byte header, then the (compacted) GAS. The header travels with the GAS so that
// launches read the traversable handle on the device, without a host sync, and so that a copied or moved
// tensor (whose handle would be stale) is recognised. Shared by every index that traces rays.
#pragma once

#include <cstdint>

namespace rtindex {

struct GasHeader {
  uint64_t handle;       // OptixTraversableHandle
  uint64_t gas_address;  // device address the handle was made for
  uint64_t num_triangles;
  uint64_t gas_bytes;
  uint64_t updatable;
};
constexpr int64_t kGasHeaderBytes = 128;  // keeps the GAS 128-byte aligned, as OptiX requires

// The handle to trace, or 0 (trace nothing) when the structure is not where its handle was made.
#if defined(__CUDACC__)
__device__ __forceinline__ uint64_t gas_handle(const GasHeader* h) {
  return h->gas_address == reinterpret_cast<uint64_t>(h) + kGasHeaderBytes ? h->handle : 0;
}
#endif

}  // namespace rtindex

