// Small helpers every CUDA kernel file uses: the current stream, grid sizing, launch checks.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace rtindex {

constexpr int kBlock = 256;

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// Grid-stride loops: enough blocks to fill the GPU, never more than the work needs.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535LL * 8)));
}

#define RTX_CHECK_LAUNCH() C10_CUDA_KERNEL_LAUNCH_CHECK()

}  // namespace rtindex
