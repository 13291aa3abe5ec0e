// CPU kernels of the sharded-index routing operators (partition.h): the queries grouped by send bucket, the
// answers packed for the return exchange and scattered back to the caller's order.
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

// Counting pass per block of queries, an exclusive scan in (bucket, block) order, then a scatter pass: stable
// (the GPU kernel is not), so the CPU result equals a stable sort by bucket.
std::tuple<at::Tensor, at::Tensor, at::Tensor> partition_queries_cpu(const at::Tensor& queries, int64_t key_type,
                                                                     const at::Tensor& splitters, int64_t chunks) {
  check_partition_args(queries, key_type, splitters, chunks);
  const at::Tensor q = queries.contiguous();
  const int64_t n = q.numel(), num_splitters = splitters.numel(), world = num_splitters + 1;
  const int64_t buckets = chunks * world;
  at::Tensor keys = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor positions = at::empty({n}, q.options().dtype(at::kLong));
  at::Tensor counts = at::zeros({chunks, world}, q.options().dtype(at::kLong));
  if (n == 0) return {keys, positions, counts};

  // Blocks of fixed size (not one per thread), so that the result does not depend on the thread count; their
  // number is capped so that the per-block counters stay small.
  int64_t blocks = (n + (1 << 15) - 1) >> 15;
  blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t(1) << 24) / buckets));
  const int64_t block_size = (n + blocks - 1) / blocks;
  blocks = (n + block_size - 1) / block_size;
  std::vector<int64_t> offsets(static_cast<size_t>(blocks * buckets), 0);

  const void* base = q.data_ptr();
  const uint64_t* split = reinterpret_cast<const uint64_t*>(splitters.data_ptr<int64_t>());
  uint64_t* out_keys = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  int64_t* out_pos = positions.data_ptr<int64_t>();
  int64_t* out_counts = counts.data_ptr<int64_t>();
  const uint64_t un = static_cast<uint64_t>(n);

  with_query_type(static_cast<uint32_t>(key_type), [&](auto tag) {
    constexpr KeyType T = decltype(tag)::value;
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t* h = offsets.data() + blk * buckets;
        const int64_t end = std::min(n, (blk + 1) * block_size);
        for (int64_t i = blk * block_size; i < end; ++i)
          ++h[send_bucket(i, un, chunks, ordered_query<T>(base, i), split, num_splitters)];
      }
    });
    int64_t run = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      const int64_t start = run;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t& o = offsets[blk * buckets + b];
        const int64_t c = o;
        o = run;
        run += c;
      }
      out_counts[b] = run - start;
    }
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t* cursor = offsets.data() + blk * buckets;  // this block's own slots: no other thread touches them
        const int64_t end = std::min(n, (blk + 1) * block_size);
        for (int64_t i = blk * block_size; i < end; ++i) {
          const uint64_t k = ordered_query<T>(base, i);
          const int64_t dst = cursor[send_bucket(i, un, chunks, k, split, num_splitters)]++;
          out_keys[dst] = k;
          out_pos[dst] = i;
        }
      }
    });
  });
  return {keys, positions, counts};
}

// Local answers (first local row or count, count or sum bits) as the [n, 2] rows of the return exchange, local
// row IDs made global on the way (local_to_global empty: no translation; -1 stays -1).
at::Tensor pack_answers_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& local_to_global) {
  check_pack_args(a, b, local_to_global);
  const at::Tensor ca = a.contiguous(), cb = b.contiguous(), l2g = local_to_global.contiguous();
  const int64_t n = ca.numel(), m = l2g.numel();
  at::Tensor out = at::empty({n, 2}, ca.options());
  const int64_t* pa = ca.data_ptr<int64_t>();
  const int64_t* pb = cb.data_ptr<int64_t>();
  const int64_t* map = l2g.data_ptr<int64_t>();
  int64_t* po = out.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
    bool b = false;
    for (int64_t i = s; i < e; ++i) {
      po[2 * i] = m > 0 ? global_row(pa[i], map, m, 0, &b) : pa[i];  // no map: the rows are global already
      po[2 * i + 1] = pb[i];
    }
    if (b) bad.store(true, std::memory_order_relaxed);
  });
  TORCH_CHECK(!bad.load(), "pack_answers: a local row ID is past local_to_global (", m, " rows)");
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

// answers[j] belongs to the caller's query positions[j]: both columns written there, as contiguous outputs.
std::tuple<at::Tensor, at::Tensor> scatter_answers_cpu(const at::Tensor& answers, const at::Tensor& positions) {
  check_answers(answers, positions);
  const at::Tensor ans = answers.contiguous(), pos = positions.contiguous();
  const int64_t n = ans.size(0);
  at::Tensor first = at::empty({n}, ans.options()), second = at::empty({n}, ans.options());
  const int64_t* pa = ans.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  int64_t* o0 = first.data_ptr<int64_t>();
  int64_t* o1 = second.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
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
  TORCH_CHECK(!bad.load(), "scatter_answers: positions must be a permutation of 0 .. n - 1");
  return {first, second};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex_internal, CPU, m) {
  m.impl("partition_queries", &partition_queries_cpu);
  m.impl("global_rows", &global_rows_cpu);
  m.impl("pack_answers", &pack_answers_cpu);
  m.impl("scatter_answers", &scatter_answers_cpu);
}

}  // namespace rtindex
