// One lookup, from key range to matches, for every storage (sorted pairs or node chains) and every way of
// finding the bucket. CPU kernels, CUDA kernels and OptiX programs all answer through visit_matches.
#pragma once

#include "cgrx_core.h"
#include "cgrx_nodes.h"

namespace rtindex::cgrx {

struct Storage {
  Pairs pairs;  // read-only index (layouts 0..2)
  Nodes nodes;  // updatable index (layout 3)
  bool use_nodes;
};

// `find(k)` returns the bucket of the first representative >= k (or kNoBucket), for reps[0] < k <= reps[m-1].
template <typename Find, typename Visit>
RTX_HD void visit_matches(const Storage& st, const uint64_t* reps, uint64_t m, uint64_t lo, uint64_t hi, Find&& find,
                          Visit&& visit) {
  if (lo > hi || m == 0) return;
  if (st.use_nodes) {
    const uint64_t b = node_bucket(reps, m, lo, find);
    if (b != kNoBucket) visit_nodes_from_bucket(st.nodes, b, lo, hi, visit);
    return;
  }
  uint64_t b = trivial_bucket(st.pairs, reps, lo, hi);
  if (b == kSearch) b = find(lo);
  if (b != kNoBucket && b < m) visit_from_bucket(st.pairs, b, lo, hi, visit);
}

}  // namespace rtindex::cgrx
