// Updatable cgRX on the CPU: the per-bucket steps of cgrx_nodes.h over at::parallel_for.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../core/sort.h"
#include "cgrx_radix_build.h"
#include "cgrx_update_args.h"

namespace rtindex::cgrx {
namespace {

// The bulk load's steps on the CPU (cgrx_update.h load).
struct CpuLoad {
  // Row first, then a stable sort by key, both unsigned through a signed sort with the top bit flipped.
  static std::pair<at::Tensor, at::Tensor> sort_pairs(const at::Tensor& keys, const at::Tensor& rows) {
    const at::Tensor by_row = unsigned_row_order(rows);
    const at::Tensor k = keys.index_select(0, by_row), r = rows.index_select(0, by_row);
    auto [sorted_k, by_key] = sort_ordered(k);
    return {sorted_k, r.index_select(0, by_key)};
  }

  static update::BucketPlan plan(const at::Tensor& sorted, int64_t node_size) {
    const uint64_t n = static_cast<uint64_t>(sorted.numel());
    const uint64_t per = std::max<int64_t>(1, node_size / 2);
    const uint64_t candidates = load_candidates(n, per);
    const uint64_t* sk = reinterpret_cast<const uint64_t*>(sorted.data_ptr<int64_t>());
    std::vector<int64_t> ends(candidates);
    at::parallel_for(0, static_cast<int64_t>(candidates), 4096, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) ends[j] = static_cast<int64_t>(load_candidate_end(sk, n, per, j));
    });
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    const int64_t m = static_cast<int64_t>(ends.size());
    const auto opts = sorted.options();
    at::Tensor reps = at::empty({m}, opts), extra_before = at::empty({m}, opts);
    int64_t* rp = reps.data_ptr<int64_t>();
    int64_t* ep = extra_before.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t b = 0; b < m; ++b) {
      rp[b] = static_cast<int64_t>(sk[ends[b]]);
      ep[b] = total;
      total += static_cast<int64_t>(load_slice(ends.data(), b, static_cast<uint32_t>(node_size)).extra);
    }
    return {reps, at::tensor(ends, opts), extra_before, total};
  }

  static void fill(at::Tensor& nodes, int64_t node_size, const at::Tensor& keys, const at::Tensor& rows,
                   const update::BucketPlan& plan) {
    const int64_t m = plan.reps.numel();
    const Nodes ns = update::nodes_view(nodes, node_size, m);
    const uint64_t* kp = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
    const int32_t* rp = rows.data_ptr<int32_t>();
    const int64_t* endp = plan.ends.data_ptr<int64_t>();
    const int64_t* ep = plan.extra_before.data_ptr<int64_t>();
    at::parallel_for(0, m, 256, [&](int64_t b0, int64_t e) {
      for (int64_t b = b0; b < e; ++b) {
        const LoadSlice s = load_slice(endp, b, static_cast<uint32_t>(node_size));
        load_bucket(ns, b, kp, rp, s.start, s.count, static_cast<uint32_t>(m + ep[b]));
      }
    });
  }
};

// `used` is a SymInt in the schema (data dependent: an unbacked size for the fake kernel).
std::tuple<at::Tensor, at::Tensor, at::Tensor, c10::SymInt> nodes_load_cpu(const at::Tensor& keys, const at::Tensor& rows,
                                                                           int64_t node_size, double growth) {
  auto loaded = update::load<CpuLoad>(keys, rows, node_size, growth);
  return {loaded.nodes, loaded.reps, build_radix_table_cpu(loaded.reps), c10::SymInt(loaded.used)};
}

at::Tensor find_buckets_cpu(const at::Tensor& reps, const at::Tensor& table, const at::Tensor& keys) {
  check_ordered_keys(keys, "keys");
  const uint64_t m = static_cast<uint64_t>(reps.numel());
  TORCH_CHECK(m > 0 && table.numel() == radix_table_words(m), "table does not match the representatives");
  at::Tensor out = at::empty({keys.numel()}, keys.options());
  const uint64_t* r = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  const uint64_t* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  const int32_t* t = table.data_ptr<int32_t>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, keys.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      o[i] = static_cast<int64_t>(node_bucket(r, m, k[i], [&](uint64_t key) { return radix_lower_bound(r, t, key); }));
  });
  return out;
}

