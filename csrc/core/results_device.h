// The result forms on the GPU, shared by the RX and cgRX OptiX programs and the cgRX CUDA kernels: one
// thread answers one query, accumulating its matches in a HitState (which fits OptiX's payload registers)
// and writing (first row, count), a CSR count or fill, or (count, sum) at the end.
#pragma once

#include <cstdint>

#include "cache_hints.h"

namespace rtindex {

enum class ResultMode : uint32_t {
  First = 0,      // first_row + count
  Count = 1,      // count only (pass 1 of a CSR result)
  Fill = 2,       // rows[offsets[q] + i] (pass 2 of a CSR result), only below `capacity`
  Aggregate = 3,  // count + sum of values[row]
  Rows = 4,       // first_row only, `miss_row` where a query has no match (IdToRow's one-output form)
};

enum class ValueKind : uint32_t { Int64 = 0, Int32 = 1, Float32 = 2, Float64 = 3 };

struct ResultParams {
  uint32_t mode;
  uint32_t value_kind;
  int64_t* first_row;
  int64_t* count;
  const int64_t* offsets;
  int64_t* rows;
  const void* values;
  void* sums;
  int64_t capacity;  // Fill: the length of `rows`; entries at or past it are counted but not written
  int64_t miss_row;  // First, Rows: the first row of a query without a match
};

// count, smallest row ID and the 64-bit sum as two words: four 32-bit values, as OptiX payloads are.
struct HitState {
  unsigned count = 0, first = 0xFFFFFFFFu, sum_lo = 0, sum_hi = 0;
};

#if defined(__CUDACC__)
__device__ __forceinline__ void add_value(const ResultParams& r, HitState& s, unsigned row) {
  unsigned long long bits = (static_cast<unsigned long long>(s.sum_hi) << 32) | s.sum_lo;
  switch (static_cast<ValueKind>(r.value_kind)) {
    case ValueKind::Int64: bits += static_cast<unsigned long long>(static_cast<const int64_t*>(r.values)[row]); break;
    case ValueKind::Int32:
      bits += static_cast<unsigned long long>(static_cast<long long>(static_cast<const int32_t*>(r.values)[row]));
      break;
    case ValueKind::Float32:
      bits = __double_as_longlong(__longlong_as_double(bits) + static_cast<const float*>(r.values)[row]);
      break;
    case ValueKind::Float64:
      bits = __double_as_longlong(__longlong_as_double(bits) + static_cast<const double*>(r.values)[row]);
      break;
  }
  s.sum_lo = static_cast<unsigned>(bits);
  s.sum_hi = static_cast<unsigned>(bits >> 32);
}

__device__ __forceinline__ void record_hit(const ResultParams& r, HitState& s, unsigned row, unsigned long long q) {
  const ResultMode mode = static_cast<ResultMode>(r.mode);
  if (mode == ResultMode::Fill) {
    const long long at = r.offsets[q] + s.count;
    // Both passes see the same matches; never past the query's end, nor past the buffer of a capped result.
    if (at < r.offsets[q + 1] && at < r.capacity) store_once(r.rows + at, static_cast<int64_t>(row));
  } else if (mode == ResultMode::Aggregate) {
    add_value(r, s, row);
  }
  s.count += 1;
  s.first = row < s.first ? row : s.first;
}

__device__ __forceinline__ void write_result(const ResultParams& r, const HitState& s, unsigned long long q) {
  const ResultMode mode = static_cast<ResultMode>(r.mode);
  if (mode == ResultMode::First || mode == ResultMode::Rows)
    store_once(r.first_row + q, s.count ? static_cast<int64_t>(s.first) : r.miss_row);
  if (mode == ResultMode::Rows) return;
  if (mode != ResultMode::Fill) store_once(r.count + q, static_cast<int64_t>(s.count));
  if (mode == ResultMode::Aggregate) {
    const unsigned long long bits = (static_cast<unsigned long long>(s.sum_hi) << 32) | s.sum_lo;
    if (r.value_kind == static_cast<uint32_t>(ValueKind::Float32) || r.value_kind == static_cast<uint32_t>(ValueKind::Float64))
      store_once(static_cast<double*>(r.sums) + q, __longlong_as_double(bits));
    else
      store_once(static_cast<long long*>(r.sums) + q, static_cast<long long>(bits));
  }
}
#endif

}  // namespace rtindex
