// Host-side orchestration of the updatable cgRX's bulk load, written once over device steps; the per-bucket work
// (cgrx_nodes.h) runs in the CPU and CUDA files.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>

#include "../core/checks.h"
#include "cgrx_core.h"
#include "cgrx_nodes.h"

namespace rtindex::cgrx::update {

inline void check_node_size(int64_t node_size) {
  TORCH_CHECK(node_size >= 2 && node_size <= 4096 && node_size % 2 == 0,
              "node_size must be an even number in 2 .. 4096, got ", node_size);
}

struct Loaded {
  at::Tensor nodes, reps;
  int64_t used;
};

// A bulk load's buckets (cgrx_nodes.h load_candidates): each bucket's representative (its largest key), its last
// position in the sorted pairs (its slice: load_slice), and the extra nodes (beyond its own) of the buckets before
// it and of all buckets.
struct BucketPlan {
  at::Tensor reps, ends, extra_before;
  int64_t extra_total;
};

// The bulk load, written once over a device's three steps:
//   Device::sort_pairs(keys, rows): the pairs sorted by (unsigned key, unsigned row ID);
//   Device::plan(sorted keys, node_size): the BucketPlan of n >= 1 sorted keys;
//   Device::fill(nodes, node_size, sorted keys, sorted rows, plan): load_bucket for every bucket b, its extra
//   nodes from m + extra_before[b] on (the m buckets' own nodes come first).
// The CUDA steps call the extension's own kernels only (CUB compiled in): a first build in a process then loads
// none of torch's kernels, each of which costs tens of milliseconds on first use.
template <typename Device>
inline Loaded load(const at::Tensor& keys, const at::Tensor& rows, int64_t node_size, double growth) {
  check_ordered_keys(keys, "keys");
  check_node_size(node_size);
  TORCH_CHECK(rows.dim() == 1 && rows.numel() == keys.numel() && rows.scalar_type() == at::kInt,
              "rows must be int32 row IDs, one per key");
  check_same_device(keys, rows, "keys", "rows");
  TORCH_CHECK(growth >= 1.0, "growth must be at least 1");
  const auto opts = keys.options();
  at::Tensor sorted_k = keys, sorted_r = rows;
  BucketPlan plan;
  if (keys.numel() == 0) {
    // One empty bucket whose representative is the largest key: every insertion lands in it.
    plan = {at::full({1}, int64_t(-1), opts), at::full({1}, int64_t(-1), opts), at::zeros({1}, opts), 0};
  } else {
    std::tie(sorted_k, sorted_r) = Device::sort_pairs(keys, rows.contiguous());
    plan = Device::plan(sorted_k, node_size);
  }
  const int64_t m = plan.reps.numel();
  const int64_t used = m + plan.extra_total;
  const int64_t capacity = std::max<int64_t>(used, static_cast<int64_t>(used * growth) + 1);
  at::Tensor nodes = at::zeros({capacity * node_words(static_cast<uint32_t>(node_size))}, opts.dtype(at::kInt));
  Device::fill(nodes, node_size, sorted_k, sorted_r, plan);
  return {nodes, plan.reps, used};
}

}  // namespace rtindex::cgrx::update
