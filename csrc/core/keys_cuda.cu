// CUDA kernels of the key-mapping operators (same mapping as keys_cpu.cpp, from csrc/core/keys.h) and the
// query sort.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>

#include <limits>

#include "checks.h"
#include "cuda_utils.h"
#include "key_dispatch.h"

namespace rtindex {
namespace {

template <typename T>
__global__ void map_keys_kernel(const T* __restrict__ in, uint64_t* __restrict__ out, int64_t n, bool as_unsigned) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ordered_key(in[i], as_unsigned);
}

template <typename T>
__global__ void map_ranges_kernel(const T* __restrict__ lo, const T* __restrict__ hi, uint64_t* __restrict__ out_lo,
                                  uint64_t* __restrict__ out_hi, int64_t n, bool as_unsigned) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const bool empty = is_nan_value(lo[i]) || is_nan_value(hi[i]);
    out_lo[i] = empty ? kEmptyRangeLo : ordered_key(lo[i], as_unsigned);
    out_hi[i] = empty ? kEmptyRangeHi : ordered_key(hi[i], as_unsigned);
  }
}

template <typename T>
__global__ void unmap_keys_kernel(const uint64_t* __restrict__ in, T* __restrict__ out, int64_t n, bool as_unsigned) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = key_from_ordered(in[i], T{}, as_unsigned);
}

at::Tensor unmap_keys_cuda(const at::Tensor& ordered, int64_t key_type, at::ScalarType dtype) {
  check_ordered_keys(ordered, "ordered keys");
  const c10::cuda::CUDAGuard guard(ordered.device());
  at::Tensor out = at::empty({ordered.numel()}, ordered.options().dtype(dtype));
  if (ordered.numel() == 0) return out;
  dispatch_key_type(out, key_type, "keys", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    unmap_keys_kernel<<<grid_for(ordered.numel()), kBlock, 0, current_stream()>>>(
        reinterpret_cast<const uint64_t*>(ordered.data_ptr<int64_t>()), static_cast<T*>(out.data_ptr()),
        ordered.numel(), as_unsigned);
  });
  RTX_CHECK_LAUNCH();
  return out;
}

at::Tensor map_keys_cuda(const at::Tensor& keys, int64_t key_type) {
  TORCH_CHECK(keys.dim() == 1, "keys must be a 1-D tensor, got ", keys.dim(), " dimensions");
  const c10::cuda::CUDAGuard guard(keys.device());
  const at::Tensor in = keys.contiguous();
  at::Tensor out = at::empty({in.numel()}, in.options().dtype(at::kLong));
  if (in.numel() == 0) return out;
  dispatch_key_type(in, key_type, "keys", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    map_keys_kernel<<<grid_for(in.numel()), kBlock, 0, current_stream()>>>(
        static_cast<const T*>(in.data_ptr()), reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()), in.numel(),
        as_unsigned);
  });
  RTX_CHECK_LAUNCH();
  return out;
}

std::tuple<at::Tensor, at::Tensor> map_ranges_cuda(const at::Tensor& lo, const at::Tensor& hi, int64_t key_type) {
  TORCH_CHECK(lo.dim() == 1 && hi.dim() == 1, "lo and hi must be 1-D tensors");
  TORCH_CHECK(lo.numel() == hi.numel(), "lo and hi must have the same length, got ", lo.numel(), " and ", hi.numel());
  TORCH_CHECK(lo.scalar_type() == hi.scalar_type(), "lo and hi must have the same dtype");
  check_same_device(lo, hi, "lo", "hi");
  const c10::cuda::CUDAGuard guard(lo.device());
  const at::Tensor l = lo.contiguous(), h = hi.contiguous();
  at::Tensor out_lo = at::empty({l.numel()}, l.options().dtype(at::kLong));
  at::Tensor out_hi = at::empty({l.numel()}, l.options().dtype(at::kLong));
  if (l.numel() == 0) return {out_lo, out_hi};
  dispatch_key_type(l, key_type, "range bounds", [&](auto tag, bool as_unsigned) {
    using T = decltype(tag);
    map_ranges_kernel<<<grid_for(l.numel()), kBlock, 0, current_stream()>>>(
        static_cast<const T*>(l.data_ptr()), static_cast<const T*>(h.data_ptr()),
        reinterpret_cast<uint64_t*>(out_lo.data_ptr<int64_t>()), reinterpret_cast<uint64_t*>(out_hi.data_ptr<int64_t>()),
        l.numel(), as_unsigned);
  });
  RTX_CHECK_LAUNCH();
  return {out_lo, out_hi};
}

// CUB's radix sort over only the bits that tell the index's keys apart (a few passes instead of eight for a
// full 64-bit sort); the order values ride along. Temporary storage comes from PyTorch's caching allocator,
// and nothing waits for the host, so the sort can be captured in a CUDA graph.
std::tuple<at::Tensor, at::Tensor> sort_queries_cuda(const at::Tensor& keys, int64_t begin_bit, int64_t end_bit) {
  check_ordered_keys(keys, "keys");
  check_sort_bits(begin_bit, end_bit);
  TORCH_CHECK(keys.numel() <= std::numeric_limits<int>::max(), "sort_queries sorts at most 2^31 - 1 keys per call");
  const c10::cuda::CUDAGuard guard(keys.device());
  const int n = static_cast<int>(keys.numel());
  at::Tensor sorted = at::empty_like(keys);
  at::Tensor order = at::empty_like(keys);
  if (n == 0) return {sorted, order};
  at::Tensor positions = at::arange(n, keys.options());
  const auto* kin = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  auto* kout = reinterpret_cast<uint64_t*>(sorted.data_ptr<int64_t>());
  const auto* vin = positions.data_ptr<int64_t>();
  auto* vout = order.data_ptr<int64_t>();
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, vin, vout, n, static_cast<int>(begin_bit),
                                                 static_cast<int>(end_bit), current_stream()));
  at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, keys.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, kin, kout, vin, vout, n,
                                                 static_cast<int>(begin_bit), static_cast<int>(end_bit), current_stream()));
  return {sorted, order};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CUDA, m) {
  m.impl("map_keys", &map_keys_cuda);
  m.impl("map_ranges", &map_ranges_cuda);
  m.impl("sort_queries", &sort_queries_cuda);
  m.impl("unmap_keys", &unmap_keys_cuda);
}

}  // namespace rtindex
