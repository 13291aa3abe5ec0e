// CPU kernels of the sharded-index routing operators (partition.h): the queries grouped by send bucket (or into
// padded blocks), the answers packed for the return exchange and put back in the caller's order.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../core/queries.h"
#include "partition.h"
#include "partition_checks.h"

namespace rtindex {
namespace {

// The queries in blocks of fixed size (not one per thread, so that results do not depend on the thread count;
// their number capped so that the per-block counters stay small). count() gives each block its first slot in
// each bucket: an exclusive scan in (bucket, block) order, over all buckets (grouped output) or restarting at
// every bucket (padded output). Together with a scatter pass in block order this groups stably.
struct BlockPlan {
  int64_t n, buckets, blocks, block_size;
  std::vector<int64_t> offsets;  // [blocks][buckets]

  BlockPlan(int64_t n_, int64_t buckets_) : n(n_), buckets(buckets_) {
    blocks = (n + (1 << 15) - 1) >> 15;
    blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t(1) << 24) / buckets));
    block_size = (n + blocks - 1) / blocks;
    blocks = (n + block_size - 1) / block_size;
    offsets.assign(static_cast<size_t>(blocks * buckets), 0);
  }

  // bucket(i) -> bucket of query i (-1: none); totals[b] <- queries in bucket b.
  template <typename Bucket>
  void count(const Bucket& bucket, bool restart_per_bucket, int64_t* totals) {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t* h = offsets.data() + blk * buckets;
        for (int64_t i = blk * block_size, end = std::min(n, (blk + 1) * block_size); i < end; ++i) {
          const int64_t b = bucket(i);
          if (b >= 0) ++h[b];  // -1: a query left out
        }
      }
    });
    int64_t run = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      if (restart_per_bucket) run = 0;
      const int64_t start = run;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t& o = offsets[blk * buckets + b];
        const int64_t c = o;
        o = run;
        run += c;
      }
      totals[b] = run - start;
    }
  }

  // visit(i, cursor) for every query, blocks in parallel; cursor: this block's next slot per bucket (no other
  // thread touches it).
  template <typename Visit>
  void scatter(const Visit& visit) {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t* cursor = offsets.data() + blk * buckets;
        for (int64_t i = blk * block_size, end = std::min(n, (blk + 1) * block_size); i < end; ++i) visit(i, cursor);
      }
    });
  }
};

// Grouped by send bucket, stable (the GPU kernel is not): the CPU result equals a stable sort by bucket.
std::tuple<at::Tensor, at::Tensor, at::Tensor> partition_queries_cpu(const at::Tensor& queries, int64_t key_type,
                                                                     const at::Tensor& splitters, int64_t chunks,
                                                                     int64_t skip) {
  check_partition_args(queries, key_type, splitters, chunks, skip);
  const at::Tensor q = queries.contiguous();
  const int64_t n = q.numel(), num_splitters = splitters.numel(), world = num_splitters + 1;
  const int64_t buckets = chunks * world;
  at::Tensor keys = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor positions = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor counts = at::zeros({chunks, world}, q.options().dtype(at::kLong));
  if (n == 0) return {keys, positions, counts};

  const void* base = q.data_ptr();
  const uint64_t* split = reinterpret_cast<const uint64_t*>(splitters.data_ptr<int64_t>());
  uint64_t* out_keys = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  int64_t* out_pos = positions.data_ptr<int64_t>();
  const uint64_t un = static_cast<uint64_t>(n);
  BlockPlan plan(n, buckets);
  with_query_type(static_cast<uint32_t>(key_type), [&](auto tag) {
    constexpr KeyType T = decltype(tag)::value;
    plan.count([&](int64_t i) { return send_bucket(i, un, chunks, ordered_query<T>(base, i), split, num_splitters, skip); },
               false, counts.data_ptr<int64_t>());
    plan.scatter([&](int64_t i, int64_t* cursor) {
      const uint64_t k = ordered_query<T>(base, i);
      const int64_t b = send_bucket(i, un, chunks, k, split, num_splitters, skip);
      if (b < 0) return;
      const int64_t dst = cursor[b]++;
      out_keys[dst] = k;
      out_pos[dst] = i;
    });
  });
  if (skip >= 0) {  // the tail the skipped queries leave: zeros, so that the CPU outputs are deterministic (CUDA
                   // leaves it: its kernels do not know where it starts)
    const int64_t routed = counts.sum().item<int64_t>();
    keys.slice(0, routed).zero_();
    positions.slice(0, routed).zero_();
  }
  return {keys, positions, counts};
}

