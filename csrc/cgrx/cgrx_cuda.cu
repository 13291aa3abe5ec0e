// cgRX on CUDA: build (sort, pairs, representatives, search tree, optional OptiX scene) and lookups, either a
// CUDA kernel walking the search tree (or binary search) or an OptiX launch tracing the representatives.
// Everything runs on PyTorch's current stream; lookups do not synchronize except the CSR forms' size read.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstring>
#include <limits>
#include <vector>

#include "../core/cuda_utils.h"
#include "../core/l2_residency.h"
#include "../core/results_cuda.h"
#include "../core/sort_cuda.cuh"
#include "../optix/gas.h"
#include "../optix/optix_runtime.h"
#include "cgrx_args.h"
#include "cgrx_launch.h"
#include "cgrx_radix_build.h"

namespace rtindex::cgrx {
namespace {

// Two payload values: the closest hit's primitive index and its back-face bit (cgrx_programs.cu).
const optix::ProgramSet kCgrxPrograms{"cgrx", "__raygen__cgrx", "__miss__cgrx", "__closesthit__cgrx", nullptr, 2};

template <typename K>
__global__ void store_pairs_kernel(const K* __restrict__ keys, const uint32_t* __restrict__ rows, uint32_t* pairs,
                                   int64_t n, Layout l) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_pair(pairs, n, l, i, static_cast<uint64_t>(keys[i]), rows[i]);
}

__global__ void export_pairs_kernel(Pairs p, uint64_t* __restrict__ keys, int64_t* __restrict__ rows) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < p.n; i += uint64_t(gridDim.x) * blockDim.x) {
    keys[i] = p.key(i);
    rows[i] = p.row(i);
  }
}

std::tuple<at::Tensor, at::Tensor> cgrx_pairs_export_cuda(const at::Tensor& pairs, int64_t layout) {
  const Pairs p = pairs_view(pairs, pairs_layout_from_int(layout), 1, false);
  const c10::cuda::CUDAGuard guard(pairs.device());
  const int64_t n = static_cast<int64_t>(p.n);
  at::Tensor keys = at::empty({n}, pairs.options().dtype(at::kLong));
  at::Tensor rows = at::empty({n}, pairs.options().dtype(at::kLong));
  if (n > 0) {
    export_pairs_kernel<<<grid_for(n), kBlock, 0, current_stream()>>>(
        p, reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>()), rows.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
  }
  return {keys, rows};
}

__global__ void set_spare_rows_kernel(uint32_t* __restrict__ data, const int64_t* __restrict__ rows, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_spare_row(data, i, rows);
}

void cgrx_set_spare_rows_cuda(at::Tensor& pairs, int64_t layout, const at::Tensor& rows) {
  const Pairs p = spare_rows_view(pairs, layout, rows);
  const c10::cuda::CUDAGuard guard(pairs.device());
  const int64_t n = static_cast<int64_t>(p.n);
  if (n == 0) return;
  set_spare_rows_kernel<<<grid_for(n), kBlock, 0, current_stream()>>>(
      reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>()), rows.data_ptr<int64_t>(), n);
  RTX_CHECK_LAUNCH();
}

__global__ void scene_kernel(const uint64_t* reps, Pairs pairs, SceneShape s, SceneConfig c, Vec3* v) {
  for (uint64_t b = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b < s.num_buckets; b += uint64_t(gridDim.x) * blockDim.x)
    bucket_triangles(reps, pairs, s, b, c, v);
}

template <typename K>
std::tuple<at::Tensor, at::Tensor, at::Tensor> build_from_sorted(SortedPositions& s, int64_t bucket_size, Layout l) {
  const int64_t n = s.keys.numel();
  const K* sorted = static_cast<const K*>(s.keys.data_ptr());
  at::Tensor pairs = at::empty({layout_words(l, n)}, s.keys.options().dtype(at::kInt));
  if (n > 0) {
    store_pairs_kernel<K><<<grid_for(n), kBlock, 0, current_stream()>>>(
        sorted, reinterpret_cast<const uint32_t*>(s.rows.data_ptr<int32_t>()),
        reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>()), n, l);
    RTX_CHECK_LAUNCH();
  }
  s.rows.reset();  // the pairs hold the positions now
  at::Tensor reps = group_lasts_cuda(sorted, n, bucket_size, s.keys.options());
  return {pairs, reps, build_pairs_radix_table_cuda(sorted, n, reps, l, bucket_size)};
}

