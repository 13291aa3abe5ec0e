// Building the radix table over the representatives (cgrx_core.h), on the CPU and on CUDA. Both the read-only
// and the updatable index build it through these two functions.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cgrx_core.h"

namespace rtindex::cgrx {

inline at::Tensor build_radix_table_cpu(const at::Tensor& reps) {
  const uint64_t m = static_cast<uint64_t>(reps.numel());
  at::Tensor table = at::zeros({radix_table_words(m)}, reps.options().dtype(at::kInt));
  if (m == 0) return table;
  const uint64_t* r = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  int32_t* t = table.data_ptr<int32_t>();
  const int bits = radix_log2_slots(m);
  const int shift = radix_shift(r[0], r[m - 1], bits);
  t[0] = shift;
  t[1] = bits;
  uint32_t* entries = reinterpret_cast<uint32_t*>(t + kRadixHeaderWords);
  const int64_t slots = (int64_t(1) << bits) + 1;
  at::parallel_for(0, slots, 4096, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) entries[j] = radix_entry(r, m, bits, shift, static_cast<uint64_t>(j));
  });
  RadixWord* words = reinterpret_cast<RadixWord*>(entries + slots);
  at::parallel_for(0, static_cast<int64_t>(m), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) words[i] = radix_word(r[i], r[0], shift);
  });
  return table;
}

#if defined(__CUDACC__)
// Every thread derives the slice width from the first and last representative itself: no host round trip.
static __global__ void radix_table_kernel(const uint64_t* reps, uint64_t m, int bits, int32_t* table) {
  const int shift = radix_shift(reps[0], reps[m - 1], bits);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    table[0] = shift;
    table[1] = bits;
  }
  uint32_t* entries = reinterpret_cast<uint32_t*>(table + kRadixHeaderWords);
  const uint64_t slots = (uint64_t(1) << bits) + 1;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < slots; j += uint64_t(gridDim.x) * blockDim.x)
    entries[j] = radix_entry(reps, m, bits, shift, j);
  RadixWord* words = reinterpret_cast<RadixWord*>(entries + slots);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < m; i += uint64_t(gridDim.x) * blockDim.x)
    words[i] = radix_word(reps[i], reps[0], shift);
}

inline at::Tensor build_radix_table_cuda(const at::Tensor& reps, cudaStream_t stream) {
  const uint64_t m = static_cast<uint64_t>(reps.numel());
  at::Tensor table = at::zeros({radix_table_words(m)}, reps.options().dtype(at::kInt));
  if (m == 0) return table;
  const int bits = radix_log2_slots(m);
  const int64_t work = std::max<int64_t>((int64_t(1) << bits) + 1, static_cast<int64_t>(m));
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 65535LL * 8));
  radix_table_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>()), m, bits,
                                                 table.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return table;
}
#endif

}  // namespace rtindex::cgrx
