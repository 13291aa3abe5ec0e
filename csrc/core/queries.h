// A lookup's queries as the caller gave them (any key dtype), mapped to ordered keys where a CPU loop, a CUDA
// kernel or an OptiX program reads them: a lookup writes no ordered copy of its batch and launches no mapping
// kernel before the search (keys.h holds the mapping itself).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cache_hints.h"
#include "keys.h"

namespace rtindex {

// Element i of a query tensor of key type T, as an ordered key.
template <KeyType T>
RTX_HD uint64_t ordered_query(const void* base, uint64_t i) {
  if constexpr (T == KeyType::Int64) {
    return ordered_from_int64(static_cast<int64_t>(load_once(static_cast<const unsigned long long*>(base) + i)));
  } else if constexpr (T == KeyType::Int32) {
    return ordered_from_int32(load_once(static_cast<const int*>(base) + i));
  } else if constexpr (T == KeyType::Float32) {
    return ordered_from_float32(load_once(static_cast<const float*>(base) + i));
  } else if constexpr (T == KeyType::Float64) {
    return ordered_from_float64(load_once(static_cast<const double*>(base) + i));
  } else {
    return load_once(static_cast<const unsigned long long*>(base) + i);
  }
}

struct QueryKeys {
  const void* lo;
  const void* hi;  // nullptr: point lookups of lo
  uint32_t key_type;  // KeyType; UInt64 also serves batches that are ordered keys already (the query sort's)

  // Query i as an inclusive range of ordered keys; a point lookup is [k, k] (a NaN query maps past every key,
  // which the build never holds), a range with a NaN bound is empty (map_ranges does the same). CUDA kernels
  // are instantiated per key type (one load path each: fewer registers than a switch per query).
  template <KeyType T>
  RTX_HD void range_as(uint64_t i, uint64_t& l, uint64_t& h) const {
    l = ordered_query<T>(lo, i);
    if (hi == nullptr) {
      h = l;
      return;
    }
    h = ordered_query<T>(hi, i);
    if constexpr (T == KeyType::Float32) {
      if (is_nan_value(static_cast<const float*>(lo)[i]) || is_nan_value(static_cast<const float*>(hi)[i])) {
        l = kEmptyRangeLo;
        h = kEmptyRangeHi;
      }
    } else if constexpr (T == KeyType::Float64) {
      if (is_nan_value(static_cast<const double*>(lo)[i]) || is_nan_value(static_cast<const double*>(hi)[i])) {
        l = kEmptyRangeLo;
        h = kEmptyRangeHi;
      }
    }
  }

  // The same, with the key type read at run time (CPU loops, OptiX programs).
  RTX_HD void range(uint64_t i, uint64_t& l, uint64_t& h) const {
    switch (static_cast<KeyType>(key_type)) {
      case KeyType::Int64: range_as<KeyType::Int64>(i, l, h); break;
      case KeyType::Int32: range_as<KeyType::Int32>(i, l, h); break;
      case KeyType::Float32: range_as<KeyType::Float32>(i, l, h); break;
      case KeyType::Float64: range_as<KeyType::Float64>(i, l, h); break;
      default: range_as<KeyType::UInt64>(i, l, h); break;
    }
  }
};

// Calls f(std::integral_constant<KeyType, T>{}) for a batch's key type: the host side of a kernel launch
// instantiated per key type.
template <typename F>
void with_query_type(uint32_t key_type, F&& f) {
  switch (static_cast<KeyType>(key_type)) {
    case KeyType::Int64: f(std::integral_constant<KeyType, KeyType::Int64>{}); break;
    case KeyType::Int32: f(std::integral_constant<KeyType, KeyType::Int32>{}); break;
    case KeyType::Float32: f(std::integral_constant<KeyType, KeyType::Float32>{}); break;
    case KeyType::Float64: f(std::integral_constant<KeyType, KeyType::Float64>{}); break;
    default: f(std::integral_constant<KeyType, KeyType::UInt64>{}); break;
  }
}

}  // namespace rtindex