// keys: the caller's keys of `key_type` (uint64 for ordered keys), mapped where the sort reads them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> cgrx_build_cuda(const at::Tensor& keys, int64_t bucket_size, int64_t layout,
                                                               int64_t key_type) {
  const Layout l = pairs_layout_from_int(layout);
  check_bucket_size(bucket_size);
  const c10::cuda::CUDAGuard guard(keys.device());
  SortedPositions s = sort_positions_cuda(keys, key_type);
  return s.narrow ? build_from_sorted<uint32_t>(s, bucket_size, l) : build_from_sorted<uint64_t>(s, bucket_size, l);
}

at::Tensor cgrx_build_scene_cuda(const at::Tensor& reps, int64_t num_reps, at::IntArrayRef scene, int64_t representation,
                                 const c10::optional<at::Tensor>& pairs, int64_t bucket_size, int64_t layout) {
  const SceneConfig c = scene_from_list(scene);
  const Representation rep = representation_from_int(representation);
  check_scene_reps(reps, num_reps);
  const c10::cuda::CUDAGuard guard(reps.device());
  const Pairs p = scene_pairs(rep, pairs, bucket_size, layout, reps, num_reps);
  // The shape (how many marker slots) needs the first and last representative on the host: a build-time sync.
  SceneShape shape{static_cast<uint64_t>(num_reps), false, false, static_cast<uint32_t>(rep)};
  if (num_reps > 0) {
    const uint64_t ends[2] = {static_cast<uint64_t>(reps[0].item<int64_t>()),
                              static_cast<uint64_t>(reps[num_reps - 1].item<int64_t>())};
    const SceneShape e = scene_shape(ends, 2, c);
    shape.multi_row = e.multi_row;
    shape.multi_plane = e.multi_plane;
  }
  // The optimized representation's trailing tag slot makes the GAS's triangle count tell the lookups which
  // representation they trace (representation_of_scene).
  const int64_t triangles = static_cast<int64_t>(shape.num_triangles());
  at::Tensor vertices = at::empty({triangles * 9}, reps.options().dtype(at::kFloat));
  if (num_reps > 0) {
    scene_kernel<<<grid_for(num_reps), kBlock, 0, current_stream()>>>(
        reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>()), p, shape, c,
        reinterpret_cast<Vec3*>(vertices.data_ptr<float>()));
    RTX_CHECK_LAUNCH();
  }
  return gas::build(std::move(vertices), triangles, /*allow_update=*/false);
}

// The radix-table and binary-search backends: one thread per query, grid-stride. The binary search is the
// reference the other backends are checked against; node chains (the updatable index) also take this kernel.
// Counts over sorted pairs (range_count, a CSR's first pass) come from the positions of each range's ends
// (count_in_range), not from visiting the matches.
template <KeyType T>
__global__ void __launch_bounds__(kBlock) search_kernel(LaunchParams p) {
  const bool radix = static_cast<Backend>(p.backend) == Backend::Radix;
  const bool positions = static_cast<ResultMode>(p.results.mode) == ResultMode::Count && !p.storage.use_nodes;
  const auto range = [&](uint64_t i, uint64_t& lo, uint64_t& hi) { p.queries.range_as<T>(i, lo, hi); };
  const auto find = [&](uint64_t k) { return reps_lower_bound(p.reps, p.num_reps, k); };
  const auto serve = [&](uint64_t q, auto&& finder) {
    if (!positions) return answer_query(p, q, finder, range);
    uint64_t lo, hi;
    range(q, lo, hi);
    store_once(p.results.count + q,
               static_cast<int64_t>(count_in_range(p.storage, p.reps, p.num_reps, p.table, lo, hi, finder)));
  };
  for (uint64_t q = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; q < p.num_queries; q += uint64_t(gridDim.x) * blockDim.x) {
    if (radix)
      serve(q, RadixSearch{});
    else
      serve(q, find);
  }
}

