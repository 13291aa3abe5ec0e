// Argument checks shared by the CPU and CUDA kernels. The Python API validates first and explains; these
// are the last line, so that a direct torch.ops call with bad arguments raises instead of crashing.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "key_dispatch.h"
#include "queries.h"
#include "results_device.h"
#include "scene.h"

namespace rtindex {

inline void check_ordered_keys(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be a 1-D tensor, got ", t.dim(), " dimensions");
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must hold ordered keys as int64 (use map_keys), got ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// The fixed-capacity CSR results (lookup_all_capped, range_capped): rows past `capacity` are counted, not written.
inline void check_capacity(int64_t capacity) {
  TORCH_CHECK(capacity >= 0, "capacity must be non-negative, got ", capacity);
}

// The bit range a query sort orders by (sort_queries): begin < end would be empty, and an ordered key has 64 bits.
inline void check_sort_bits(int64_t begin_bit, int64_t end_bit) {
  TORCH_CHECK(0 <= begin_bit && begin_bit < end_bit && end_bit <= 64,
              "sort bits must satisfy 0 <= begin_bit < end_bit <= 64, got [", begin_bit, ", ", end_bit, ")");
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* name_a,
                              const char* name_b) {
  TORCH_CHECK(a.device() == b.device(), name_a, " is on ", a.device(), " but ", name_b, " is on ", b.device(),
              "; move both to one device");
}

inline SceneConfig scene_from_list(at::IntArrayRef scene) {
  TORCH_CHECK(scene.size() == kSceneConfigLength,
              "scene must be [bits_x, bits_y, bits_z, scale_y_log2, scale_z_log2], got ", scene.size(),
              " values");
  SceneConfig c{};
  c.bits_x = static_cast<int32_t>(scene[0]);
  c.bits_y = static_cast<int32_t>(scene[1]);
  c.bits_z = static_cast<int32_t>(scene[2]);
  c.scale_y_log2 = static_cast<int32_t>(scene[3]);
  c.scale_z_log2 = static_cast<int32_t>(scene[4]);
  const char* err = scene_config_error(c);
  TORCH_CHECK(err == nullptr, "invalid scene configuration: ", err ? err : "");
  return c;
}

// A lookup's queries in the caller's dtype (or ordered keys with KeyType::UInt64), checked against the index
// (`index` is any tensor of it, for its device); the kernels map them where they read them.
inline QueryKeys query_keys(const at::Tensor& index, const at::Tensor& lo, const c10::optional<at::Tensor>& hi,
                            KeyType t) {
  const char* name = hi.has_value() ? "lo" : "queries";
  TORCH_CHECK(lo.dim() == 1, name, " must be a 1-D tensor, got ", lo.dim(), " dimensions");
  TORCH_CHECK(dtype_holds(lo.scalar_type(), t), name, " have dtype ", lo.scalar_type(), " but the index holds ",
              key_type_name(t), " keys");
  TORCH_CHECK(lo.is_contiguous(), name, " must be contiguous");
  check_same_device(index, lo, "the index", name);
  QueryKeys q{lo.data_ptr(), nullptr, static_cast<uint32_t>(t)};
  if (hi.has_value()) {
    TORCH_CHECK(hi->dim() == 1 && hi->scalar_type() == lo.scalar_type() && hi->is_contiguous(),
                "hi must be a contiguous 1-D tensor of lo's dtype");
    check_same_device(lo, *hi, "lo", "hi");
    TORCH_CHECK(lo.numel() == hi->numel(), "lo and hi must have the same length, got ", lo.numel(), " and ",
                hi->numel());
    q.hi = hi->data_ptr();
  }
  return q;
}

// `index` is any tensor of the index (for its device); num_keys the number of indexed keys. `at_least`: values
// may run past the keys (they cover every row ID the index holds, which the caller guarantees).
inline void check_values(const at::Tensor& values, int64_t num_keys, const at::Tensor& index, bool at_least = false) {
  TORCH_CHECK(values.dim() == 1 && (at_least ? values.numel() >= num_keys : values.numel() == num_keys),
              "values must be a 1-D tensor with ", at_least ? "at least " : "", "one value per indexed key (",
              num_keys, "), got shape ", values.sizes());
  TORCH_CHECK(values.is_contiguous(), "values must be contiguous");
  check_same_device(values, index, "values", "the index");
  const auto t = values.scalar_type();
  TORCH_CHECK(t == at::kLong || t == at::kInt || t == at::kFloat || t == at::kDouble,
              "values must be int32, int64, float32 or float64, got ", t);
}

// Sums of integer columns are int64, sums of floating columns float64.
inline at::ScalarType sum_dtype(at::ScalarType values) {
  return at::isFloatingType(values) ? at::kDouble : at::kLong;
}

inline ValueKind value_kind_of(at::ScalarType t) {
  switch (t) {
    case at::kLong: return ValueKind::Int64;
    case at::kInt: return ValueKind::Int32;
    case at::kFloat: return ValueKind::Float32;
    default: return ValueKind::Float64;
  }
}

}  // namespace rtindex
