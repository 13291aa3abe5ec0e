// A lookup's queries as the caller gave them (any key dtype), mapped to ordered keys where a CPU loop, a CUDA
// kernel or an OptiX program reads them: a lookup writes no ordered copy of its batch and launches no mapping
// kernel before the search (keys.h holds the mapping itself).
#pragma once

#include <cstdint>

#include "cache_hints.h"
#include "keys.h"

namespace rtindex {

struct QueryKeys {
  const void* lo;
  const void* hi;  // nullptr: point lookups of lo
  uint32_t key_type;  // KeyType; UInt64 also serves batches that are ordered keys already (the query sort's)

  RTX_HD uint64_t ordered(const void* base, uint64_t i) const {
    switch (static_cast<KeyType>(key_type)) {
      case KeyType::Int64:
        return ordered_from_int64(static_cast<int64_t>(load_once(static_cast<const unsigned long long*>(base) + i)));
      case KeyType::Int32: return ordered_from_int32(load_once(static_cast<const int*>(base) + i));
      case KeyType::Float32: return ordered_from_float32(load_once(static_cast<const float*>(base) + i));
      case KeyType::Float64: return ordered_from_float64(load_once(static_cast<const double*>(base) + i));
      default: return load_once(static_cast<const unsigned long long*>(base) + i);
    }
  }

  RTX_HD bool is_nan(const void* base, uint64_t i) const {
    switch (static_cast<KeyType>(key_type)) {
      case KeyType::Float32: return is_nan_value(static_cast<const float*>(base)[i]);
      case KeyType::Float64: return is_nan_value(static_cast<const double*>(base)[i]);
      default: return false;
    }
  }

  // Query i as an inclusive range of ordered keys; a point lookup is [k, k] (a NaN query maps past every key,
  // which the build never holds), a range with a NaN bound is empty (map_ranges does the same).
  RTX_HD void range(uint64_t i, uint64_t& l, uint64_t& h) const {
    l = ordered(lo, i);
    if (hi == nullptr) {
      h = l;
      return;
    }
    h = ordered(hi, i);
    if (key_type == static_cast<uint32_t>(KeyType::Float32) || key_type == static_cast<uint32_t>(KeyType::Float64)) {
      if (is_nan(lo, i) || is_nan(hi, i)) {
        l = kEmptyRangeLo;
        h = kEmptyRangeHi;
      }
    }
  }
};

}  // namespace rtindex