// cgrx_lookup_queues: the answers of many queues, each in its own index, in one launch. Thread i finds its
// queue by bisecting the queues' first answers, then answers as search_kernel does with that queue's index; a
// found row gets the queue's base (the pairs hold row offsets).
template <KeyType T>
__global__ void __launch_bounds__(kBlock) queues_kernel(LaunchParams p, const QueueArgs* queues, int64_t num_queues,
                                                        uint64_t total) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < total; i += uint64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = num_queues;  // the last queue whose first answer is at or before i
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<uint64_t>(queues[mid].out_begin) <= i) lo = mid; else hi = mid;
    }
    const QueueArgs& q = queues[lo];
    LaunchParams k = p;
    k.storage = q.index.storage;
    k.reps = q.index.reps;
    k.num_reps = q.index.num_reps;
    k.table = q.index.table;
    const uint64_t local = i - static_cast<uint64_t>(q.out_begin);
    const auto range = [&](uint64_t, uint64_t& l, uint64_t& h) { q.keys.range_as<T>(local, l, h); };
    if (q.index.backend == Backend::Radix) {
      answer_query(k, i, RadixSearch{}, range);
    } else {
      answer_query(k, i, [&](uint64_t key) { return reps_lower_bound(k.reps, k.num_reps, key); }, range);
    }
    if (q.base != 0 && p.results.count[i] != 0) p.results.first_row[i] += q.base;
  }
}

// OptiX parameters are written on the stream (graph-capturable) with the handle and the scene shape read on
// the device, so a lookup never waits for the host.
__global__ void write_params_kernel(LaunchParams p, LaunchParams* out) {
  p.handle = gas_handle(p.header);
  SceneShape s = scene_shape(p.reps, p.num_reps, p.scene);
  // Which representation the scene holds follows from its triangle count: decided once here, not per ray.
  s.representation = static_cast<uint32_t>(representation_of_scene(p.header->num_triangles, s));
  p.shape = s;
  *out = p;
}

// Whether a batch of point lookups reads more lines of pairs than L2 holds (one 64-byte line a query): its lines
// then stream through L2 and are read evict-first (Pairs::stream_lines).
bool lines_stream_through_l2(int64_t queries, int device) {
  return static_cast<uint64_t>(queries) * 64 > static_cast<uint64_t>(at::cuda::getDeviceProperties(device)->l2CacheSize);
}

struct Launch {
  LaunchParams p{};
  at::Tensor scene_structure;
  int device;
  size_t table_bytes;

  Launch(const at::Tensor& pairs, const at::Tensor& reps, const at::Tensor& table, const at::Tensor& scene_structure_,
         int64_t config, const at::Tensor& lo, const c10::optional<at::Tensor>& hi)
      : scene_structure(scene_structure_) {
    const CgrxConfig cfg = cgrx_config(config);
    const IndexArgs a = index_args(pairs, reps, table, cfg);
    p.queries = query_keys(pairs, lo, hi, cfg.key_type);
    p.storage = a.storage;
    p.reps = a.reps;
    p.num_reps = a.num_reps;
    p.table = a.table;
    p.backend = static_cast<uint32_t>(a.backend);
    p.scene = a.scene;
    p.num_queries = static_cast<uint64_t>(lo.numel());
    device = lo.device().index();
    p.storage.pairs.stream_lines = lines_stream_through_l2(lo.numel(), device) ? 1u : 0u;
    table_bytes = static_cast<size_t>(table.nbytes());
    if (a.backend == Backend::OptiX && a.num_reps > 0) {
      gas::check_structure(scene_structure);
      check_same_device(scene_structure, pairs, "the scene", "the index");
      p.header = reinterpret_cast<const GasHeader*>(scene_structure.data_ptr());
    }
    record_uses({&pairs, &reps, &table, &scene_structure, &lo, hi ? &*hi : nullptr});
  }

