// One lookup, from key range to matches, for every storage (sorted pairs or node chains) and every way of
// finding where the matches start. CPU kernels, CUDA kernels and OptiX programs all answer through
// visit_matches.
#pragma once

#include <type_traits>

#include "cgrx_core.h"
#include "cgrx_nodes.h"

namespace rtindex::cgrx {

struct Storage {
  Pairs pairs;  // read-only index (layouts 0..2)
  Nodes nodes;  // updatable index (layout 3)
  bool use_nodes;
};

// The radix backend's finder. It is a tag, not a function of the key like the others, because it answers with
// a unit (a line of a bucket, cgrx_core.h) instead of a bucket.
struct RadixSearch {};

// `find(k)` returns the bucket of the first representative >= k (or kNoBucket), for reps[0] < k <= reps[m-1];
// or it is RadixSearch. `table` is the index's radix table (its flags serve every backend).
template <typename Find, typename Visit>
RTX_HD void visit_matches(const Storage& st, const uint64_t* reps, uint64_t m, const int32_t* table, uint64_t lo,
                          uint64_t hi, Find&& find, Visit&& visit) {
  constexpr bool radix = std::is_same<std::decay_t<Find>, RadixSearch>::value;
  if (lo > hi || m == 0) return;
  if (st.use_nodes) {
    const uint64_t b = node_bucket(reps, m, lo, [&](uint64_t k) -> uint64_t {
      if constexpr (radix) return radix_lower_bound(reps, table, k);
      else return find(k);
    });
    if (b != kNoBucket) visit_nodes_from_bucket(st.nodes, b, lo, hi, visit);
    return;
  }
  const Pairs& p = st.pairs;
  if (lo > p.key(p.n - 1)) return;  // above the largest key: answered without a search
  // The first pair >= lo lies in [begin, begin + span): bucket 0 where lo is at most the first representative.
  uint64_t begin = 0, span = p.bucket_size;
  if constexpr (radix) {
    const RadixTable t(table);
    span = radix_unit_pairs(static_cast<Layout>(p.layout), p.bucket_size);
    const auto unit_rep = [&](uint64_t c) { return p.key(group_last(c, span, p.n)); };
    if (lo > t.first()) begin = t.lower_bound(lo, unit_rep) * span;
  } else if (lo > reps[0]) {
    const uint64_t b = find(lo);
    if (b == kNoBucket || b >= m) return;
    begin = b * span;
  }
  const uint64_t end = begin + span < p.n ? begin + span : p.n;
  visit_from(p, p.lower_bound_in(begin, end, lo), hi, lo == hi && RadixTable(table).unique_keys(), visit);
}

}  // namespace rtindex::cgrx
