// RX on the CPU: the reference implementation of the RX operators. It answers exactly what the OptiX
// programs answer, from a sorted copy of the keys instead of a BVH: a point lookup is the key's equal range,
// a range lookup walks the same row segments (csrc/core/scene.h) the GPU fires rays for and turns each
// into an interval of keys. The scene ops expose the triangles and rays for the Embree check.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../core/checks.h"
#include "../core/scene.h"

namespace rtindex {
namespace {

// structure = [2, n] int64: row 0 the ordered keys in ascending order, row 1 their row IDs (ascending among
// equal keys, so the first match is the smallest row ID).
at::Tensor rx_build_cpu(const at::Tensor& keys, at::IntArrayRef scene, bool /*allow_update*/) {
  check_ordered_keys(keys, "keys");
  scene_from_list(scene);
  const int64_t n = keys.numel();
  const uint64_t* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return k[a] < k[b]; });
  at::Tensor structure = at::empty({2, n}, keys.options());
  int64_t* sk = structure[0].data_ptr<int64_t>();
  int64_t* sr = structure[1].data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    sk[i] = static_cast<int64_t>(k[order[i]]);
    sr[i] = order[i];
  }
  return structure;
}

void rx_refit_cpu(at::Tensor& structure, const at::Tensor& keys, at::IntArrayRef scene) {
  TORCH_CHECK(structure.dim() == 2 && structure.size(1) == keys.numel(),
              "refit keeps the number of keys: the index has ", structure.size(1), ", the new keys ", keys.numel());
  structure.copy_(rx_build_cpu(keys, scene, true));
}

struct SortedKeys {
  const uint64_t* keys;
  const int64_t* rows;
  int64_t n;

  explicit SortedKeys(const at::Tensor& structure) {
    TORCH_CHECK(structure.dim() == 2 && structure.size(0) == 2 && structure.scalar_type() == at::kLong &&
                    structure.is_contiguous(),
                "not a CPU RX structure (expected a [2, n] int64 tensor from rx_build on the CPU)");
    n = structure.size(1);
    keys = reinterpret_cast<const uint64_t*>(structure.data_ptr<int64_t>());
    rows = structure.data_ptr<int64_t>() + n;
  }

  // Calls visit(row) for every key in [first, last].
  template <typename Visit>
  void visit_interval(uint64_t first, uint64_t last, Visit&& visit) const {
    const uint64_t* b = std::lower_bound(keys, keys + n, first);
    for (const uint64_t* p = b; p != keys + n && *p <= last; ++p) visit(rows[p - keys]);
  }
};

// Visits the matches of query i, walking the same ray sequence the OptiX programs fire.
template <typename Visit>
void visit_matches(const SortedKeys& sk, const uint64_t* lo, const uint64_t* hi, int64_t i, const SceneConfig& c,
                   int64_t max_range_rays, Visit&& visit) {
  if (hi == nullptr) {
    sk.visit_interval(lo[i], lo[i], visit);
    return;
  }
  const uint64_t segments = range_segment_count(lo[i], hi[i], c);
  if (segments == 0) return;
  if (segments > static_cast<uint64_t>(max_range_rays)) {  // the GPU scans the keys for such wide ranges
    sk.visit_interval(lo[i], hi[i], visit);
    return;
  }
  for (uint64_t s = 0; s < segments; ++s) {
    const RowSegment seg = range_segment(lo[i], hi[i], s, c);
    sk.visit_interval(segment_first_key(seg, c), segment_last_key(seg, c), visit);
  }
}

struct LookupArgs {
  SortedKeys sk;
  const uint64_t* lo;
  const uint64_t* hi;
  int64_t q;
  SceneConfig cfg;
};

LookupArgs lookup_args(const at::Tensor& structure, const at::Tensor& keys, const at::Tensor& lo,
                       const c10::optional<at::Tensor>& hi, at::IntArrayRef scene, int64_t max_range_rays) {
  const bool is_range = check_lookup_args(keys, lo, hi);
  TORCH_CHECK(max_range_rays >= 1, "max_range_rays must be at least 1");
  return LookupArgs{SortedKeys(structure), reinterpret_cast<const uint64_t*>(lo.data_ptr<int64_t>()),
                    is_range ? reinterpret_cast<const uint64_t*>(hi->data_ptr<int64_t>()) : nullptr,
                    lo.numel(), scene_from_list(scene)};
}

