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

// The radix backend's search over read-only pairs: the first pair >= k lies in [begin, begin + span), where
// span = radix_unit_pairs(...) and first() < k <= the largest key.
RTX_HD uint64_t radix_unit_begin(const Pairs& p, const RadixTable& t, uint64_t span, uint64_t k) {
  const auto unit_rep = [&](uint64_t c) { return p.key(group_last(c, span, p.n)); };
  return t.lower_bound(k, unit_rep) * span;
}

// Where the first pair >= k lies among the sorted pairs: in [begin, end) (begin = end = p.n where no pair is): the
// search every lookup of the read-only index starts with. `find(k)` returns the bucket of the first representative
// >= k (or kNoBucket), for reps[0] < k <= reps[m-1]; or it is RadixSearch. `table` is the index's radix table (its
// flags serve every backend).
template <typename Find>
RTX_HD void pairs_candidates(const Pairs& p, const uint64_t* reps, uint64_t m, const int32_t* table, uint64_t k,
                             Find&& find, uint64_t& begin, uint64_t& end) {
  constexpr bool radix = std::is_same<std::decay_t<Find>, RadixSearch>::value;
  begin = end = p.n;
  if (m == 0) return;
  const uint64_t last = p.key(p.n - 1);
  // Bucket 0 where k is at most the first representative.
  uint64_t at = 0, span = p.bucket_size;
  if constexpr (radix) {
    const RadixTable t(table);
    const uint64_t first = t.first();  // read next to the largest key, before either decides anything
    if (k > last) return;  // above the largest key: answered without a search
    span = radix_unit_pairs(static_cast<Layout>(p.layout), p.bucket_size);
    if (k > first) at = radix_unit_begin(p, t, span, k);
  } else if (k > last) {
    return;
  } else if (k > reps[0]) {
    const uint64_t b = find(k);
    if (b == kNoBucket || b >= m) return;
    at = b * span;
  }
  begin = at;
  end = at + span < p.n ? at + span : p.n;
}

// The position of the first pair >= k (p.n where none).
template <typename Find>
RTX_HD uint64_t pairs_lower_bound(const Pairs& p, const uint64_t* reps, uint64_t m, const int32_t* table, uint64_t k,
                                  Find&& find) {
  uint64_t begin, end;
  pairs_candidates(p, reps, m, table, k, find, begin, end);
  return p.lower_bound_in(begin, end, k);
}

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
  uint64_t begin, end;
  pairs_candidates(p, reps, m, table, lo, find, begin, end);
  const bool first_only = lo == hi && RadixTable(table).unique_keys();
#if defined(__CUDA_ARCH__)
  if (first_only && p.is_line(begin, end)) {
    // A point lookup over unique keys whose candidates are one line of aligned rows (a radix unit, a bucket of
    // four): on the GPU the line's pairs are read at once, four 16-byte loads, and the answer comes from
    // registers, where the search and the visit would issue six scattered loads (a CPU core gains nothing:
    // benchmarks/results/). The candidates end at a key >= lo (their unit's or bucket's representative), so a
    // match is in the line, and with unique keys there is one at most.
    const Pairs::Line l = p.line(begin);
#pragma unroll
    for (int t = 0; t < 4; ++t)
      if (l.key[t] == lo) visit(l.row[t]);
    return;
  }
#endif
  visit_from(p, p.lower_bound_in(begin, end, lo), hi, first_only, visit);
}

// The number of pairs with keys in [lo, hi] from the positions of the range's two ends (at most two searches,
// no visit of a long range's matches): the read-only index's range count. Node chains have no global
// positions: they count by visiting.
template <typename Find>
RTX_HD uint64_t count_in_range(const Storage& st, const uint64_t* reps, uint64_t m, const int32_t* table, uint64_t lo,
                               uint64_t hi, Find&& find) {
  if (lo > hi || m == 0) return 0;
  if (st.use_nodes) {
    uint64_t n = 0;
    visit_matches(st, reps, m, table, lo, hi, find, [&](auto) { ++n; });
    return n;
  }
  const Pairs& p = st.pairs;
  const uint64_t begin = pairs_lower_bound(p, reps, m, table, lo, find);
  // A short range ends within the next few pairs, which the search has just brought in: counted by reading
  // them. A longer one by the position of its upper end (a second search), whatever its width.
  constexpr uint64_t kScan = 8;
  const uint64_t scan_end = begin + kScan < p.n ? begin + kScan : p.n;
  uint64_t i = begin;
  while (i < scan_end && p.key(i) <= hi) ++i;
  if (i < scan_end || i == p.n) return i - begin;
  const uint64_t end = hi == ~uint64_t(0) ? p.n : pairs_lower_bound(p, reps, m, table, hi + 1, find);
  return end - begin;
}

}  // namespace rtindex::cgrx
