// CUDA kernels of the sharded-index routing operators (same routing as partition_cpu.cpp, from partition.h).
// partition_queries: a counting kernel (per-block histogram in shared memory, then one global atomic per
// bucket and block), an exclusive scan of the small count array, and a scatter kernel in which each block
// reserves its slots per bucket with one global atomic. Order within a bucket is not stable (blocks reserve in
// any order); the positions travel with the keys, so every answer still lands at its query. partition_padded
// (the fixed-capacity exchange) is the scatter kernel alone, writing into per-owner blocks behind their header
// (the owners' counts are its cursors); gather_answers reads the answers back by the slots it recorded.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../core/cuda_utils.h"
#include "../core/queries.h"
#include "partition.h"
#include "partition_checks.h"

namespace rtindex {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Shared memory of both partition kernels: the splitters, then per bucket a 64-bit base and a 32-bit counter.
inline size_t partition_smem(int64_t num_splitters, int64_t buckets) {
  return static_cast<size_t>(num_splitters) * 8 + static_cast<size_t>(buckets) * 12;
}

// Queries per thread per tile: 8 (a block's shared and global atomics serve more queries) once tiles that big
// still give every multiprocessor two blocks; below that, one, so that a small batch (an embedding call's IDs)
// spreads over the whole GPU instead of a few blocks that walk their 8 items one after another.
constexpr int kWideItems = 8;

inline int partition_sms() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

inline bool wide_tiles(int64_t n) { return n >= int64_t(partition_sms()) * 2 * kBlock * kWideItems; }

// Blocks of the partition kernels: a tile each, at most 8 per multiprocessor (they loop over the tiles).
inline unsigned partition_grid(int64_t n, int items) {
  const int64_t tile = int64_t(kBlock) * items;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + tile - 1) / tile, int64_t(partition_sms()) * 8)));
}

// Calls launch(std::integral_constant<int, Items>) with the tile width wide_tiles picks for n queries.
template <typename F>
void with_tile_items(int64_t n, F&& launch) {
  if (wide_tiles(n)) launch(std::integral_constant<int, kWideItems>{});
  else launch(std::integral_constant<int, 1>{});
}

// Lanes of a warp adding one to the same shared counter are served by one atomic (few buckets: a warp's lanes
// mostly agree, and 32 lanes on one shared address would serialize). Returns this lane's slot; bucket < 0 (no
// query) takes none. Every lane of the warp must call it.
__device__ __forceinline__ unsigned warp_claim(unsigned* counters, int bucket) {
  const unsigned peers = __match_any_sync(kFullMask, bucket);
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(peers) - 1;
  unsigned first = 0;
  if (lane == leader && bucket >= 0) first = atomicAdd(&counters[bucket], static_cast<unsigned>(__popc(peers)));
  first = __shfl_sync(kFullMask, first, leader);
  return first + __popc(peers & ((1u << lane) - 1u));
}

template <KeyType T, int Items>
__global__ void partition_count_kernel(const void* __restrict__ queries, int64_t n, const uint64_t* __restrict__ splitters,
                                       int64_t num_splitters, int64_t chunks, int64_t buckets, int64_t skip,
                                       unsigned long long* __restrict__ counts) {
  extern __shared__ unsigned long long smem[];
  uint64_t* s_split = reinterpret_cast<uint64_t*>(smem);
  unsigned* s_count = reinterpret_cast<unsigned*>(smem + num_splitters + buckets);
  for (int64_t j = threadIdx.x; j < num_splitters; j += blockDim.x) s_split[j] = splitters[j];
  for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x) s_count[b] = 0;
  __syncthreads();
  const uint64_t un = static_cast<uint64_t>(n);
  constexpr int64_t kTile = int64_t(kBlock) * Items;
  // Tiles are uniform per block (and items per warp), so every lane reaches warp_claim together.
  for (int64_t tile = blockIdx.x * kTile; tile < n; tile += int64_t(gridDim.x) * kTile) {
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      const int64_t i = tile + j * kBlock + threadIdx.x;
      int bucket = -1;
      if (i < n) bucket = static_cast<int>(send_bucket(i, un, chunks, ordered_query<T>(queries, i), s_split, num_splitters, skip));
      warp_claim(s_count, bucket);
    }
  }
  __syncthreads();
  for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x)
    if (s_count[b]) atomicAdd(&counts[b], static_cast<unsigned long long>(s_count[b]));
}

