// cgRX on the CPU: the same build and lookups as on CUDA, from the same shared code (cgrx_core.h). The
// OptiX backend's answer is, by definition, the first representative >= key; on the CPU it is computed by
// binary search, and the Embree test checks that the scene and rays (cgrx_scene.h) give that same bucket.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../core/results_cpu.h"
#include "../core/sort.h"
#include "cgrx_args.h"
#include "cgrx_radix_build.h"
#include "cgrx_scene.h"

namespace rtindex::cgrx {
namespace {

// Keys of `key_type` as ordered keys (int64 storage): the keys themselves where they are ordered already
// (uint64 in int64 storage), else map_keys through the dispatcher (for operators that take either).
inline at::Tensor ordered_keys_of(const at::Tensor& keys, int64_t key_type) {
  if (key_type_from_int(key_type) == KeyType::UInt64 && keys.scalar_type() == at::kLong) return keys;
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("rtindex::map_keys", "").typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(keys, key_type);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cgrx_build_cpu(const at::Tensor& raw_keys, int64_t bucket_size, int64_t layout,
                                                              int64_t key_type) {
  const at::Tensor keys = ordered_keys_of(raw_keys, key_type);
  check_ordered_keys(keys, "keys");
  const Layout l = pairs_layout_from_int(layout);
  check_bucket_size(bucket_size);
  const int64_t n = keys.numel();
  auto [sorted, order] = sort_ordered(keys);
  at::Tensor pairs = at::empty({layout_words(l, n)}, keys.options().dtype(at::kInt));
  uint32_t* data = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  const uint64_t* s = reinterpret_cast<const uint64_t*>(sorted.data_ptr<int64_t>());
  const int64_t* o = order.data_ptr<int64_t>();
  at::parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) store_pair(data, n, l, i, s[i], static_cast<uint32_t>(o[i]));
  });
  at::Tensor reps = group_lasts_cpu(sorted, bucket_size);
  return {pairs, reps, build_pairs_radix_table_cpu(sorted, reps, l, bucket_size)};
}

void cgrx_set_spare_rows_cpu(at::Tensor& pairs, int64_t layout, const at::Tensor& rows) {
  const Pairs p = spare_rows_view(pairs, layout, rows);
  uint32_t* data = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t n = static_cast<int64_t>(p.n);
  at::parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) store_spare_row(data, i, r);
  });
}

// The sorted pairs as (ordered keys, row IDs as int64): what the index holds, for its state.
std::tuple<at::Tensor, at::Tensor> cgrx_pairs_export_cpu(const at::Tensor& pairs, int64_t layout) {
  const Pairs p = pairs_view(pairs, pairs_layout_from_int(layout), 1, false);
  const int64_t n = static_cast<int64_t>(p.n);
  at::Tensor keys = at::empty({n}, pairs.options().dtype(at::kLong));
  at::Tensor rows = at::empty({n}, pairs.options().dtype(at::kLong));
  uint64_t* k = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  int64_t* r = rows.data_ptr<int64_t>();
  at::parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      k[i] = p.key(i);
      r[i] = p.row(i);
    }
  });
  return {keys, rows};
}

// On the CPU the "scene" is the triangle list itself ([T, 3, 3] float32, NaN for inactive slots), for inspection
// and the Embree test; T = SceneShape::num_triangles(), the same buffer the CUDA build hands to OptiX.
at::Tensor cgrx_build_scene_cpu(const at::Tensor& reps, int64_t num_reps, at::IntArrayRef scene, int64_t representation,
                                const c10::optional<at::Tensor>& pairs, int64_t bucket_size, int64_t layout) {
  const SceneConfig c = scene_from_list(scene);
  const Representation rep = representation_from_int(representation);
  check_scene_reps(reps, num_reps);
  const Pairs p = scene_pairs(rep, pairs, bucket_size, layout, reps, num_reps);
  const uint64_t* r = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  const SceneShape s = scene_shape(r, num_reps, c, rep);
  at::Tensor tris = at::empty({static_cast<int64_t>(s.num_triangles()), 3, 3}, reps.options().dtype(at::kFloat));
  Vec3* v = reinterpret_cast<Vec3*>(tris.data_ptr<float>());
  for (int64_t b = 0; b < num_reps; ++b) bucket_triangles(r, p, s, b, c, v);
  return tris;
}

// Group prefetching. On an index larger than the caches, the radix search of one query makes three dependent
// reads from memory (its slice's table entries, the slice's words, the pairs' line), and a core waits for each
// in turn. So every kPrefetchGroup-th query walks the next group's searches stage by stage, prefetching what the
// next stage reads: the group's misses overlap. The answers are then made as before (visit_matches), on warm
// caches. Read-only pairs and the radix backend only (node chains and the binary search read other places).
// An index whose pairs stay in the caches has no misses to overlap, and the walk only repeats its searches (the
// out-of-core index's hot tier got slower with it: benchmarks/results/): below this size it is skipped, unless
// the caller says the structure is cold (an out-of-core chunk: visited once per batch, its lines not cached).
constexpr int64_t kPrefetchGroup = 16;
constexpr uint64_t kPrefetchMinBytes = uint64_t(16) << 20;

