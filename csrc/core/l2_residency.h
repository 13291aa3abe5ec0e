// Keeping a lookup's small search structure in L2 (CUDA builds). A batch of random point lookups streams one
// line of pairs per query through L2 while every query also reads the radix table; at tens of MiB the table then
// loses part of itself to the lines and its misses cost device-memory transactions (benchmarks/results/). CUDA's
// persisting-L2 set-aside protects it: l2_reserve sets the device's set-aside, and launches that read such a
// structure pass an access-policy window over it (a launch attribute: the caller's stream keeps its own settings).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rtindex {

// Sets the persisting-L2 set-aside of `device` to `bytes` (0: none; capped at what the device allows) and returns
// the bytes granted. Device-wide, as CUDA's limit is.
int64_t l2_reserve(int device, int64_t bytes);

// A launch attribute marking [base, base + bytes) persisting in L2, for a kernel on `device`; false where no
// set-aside is reserved there (the launch then goes out without it).
bool l2_window(int device, const void* base, size_t bytes, cudaLaunchAttribute& attribute);

}  // namespace rtindex
