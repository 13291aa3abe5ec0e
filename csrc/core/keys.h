// Key types and the order-preserving map from a key value to an unsigned 64-bit "ordered key".
//
// Every index in this package works on ordered keys: the map is a bijection on bit patterns that turns the
// key type's own order (signed, unsigned or numeric) into plain unsigned order, the radix-sort trick the
// RX paper uses for non-integer types. It lives here once and is shared by the CPU kernels, the CUDA
// kernels and the OptiX programs.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RTX_HD __host__ __device__ __forceinline__
#else
#define RTX_HD inline
#endif

namespace rtindex {

// The numbering is part of the operator schemas (an `int key_type` argument); the extension exports it
// (ops.cpp config_schema) and torch_rtindex/_config.py checks the Python spelling against it at import.
enum class KeyType : int64_t {
  Int64 = 0,
  Int32 = 1,
  UInt64 = 2,  // unsigned 64-bit values stored bit for bit in an int64 (or torch.uint64) tensor
  Float32 = 3,
  Float64 = 4,
};

constexpr int64_t kNumKeyTypes = 5;

template <typename To, typename From>
RTX_HD To bit_cast_value(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

// Signed integers: flipping the sign bit turns two's-complement order into unsigned order.
RTX_HD uint64_t ordered_from_int64(int64_t v) { return static_cast<uint64_t>(v) ^ (uint64_t(1) << 63); }

// 32-bit keys stay 32-bit (zero-extended), as in the papers: small keys keep the upper key axes empty.
RTX_HD uint64_t ordered_from_int32(int32_t v) {
  return static_cast<uint64_t>(static_cast<uint32_t>(v) ^ 0x80000000u);
}

RTX_HD uint64_t ordered_from_uint64(uint64_t v) { return v; }

// Floats: negative numbers get all bits flipped (their magnitude order is reversed), non-negative ones
// get the sign bit set. -0.0 is folded onto +0.0 first, because the two compare equal as numbers.
// NaN maps to patterns above +inf or below -inf; the build rejects NaN keys, so NaN queries never match.
RTX_HD uint64_t ordered_from_float32(float v) {
  uint32_t bits = bit_cast_value<uint32_t>(v);
  if (v == 0.0f) bits = 0;
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return static_cast<uint64_t>(bits);
}

RTX_HD uint64_t ordered_from_float64(double v) {
  uint64_t bits = bit_cast_value<uint64_t>(v);
  if (v == 0.0) bits = 0;
  return (bits >> 63) ? ~bits : (bits | (uint64_t(1) << 63));
}

RTX_HD bool is_nan_value(float v) { return v != v; }
RTX_HD bool is_nan_value(double v) { return v != v; }
template <typename T>
RTX_HD bool is_nan_value(T) { return false; }

// Overloads by storage type, for kernels templated on the tensor's element type. `as_unsigned` selects the
// UInt64 interpretation of int64 storage.
RTX_HD uint64_t ordered_key(int64_t v, bool as_unsigned) {
  return as_unsigned ? ordered_from_uint64(static_cast<uint64_t>(v)) : ordered_from_int64(v);
}
RTX_HD uint64_t ordered_key(uint64_t v, bool) { return ordered_from_uint64(v); }
RTX_HD uint64_t ordered_key(int32_t v, bool) { return ordered_from_int32(v); }
RTX_HD uint64_t ordered_key(float v, bool) { return ordered_from_float32(v); }
RTX_HD uint64_t ordered_key(double v, bool) { return ordered_from_float64(v); }

// The inverse of ordered_key, for exporting what an index holds (state_dict): the tag's type selects the storage
// type. -0.0 comes back as +0.0, the value the index holds for it.
RTX_HD int64_t key_from_ordered(uint64_t o, int64_t, bool as_unsigned) {
  return static_cast<int64_t>(as_unsigned ? o : o ^ (uint64_t(1) << 63));
}
RTX_HD uint64_t key_from_ordered(uint64_t o, uint64_t, bool) { return o; }
RTX_HD int32_t key_from_ordered(uint64_t o, int32_t, bool) {
  return static_cast<int32_t>(static_cast<uint32_t>(o) ^ 0x80000000u);
}
RTX_HD float key_from_ordered(uint64_t o, float, bool) {
  const uint32_t b = static_cast<uint32_t>(o);
  return bit_cast_value<float>((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}
RTX_HD double key_from_ordered(uint64_t o, double, bool) {
  const uint64_t top = uint64_t(1) << 63;
  return bit_cast_value<double>((o & top) ? (o & ~top) : ~o);
}

// An empty ordered range, for range bounds that admit no key (a NaN bound). Every range [lo, hi] with
// lo > hi is empty; this is one such pair.
constexpr uint64_t kEmptyRangeLo = 1;
constexpr uint64_t kEmptyRangeHi = 0;

}  // namespace rtindex
