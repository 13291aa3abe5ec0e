// GPU threads reading pinned host memory at random (zero copy), by how the host memory was allocated: whether the
// host's page size changes the random-read rate over a large region (the GPU's and the IOMMU's translation of host
// pages). Each thread reads S 32-byte sectors of one random line and writes 8 bytes, as gather_floor.cu does.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <torch/extension.h>

#include <cerrno>
#include <cstring>

namespace {

template <int S>
__global__ void host_gather_kernel(const int4* __restrict__ table, const long long* __restrict__ idx,
                                   long long* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int4* line = table + idx[i] * (2 * S);
    long long acc = 0;
#pragma unroll
    for (int j = 0; j < 2 * S; ++j) {
      const int4 v = line[j];
      acc ^= (static_cast<long long>(v.x) << 32) ^ v.y ^ (static_cast<long long>(v.z) << 16) ^ v.w;
    }
    out[i] = acc;
  }
}

constexpr size_t kHuge = size_t(2) << 20;

// kind: "hostalloc" (cudaHostAlloc), "thp" (2 MiB-aligned anonymous mmap, madvise(MADV_HUGEPAGE), touched, then
// cudaHostRegister), "hugetlb" (mmap MAP_HUGETLB, then cudaHostRegister), "small" (mmap with MADV_NOHUGEPAGE,
// registered). Returns the host address; the memory is filled with a pattern.
int64_t host_alloc(const std::string& kind, int64_t bytes) {
  void* p = nullptr;
  if (kind == "hostalloc") {
    C10_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  } else {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    size_t len = bytes + (kind == "hugetlb" ? 0 : kHuge);
    if (kind == "hugetlb") flags |= MAP_HUGETLB;
    void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    TORCH_CHECK(raw != MAP_FAILED, "mmap(", kind, ") failed: ", std::strerror(errno));
    p = raw;
    if (kind != "hugetlb") {
      p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
      TORCH_CHECK(madvise(p, bytes, kind == "thp" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0, "madvise failed: ",
                  std::strerror(errno));
    }
    std::memset(p, 0x5a, bytes);  // fault every page in before pinning
    C10_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  }
  std::memset(p, 0x5b, bytes);
  return reinterpret_cast<int64_t>(p);
}

// Random reads by the GPU: idx holds line numbers (lines of 32 S bytes) within the region at `address`.
torch::Tensor host_gather(int64_t address, torch::Tensor idx, int64_t sectors) {
  TORCH_CHECK(idx.is_cuda() && idx.scalar_type() == torch::kLong && idx.is_contiguous());
  void* dev = nullptr;
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&dev, reinterpret_cast<void*>(address), 0));
  auto out = torch::empty_like(idx);
  const long long n = idx.numel();
  const auto* t = reinterpret_cast<const int4*>(dev);
  const auto* i = reinterpret_cast<const long long*>(idx.data_ptr<int64_t>());
  auto* o = reinterpret_cast<long long*>(out.data_ptr<int64_t>());
  const int block = 256;
  const long long grid = std::min<long long>((n + block - 1) / block, 1 << 20);
  auto stream = at::cuda::getCurrentCUDAStream();
  if (sectors == 1) host_gather_kernel<1><<<grid, block, 0, stream>>>(t, i, o, n);
  if (sectors == 4) host_gather_kernel<4><<<grid, block, 0, stream>>>(t, i, o, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("host_alloc", &host_alloc, "pinned, GPU-mapped host memory of the given kind; returns its address");
  m.def("host_gather", &host_gather, "per index, the XOR of `sectors` sectors of its line, read by the GPU");
}
