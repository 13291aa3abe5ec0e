// The memory floor of a random point lookup, measured rather than assumed: each thread reads one random index and
// then S 32-byte sectors of one random line of a table (S = 1, 2 or 4: one sector, a 64-byte line, a 128-byte
// window), and writes 8 bytes. No search, no compare: what the lookups of an index that touches S sectors per
// query cannot beat on this GPU.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

namespace {

template <int S>
__global__ void gather_kernel(const int4* __restrict__ table, const long long* __restrict__ idx,
                              long long* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int4* line = table + idx[i] * (2 * S);  // a sector is two 16-byte loads
    long long acc = 0;
#pragma unroll
    for (int j = 0; j < 2 * S; ++j) {
      const int4 v = __ldg(line + j);
      acc ^= (static_cast<long long>(v.x) << 32) ^ v.y ^ (static_cast<long long>(v.z) << 16) ^ v.w;
    }
    out[i] = acc;
  }
}

// table: any int64 tensor (its bytes are the footprint); idx: line numbers in [0, table bytes / (32 S)).
torch::Tensor gather(torch::Tensor table, torch::Tensor idx, int64_t sectors) {
  TORCH_CHECK(table.is_cuda() && idx.is_cuda() && idx.scalar_type() == torch::kLong && idx.is_contiguous());
  TORCH_CHECK(sectors == 1 || sectors == 2 || sectors == 4, "sectors must be 1, 2 or 4");
  auto out = torch::empty_like(idx);
  const long long n = idx.numel();
  if (n == 0) return out;
  const auto* t = reinterpret_cast<const int4*>(table.data_ptr());
  const auto* i = reinterpret_cast<const long long*>(idx.data_ptr<int64_t>());
  auto* o = reinterpret_cast<long long*>(out.data_ptr<int64_t>());
  const int block = 256;
  const long long grid = std::min<long long>((n + block - 1) / block, 1 << 20);
  auto stream = at::cuda::getCurrentCUDAStream();
  if (sectors == 1) gather_kernel<1><<<grid, block, 0, stream>>>(t, i, o, n);
  if (sectors == 2) gather_kernel<2><<<grid, block, 0, stream>>>(t, i, o, n);
  if (sectors == 4) gather_kernel<4><<<grid, block, 0, stream>>>(t, i, o, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gather", &gather, "per index, the XOR of `sectors` 32-byte sectors of its line of the table");
}
