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
#include "../core/results_cpu.h"
#include "../core/scene.h"
#include "../core/sort.h"
#include "rx_args.h"

namespace rtindex {
namespace {

// structure = [2, n] int64: row 0 the ordered keys in ascending order, row 1 their row IDs (ascending among
// equal keys, so the first match is the smallest row ID).
at::Tensor rx_build_cpu(const at::Tensor& keys, at::IntArrayRef scene, bool /*allow_update*/) {
  check_ordered_keys(keys, "keys");
  scene_from_list(scene);
  auto [sorted, order] = sort_ordered(keys);
  return at::stack({sorted, order});
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
void visit_matches(const SortedKeys& sk, const QueryKeys& qs, int64_t i, const RxConfig& cfg, Visit&& visit) {
  uint64_t lo, hi;
  qs.range(static_cast<uint64_t>(i), lo, hi);
  if (qs.hi == nullptr) {
    sk.visit_interval(lo, lo, visit);
    return;
  }
  const uint64_t segments = range_segment_count(lo, hi, cfg.scene);
  if (segments == 0) return;
  if (segments > static_cast<uint64_t>(cfg.max_range_rays)) {  // the GPU scans the keys for such wide ranges
    sk.visit_interval(lo, hi, visit);
    return;
  }
  for (uint64_t s = 0; s < segments; ++s) {
    const RowSegment seg = range_segment(lo, hi, s, cfg.scene);
    sk.visit_interval(segment_first_key(seg, cfg.scene), segment_last_key(seg, cfg.scene), visit);
  }
}

struct LookupArgs {
  SortedKeys sk;
  QueryKeys qs;
  RxConfig cfg;
};

LookupArgs lookup_args(const at::Tensor& structure, const at::Tensor& keys, int64_t config,
                       const at::Tensor& lo, const c10::optional<at::Tensor>& hi) {
  check_ordered_keys(keys, "keys");
  const RxConfig cfg = rx_config(config);
  return LookupArgs{SortedKeys(structure), query_keys(keys, lo, hi, cfg.key_type), cfg};
}

// The matches of query i of a lookup, for the shared result forms.
auto matches_of(const LookupArgs& a) {
  return [&a](int64_t i, auto&& visit) { visit_matches(a.sk, a.qs, i, a.cfg, visit); };
}

#define RX_LOOKUP_ARGS \
  const at::Tensor &structure, const at::Tensor &keys, int64_t config, const at::Tensor &lo, \
      const c10::optional<at::Tensor> &hi

std::tuple<at::Tensor, at::Tensor> rx_lookup_cpu(RX_LOOKUP_ARGS) {
  const LookupArgs a = lookup_args(structure, keys, config, lo, hi);
  return cpu_results::first_and_count(lo.numel(), keys.options(), matches_of(a));
}

at::Tensor rx_lookup_rows_cpu(RX_LOOKUP_ARGS, int64_t miss_row) {
  const LookupArgs a = lookup_args(structure, keys, config, lo, hi);
  return cpu_results::first_rows(lo.numel(), keys.options(), miss_row, matches_of(a));
}

std::tuple<at::Tensor, at::Tensor> rx_lookup_csr_cpu(RX_LOOKUP_ARGS) {
  const LookupArgs a = lookup_args(structure, keys, config, lo, hi);
  return cpu_results::csr(lo.numel(), keys.options(), /*sort_rows=*/true, matches_of(a));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rx_lookup_csr_capped_cpu(RX_LOOKUP_ARGS, int64_t capacity) {
  const LookupArgs a = lookup_args(structure, keys, config, lo, hi);
  return cpu_results::csr_capped(lo.numel(), keys.options(), /*sort_rows=*/true, capacity, matches_of(a));
}

std::tuple<at::Tensor, at::Tensor> rx_aggregate_cpu(RX_LOOKUP_ARGS, const at::Tensor& values) {
  const LookupArgs a = lookup_args(structure, keys, config, lo, hi);
  check_values(values, keys.numel(), keys);
  return cpu_results::aggregate(lo.numel(), keys.options(), values, matches_of(a));
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CPU, m) {
  m.impl("rx_build", &rx_build_cpu);
  m.impl("rx_refit", &rx_refit_cpu);
  m.impl("rx_lookup", &rx_lookup_cpu);
  m.impl("rx_lookup_rows", &rx_lookup_rows_cpu);
  m.impl("rx_lookup_csr", &rx_lookup_csr_cpu);
  m.impl("rx_lookup_csr_capped", &rx_lookup_csr_capped_cpu);
  m.impl("rx_aggregate", &rx_aggregate_cpu);
}

}  // namespace rtindex