// Whether a lookup call walks its queries' searches ahead (decided once per call).
bool prefetch_pays(const IndexArgs& a) {
  if (a.backend != Backend::Radix || a.storage.use_nodes || a.num_reps == 0) return false;
  const Pairs& p = a.storage.pairs;
  const uint64_t bytes = 4 * static_cast<uint64_t>(layout_words(static_cast<Layout>(p.layout), static_cast<int64_t>(p.n)));
  return a.cold || bytes >= kPrefetchMinBytes;
}

void prefetch_searches(const IndexArgs& a, const QueryKeys& qs, int64_t i0, int64_t i1) {
  const Pairs& p = a.storage.pairs;
  const RadixTable t(a.table);
  const uint64_t first = t.first(), last = p.key(p.n - 1);
  const uint64_t span = radix_unit_pairs(static_cast<Layout>(p.layout), p.bucket_size);
  uint64_t key[kPrefetchGroup], slot[kPrefetchGroup];
  const int64_t n = std::min(i1 - i0, kPrefetchGroup);
  for (int64_t g = 0; g < n; ++g) {
    uint64_t hi;
    qs.range(static_cast<uint64_t>(i0 + g), key[g], hi);
    if (key[g] > first && key[g] <= last && key[g] <= hi) {  // the queries that search (pairs_lower_bound)
      slot[g] = t.slot(key[g]);
      __builtin_prefetch(t.entries() + slot[g]);
    } else {
      slot[g] = kNoBucket;
    }
  }
  for (int64_t g = 0; g < n; ++g)
    if (slot[g] != kNoBucket) __builtin_prefetch(t.words() + t.entries()[slot[g]]);
  // The candidate unit's line: where the answer lies, and where the representative lies that the search reads
  // when the candidate's word equals the key's.
  for (int64_t g = 0; g < n; ++g)
    if (slot[g] != kNoBucket) __builtin_prefetch(p.key_address(group_last(t.candidate(key[g]), span, p.n)));
  for (int64_t g = 0; g < n; ++g) {
    if (slot[g] == kNoBucket) continue;
    const uint64_t begin = radix_unit_begin(p, t, span, key[g]);
    const uint64_t end = std::min(begin + span, p.n) - 1;
    __builtin_prefetch(p.key_address(begin));
    __builtin_prefetch(p.key_address((begin + end) / 2));
    __builtin_prefetch(p.key_address(end));
    __builtin_prefetch(p.row_address(begin));
  }
}

auto matches_of(const IndexArgs& a, const QueryKeys& qs, int64_t q) {
  return [&a, &qs, q, ahead = prefetch_pays(a)](int64_t i, auto&& visit) {
    if (ahead && i % kPrefetchGroup == 0) prefetch_searches(a, qs, i, q);
    uint64_t lo, hi;
    qs.range(static_cast<uint64_t>(i), lo, hi);
    const auto on_row = [&](uint32_t row) { visit(static_cast<int64_t>(row)); };
    if (a.backend == Backend::Radix) {
      visit_matches(a.storage, a.reps, a.num_reps, a.table, lo, hi, RadixSearch{}, on_row);
    } else {
      const auto find = [&](uint64_t k) { return reps_lower_bound(a.reps, a.num_reps, k); };
      visit_matches(a.storage, a.reps, a.num_reps, a.table, lo, hi, find, on_row);
    }
  };
}

// The number of matches of query i without visiting them: from positions over sorted pairs (count_in_range).
auto counts_of(const IndexArgs& a, const QueryKeys& qs, int64_t q) {
  return [&a, &qs, q, ahead = prefetch_pays(a)](int64_t i) -> int64_t {
    if (ahead && i % kPrefetchGroup == 0) prefetch_searches(a, qs, i, q);
    uint64_t lo, hi;
    qs.range(static_cast<uint64_t>(i), lo, hi);
    if (a.backend == Backend::BinarySearch) {
      const auto find = [&](uint64_t k) { return reps_lower_bound(a.reps, a.num_reps, k); };
      return static_cast<int64_t>(count_in_range(a.storage, a.reps, a.num_reps, a.table, lo, hi, find));
    }
    return static_cast<int64_t>(count_in_range(a.storage, a.reps, a.num_reps, a.table, lo, hi, RadixSearch{}));
  };
}