// Grouped (Padded = false): query i's key goes to the bucket's next slot of one array (cursor: each bucket's
// first slot), out_pos[slot] = i. Padded: out_keys is the zeroed block [owners, kPaddedHeader + capacity]; the
// key goes to owner d's row after the header at its offset, out_pos[i] = that entry, or -1 past the capacity;
// the cursors are the rows' count column (each owner's count once done), and the query that lands first past
// an owner's capacity sets the overflow flag of every row.
template <KeyType T, bool Padded, int Items>
__global__ void partition_scatter_kernel(const void* __restrict__ queries, int64_t n,
                                         const uint64_t* __restrict__ splitters, int64_t num_splitters, int64_t chunks,
                                         int64_t buckets, int64_t skip, unsigned long long* __restrict__ cursor,
                                         uint64_t* __restrict__ out_keys, int64_t* __restrict__ out_pos,
                                         int64_t capacity) {
  const int64_t width = Padded ? kPaddedHeader + capacity : 0;
  extern __shared__ unsigned long long smem[];
  uint64_t* s_split = reinterpret_cast<uint64_t*>(smem);
  unsigned long long* s_base = smem + num_splitters;
  unsigned* s_count = reinterpret_cast<unsigned*>(smem + num_splitters + buckets);
  for (int64_t j = threadIdx.x; j < num_splitters; j += blockDim.x) s_split[j] = splitters[j];
  const uint64_t un = static_cast<uint64_t>(n);
  constexpr int64_t kTile = int64_t(kBlock) * Items;
  for (int64_t tile = blockIdx.x * kTile; tile < n; tile += int64_t(gridDim.x) * kTile) {
    __syncthreads();  // the last tile's s_base reads are done (and, the first time, the splitters are loaded)
    for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x) s_count[b] = 0;
    __syncthreads();
    uint64_t key[Items];
    int bucket[Items];
    unsigned slot[Items];
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      const int64_t i = tile + j * kBlock + threadIdx.x;
      bucket[j] = -1;
      key[j] = 0;
      if (i < n) {
        key[j] = ordered_query<T>(queries, i);
        bucket[j] = static_cast<int>(send_bucket(i, un, chunks, key[j], s_split, num_splitters, skip));
      }
      slot[j] = warp_claim(s_count, bucket[j]);
    }
    __syncthreads();
    for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x) {
      const unsigned c = s_count[b];
      if (c) s_base[b] = atomicAdd(&cursor[Padded ? b * width + kPaddedCount : b], static_cast<unsigned long long>(c));
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      if (bucket[j] < 0) continue;
      const int64_t i = tile + j * kBlock + threadIdx.x;
      const int64_t at = static_cast<int64_t>(s_base[bucket[j]] + slot[j]);
      if constexpr (Padded) {
        const int64_t dst = bucket[j] * width + kPaddedHeader + at;
        if (at < capacity) out_keys[dst] = key[j];
        out_pos[i] = at < capacity ? dst : -1;
        if (at == capacity)  // one query per overfull owner
          for (int64_t r = 0; r < buckets; ++r) out_keys[r * width + kPaddedOverflow] = 1;
      } else {
        out_keys[at] = key[j];
        out_pos[at] = i;
      }
    }
  }
}

