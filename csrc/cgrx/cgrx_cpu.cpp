// cgRX on the CPU: the same build and lookups as on CUDA, from the same shared code (cgrx_core.h). The
// OptiX backend's answer is, by definition, the first representative >= key; on the CPU it is computed by
// binary search, and the Embree test checks that the scene and rays (cgrx_scene.h) give that same bucket.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../core/results_cpu.h"
#include "cgrx_args.h"
#include "cgrx_scene.h"

namespace rtindex::cgrx {
namespace {

void fill_radix_table(const uint64_t* reps, uint64_t m, int32_t* table) {
  if (m == 0) {
    table[0] = table[1] = 0;
    return;
  }
  const int r = radix_log2_slots(m);
  const int shift = radix_shift(reps[0], reps[m - 1], r);
  table[0] = shift;
  table[1] = r;
  uint32_t* entries = reinterpret_cast<uint32_t*>(table + kRadixHeaderWords);
  at::parallel_for(0, (int64_t(1) << r) + 1, 4096, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) entries[j] = radix_entry(reps, m, r, shift, static_cast<uint64_t>(j));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cgrx_build_cpu(const at::Tensor& keys, int64_t bucket_size, int64_t layout) {
  check_ordered_keys(keys, "keys");
  const Layout l = layout_from_int(layout);
  TORCH_CHECK(bucket_size >= 1 && bucket_size <= (int64_t(1) << 30), "bucket_size must be in 1 .. 2^30");
  const int64_t n = keys.numel();
  const uint64_t* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return k[a] < k[b]; });
  at::Tensor pairs = at::empty({layout_words(l, n)}, keys.options().dtype(at::kInt));
  uint32_t* data = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  for (int64_t i = 0; i < n; ++i) store_pair(data, n, l, i, k[order[i]], static_cast<uint32_t>(order[i]));
  const uint64_t m = (n + bucket_size - 1) / bucket_size;
  at::Tensor reps = at::empty({static_cast<int64_t>(m)}, keys.options());
  uint64_t* r = reinterpret_cast<uint64_t*>(reps.data_ptr<int64_t>());
  for (uint64_t b = 0; b < m; ++b) r[b] = k[order[std::min<uint64_t>((b + 1) * bucket_size, n) - 1]];
  at::Tensor table = at::empty({radix_table_words(m)}, keys.options().dtype(at::kInt));
  fill_radix_table(r, m, table.data_ptr<int32_t>());
  return {pairs, reps, table};
}

// On the CPU the "scene" is the triangle list itself ([T, 3, 3] float32), for inspection and the Embree test.
at::Tensor cgrx_build_scene_cpu(const at::Tensor& reps, int64_t num_reps, at::IntArrayRef scene) {
  const SceneConfig c = scene_from_list(scene);
  TORCH_CHECK(num_reps >= 0 && num_reps <= reps.numel(), "num_reps out of range");
  const uint64_t* r = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  const SceneShape s = scene_shape(r, num_reps, c);
  at::Tensor tris = at::empty({static_cast<int64_t>(s.num_triangles()), 3, 3}, reps.options().dtype(at::kFloat));
  Vec3* v = reinterpret_cast<Vec3*>(tris.data_ptr<float>());
  for (int64_t b = 0; b < num_reps; ++b) bucket_triangles(r, s, b, c, v);
  return tris;
}

struct Queries {
  const uint64_t* lo;
  const uint64_t* hi;
  int64_t q;
};

Queries queries_of(const at::Tensor& pairs, const at::Tensor& lo, const c10::optional<at::Tensor>& hi) {
  check_ordered_keys(lo, hi.has_value() ? "lo" : "queries");
  check_same_device(pairs, lo, "the index", "the queries");
  Queries out{reinterpret_cast<const uint64_t*>(lo.data_ptr<int64_t>()), nullptr, lo.numel()};
  if (hi.has_value()) {
    check_ordered_keys(*hi, "hi");
    TORCH_CHECK(hi->numel() == lo.numel(), "lo and hi must have the same length");
    out.hi = reinterpret_cast<const uint64_t*>(hi->data_ptr<int64_t>());
  }
  return out;
}

auto matches_of(const IndexArgs& a, const Queries& qs) {
  return [&a, &qs](int64_t i, auto&& visit) {
    const uint64_t lo = qs.lo[i], hi = qs.hi ? qs.hi[i] : lo;
    uint64_t b = trivial_bucket(a.pairs, a.reps, lo, hi);
    if (b == kNoBucket) return;
    if (b == kSearch)
      b = a.backend == Backend::Radix ? radix_lower_bound(a.reps, a.table, lo)
                                      : reps_lower_bound(a.reps, a.num_reps, lo);
    visit_from_bucket(a.pairs, b, lo, hi, [&](uint32_t row) { visit(static_cast<int64_t>(row)); });
  };
}

#define CGRX_LOOKUP_ARGS                                                                                       \
  const at::Tensor &pairs, const at::Tensor &reps, const at::Tensor &table, const at::Tensor & /*scene_structure*/, \
      const at::Tensor &lo, const c10::optional<at::Tensor> &hi, int64_t bucket_size, int64_t layout,            \
      bool linear_search, at::IntArrayRef scene, int64_t backend

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_cpu(CGRX_LOOKUP_ARGS) {
  const IndexArgs a = index_args(pairs, reps, table, bucket_size, layout, linear_search, scene, backend);
  const Queries qs = queries_of(pairs, lo, hi);
  return cpu_results::first_and_count(qs.q, lo.options(), matches_of(a, qs));
}

std::tuple<at::Tensor, at::Tensor> cgrx_lookup_csr_cpu(CGRX_LOOKUP_ARGS) {
  const IndexArgs a = index_args(pairs, reps, table, bucket_size, layout, linear_search, scene, backend);
  const Queries qs = queries_of(pairs, lo, hi);
  // cgRX visits matches in (key, rowID) order, which is also its documented output order.
  return cpu_results::csr(qs.q, lo.options(), /*sort_rows=*/false, matches_of(a, qs));
}

std::tuple<at::Tensor, at::Tensor> cgrx_aggregate_cpu(CGRX_LOOKUP_ARGS, const at::Tensor& values) {
  const IndexArgs a = index_args(pairs, reps, table, bucket_size, layout, linear_search, scene, backend);
  const Queries qs = queries_of(pairs, lo, hi);
  check_values(values, static_cast<int64_t>(a.pairs.n), pairs);
  return cpu_results::aggregate(qs.q, lo.options(), values, matches_of(a, qs));
}

// [q, 3, 8]: the same-row, next-row and next-plane rays of each query (origin, direction, tmin, tmax);
// tmax is -1 where a query has no next row or plane.
at::Tensor cgrx_scene_rays_cpu(const at::Tensor& queries, at::IntArrayRef scene) {
  check_ordered_keys(queries, "queries");
  const SceneConfig c = scene_from_list(scene);
  at::Tensor out = at::empty({queries.numel(), 3, 8}, queries.options().dtype(at::kFloat));
  const uint64_t* q = reinterpret_cast<const uint64_t*>(queries.data_ptr<int64_t>());
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < queries.numel(); ++i) {
    const CgrxRays r = cgrx_rays(q[i], c);
    const Ray* rays[3] = {&r.same_row, &r.next_row, &r.next_plane};
    const bool present[3] = {true, r.has_next_row, r.has_next_plane};
    for (int j = 0; j < 3; ++j) {
      float* d = o + (i * 3 + j) * 8;
      const Ray& x = *rays[j];
      const float v[8] = {x.origin.x, x.origin.y, x.origin.z, x.direction.x, x.direction.y, x.direction.z,
                          x.tmin, present[j] ? x.tmax : -1.0f};
      std::copy(v, v + 8, d);
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("cgrx_build", &cgrx_build_cpu);
  m.impl("cgrx_build_scene", &cgrx_build_scene_cpu);
  m.impl("cgrx_lookup", &cgrx_lookup_cpu);
  m.impl("cgrx_lookup_csr", &cgrx_lookup_csr_cpu);
  m.impl("cgrx_aggregate", &cgrx_aggregate_cpu);
  m.impl("cgrx_scene_rays", &cgrx_scene_rays_cpu);
}

}  // namespace rtindex::cgrx