  void run(ResultMode mode) {
    if (p.num_queries == 0) return;
    p.results.mode = static_cast<uint32_t>(mode);
    // A count over sorted pairs needs no rays: the search kernel finds it through the radix table (search_kernel).
    const bool positions = mode == ResultMode::Count && !p.storage.use_nodes;
    if (positions || static_cast<Backend>(p.backend) != Backend::OptiX || p.num_reps == 0) {
      LaunchParams k = p;
      if (static_cast<Backend>(k.backend) == Backend::OptiX) k.backend = static_cast<uint32_t>(Backend::Radix);
      cudaLaunchConfig_t launch{};
      launch.gridDim = dim3(grid_for(static_cast<int64_t>(p.num_queries)));
      launch.blockDim = dim3(kBlock);
      launch.stream = current_stream();
      // The radix table in L2's persisting set-aside, where the caller reserved one (torch_rtindex.reserve_l2).
      cudaLaunchAttribute window;
      if (static_cast<Backend>(k.backend) == Backend::Radix && l2_window(device, p.table, table_bytes, window)) {
        launch.attrs = &window;
        launch.numAttrs = 1;
      }
      with_query_type(p.queries.key_type, [&](auto t) {
        C10_CUDA_CHECK(cudaLaunchKernelEx(&launch, search_kernel<decltype(t)::value>, k));
      });
      return;
    }
    const optix::Pipeline& pipe = optix::pipeline(device, kCgrxPrograms);
    constexpr uint64_t kMaxLaunch = uint64_t(1) << 30;
    const uint64_t chunks = (p.num_queries + kMaxLaunch - 1) / kMaxLaunch;
    at::Tensor buf = at::empty({static_cast<int64_t>(chunks * sizeof(LaunchParams))},
                               at::TensorOptions().device(at::kCUDA, device).dtype(at::kByte));
    auto* dev = reinterpret_cast<LaunchParams*>(buf.data_ptr());
    for (uint64_t c = 0; c < chunks; ++c) {
      p.query_base = c * kMaxLaunch;
      write_params_kernel<<<1, 1, 0, current_stream()>>>(p, dev + c);
      RTX_CHECK_LAUNCH();
      const uint64_t width = std::min(kMaxLaunch, p.num_queries - c * kMaxLaunch);
      optix::launch(pipe, current_stream(), dev + c, sizeof(LaunchParams), static_cast<unsigned>(width));
    }
  }
};

#define CGRX_LOOKUP_ARGS                                                                                  \
  const at::Tensor &pairs, const at::Tensor &reps, const at::Tensor &table, const at::Tensor &scene_structure, \
      int64_t config, const at::Tensor &lo, const c10::optional<at::Tensor> &hi
#define CGRX_FORWARD pairs, reps, table, scene_structure, config, lo, hi

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_cuda(CGRX_LOOKUP_ARGS) {
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  return cuda_results::first_and_count(l, lo.numel(), lo.options().dtype(at::kLong), false);
}

at::Tensor cgrx_lookup_rows_cuda(CGRX_LOOKUP_ARGS, int64_t miss_row) {
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  return cuda_results::first_rows(l, lo.numel(), lo.options().dtype(at::kLong), false, miss_row);
}

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_csr_cuda(CGRX_LOOKUP_ARGS) {
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  // Matches arrive in (key, row ID) order: no sort needed.
  auto [offsets, rows, counts] = cuda_results::csr(l, lo.numel(), lo.options().dtype(at::kLong), false);
  return {offsets, rows};
}

// The fixed-capacity form: no host sync, so the radix-table and binary-search backends (plain CUDA kernels)
// can be captured in a CUDA graph.
std::tuple<at::Tensor, at::Tensor, at::Tensor> cgrx_lookup_csr_capped_cuda(CGRX_LOOKUP_ARGS, int64_t capacity) {
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  auto [offsets, rows, total, counts] = cuda_results::csr_capped(l, lo.numel(), lo.options().dtype(at::kLong), capacity, false);
  return {offsets, rows, total};
}

at::Tensor cgrx_range_count_cuda(CGRX_LOOKUP_ARGS) {
  TORCH_CHECK(hi.has_value(), "cgrx_range_count counts ranges: hi is required");
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  return cuda_results::match_counts(l, lo.numel(), lo.options().dtype(at::kLong), false);
}

