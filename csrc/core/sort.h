// Sorting ordered keys (uint64 values in int64 storage) in unsigned order, on any device, through PyTorch's own
// sort (CUB on CUDA; a parallel radix sort for 1-D integers on the CPU): flipping the top bit maps unsigned
// order onto signed order. The one place every build and the query sort get their order from.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <tuple>

namespace rtindex {

constexpr int64_t kTopBit = std::numeric_limits<int64_t>::min();

// (sorted ordered keys, their positions in `keys`); stable, so equal keys keep ascending positions.
inline std::tuple<at::Tensor, at::Tensor> sort_ordered(const at::Tensor& keys) {
  auto [flipped, order] = at::sort(at::bitwise_xor(keys, kTopBit), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  return {at::bitwise_xor(flipped, kTopBit), order};
}

// Positions that order `rows` (int32 row IDs up to 2^32 - 2) as unsigned 32-bit values, stably.
inline at::Tensor unsigned_row_order(const at::Tensor& rows) {
  return std::get<1>(at::sort(at::bitwise_xor(rows, std::numeric_limits<int32_t>::min()), /*stable=*/true, 0, false));
}

// Stable order of ordered keys by their bits [begin_bit, end_bit) (the query sort's order): a sort of the
// extracted bits, non-negative unless all 64 are taken (then the plain unsigned order).
inline at::Tensor bits_order(const at::Tensor& keys, int64_t begin_bit, int64_t end_bit) {
  if (end_bit - begin_bit == 64) return std::get<1>(sort_ordered(keys));
  const int64_t mask = (int64_t(1) << (end_bit - begin_bit)) - 1;
  // The mask keeps bits below end_bit - begin_bit, so the sign bits an arithmetic shift brings in are cut off.
  const at::Tensor field = at::bitwise_and(at::bitwise_right_shift(keys, begin_bit), mask);
  return std::get<1>(at::sort(field, /*stable=*/true, 0, false));
}

}  // namespace rtindex
