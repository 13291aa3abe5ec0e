// The builds' sorts and scans on CUDA, with CUB compiled into the extension (a first build then loads none of
// torch's kernels for them). The read-only build's sort, in bounded memory: the caller's keys, mapped to ordered
// keys where they are read, sorted with their 32-bit positions by CUB's radix sort over two double buffers. Keys
// of the 32-bit key types stay 32-bit. The buffers the sort ends in are kept, the other two freed at once, so a
// build holds at most 2 x (key width + 4) bytes per key while sorting (at::sort's stable sort of int64 keys needs
// about 48).
#pragma once

#include <ATen/ATen.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include <cstdint>
#include <limits>
#include <utility>

#include "cuda_utils.h"
#include "key_dispatch.h"

namespace rtindex {

// keys: the sorted ordered keys, int32 storage of uint32 values (`narrow`) or int64 storage of uint64 values;
// rows: each key's position in the caller's tensor, int32 storage of uint32 values; equal keys ascending.
struct SortedPositions {
  at::Tensor keys;
  at::Tensor rows;
  bool narrow;
};

inline bool narrow_key_type(KeyType t) { return t == KeyType::Int32 || t == KeyType::Float32; }

template <typename T, typename K>
__global__ void map_with_positions_kernel(const T* __restrict__ in, K* __restrict__ keys, uint32_t* __restrict__ rows,
                                          int64_t n, bool as_unsigned) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = static_cast<K>(ordered_key(in[i], as_unsigned));
    rows[i] = static_cast<uint32_t>(i);
  }
}

template <typename K>
SortedPositions sort_positions_as(const at::Tensor& in, int64_t key_type, bool narrow) {
  const int64_t n = in.numel();
  const at::TensorOptions kopts = in.options().dtype(narrow ? at::kInt : at::kLong);
  const at::TensorOptions ropts = in.options().dtype(at::kInt);
  at::Tensor keys[2] = {at::empty({n}, kopts), at::Tensor()};
  at::Tensor rows[2] = {at::empty({n}, ropts), at::Tensor()};
  auto* k0 = static_cast<K*>(keys[0].data_ptr());
  auto* r0 = reinterpret_cast<uint32_t*>(rows[0].data_ptr<int32_t>());
  if (n == 0) return {keys[0], rows[0], narrow};
  dispatch_key_type(in, key_type, "keys", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    map_with_positions_kernel<T, K><<<grid_for(n), kBlock, 0, current_stream()>>>(static_cast<const T*>(in.data_ptr()),
                                                                                 k0, r0, n, as_unsigned);
  });
  RTX_CHECK_LAUNCH();
  keys[1] = at::empty({n}, kopts);
  rows[1] = at::empty({n}, ropts);
  cub::DoubleBuffer<K> dk(k0, static_cast<K*>(keys[1].data_ptr()));
  cub::DoubleBuffer<uint32_t> dv(r0, reinterpret_cast<uint32_t*>(rows[1].data_ptr<int32_t>()));
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dk, dv, n, 0, int(sizeof(K) * 8), current_stream()));
  at::Tensor scratch = at::empty({static_cast<int64_t>(bytes)}, in.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data_ptr(), bytes, dk, dv, n, 0, int(sizeof(K) * 8),
                                                 current_stream()));
  // The caching allocator hands the freed halves out again only after the sort on this stream has run.
  return {keys[dk.selector], rows[dv.selector], narrow};
}

// `keys` in the caller's dtype, `key_type` as map_keys takes it (uint64 for keys that are ordered already).
inline SortedPositions sort_positions_cuda(const at::Tensor& keys, int64_t key_type) {
  TORCH_CHECK(keys.dim() == 1, "keys must be a 1-D tensor, got ", keys.dim(), " dimensions");
  TORCH_CHECK(keys.numel() <= int64_t(std::numeric_limits<uint32_t>::max()),
              "an index holds at most 2^32 - 1 keys, got ", keys.numel());
  const at::Tensor in = keys.contiguous();
  return narrow_key_type(key_type_from_int(key_type)) ? sort_positions_as<uint32_t>(in, key_type, true)
                                                      : sort_positions_as<uint64_t>(in, key_type, false);
}

// (ordered key, row ID) pairs sorted by unsigned key, then unsigned row ID: a stable radix sort by row with the
// keys carried, then one by key with the rows carried (the updatable index's bulk load). keys: uint64 values in
// int64 storage; rows: uint32 values in int32 storage; neither is written.
inline std::pair<at::Tensor, at::Tensor> sort_key_row_pairs_cuda(const at::Tensor& keys, const at::Tensor& rows) {
  const int64_t n = keys.numel();
  TORCH_CHECK(keys.is_contiguous() && rows.is_contiguous() && rows.numel() == n, "keys and rows: contiguous, one each");
  at::Tensor k[2] = {at::empty_like(keys), at::empty_like(keys)};
  at::Tensor r[2] = {at::empty_like(rows), at::empty_like(rows)};
  if (n == 0) return {k[0], r[0]};
  const cudaStream_t stream = current_stream();
  C10_CUDA_CHECK(cudaMemcpyAsync(k[0].data_ptr(), keys.data_ptr(), n * sizeof(uint64_t), cudaMemcpyDeviceToDevice, stream));
  C10_CUDA_CHECK(cudaMemcpyAsync(r[0].data_ptr(), rows.data_ptr(), n * sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream));
  auto words = [](at::Tensor& t) { return reinterpret_cast<uint64_t*>(t.data_ptr<int64_t>()); };
  auto ids = [](at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr<int32_t>()); };
  cub::DoubleBuffer<uint64_t> dk(words(k[0]), words(k[1]));
  cub::DoubleBuffer<uint32_t> dr(ids(r[0]), ids(r[1]));
  size_t by_row = 0, by_key = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, by_row, dr, dk, n, 0, 32, stream));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, by_key, dk, dr, n, 0, 64, stream));
  at::Tensor scratch = at::empty({static_cast<int64_t>(std::max(by_row, by_key))}, keys.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data_ptr(), by_row, dr, dk, n, 0, 32, stream));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data_ptr(), by_key, dk, dr, n, 0, 64, stream));
  // CUB moves both buffers' selectors together (the values follow the keys' selector), so each pair is in step.
  return {k[dk.selector], r[dr.selector]};
}

// Exclusive prefix sums of n int64 values on the current stream (CUB, compiled into the extension).
inline void exclusive_sum_cuda(const int64_t* in, int64_t* out, int64_t n, const at::TensorOptions& opts) {
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n, current_stream()));
  at::Tensor scratch = at::empty({static_cast<int64_t>(bytes)}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch.data_ptr(), bytes, in, out, n, current_stream()));
}

// The first of each run of equal int64 values, in order, into `out` (room for n); returns how many (a host sync).
inline int64_t unique_cuda(const int64_t* in, int64_t* out, int64_t n, const at::TensorOptions& opts) {
  at::Tensor count = at::empty({1}, opts.dtype(at::kLong));
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceSelect::Unique(nullptr, bytes, in, out, count.data_ptr<int64_t>(), n, current_stream()));
  at::Tensor scratch = at::empty({static_cast<int64_t>(bytes)}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceSelect::Unique(scratch.data_ptr(), bytes, in, out, count.data_ptr<int64_t>(), n,
                                           current_stream()));
  return count.item<int64_t>();
}

}  // namespace rtindex