at::Tensor nodes_plan_cpu(const at::Tensor& nodes, int64_t node_size, const at::Tensor& del_keys,
                          const c10::optional<at::Tensor>& del_rows, const at::Tensor& del_offsets,
                          const at::Tensor& ins_keys, const at::Tensor& ins_rows, const at::Tensor& ins_offsets) {
  const int64_t m = del_offsets.numel() - 1;
  const Nodes ns = update::nodes_view(nodes, node_size, m);
  const update::Batch batch = update::batch_view(nodes, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets);
  at::Tensor plan = at::empty({m, kPlanFields}, del_offsets.options());
  int64_t* p = plan.data_ptr<int64_t>();
  at::parallel_for(0, m, 256, [&](int64_t b0, int64_t e) {
    for (int64_t b = b0; b < e; ++b) plan_bucket(ns, b, batch.bucket(b), p + b * kPlanFields);
  });
  return plan;
}

at::Tensor nodes_apply_cpu(at::Tensor& nodes, int64_t node_size, const at::Tensor& del_keys,
                     const c10::optional<at::Tensor>& del_rows, const at::Tensor& del_offsets, const at::Tensor& ins_keys,
                     const at::Tensor& ins_rows, const at::Tensor& ins_offsets, const at::Tensor& first_new) {
  const int64_t m = del_offsets.numel() - 1;
  const Nodes ns = update::nodes_view(nodes, node_size, m);
  const update::Batch batch = update::batch_view(nodes, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets);
  update::check_first_new(first_new, m, nodes);
  const int64_t* fn = first_new.data_ptr<int64_t>();
  at::Tensor applied = at::empty({m, 2}, del_offsets.options());
  int64_t* out = applied.data_ptr<int64_t>();
  at::parallel_for(0, m, 256, [&](int64_t b0, int64_t e) {
    for (int64_t b = b0; b < e; ++b) {
      const Applied a = apply_bucket(ns, b, batch.bucket(b), static_cast<uint32_t>(fn[b]));
      out[2 * b] = static_cast<int64_t>(a.removed);
      out[2 * b + 1] = static_cast<int64_t>(a.found);
    }
  });
  return applied;
}

std::tuple<at::Tensor, at::Tensor> nodes_export_cpu(const at::Tensor& nodes, int64_t node_size, int64_t num_buckets) {
  const Nodes ns = update::nodes_view(nodes, node_size, num_buckets);
  std::vector<int64_t> offsets(num_buckets + 1, 0);
  for (int64_t b = 0; b < num_buckets; ++b) offsets[b + 1] = offsets[b] + static_cast<int64_t>(chain_pairs(ns, b));
  at::Tensor keys = at::empty({offsets[num_buckets]}, nodes.options().dtype(at::kLong));
  at::Tensor rows = at::empty({offsets[num_buckets]}, nodes.options().dtype(at::kInt));
  uint64_t* k = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  int32_t* r = rows.data_ptr<int32_t>();
  at::parallel_for(0, num_buckets, 256, [&](int64_t b0, int64_t e) {
    for (int64_t b = b0; b < e; ++b) export_chain(ns, b, k + offsets[b], r + offsets[b]);
  });
  return {keys, rows};
}

at::Tensor nodes_stats_cpu(const at::Tensor& nodes, int64_t node_size, int64_t num_buckets) {
  const Nodes ns = update::nodes_view(nodes, node_size, num_buckets);
  at::Tensor out = at::empty({num_buckets, 3}, nodes.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, num_buckets, 256, [&](int64_t b0, int64_t e) {
    for (int64_t b = b0; b < e; ++b) chain_stats(ns, b, o + 3 * b);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("cgrx_nodes_load", &nodes_load_cpu);
  m.impl("cgrx_find_buckets", &find_buckets_cpu);
  m.impl("cgrx_nodes_plan", &nodes_plan_cpu);
  m.impl("cgrx_nodes_apply", &nodes_apply_cpu);
  m.impl("cgrx_nodes_export", &nodes_export_cpu);
  m.impl("cgrx_nodes_stats", &nodes_stats_cpu);
}

}  // namespace rtindex::cgrx