// Padded blocks behind their header, stable: each owner's block holds its first `capacity` queries in query order.
std::tuple<at::Tensor, at::Tensor> partition_padded_cpu(const at::Tensor& queries, int64_t key_type,
                                                        const at::Tensor& splitters, int64_t capacity) {
  check_padded_args(queries, key_type, splitters, capacity);
  const at::Tensor q = queries.contiguous();
  const int64_t n = q.numel(), num_splitters = splitters.numel(), world = num_splitters + 1;
  const int64_t width = kPaddedHeader + capacity;
  at::Tensor block = at::zeros({world, width}, q.options().dtype(at::kLong));
  at::Tensor slots = at::empty({n}, q.options().dtype(at::kLong));
  if (n == 0) return {block, slots};

  const void* base = q.data_ptr();
  const uint64_t* split = reinterpret_cast<const uint64_t*>(splitters.data_ptr<int64_t>());
  int64_t* out = block.data_ptr<int64_t>();
  int64_t* out_slot = slots.data_ptr<int64_t>();
  std::vector<int64_t> counts(static_cast<size_t>(world));
  BlockPlan plan(n, world);
  with_query_type(static_cast<uint32_t>(key_type), [&](auto tag) {
    constexpr KeyType T = decltype(tag)::value;
    plan.count([&](int64_t i) { return owner_of(ordered_query<T>(base, i), split, num_splitters); }, true,
               counts.data());
    plan.scatter([&](int64_t i, int64_t* cursor) {
      const uint64_t k = ordered_query<T>(base, i);
      const int64_t d = owner_of(k, split, num_splitters);
      const int64_t off = cursor[d]++;
      if (off < capacity) {
        const int64_t at = d * width + kPaddedHeader + off;
        out[at] = static_cast<int64_t>(k);
        out_slot[i] = at;
      } else {
        out_slot[i] = -1;
      }
    });
  });
  const bool overflow = std::any_of(counts.begin(), counts.end(), [&](int64_t c) { return c > capacity; });
  for (int64_t d = 0; d < world; ++d) {  // the header (the status stays 0)
    out[d * width + kPaddedCount] = counts[d];
    out[d * width + kPaddedOverflow] = overflow;
  }
  return {block, slots};
}

// Local answers (first local row or count, count or sum bits) as the [n, 2] rows of the return exchange, local
// row IDs made global on the way (local_to_global empty: no translation; -1 stays -1).
template <typename B>
void pack_answers_impl(const int64_t* pa, const B* pb, const at::Tensor& l2g, int64_t n, int64_t* po) {
  const int64_t m = l2g.numel();
  const int64_t* map = l2g.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
    bool b = false;
    for (int64_t i = s; i < e; ++i) {
      po[2 * i] = m > 0 ? global_row(pa[i], map, m, 0, &b) : pa[i];  // no map: the rows are global already
      po[2 * i + 1] = static_cast<int64_t>(pb[i]);
    }
    if (b) bad.store(true, std::memory_order_relaxed);
  });
  TORCH_CHECK(!bad.load(), "pack_answers: a local row ID is past local_to_global (", m, " rows)");
}

at::Tensor pack_answers_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& local_to_global) {
  check_pack_args(a, b, local_to_global);
  const at::Tensor ca = a.contiguous(), cb = b.contiguous(), l2g = local_to_global.contiguous();
  const int64_t n = ca.numel();
  at::Tensor out = at::empty({n, 2}, ca.options());
  if (cb.scalar_type() == at::kInt)
    pack_answers_impl(ca.data_ptr<int64_t>(), cb.data_ptr<int32_t>(), l2g, n, out.data_ptr<int64_t>());
  else
    pack_answers_impl(ca.data_ptr<int64_t>(), cb.data_ptr<int64_t>(), l2g, n, out.data_ptr<int64_t>());
  return out;
}

