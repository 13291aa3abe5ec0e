// Building the radix table (cgrx_core.h), on the CPU and on CUDA (on the current stream), from the units'
// representatives. The read-only index builds it over lines of its sorted keys (build_pairs_radix_table_*), the
// updatable one over its buckets' representatives (build_radix_table_*, no flags: updates may add equal keys
// later).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cgrx_core.h"
#if defined(__CUDACC__)
#include "../core/cuda_utils.h"
#endif

namespace rtindex::cgrx {

// The last key of every group of `group` consecutive sorted keys: the representatives of buckets or units.
inline at::Tensor group_lasts_cpu(const at::Tensor& sorted, int64_t group) {
  const int64_t n = sorted.numel(), m = (n + group - 1) / group;
  at::Tensor out = at::empty({m}, sorted.options());
  const int64_t* s = sorted.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, m, 1 << 14, [&](int64_t b0, int64_t e) {
    for (int64_t b = b0; b < e; ++b) o[b] = s[group_last(b, group, n)];
  });
  return out;
}

RTX_HD void write_radix_header(int32_t* t, int shift, int bits, uint32_t flags, uint64_t first) {
  t[0] = shift;
  t[1] = bits;
  t[2] = static_cast<int32_t>(flags);
  t[3] = 0;
  t[4] = static_cast<int32_t>(static_cast<uint32_t>(first));
  t[5] = static_cast<int32_t>(static_cast<uint32_t>(first >> 32));
}

inline at::Tensor build_radix_table_cpu(const at::Tensor& unit_reps, bool unique_keys = false) {
  const uint64_t m = static_cast<uint64_t>(unit_reps.numel());
  at::Tensor table = at::zeros({radix_table_words(m)}, unit_reps.options().dtype(at::kInt));
  if (m == 0) return table;
  const uint64_t* r = reinterpret_cast<const uint64_t*>(unit_reps.data_ptr<int64_t>());
  int32_t* t = table.data_ptr<int32_t>();
  const int bits = radix_log2_slots(m);
  const int shift = radix_shift(r[0], r[m - 1], bits);
  write_radix_header(t, shift, bits, unique_keys ? kRadixUniqueKeys : 0, r[0]);
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

// `bucket_reps` (group_lasts of bucket_size) serve as the units where units are whole buckets.
inline at::Tensor build_pairs_radix_table_cpu(const at::Tensor& sorted, const at::Tensor& bucket_reps, Layout l,
                                              int64_t bucket_size) {
  const int64_t n = sorted.numel();
  const uint64_t* s = reinterpret_cast<const uint64_t*>(sorted.data_ptr<int64_t>());
  const bool unique = at::parallel_reduce(
      int64_t(1), n, int64_t(1) << 16, true,
      [&](int64_t b, int64_t e, bool ok) {
        for (int64_t i = b; i < e && ok; ++i) ok = s[i - 1] != s[i];
        return ok;
      },
      [](bool a, bool b) { return a && b; });
  const int64_t unit = static_cast<int64_t>(radix_unit_pairs(l, static_cast<uint64_t>(bucket_size)));
  return build_radix_table_cpu(unit == bucket_size ? bucket_reps : group_lasts_cpu(sorted, unit), unique);
}

#if defined(__CUDACC__)
// K: the sorted keys' element type: uint64_t, or uint32_t for the 32-bit key types' narrow build.
template <typename K>
__global__ void group_lasts_kernel(const K* __restrict__ sorted, int64_t n, int64_t group, uint64_t* out, int64_t m) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x)
    out[b] = static_cast<uint64_t>(sorted[group_last(b, group, n)]);
}

template <typename K>
at::Tensor group_lasts_cuda(const K* sorted, int64_t n, int64_t group, const at::TensorOptions& opts) {
  const int64_t m = (n + group - 1) / group;
  at::Tensor out = at::empty({m}, opts.dtype(at::kLong));
  if (m == 0) return out;
  group_lasts_kernel<K><<<grid_for(m), kBlock, 0, current_stream()>>>(sorted, n, group,
                                                                      reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()), m);
  RTX_CHECK_LAUNCH();
  return out;
}

// Every thread derives the slice width from the first and last representative itself: no host round trip.
static __global__ void radix_table_kernel(const uint64_t* reps, uint64_t m, int bits, uint32_t flags, int32_t* table) {
  const int shift = radix_shift(reps[0], reps[m - 1], bits);
  if (blockIdx.x == 0 && threadIdx.x == 0) write_radix_header(table, shift, bits, flags, reps[0]);
  uint32_t* entries = reinterpret_cast<uint32_t*>(table + kRadixHeaderWords);
  const uint64_t slots = (uint64_t(1) << bits) + 1;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < slots; j += uint64_t(gridDim.x) * blockDim.x)
    entries[j] = radix_entry(reps, m, bits, shift, j);
  RadixWord* words = reinterpret_cast<RadixWord*>(entries + slots);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < m; i += uint64_t(gridDim.x) * blockDim.x)
    words[i] = radix_word(reps[i], reps[0], shift);
}

// Clears the unique-keys flag where two neighbouring sorted keys are equal (every writer writes the same value).
template <typename K>
__global__ void clear_unique_flag_kernel(const K* __restrict__ sorted, int64_t n, int32_t* table) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x + 1; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (sorted[i - 1] == sorted[i]) table[2] = 0;
}

// unique_flag: start from "no two keys are equal" (the caller then clears it where that is false).
inline at::Tensor build_radix_table_cuda(const at::Tensor& unit_reps, bool unique_flag = false) {
  const uint64_t m = static_cast<uint64_t>(unit_reps.numel());
  at::Tensor table = at::zeros({radix_table_words(m)}, unit_reps.options().dtype(at::kInt));
  if (m == 0) return table;
  const int bits = radix_log2_slots(m);
  const int64_t work = std::max<int64_t>((int64_t(1) << bits) + 1, static_cast<int64_t>(m));
  radix_table_kernel<<<grid_for(work), kBlock, 0, current_stream()>>>(
      reinterpret_cast<const uint64_t*>(unit_reps.data_ptr<int64_t>()), m, bits, unique_flag ? kRadixUniqueKeys : 0,
      table.data_ptr<int32_t>());
  RTX_CHECK_LAUNCH();
  return table;
}

// The read-only index's table over its n sorted keys, with the unique-keys flag derived from them.
template <typename K>
at::Tensor build_pairs_radix_table_cuda(const K* sorted, int64_t n, const at::Tensor& bucket_reps, Layout l,
                                        int64_t bucket_size) {
  const int64_t unit = static_cast<int64_t>(radix_unit_pairs(l, static_cast<uint64_t>(bucket_size)));
  at::Tensor table = build_radix_table_cuda(
      unit == bucket_size ? bucket_reps : group_lasts_cuda(sorted, n, unit, bucket_reps.options()), true);
  if (n > 1) {
    clear_unique_flag_kernel<K><<<grid_for(n), kBlock, 0, current_stream()>>>(sorted, n, table.data_ptr<int32_t>());
    RTX_CHECK_LAUNCH();
  }
  return table;
}
#endif

}  // namespace rtindex::cgrx
