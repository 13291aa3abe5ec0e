// Host-side orchestration of the updatable cgRX (build, plan, apply, export), written once with tensor
// operations; the per-bucket work (cgrx_nodes.h) is handed in by the CPU and CUDA files as callbacks.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <limits>

#include "../core/checks.h"
#include "../core/sort.h"
#include "cgrx_core.h"
#include "cgrx_nodes.h"

namespace rtindex::cgrx::update {

inline void check_node_size(int64_t node_size) {
  TORCH_CHECK(node_size >= 2 && node_size <= 4096 && node_size % 2 == 0,
              "node_size must be an even number in 2 .. 4096, got ", node_size);
}

// Sorts pairs by (unsigned key, unsigned row ID): row first, then a stable sort by key. Both in unsigned order
// through a signed sort with the top bit flipped (row IDs go up to 2^32 - 2 in int32 storage).
inline std::pair<at::Tensor, at::Tensor> sort_pairs(const at::Tensor& keys, const at::Tensor& rows) {
  const at::Tensor by_row = unsigned_row_order(rows);
  const at::Tensor k = keys.index_select(0, by_row), r = rows.index_select(0, by_row);
  auto [sorted_k, by_key] = sort_ordered(k);
  return {sorted_k, r.index_select(0, by_key)};
}

struct Loaded {
  at::Tensor nodes, reps;
  int64_t used;
};

// The device-specific bulk load of every bucket (cgrx_nodes.h load_bucket, one bucket per thread).
using LoadBuckets = std::function<void(at::Tensor& nodes, int64_t node_size, int64_t m, const at::Tensor& keys,
                                       const at::Tensor& rows, const at::Tensor& starts, const at::Tensor& counts,
                                       const at::Tensor& first_extra)>;

// Buckets of about node_size / 2 pairs (the paper's half-full bulk load), never splitting a run of equal keys.
inline Loaded load(const at::Tensor& keys, const at::Tensor& rows, int64_t node_size, double growth,
                   const LoadBuckets& load_buckets) {
  check_ordered_keys(keys, "keys");
  check_node_size(node_size);
  TORCH_CHECK(rows.dim() == 1 && rows.numel() == keys.numel() && rows.scalar_type() == at::kInt,
              "rows must be int32 row IDs, one per key");
  TORCH_CHECK(growth >= 1.0, "growth must be at least 1");
  const auto opts = keys.options();
  const int64_t n = keys.numel();
  at::Tensor reps, starts, counts, sorted_k, sorted_r;
  if (n == 0) {
    // One empty bucket whose representative is the largest key: every insertion lands in it.
    reps = at::full({1}, int64_t(-1), opts);
    starts = at::zeros({1}, opts);
    counts = at::zeros({1}, opts);
    sorted_k = keys;
    sorted_r = rows;
  } else {
    std::tie(sorted_k, sorted_r) = sort_pairs(keys, rows);
    const at::Tensor flipped = at::bitwise_xor(sorted_k, kTopBit);
    const int64_t per = std::max<int64_t>(1, node_size / 2);
    at::Tensor every = per - 1 < n ? at::arange(per - 1, n, per, opts) : at::empty({0}, opts);
    at::Tensor cand = at::cat({every, at::full({1}, n - 1, opts)});
    at::Tensor ends = at::searchsorted(flipped, flipped.index_select(0, cand), /*out_int32=*/false, /*right=*/true) - 1;
    ends = std::get<0>(at::unique_consecutive(ends));
    reps = sorted_k.index_select(0, ends);
    starts = at::cat({at::zeros({1}, opts), ends.slice(0, 0, ends.numel() - 1) + 1});
    counts = ends - starts + 1;
  }
  const int64_t m = reps.numel();
  at::Tensor needed = at::clamp_min(at::floor_divide(counts + (node_size - 1), node_size), 1);
  at::Tensor extra = needed - 1;
  at::Tensor first_extra = at::cumsum(extra, 0) - extra + m;
  const int64_t used = m + extra.sum().item<int64_t>();  // the build's host sync
  const int64_t capacity = std::max<int64_t>(used, static_cast<int64_t>(used * growth) + 1);
  at::Tensor nodes = at::zeros({capacity * node_words(static_cast<uint32_t>(node_size))}, opts.dtype(at::kInt));
  load_buckets(nodes, node_size, m, sorted_k, sorted_r, starts, counts, first_extra);
  return {nodes, reps, used};
}

}  // namespace rtindex::cgrx::update
