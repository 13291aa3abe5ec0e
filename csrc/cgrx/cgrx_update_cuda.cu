// Updatable cgRX on CUDA: the per-bucket steps of cgrx_nodes.h as one-thread-per-bucket kernels on the
// current stream. The host-side orchestration is shared with the CPU (cgrx_update.h).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../core/cuda_utils.h"
#include "../core/sort_cuda.cuh"
#include "cgrx_radix_build.h"
#include "cgrx_update_args.h"

namespace rtindex::cgrx {
namespace {

__global__ void find_buckets_kernel(const uint64_t* reps, uint64_t m, const int32_t* table, const uint64_t* keys,
                                    int64_t n, int64_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int64_t>(node_bucket(reps, m, keys[i], [&](uint64_t k) { return radix_lower_bound(reps, table, k); }));
  }
}

__global__ void plan_kernel(Nodes ns, update::Batch batch, int64_t m, int64_t* plan) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x)
    plan_bucket(ns, b, batch.bucket(b), plan + b * kPlanFields);
}

__global__ void apply_kernel(Nodes ns, update::Batch batch, int64_t m, const int64_t* first_new, int64_t* applied) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x) {
    const Applied a = apply_bucket(ns, b, batch.bucket(b), static_cast<uint32_t>(first_new[b]));
    applied[2 * b] = static_cast<int64_t>(a.removed);
    applied[2 * b + 1] = static_cast<int64_t>(a.found);
  }
}

__global__ void chain_sizes_kernel(Nodes ns, int64_t m, int64_t* sizes) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x)
    sizes[b] = static_cast<int64_t>(chain_pairs(ns, b));
}

__global__ void export_kernel(Nodes ns, int64_t m, const int64_t* offsets, uint64_t* keys, int32_t* rows) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x)
    export_chain(ns, b, keys + offsets[b], rows + offsets[b]);
}

__global__ void candidate_ends_kernel(const uint64_t* sorted, uint64_t n, uint64_t per, uint64_t candidates,
                                      int64_t* ends) {
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < candidates; j += uint64_t(gridDim.x) * blockDim.x)
    ends[j] = static_cast<int64_t>(load_candidate_end(sorted, n, per, j));
}

// Each bucket's representative and extra nodes; extra[m] = 0, so the exclusive sum's last entry is the total.
__global__ void slices_kernel(const uint64_t* sorted, const int64_t* ends, uint64_t m, uint32_t node_size, int64_t* reps,
                              int64_t* extra) {
  for (uint64_t b = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b <= m; b += uint64_t(gridDim.x) * blockDim.x) {
    if (b == m) {
      extra[b] = 0;
      continue;
    }
    reps[b] = static_cast<int64_t>(sorted[ends[b]]);
    extra[b] = static_cast<int64_t>(load_slice(ends, b, node_size).extra);
  }
}

__global__ void load_kernel(Nodes ns, int64_t m, const uint64_t* keys, const int32_t* rows, const int64_t* ends,
                            const int64_t* extra_before) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x) {
    const LoadSlice s = load_slice(ends, b, ns.node_size);
    load_bucket(ns, b, keys, rows, s.start, s.count, static_cast<uint32_t>(m + extra_before[b]));
  }
}

// The bulk load's steps on CUDA (cgrx_update.h load); two host syncs: the number of buckets, the extra nodes.
struct CudaLoad {
  static std::pair<at::Tensor, at::Tensor> sort_pairs(const at::Tensor& keys, const at::Tensor& rows) {
    return sort_key_row_pairs_cuda(keys, rows);
  }

