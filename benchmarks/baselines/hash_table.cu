// The project's own GPU hash-table baseline (no maintained GPU hash table installs from PyPI for CUDA 13):
// open addressing over 16-byte slots (64-bit key, 32-bit row ID), load factor 0.8, cooperative probing in
// groups of 8 threads that test one 128-byte window (8 slots) per step, as WarpCore does. It reserves the key
// 2^64 - 1 as the empty marker (a real index in this package reserves none) and stores unique keys.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

namespace {

constexpr unsigned long long kEmpty = ~0ull;
constexpr int kGroup = 8;

struct alignas(16) Slot {
  unsigned long long key;
  unsigned long long value;
};

__device__ __forceinline__ unsigned long long mix(unsigned long long k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

__global__ void insert_kernel(Slot* table, unsigned long long windows, const long long* keys, long long n) {
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / kGroup;
  const int lane = threadIdx.x % kGroup;
  const unsigned mask = 0xFFu << ((threadIdx.x % 32) / kGroup * kGroup);
  if (g >= n) return;
  const unsigned long long k = static_cast<unsigned long long>(keys[g]);
  unsigned long long w = mix(k) % windows;
  for (;;) {
    Slot* s = table + w * kGroup + lane;
    const bool empty = s->key == kEmpty;
    unsigned ballot = __ballot_sync(mask, empty) >> ((threadIdx.x % 32) / kGroup * kGroup) & 0xFFu;
    bool done = false;
    while (ballot) {
      const int leader = __ffs(ballot) - 1;
      unsigned long long won = 0;
      if (lane == leader) won = atomicCAS(&s->key, kEmpty, k) == kEmpty;
      won = __shfl_sync(mask, won, leader, kGroup);
      if (won) {
        if (lane == leader) s->value = static_cast<unsigned long long>(g);
        done = true;
        break;
      }
      ballot &= ballot - 1;
    }
    if (done) return;
    w = (w + 1) % windows;
  }
}

__global__ void lookup_kernel(const Slot* table, unsigned long long windows, const long long* queries, long long q,
                              long long* out) {
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / kGroup;
  const int lane = threadIdx.x % kGroup;
  const int shift = (threadIdx.x % 32) / kGroup * kGroup;
  const unsigned mask = 0xFFu << shift;
  if (g >= q) return;
  const unsigned long long k = static_cast<unsigned long long>(queries[g]);
  unsigned long long w = mix(k) % windows;
  for (;;) {
    const Slot s = table[w * kGroup + lane];
    const unsigned hit = (__ballot_sync(mask, s.key == k) >> shift) & 0xFFu;
    if (hit) {
      const unsigned long long v = __shfl_sync(mask, s.value, __ffs(hit) - 1, kGroup);
      if (lane == 0) out[g] = static_cast<long long>(v);
      return;
    }
    if ((__ballot_sync(mask, s.key == kEmpty) >> shift) & 0xFFu) {
      if (lane == 0) out[g] = -1;
      return;
    }
    w = (w + 1) % windows;
  }
}

torch::Tensor build(torch::Tensor keys, double load_factor) {
  TORCH_CHECK(keys.is_cuda() && keys.scalar_type() == torch::kLong && keys.dim() == 1);
  const long long n = keys.numel();
  const unsigned long long windows = std::max<unsigned long long>(1, static_cast<unsigned long long>(n / load_factor) / kGroup + 1);
  auto table = torch::full({static_cast<long long>(windows * kGroup * 2)}, -1, keys.options());
  const long long threads = n * kGroup;
  insert_kernel<<<(threads + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<Slot*>(table.data_ptr<int64_t>()), windows, reinterpret_cast<const long long*>(keys.data_ptr<int64_t>()), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return table;
}

torch::Tensor lookup(torch::Tensor table, torch::Tensor queries) {
  const unsigned long long windows = table.numel() / 2 / kGroup;
  auto out = torch::empty_like(queries);
  const long long threads = queries.numel() * kGroup;
  if (threads == 0) return out;
  lookup_kernel<<<(threads + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const Slot*>(table.data_ptr<int64_t>()), windows, reinterpret_cast<const long long*>(queries.data_ptr<int64_t>()), queries.numel(),
      reinterpret_cast<long long*>(out.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("build", &build, "build the table from unique int64 keys (row ID = position)");
  m.def("lookup", &lookup, "row ID of each query, -1 on a miss");
}
