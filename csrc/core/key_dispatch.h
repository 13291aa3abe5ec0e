// Chooses the element type of a key tensor from its dtype and the declared key type, once for both
// backends: a kernel is written as a lambda over `scalar_t` and receives whether int64 storage is read
// as unsigned.
#pragma once

#include <ATen/ATen.h>

#include "keys.h"

namespace rtindex {

inline const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::Int64: return "int64";
    case KeyType::Int32: return "int32";
    case KeyType::UInt64: return "uint64";
    case KeyType::Float32: return "float32";
    case KeyType::Float64: return "float64";
  }
  return "?";
}

inline KeyType key_type_from_int(int64_t v) {
  TORCH_CHECK(v >= 0 && v < kNumKeyTypes, "unknown key_type ", v, " (0=int64, 1=int32, 2=uint64, 3=float32, 4=float64)");
  return static_cast<KeyType>(v);
}

// The storage dtype that holds keys of a key type.
inline bool dtype_holds(at::ScalarType dtype, KeyType t) {
  switch (t) {
    case KeyType::Int64: return dtype == at::kLong;
    case KeyType::UInt64: return dtype == at::kLong || dtype == at::kUInt64;
    case KeyType::Int32: return dtype == at::kInt;
    case KeyType::Float32: return dtype == at::kFloat;
    case KeyType::Float64: return dtype == at::kDouble;
  }
  return false;
}

template <typename F>
void dispatch_key_type(const at::Tensor& keys, int64_t key_type, const char* what, F&& f) {
  const KeyType t = key_type_from_int(key_type);
  TORCH_CHECK(dtype_holds(keys.scalar_type(), t), what, " have dtype ", keys.scalar_type(),
              " but the index holds ", key_type_name(t), " keys");
  switch (keys.scalar_type()) {
    case at::kLong: f(int64_t{}, t == KeyType::UInt64); break;
    case at::kUInt64: f(uint64_t{}, true); break;
    case at::kInt: f(int32_t{}, false); break;
    case at::kFloat: f(float{}, false); break;
    case at::kDouble: f(double{}, false); break;
    default: TORCH_CHECK(false, "unsupported key dtype ", keys.scalar_type());
  }
}

}  // namespace rtindex