  static update::BucketPlan plan(const at::Tensor& sorted, int64_t node_size) {
    const auto opts = sorted.options();
    const uint64_t n = static_cast<uint64_t>(sorted.numel());
    const uint64_t per = std::max<int64_t>(1, node_size / 2);
    const uint64_t candidates = load_candidates(n, per);
    const uint64_t* sk = reinterpret_cast<const uint64_t*>(sorted.data_ptr<int64_t>());
    const int64_t c = static_cast<int64_t>(candidates);
    at::Tensor candidate_ends = at::empty({c}, opts), ends = at::empty({c}, opts);
    candidate_ends_kernel<<<grid_for(c), kBlock, 0, current_stream()>>>(sk, n, per, candidates,
                                                                         candidate_ends.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
    const int64_t m = unique_cuda(candidate_ends.data_ptr<int64_t>(), ends.data_ptr<int64_t>(), c, opts);  // a sync
    candidate_ends.reset();
    ends = ends.narrow(0, 0, m);
    at::Tensor reps = at::empty({m}, opts), extra = at::empty({m + 1}, opts), extra_before = at::empty({m + 1}, opts);
    slices_kernel<<<grid_for(m + 1), kBlock, 0, current_stream()>>>(sk, ends.data_ptr<int64_t>(), static_cast<uint64_t>(m),
                                                                     static_cast<uint32_t>(node_size),
                                                                     reps.data_ptr<int64_t>(), extra.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
    exclusive_sum_cuda(extra.data_ptr<int64_t>(), extra_before.data_ptr<int64_t>(), m + 1, opts);
    const int64_t total = extra_before[m].item<int64_t>();  // the second
    return {reps, ends, extra_before.narrow(0, 0, m), total};
  }

  static void fill(at::Tensor& nodes, int64_t node_size, const at::Tensor& keys, const at::Tensor& rows,
                   const update::BucketPlan& plan) {
    const int64_t m = plan.reps.numel();
    const Nodes ns = update::nodes_view(nodes, node_size, m);
    load_kernel<<<grid_for(m), kBlock, 0, current_stream()>>>(
        ns, m, reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>()), rows.data_ptr<int32_t>(),
        plan.ends.data_ptr<int64_t>(), plan.extra_before.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
  }
};

// `used` is a SymInt in the schema (data dependent: an unbacked size for the fake kernel).
std::tuple<at::Tensor, at::Tensor, at::Tensor, c10::SymInt> nodes_load_cuda(const at::Tensor& keys, const at::Tensor& rows,
                                                                            int64_t node_size, double growth) {
  const c10::cuda::CUDAGuard guard(keys.device());
  auto loaded = update::load<CudaLoad>(keys, rows, node_size, growth);
  return {loaded.nodes, loaded.reps, build_radix_table_cuda(loaded.reps), c10::SymInt(loaded.used)};
}

at::Tensor find_buckets_cuda(const at::Tensor& reps, const at::Tensor& table, const at::Tensor& keys) {
  check_ordered_keys(keys, "keys");
  const c10::cuda::CUDAGuard guard(keys.device());
  const uint64_t m = static_cast<uint64_t>(reps.numel());
  TORCH_CHECK(m > 0 && table.numel() == radix_table_words(m), "table does not match the representatives");
  at::Tensor out = at::empty({keys.numel()}, keys.options());
  if (keys.numel() == 0) return out;
  find_buckets_kernel<<<grid_for(keys.numel()), kBlock, 0, current_stream()>>>(
      reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>()), m, table.data_ptr<int32_t>(),
      reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>()), keys.numel(), out.data_ptr<int64_t>());
  RTX_CHECK_LAUNCH();
  return out;
}

at::Tensor nodes_plan_cuda(const at::Tensor& nodes, int64_t node_size, const at::Tensor& del_keys,
                           const c10::optional<at::Tensor>& del_rows, const at::Tensor& del_offsets,
                           const at::Tensor& ins_keys, const at::Tensor& ins_rows, const at::Tensor& ins_offsets) {
  const c10::cuda::CUDAGuard guard(nodes.device());
  const int64_t m = del_offsets.numel() - 1;
  const Nodes ns = update::nodes_view(nodes, node_size, m);
  const update::Batch batch = update::batch_view(nodes, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets);
  at::Tensor plan = at::empty({m, kPlanFields}, del_offsets.options());
  plan_kernel<<<grid_for(m), kBlock, 0, current_stream()>>>(ns, batch, m, plan.data_ptr<int64_t>());
  RTX_CHECK_LAUNCH();
  return plan;
}