at::Tensor global_rows_cpu(const at::Tensor& local, const at::Tensor& local_to_global, int64_t base) {
  check_global_rows_args(local, local_to_global);
  const at::Tensor cl = local.contiguous(), l2g = local_to_global.contiguous();
  const int64_t n = cl.numel(), m = l2g.numel();
  at::Tensor out = at::empty({n}, cl.options());
  const int64_t* pl = cl.data_ptr<int64_t>();
  int64_t* po = out.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  const auto run = [&](const auto* map) {
    at::parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
      bool b = false;
      for (int64_t i = s; i < e; ++i) po[i] = global_row(pl[i], map, m, base, &b);
      if (b) bad.store(true, std::memory_order_relaxed);
    });
  };
  if (l2g.scalar_type() == at::kInt) run(l2g.data_ptr<int32_t>()); else run(l2g.data_ptr<int64_t>());
  TORCH_CHECK(!bad.load(), "global_rows: a local row ID is past local_to_global (", m, " rows)");
  return out;
}

// Row j of answers [m, 2] to entry positions[j] of both columns (n entries each); false where a position lies
// outside 0 .. n - 1 (that write is dropped).
bool scatter_rows(const at::Tensor& answers, const at::Tensor& positions, at::Tensor& first, at::Tensor& second) {
  const at::Tensor ans = answers.contiguous(), pos = positions.contiguous();
  const int64_t m = ans.size(0), n = first.numel();
  const int64_t* pa = ans.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  int64_t* o0 = first.data_ptr<int64_t>();
  int64_t* o1 = second.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, m, 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t j = s; j < e; ++j) {
      const int64_t p = pp[j];
      if (p < 0 || p >= n) {
        bad.store(true, std::memory_order_relaxed);
        continue;
      }
      o0[p] = pa[2 * j];
      o1[p] = pa[2 * j + 1];
    }
  });
  return !bad.load();
}

void scatter_answers_into_cpu(const at::Tensor& answers, const at::Tensor& positions, at::Tensor& first,
                              at::Tensor& second) {
  check_answers_into(answers, positions, first, second);
  TORCH_CHECK(scatter_rows(answers, positions, first, second), "scatter_answers_into: a position is outside 0 .. ",
              first.numel() - 1);
}

// Output j of query i: answers[slots[i], j], or fill_j for slot -1; and whether any received block overflowed.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gather_answers_cpu(const at::Tensor& answers, const at::Tensor& slots,
                                                                  int64_t fill_first, int64_t fill_second,
                                                                  const at::Tensor& received) {
  check_gather_args(answers, slots, received);
  const at::Tensor ans = answers.contiguous(), sl = slots.contiguous();
  const int64_t n = sl.numel(), m = ans.size(0);
  auto [first, second] = answer_columns(n, ans.options());
  const int64_t* pa = ans.data_ptr<int64_t>();
  const int64_t* ps = sl.data_ptr<int64_t>();
  int64_t* o0 = first.data_ptr<int64_t>();
  int64_t* o1 = second.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const int64_t j = ps[i];
      if (j < 0 || j >= m) {
        if (j != -1) bad.store(true, std::memory_order_relaxed);
        o0[i] = fill_first;
        o1[i] = fill_second;
      } else {
        o0[i] = pa[2 * j];
        o1[i] = pa[2 * j + 1];
      }
    }
  });
  TORCH_CHECK(!bad.load(), "gather_answers: a slot is past the answers (", m, " rows) and not -1");
  return {first, second, received.select(1, kPaddedOverflow).ne(0).any()};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex_internal, CPU, m) {
  m.impl("partition_queries", &partition_queries_cpu);
  m.impl("partition_padded", &partition_padded_cpu);
  m.impl("gather_answers", &gather_answers_cpu);
  m.impl("global_rows", &global_rows_cpu);
  m.impl("pack_answers", &pack_answers_cpu);
  m.impl("scatter_answers_into", &scatter_answers_into_cpu);
}

}  // namespace rtindex