std::tuple<at::Tensor, at::Tensor> rx_lookup_cpu(const at::Tensor& structure, const at::Tensor& keys,
                                                 const at::Tensor& lo, const c10::optional<at::Tensor>& hi,
                                                 at::IntArrayRef scene, bool /*unique_keys*/, int64_t max_range_rays) {
  const LookupArgs a = lookup_args(structure, keys, lo, hi, scene, max_range_rays);
  at::Tensor first = at::empty({a.q}, lo.options());
  at::Tensor count = at::empty({a.q}, lo.options());
  int64_t* f = first.data_ptr<int64_t>();
  int64_t* c = count.data_ptr<int64_t>();
  at::parallel_for(0, a.q, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t best = -1, n = 0;
      visit_matches(a.sk, a.lo, a.hi, i, a.cfg, max_range_rays, [&](int64_t row) {
        best = (best < 0 || row < best) ? row : best;
        ++n;
      });
      f[i] = best;
      c[i] = n;
    }
  });
  return {first, count};
}

std::tuple<at::Tensor, at::Tensor> rx_lookup_csr_cpu(const at::Tensor& structure, const at::Tensor& keys,
                                                     const at::Tensor& lo, const c10::optional<at::Tensor>& hi,
                                                     at::IntArrayRef scene, bool unique_keys, int64_t max_range_rays) {
  const LookupArgs a = lookup_args(structure, keys, lo, hi, scene, max_range_rays);
  at::Tensor counts = std::get<1>(rx_lookup_cpu(structure, keys, lo, hi, scene, unique_keys, max_range_rays));
  at::Tensor offsets = at::zeros({a.q + 1}, lo.options());
  if (a.q > 0) offsets.slice(0, 1).copy_(counts.cumsum(0));
  const int64_t* off = offsets.data_ptr<int64_t>();
  at::Tensor rows = at::empty({off[a.q]}, lo.options());
  int64_t* r = rows.data_ptr<int64_t>();
  at::parallel_for(0, a.q, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t* out = r + off[i];
      visit_matches(a.sk, a.lo, a.hi, i, a.cfg, max_range_rays, [&](int64_t row) { *out++ = row; });
      std::sort(r + off[i], out);  // RX reports each query's row IDs in ascending order
    }
  });
  return {offsets, rows};
}

template <typename scalar_t, typename acc_t>
void aggregate_into(const LookupArgs& a, int64_t max_range_rays, const at::Tensor& values, at::Tensor& count,
                    at::Tensor& sum) {
  const scalar_t* v = values.data_ptr<scalar_t>();
  int64_t* c = count.data_ptr<int64_t>();
  acc_t* s = sum.data_ptr<acc_t>();
  at::parallel_for(0, a.q, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      acc_t total = 0;
      int64_t n = 0;
      visit_matches(a.sk, a.lo, a.hi, i, a.cfg, max_range_rays, [&](int64_t row) {
        total += static_cast<acc_t>(v[row]);
        ++n;
      });
      c[i] = n;
      s[i] = total;
    }
  });
}

std::tuple<at::Tensor, at::Tensor> rx_aggregate_cpu(const at::Tensor& structure, const at::Tensor& keys,
                                                    const at::Tensor& lo, const c10::optional<at::Tensor>& hi,
                                                    at::IntArrayRef scene, bool /*unique_keys*/,
                                                    int64_t max_range_rays, const at::Tensor& values) {
  const LookupArgs a = lookup_args(structure, keys, lo, hi, scene, max_range_rays);
  check_values(values, keys);
  at::Tensor count = at::empty({a.q}, lo.options());
  at::Tensor sum = at::empty({a.q}, lo.options().dtype(sum_dtype(values.scalar_type())));
  switch (values.scalar_type()) {
    case at::kLong: aggregate_into<int64_t, int64_t>(a, max_range_rays, values, count, sum); break;
    case at::kInt: aggregate_into<int32_t, int64_t>(a, max_range_rays, values, count, sum); break;
    case at::kFloat: aggregate_into<float, double>(a, max_range_rays, values, count, sum); break;
    default: aggregate_into<double, double>(a, max_range_rays, values, count, sum); break;
  }
  return {count, sum};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("rx_build", &rx_build_cpu);
  m.impl("rx_refit", &rx_refit_cpu);
  m.impl("rx_lookup", &rx_lookup_cpu);
  m.impl("rx_lookup_csr", &rx_lookup_csr_cpu);
  m.impl("rx_aggregate", &rx_aggregate_cpu);
}

}  // namespace rtindex