// The shared memory of both partition kernels holds the splitters and a counter per bucket.
void check_cuda_buckets(int64_t buckets, const char* op) {
  TORCH_CHECK(buckets <= kMaxPartitionBuckets, op, " on CUDA takes at most ", kMaxPartitionBuckets,
              " buckets (chunks x ranks), got ", buckets);
}

// Launches the scatter kernel (grouped or padded) over the n queries of q.
template <bool Padded>
void launch_scatter(const at::Tensor& q, int64_t key_type, const at::Tensor& splitters, int64_t chunks, int64_t skip,
                    at::Tensor& cursor, at::Tensor& keys, at::Tensor& pos, int64_t capacity) {
  const int64_t n = q.numel(), num_splitters = splitters.numel(), buckets = chunks * (num_splitters + 1);
  with_query_type(static_cast<uint32_t>(key_type), [&](auto tag) {
    with_tile_items(n, [&](auto items) {
      constexpr KeyType T = decltype(tag)::value;
      constexpr int Items = decltype(items)::value;
      partition_scatter_kernel<T, Padded, Items><<<partition_grid(n, Items), kBlock,
                                                   partition_smem(num_splitters, buckets), current_stream()>>>(
          q.data_ptr(), n, reinterpret_cast<const uint64_t*>(splitters.data_ptr<int64_t>()), num_splitters, chunks,
          buckets, skip, reinterpret_cast<unsigned long long*>(cursor.data_ptr<int64_t>()),
          reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>()), pos.data_ptr<int64_t>(), capacity);
    });
  });
  RTX_CHECK_LAUNCH();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> partition_queries_cuda(const at::Tensor& queries, int64_t key_type,
                                                                      const at::Tensor& splitters, int64_t chunks,
                                                                      int64_t skip) {
  check_partition_args(queries, key_type, splitters, chunks, skip);
  const c10::cuda::CUDAGuard guard(queries.device());
  const at::Tensor q = queries.contiguous();
  const int64_t n = q.numel(), num_splitters = splitters.numel(), world = num_splitters + 1;
  const int64_t buckets = chunks * world;
  check_cuda_buckets(buckets, "partition_queries");
  at::Tensor keys = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor positions = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor counts = at::zeros({chunks, world}, q.options().dtype(at::kLong));
  if (n == 0) return {keys, positions, counts};

  with_query_type(static_cast<uint32_t>(key_type), [&](auto tag) {
    with_tile_items(n, [&](auto items) {
      constexpr KeyType T = decltype(tag)::value;
      constexpr int Items = decltype(items)::value;
      partition_count_kernel<T, Items><<<partition_grid(n, Items), kBlock, partition_smem(num_splitters, buckets),
                                         current_stream()>>>(
          q.data_ptr(), n, reinterpret_cast<const uint64_t*>(splitters.data_ptr<int64_t>()), num_splitters, chunks,
          buckets, skip, reinterpret_cast<unsigned long long*>(counts.data_ptr<int64_t>()));
    });
  });
  RTX_CHECK_LAUNCH();
  // Each bucket's first slot: the exclusive scan of the counts (bucket-major order is chunk-major, owner-minor).
  const at::Tensor flat = counts.view({-1});
  at::Tensor cursor = flat.cumsum(0).sub_(flat);
  launch_scatter<false>(q, key_type, splitters, chunks, skip, cursor, keys, positions, 0);
  return {keys, positions, counts};
}

// One pass: no counting kernel, no scan (a block's offsets come from the owners' running counts, kept in the
// header's count column).
std::tuple<at::Tensor, at::Tensor> partition_padded_cuda(const at::Tensor& queries, int64_t key_type,
                                                         const at::Tensor& splitters, int64_t capacity) {
  check_padded_args(queries, key_type, splitters, capacity);
  const c10::cuda::CUDAGuard guard(queries.device());
  const at::Tensor q = queries.contiguous();
  const int64_t n = q.numel(), num_splitters = splitters.numel(), world = num_splitters + 1;
  check_cuda_buckets(world, "partition_padded");
  at::Tensor block = at::zeros({world, kPaddedHeader + capacity}, q.options().dtype(at::kLong));
  at::Tensor slots = at::empty({n}, q.options().dtype(at::kLong));
  if (n == 0) return {block, slots};

  launch_scatter<true>(q, key_type, splitters, 1, -1, block, block, slots, capacity);  // counts: the cursors
  return {block, slots};
}