at::Tensor nodes_apply_cuda(at::Tensor& nodes, int64_t node_size, const at::Tensor& del_keys,
                      const c10::optional<at::Tensor>& del_rows, const at::Tensor& del_offsets, const at::Tensor& ins_keys,
                      const at::Tensor& ins_rows, const at::Tensor& ins_offsets, const at::Tensor& first_new) {
  const c10::cuda::CUDAGuard guard(nodes.device());
  const int64_t m = del_offsets.numel() - 1;
  const Nodes ns = update::nodes_view(nodes, node_size, m);
  const update::Batch batch = update::batch_view(nodes, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets);
  update::check_first_new(first_new, m, nodes);
  at::Tensor applied = at::empty({m, 2}, del_offsets.options());
  if (m > 0) {
    apply_kernel<<<grid_for(m), kBlock, 0, current_stream()>>>(ns, batch, m, first_new.data_ptr<int64_t>(),
                                                                applied.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
  }
  return applied;
}

std::tuple<at::Tensor, at::Tensor> nodes_export_cuda(const at::Tensor& nodes, int64_t node_size, int64_t num_buckets) {
  const c10::cuda::CUDAGuard guard(nodes.device());
  const Nodes ns = update::nodes_view(nodes, node_size, num_buckets);
  at::Tensor sizes = at::empty({num_buckets}, nodes.options().dtype(at::kLong));
  chain_sizes_kernel<<<grid_for(num_buckets), kBlock, 0, current_stream()>>>(ns, num_buckets, sizes.data_ptr<int64_t>());
  RTX_CHECK_LAUNCH();
  at::Tensor offsets = at::cumsum(sizes, 0) - sizes;
  const int64_t total = num_buckets ? sizes.sum().item<int64_t>() : 0;
  at::Tensor keys = at::empty({total}, nodes.options().dtype(at::kLong));
  at::Tensor rows = at::empty({total}, nodes.options().dtype(at::kInt));
  if (total > 0) {
    export_kernel<<<grid_for(num_buckets), kBlock, 0, current_stream()>>>(
        ns, num_buckets, offsets.data_ptr<int64_t>(), reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>()),
        rows.data_ptr<int32_t>());
    RTX_CHECK_LAUNCH();
  }
  return {keys, rows};
}

__global__ void stats_kernel(Nodes ns, int64_t m, int64_t* out) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < m; b += int64_t(gridDim.x) * blockDim.x)
    chain_stats(ns, b, out + 3 * b);
}

at::Tensor nodes_stats_cuda(const at::Tensor& nodes, int64_t node_size, int64_t num_buckets) {
  const c10::cuda::CUDAGuard guard(nodes.device());
  const Nodes ns = update::nodes_view(nodes, node_size, num_buckets);
  at::Tensor out = at::empty({num_buckets, 3}, nodes.options().dtype(at::kLong));
  if (num_buckets > 0) {
    stats_kernel<<<grid_for(num_buckets), kBlock, 0, current_stream()>>>(ns, num_buckets, out.data_ptr<int64_t>());
    RTX_CHECK_LAUNCH();
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CUDA, m) {
  m.impl("cgrx_nodes_load", &nodes_load_cuda);
  m.impl("cgrx_find_buckets", &find_buckets_cuda);
  m.impl("cgrx_nodes_plan", &nodes_plan_cuda);
  m.impl("cgrx_nodes_apply", &nodes_apply_cuda);
  m.impl("cgrx_nodes_export", &nodes_export_cuda);
  m.impl("cgrx_nodes_stats", &nodes_stats_cuda);
}

}  // namespace rtindex::cgrx
