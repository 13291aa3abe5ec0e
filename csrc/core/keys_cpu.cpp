// CPU kernels of the key-mapping operators.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>

#include "checks.h"
#include "checks.h"
#include "key_dispatch.h"
#include "sort.h"

namespace rtindex {
namespace {

at::Tensor map_keys_cpu(const at::Tensor& keys, int64_t key_type) {
  TORCH_CHECK(keys.dim() == 1, "keys must be a 1-D tensor, got ", keys.dim(), " dimensions");
  const at::Tensor in = keys.contiguous();
  at::Tensor out = at::empty({in.numel()}, in.options().dtype(at::kLong));
  dispatch_key_type(in, key_type, "keys", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(in.data_ptr());
    uint64_t* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
    at::parallel_for(0, in.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = ordered_key(src[i], as_unsigned);
    });
  });
  return out;
}

at::Tensor unmap_keys_cpu(const at::Tensor& ordered, int64_t key_type, at::ScalarType dtype) {
  check_ordered_keys(ordered, "ordered keys");
  at::Tensor out = at::empty({ordered.numel()}, ordered.options().dtype(dtype));
  dispatch_key_type(out, key_type, "keys", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    const uint64_t* src = reinterpret_cast<const uint64_t*>(ordered.data_ptr<int64_t>());
    T* dst = static_cast<T*>(out.data_ptr());
    at::parallel_for(0, ordered.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = key_from_ordered(src[i], T{}, as_unsigned);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> map_ranges_cpu(const at::Tensor& lo, const at::Tensor& hi, int64_t key_type) {
  TORCH_CHECK(lo.dim() == 1 && hi.dim() == 1, "lo and hi must be 1-D tensors");
  TORCH_CHECK(lo.numel() == hi.numel(), "lo and hi must have the same length, got ", lo.numel(), " and ", hi.numel());
  TORCH_CHECK(lo.scalar_type() == hi.scalar_type(), "lo and hi must have the same dtype");
  const at::Tensor l = lo.contiguous(), h = hi.contiguous();
  at::Tensor out_lo = at::empty({l.numel()}, l.options().dtype(at::kLong));
  at::Tensor out_hi = at::empty({l.numel()}, l.options().dtype(at::kLong));
  dispatch_key_type(l, key_type, "range bounds", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    const T* pl = static_cast<const T*>(l.data_ptr());
    const T* ph = static_cast<const T*>(h.data_ptr());
    uint64_t* ol = reinterpret_cast<uint64_t*>(out_lo.data_ptr<int64_t>());
    uint64_t* oh = reinterpret_cast<uint64_t*>(out_hi.data_ptr<int64_t>());
    at::parallel_for(0, l.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const bool empty = is_nan_value(pl[i]) || is_nan_value(ph[i]);
        ol[i] = empty ? kEmptyRangeLo : ordered_key(pl[i], as_unsigned);
        oh[i] = empty ? kEmptyRangeHi : ordered_key(ph[i], as_unsigned);
      }
    });
  });
  return {out_lo, out_hi};
}

// The same order the GPU's radix sort gives: stable, by bits [begin_bit, end_bit) of the ordered key.
std::tuple<at::Tensor, at::Tensor> sort_queries_cpu(const at::Tensor& keys, int64_t begin_bit, int64_t end_bit) {
  check_ordered_keys(keys, "keys");
  check_sort_bits(begin_bit, end_bit);
  const at::Tensor order = bits_order(keys, begin_bit, end_bit);
  return {keys.index_select(0, order), order};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("map_keys", &map_keys_cpu);
  m.impl("map_ranges", &map_ranges_cpu);
  m.impl("unmap_keys", &unmap_keys_cpu);
  m.impl("sort_queries", &sort_queries_cpu);
}

}  // namespace rtindex