std::tuple<at::Tensor, at::Tensor> cgrx_aggregate_cuda(CGRX_LOOKUP_ARGS, const at::Tensor& values) {
  const c10::cuda::CUDAGuard guard(lo.device());
  Launch l(CGRX_FORWARD);
  check_cgrx_values(values, l.p.storage, pairs);
  record_uses({&values});
  return cuda_results::aggregate(l, lo.numel(), lo.options().dtype(at::kLong), values, false);
}

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_queues_cuda(at::TensorList pairs, at::TensorList reps, at::TensorList tables,
                                                           int64_t config, const at::Tensor& queries, at::IntArrayRef starts,
                                                           at::IntArrayRef sizes, at::IntArrayRef bases, int64_t window) {
  TORCH_CHECK(window >= 0, "window must be >= 0, got ", window);
  const c10::cuda::CUDAGuard guard(queries.device());
  int64_t total = 0;
  const std::vector<QueueArgs> qs = queues_args(pairs, reps, tables, config, queries, starts, sizes, bases, total);
  const at::TensorOptions opts = queries.options().dtype(at::kLong);
  at::Tensor first = cuda_results::per_query(total, opts);
  at::Tensor count = cuda_results::per_query(total, opts);
  if (total == 0) return {first, count};
  // The queues' arguments cross in one copy on the current stream, from pinned memory that the host allocator
  // keeps until the copy has run.
  const int64_t bytes = static_cast<int64_t>(qs.size() * sizeof(QueueArgs));
  at::Tensor staged = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(staged.data_ptr(), qs.data(), static_cast<size_t>(bytes));
  const at::Tensor args = staged.to(queries.device(), /*non_blocking=*/true);
  for (size_t j = 0; j < qs.size(); ++j) record_uses({&pairs[j], &reps[j], &tables[j]});
  record_uses({&queries});
  LaunchParams p{};
  p.results.mode = static_cast<uint32_t>(ResultMode::First);
  p.results.first_row = first.data_ptr<int64_t>();
  p.results.count = count.data_ptr<int64_t>();
  p.results.miss_row = -1;
  const auto* dev = reinterpret_cast<const QueueArgs*>(args.data_ptr());
  // A grid of `window` threads sweeps the answers in order (the grid-stride loop's k-th round covers answers
  // [k * grid, (k + 1) * grid)).
  const unsigned grid = window > 0 ? std::min(grid_for(total), grid_for(window)) : grid_for(total);
  with_query_type(qs[0].keys.key_type, [&](auto t) {
    queues_kernel<decltype(t)::value><<<grid, kBlock, 0, current_stream()>>>(
        p, dev, static_cast<int64_t>(qs.size()), static_cast<uint64_t>(total));
  });
  RTX_CHECK_LAUNCH();
  return {first, count};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex_internal, CUDA, m) { m.impl("cgrx_lookup_queues", &cgrx_lookup_queues_cuda); }

TORCH_LIBRARY_IMPL(rtindex, CUDA, m) {
  m.impl("cgrx_build", &cgrx_build_cuda);
  m.impl("cgrx_build_scene", &cgrx_build_scene_cuda);
  m.impl("cgrx_pairs_export", &cgrx_pairs_export_cuda);
  m.impl("cgrx_set_spare_rows", &cgrx_set_spare_rows_cuda);
  m.impl("cgrx_lookup", &cgrx_lookup_cuda);
  m.impl("cgrx_lookup_rows", &cgrx_lookup_rows_cuda);
  m.impl("cgrx_lookup_csr", &cgrx_lookup_csr_cuda);
  m.impl("cgrx_lookup_csr_capped", &cgrx_lookup_csr_capped_cuda);
  m.impl("cgrx_aggregate", &cgrx_aggregate_cuda);
  m.impl("cgrx_range_count", &cgrx_range_count_cuda);
  // The same kernels under the names of the ray-tracing backend (ops.cpp says why).
  m.impl("cgrx_optix_lookup", &cgrx_lookup_cuda);
  m.impl("cgrx_optix_lookup_rows", &cgrx_lookup_rows_cuda);
  m.impl("cgrx_optix_lookup_csr", &cgrx_lookup_csr_cuda);
  m.impl("cgrx_optix_lookup_csr_capped", &cgrx_lookup_csr_capped_cuda);
  m.impl("cgrx_optix_aggregate", &cgrx_aggregate_cuda);
}

}  // namespace rtindex::cgrx