// Answer rows [m, 2] read as 16-byte vectors: a contiguous tensor whose storage starts 16-byte aligned.
at::Tensor vector_rows(const at::Tensor& answers) {
  at::Tensor ans = answers.contiguous();
  return reinterpret_cast<uintptr_t>(ans.data_ptr()) % 16 == 0 ? ans : ans.clone();
}

__global__ void gather_answers_kernel(const longlong2* __restrict__ ans, int64_t m, const int64_t* __restrict__ slots,
                                      int64_t n, int64_t fill_first, int64_t fill_second, int64_t* __restrict__ first,
                                      int64_t* __restrict__ second, const int64_t* __restrict__ flags, int64_t owners,
                                      int64_t flag_stride, bool* __restrict__ overflowed) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // a handful of owners: one thread, no reduction kernel
    bool any = false;
    for (int64_t r = 0; r < owners; ++r) any |= flags[r * flag_stride] != 0;
    *overflowed = any;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = slots[i];
    // Past the answers and not -1 cannot come from partition_padded: filled (the CPU kernel raises).
    const bool hit = j >= 0 && j < m;
    const longlong2 v = hit ? ans[j] : make_longlong2(fill_first, fill_second);
    first[i] = v.x;
    second[i] = v.y;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gather_answers_cuda(const at::Tensor& answers, const at::Tensor& slots,
                                                                   int64_t fill_first, int64_t fill_second,
                                                                   const at::Tensor& received) {
  check_gather_args(answers, slots, received);
  const c10::cuda::CUDAGuard guard(answers.device());
  const at::Tensor sl = slots.contiguous(), ans = vector_rows(answers);
  const int64_t n = sl.numel();
  auto [first, second] = answer_columns(n, ans.options());
  at::Tensor overflowed = at::empty({}, ans.options().dtype(at::kBool));
  // Launched also for no queries: the flag is read by its first thread.
  gather_answers_kernel<<<grid_for(std::max<int64_t>(n, 1)), kBlock, 0, current_stream()>>>(
      reinterpret_cast<const longlong2*>(ans.data_ptr<int64_t>()), ans.size(0), sl.data_ptr<int64_t>(), n,
      fill_first, fill_second, first.data_ptr<int64_t>(), second.data_ptr<int64_t>(),
      received.data_ptr<int64_t>() + kPaddedOverflow * received.stride(1), received.size(0), received.stride(0),
      overflowed.data_ptr<bool>());
  RTX_CHECK_LAUNCH();
  return {first, second, overflowed};
}

template <typename B>
__global__ void pack_answers_kernel(const int64_t* __restrict__ a, const B* __restrict__ b,
                                    const int64_t* __restrict__ map, int64_t m, int64_t n, longlong2* __restrict__ out) {
  bool bad = false;  // past the map cannot come from a local index: answered -1 (the CPU kernel raises)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = make_longlong2(m > 0 ? global_row(a[i], map, m, 0, &bad) : a[i], static_cast<int64_t>(b[i]));
}

at::Tensor pack_answers_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& local_to_global) {
  check_pack_args(a, b, local_to_global);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor ca = a.contiguous(), cb = b.contiguous(), l2g = local_to_global.contiguous();
  const int64_t n = ca.numel();
  at::Tensor out = at::empty({n, 2}, ca.options());  // 16-byte aligned rows: the caching allocator aligns to 512
  if (n == 0) return out;
  const auto launch = [&](auto* pb) {
    pack_answers_kernel<<<grid_for(n), kBlock, 0, current_stream()>>>(
        ca.data_ptr<int64_t>(), pb, l2g.data_ptr<int64_t>(), l2g.numel(), n,
        reinterpret_cast<longlong2*>(out.data_ptr<int64_t>()));
  };
  if (cb.scalar_type() == at::kInt) launch(cb.data_ptr<int32_t>()); else launch(cb.data_ptr<int64_t>());
  RTX_CHECK_LAUNCH();
  return out;
}