#define CGRX_LOOKUP_ARGS                                                                                       \
  const at::Tensor &pairs, const at::Tensor &reps, const at::Tensor &table, const at::Tensor & /*scene_structure*/, \
      int64_t config, const at::Tensor &lo, const c10::optional<at::Tensor> &hi
// The checked index and queries of one lookup call.
#define CGRX_PREPARE                                                                  \
  const CgrxConfig cfg = cgrx_config(config);                                         \
  const IndexArgs a = index_args(pairs, reps, table, cfg);                            \
  const QueryKeys qs = query_keys(pairs, lo, hi, cfg.key_type)

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_cpu(CGRX_LOOKUP_ARGS) {
  CGRX_PREPARE;
  return cpu_results::first_and_count(lo.numel(), lo.options().dtype(at::kLong), matches_of(a, qs, lo.numel()));
}

at::Tensor cgrx_lookup_rows_cpu(CGRX_LOOKUP_ARGS, int64_t miss_row) {
  CGRX_PREPARE;
  return cpu_results::first_rows(lo.numel(), lo.options().dtype(at::kLong), miss_row, matches_of(a, qs, lo.numel()));
}

// Every backend counts through the radix table (binary search for that backend): a count needs no rays.
at::Tensor cgrx_range_count_cpu(CGRX_LOOKUP_ARGS) {
  TORCH_CHECK(hi.has_value(), "cgrx_range_count counts ranges: hi is required");
  CGRX_PREPARE;
  return cpu_results::match_counts(lo.numel(), lo.options().dtype(at::kLong), counts_of(a, qs, lo.numel()));
}

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_csr_cpu(CGRX_LOOKUP_ARGS) {
  CGRX_PREPARE;
  // cgRX visits matches in (key, rowID) order, which is also its documented output order.
  return cpu_results::csr(lo.numel(), lo.options().dtype(at::kLong), /*sort_rows=*/false, matches_of(a, qs, lo.numel()),
                          counts_of(a, qs, lo.numel()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cgrx_lookup_csr_capped_cpu(CGRX_LOOKUP_ARGS, int64_t capacity) {
  CGRX_PREPARE;
  return cpu_results::csr_capped(lo.numel(), lo.options().dtype(at::kLong), /*sort_rows=*/false, capacity,
                                 matches_of(a, qs, lo.numel()), counts_of(a, qs, lo.numel()));
}

std::tuple<at::Tensor, at::Tensor> cgrx_aggregate_cpu(CGRX_LOOKUP_ARGS, const at::Tensor& values) {
  CGRX_PREPARE;
  check_cgrx_values(values, a.storage, pairs);
  return cpu_results::aggregate(lo.numel(), lo.options().dtype(at::kLong), values, matches_of(a, qs, lo.numel()));
}

// Queues of several indexes in one call (cgrx_args.h, queues_args), their queries spread over all cores at
// once: the out-of-core index's CPU worker answers many small chunk queues without a call and a parallel
// region per queue. Rows are global (each queue's base added).
std::tuple<at::Tensor, at::Tensor> cgrx_lookup_queues_cpu(at::TensorList pairs, at::TensorList reps, at::TensorList tables,
                                                          int64_t config, const at::Tensor& queries, at::IntArrayRef starts,
                                                          at::IntArrayRef sizes, at::IntArrayRef bases, int64_t window) {
  TORCH_CHECK(window >= 0, "window must be >= 0, got ", window);
  int64_t total = 0;
  const std::vector<QueueArgs> qs = queues_args(pairs, reps, tables, config, queries, starts, sizes, bases, total);
  std::vector<int64_t> begins;
  for (const QueueArgs& a : qs) begins.push_back(a.out_begin);
  return cpu_results::first_and_count(total, queries.options().dtype(at::kLong), [&](int64_t i, auto&& visit) {
    // The queue of answer i: the last whose first answer is at or before it (an empty queue shares its begin).
    const QueueArgs& a = qs[static_cast<size_t>(std::upper_bound(begins.begin(), begins.end(), i) - begins.begin()) - 1];
    matches_of(a.index, a.keys, a.size)(i - a.out_begin, [&](int64_t row) { visit(a.base + row); });
  });
}

// One step of the OptiX backend's ray search (ray_search_step, cgrx_scene.h) for every query, so that a test
// can trace the rays with another ray tracer and run the GPU's exact search. state: int64 [q, 2] (stage, bucket;
// None at the start); hits: int64 [q, 2] (closest-hit slot or -1, back face 0/1) of the rays the last step
// returned (None at the start). Returns the new state (bucket -1: none) and the next ray of each query
// [q, 8] (origin, direction, tmin, tmax; tmax = -1 where the search is over).
std::tuple<at::Tensor, at::Tensor> cgrx_scene_rays_cpu(const at::Tensor& queries, at::IntArrayRef scene,
                                                       const at::Tensor& reps, int64_t num_reps, int64_t representation,
                                                       const c10::optional<at::Tensor>& state,
                                                       const c10::optional<at::Tensor>& hits) {
  check_ordered_keys(queries, "queries");
  const SceneConfig c = scene_from_list(scene);
  const Representation rep = representation_from_int(representation);
  TORCH_CHECK(reps.scalar_type() == at::kLong && reps.is_contiguous() && reps.device().is_cpu() && num_reps >= 1 &&
                  num_reps <= reps.numel(),
              "reps must be the CPU int64 representatives with 1 <= num_reps <= their length");
  const int64_t nq = queries.numel();
  auto check_pair_tensor = [&](const c10::optional<at::Tensor>& t, const char* name) {
    TORCH_CHECK(!t.has_value() || (t->scalar_type() == at::kLong && t->is_contiguous() && t->dim() == 2 &&
                                   t->size(0) == nq && t->size(1) == 2),
                name, " must be an int64 [queries, 2] tensor");
  };
  check_pair_tensor(state, "state");
  check_pair_tensor(hits, "hits");
  const uint64_t* r = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  SceneView view{r, scene_shape(r, num_reps, c, rep), c};
  const uint64_t* q = reinterpret_cast<const uint64_t*>(queries.data_ptr<int64_t>());
  at::Tensor out_state = at::empty({nq, 2}, queries.options());
  at::Tensor out_rays = at::empty({nq, 8}, queries.options().dtype(at::kFloat));
  const int64_t* st = state.has_value() ? state->data_ptr<int64_t>() : nullptr;
  const int64_t* hi = hits.has_value() ? hits->data_ptr<int64_t>() : nullptr;
  int64_t* os = out_state.data_ptr<int64_t>();
  float* o = out_rays.data_ptr<float>();
  for (int64_t i = 0; i < nq; ++i) {
    RaySearch s = ray_search_start(q[i]);
    if (st) {
      TORCH_CHECK(st[2 * i] >= 0 && st[2 * i] <= static_cast<int64_t>(RayStage::Done), "state holds an unknown stage");
      s.stage = static_cast<uint32_t>(st[2 * i]);
      s.bucket = static_cast<uint64_t>(st[2 * i + 1]);
    }
    RayHit h{kRayMiss, 0};
    if (hi && hi[2 * i] >= 0) {
      TORCH_CHECK(static_cast<uint64_t>(hi[2 * i]) < view.shape.num_triangles(), "hit slot out of range");
      h = RayHit{static_cast<uint32_t>(hi[2 * i]), hi[2 * i + 1] != 0 ? 1u : 0u};
    }
    Ray x{};
    const bool more = s.stage != static_cast<uint32_t>(RayStage::Done) && ray_search_step(view, s, h, x);
    os[2 * i] = s.stage;
    os[2 * i + 1] = static_cast<int64_t>(s.bucket);  // kNoBucket reads as -1
    const float v[8] = {x.origin.x, x.origin.y, x.origin.z, x.direction.x, x.direction.y, x.direction.z,
                        x.tmin, more ? x.tmax : -1.0f};
    std::copy(v, v + 8, o + i * 8);
  }
  return {out_state, out_rays};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("cgrx_build", &cgrx_build_cpu);
  m.impl("cgrx_build_scene", &cgrx_build_scene_cpu);
  m.impl("cgrx_pairs_export", &cgrx_pairs_export_cpu);
  m.impl("cgrx_set_spare_rows", &cgrx_set_spare_rows_cpu);
  m.impl("cgrx_lookup", &cgrx_lookup_cpu);
  m.impl("cgrx_lookup_rows", &cgrx_lookup_rows_cpu);
  m.impl("cgrx_range_count", &cgrx_range_count_cpu);
  m.impl("cgrx_lookup_csr", &cgrx_lookup_csr_cpu);
  m.impl("cgrx_lookup_csr_capped", &cgrx_lookup_csr_capped_cpu);
  m.impl("cgrx_aggregate", &cgrx_aggregate_cpu);
  // The same kernels under the names of the ray-tracing backend (ops.cpp says why).
  m.impl("cgrx_optix_lookup", &cgrx_lookup_cpu);
  m.impl("cgrx_optix_lookup_rows", &cgrx_lookup_rows_cpu);
  m.impl("cgrx_optix_lookup_csr", &cgrx_lookup_csr_cpu);
  m.impl("cgrx_optix_lookup_csr_capped", &cgrx_lookup_csr_capped_cpu);
  m.impl("cgrx_optix_aggregate", &cgrx_aggregate_cpu);
}

TORCH_LIBRARY_IMPL(rtindex_internal, CPU, m) {
  m.impl("cgrx_scene_rays", &cgrx_scene_rays_cpu);
  m.impl("cgrx_lookup_queues", &cgrx_lookup_queues_cpu);
}

}  // namespace rtindex::cgrx