template <typename Map>
__global__ void global_rows_kernel(const int64_t* __restrict__ local, const Map* __restrict__ map, int64_t m,
                                   int64_t base, int64_t n, int64_t* __restrict__ out) {
  bool bad = false;  // past the map cannot come from a chunk's index; the CPU kernel raises, here it answers -1
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = global_row(local[i], map, m, base, &bad);
}

at::Tensor global_rows_cuda(const at::Tensor& local, const at::Tensor& local_to_global, int64_t base) {
  check_global_rows_args(local, local_to_global);
  const c10::cuda::CUDAGuard guard(local.device());
  const at::Tensor cl = local.contiguous(), l2g = local_to_global.contiguous();
  const int64_t n = cl.numel();
  at::Tensor out = at::empty({n}, cl.options());
  if (n == 0) return out;
  if (l2g.scalar_type() == at::kInt) {
    global_rows_kernel<<<grid_for(n), kBlock, 0, current_stream()>>>(cl.data_ptr<int64_t>(), l2g.data_ptr<int32_t>(),
                                                                     l2g.numel(), base, n, out.data_ptr<int64_t>());
  } else {
    global_rows_kernel<<<grid_for(n), kBlock, 0, current_stream()>>>(cl.data_ptr<int64_t>(), l2g.data_ptr<int64_t>(),
                                                                     l2g.numel(), base, n, out.data_ptr<int64_t>());
  }
  RTX_CHECK_LAUNCH();
  return out;
}

__global__ void scatter_answers_kernel(const longlong2* __restrict__ ans, const int64_t* __restrict__ pos, int64_t m,
                                       int64_t n, int64_t* __restrict__ first, int64_t* __restrict__ second) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < m; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = pos[j];
    if (p < 0 || p >= n) continue;  // outside the columns: the CPU kernel raises; here the write is dropped
    const longlong2 v = ans[j];
    first[p] = v.x;
    second[p] = v.y;
  }
}

// Rows of answers [m, 2] to entries positions[j] of first and second (n entries each).
void scatter_rows(const at::Tensor& answers, const at::Tensor& positions, at::Tensor& first, at::Tensor& second) {
  const at::Tensor pos = positions.contiguous(), ans = vector_rows(answers);
  const int64_t m = ans.size(0);
  if (m == 0) return;
  scatter_answers_kernel<<<grid_for(m), kBlock, 0, current_stream()>>>(
      reinterpret_cast<const longlong2*>(ans.data_ptr<int64_t>()), pos.data_ptr<int64_t>(), m, first.numel(),
      first.data_ptr<int64_t>(), second.data_ptr<int64_t>());
  RTX_CHECK_LAUNCH();
}

void scatter_answers_into_cuda(const at::Tensor& answers, const at::Tensor& positions, at::Tensor& first,
                               at::Tensor& second) {
  check_answers_into(answers, positions, first, second);
  const c10::cuda::CUDAGuard guard(answers.device());
  scatter_rows(answers, positions, first, second);
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex_internal, CUDA, m) {
  m.impl("partition_queries", &partition_queries_cuda);
  m.impl("partition_padded", &partition_padded_cuda);
  m.impl("gather_answers", &gather_answers_cuda);
  m.impl("pack_answers", &pack_answers_cuda);
  m.impl("scatter_answers_into", &scatter_answers_into_cuda);
  m.impl("global_rows", &global_rows_cuda);
}

}  // namespace rtindex
