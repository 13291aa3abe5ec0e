// cgRX, the parts every backend shares (CPU, CUDA kernels, OptiX programs): the sorted key/rowID pairs in
// one of three layouts, bucket search, the static search tree over the representatives, and the scan that
// turns "the bucket of the first representative >= key" into an answer. Only how that bucket is found
// differs between backends: rays through the representatives' scene (cgrx_scene.h) or the tree below.
#pragma once

#include <cstdint>

#include "../core/keys.h"

namespace rtindex::cgrx {

// How the sorted (key, rowID) pairs sit in memory; all three live in one int32 tensor.
enum class Layout : uint32_t {
  PackedRow = 0,   // 12 bytes per pair: key low word, key high word, rowID (the paper's choice)
  AlignedRow = 1,  // 16 bytes per pair: 64-bit key, rowID, padding
  Column = 2,      // all keys (8 bytes each), then all rowIDs (4 bytes each)
};

RTX_HD int64_t layout_words(Layout l, int64_t n) {  // int32 words the pairs take
  return l == Layout::AlignedRow ? 4 * n : 3 * n;
}

// Read-only view of the sorted pairs, with the bucket size and search method.
struct Pairs {
  const uint32_t* data;
  uint64_t n;
  uint32_t layout;
  uint32_t bucket_size;
  uint32_t linear_search;  // 0: binary search in the bucket (default), 1: linear scan

  RTX_HD uint64_t key(uint64_t i) const {
    switch (static_cast<Layout>(layout)) {
      case Layout::PackedRow: return uint64_t(data[3 * i]) | (uint64_t(data[3 * i + 1]) << 32);
      case Layout::AlignedRow: return reinterpret_cast<const uint64_t*>(data)[2 * i];
      default: return reinterpret_cast<const uint64_t*>(data)[i];
    }
  }
  RTX_HD uint32_t row(uint64_t i) const {
    switch (static_cast<Layout>(layout)) {
      case Layout::PackedRow: return data[3 * i + 2];
      case Layout::AlignedRow: return data[4 * i + 2];
      default: return data[2 * n + i];
    }
  }
  RTX_HD uint64_t num_buckets() const { return (n + bucket_size - 1) / bucket_size; }

  // First position in bucket b whose key is >= k. The bucket's last key (its representative) is >= k.
  RTX_HD uint64_t search_bucket(uint64_t b, uint64_t k) const {
    uint64_t lo = b * bucket_size;
    uint64_t hi = lo + bucket_size < n ? lo + bucket_size : n;
    if (linear_search) {
      while (lo < hi && key(lo) < k) ++lo;
      return lo;
    }
    while (lo < hi) {
      const uint64_t mid = (lo + hi) >> 1;
      if (key(mid) < k) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
};

// Stores pair i (used by the builds).
RTX_HD void store_pair(uint32_t* data, uint64_t n, Layout l, uint64_t i, uint64_t key, uint32_t row) {
  switch (l) {
    case Layout::PackedRow:
      data[3 * i] = static_cast<uint32_t>(key);
      data[3 * i + 1] = static_cast<uint32_t>(key >> 32);
      data[3 * i + 2] = row;
      break;
    case Layout::AlignedRow:
      reinterpret_cast<uint64_t*>(data)[2 * i] = key;
      data[4 * i + 2] = row;
      data[4 * i + 3] = 0;
      break;
    default:
      reinterpret_cast<uint64_t*>(data)[i] = key;
      data[2 * n + i] = row;
      break;
  }
}

// ---- The static search tree over the representatives (for GPUs without RT cores) ------------------------
// A B+-tree without pointers: every node is 16 consecutive 64-bit keys (128 bytes, one cache line pair), the
// node j of level l+1 holding the largest key of node j of level l. Level 0 is the representative array
// itself, padded to a multiple of 16 with UINT64_MAX. Upper levels are a few percent of the representatives
// and stay in L2; a lookup reads one node per level.
constexpr int kFanout = 16;
constexpr int kMaxTreeLevels = 16;  // 16^16 = 2^64

struct TreeLayout {
  int32_t num_levels;                 // levels above the representatives (0 when they fit in one node)
  uint64_t offset[kMaxTreeLevels];    // where level l (1-based) starts in the tree array: offset[l - 1]
  uint64_t size[kMaxTreeLevels + 1];  // entries of level l (size[0]: representatives), before padding
};

RTX_HD uint64_t pad_to_node(uint64_t m) { return (m + kFanout - 1) / kFanout * kFanout; }

// The tree's shape depends only on the number of representatives; total = entries of the tree array.
inline TreeLayout tree_layout(uint64_t num_reps, uint64_t* total) {
  TreeLayout t{};
  t.size[0] = num_reps;
  uint64_t s = num_reps, at = 0;
  while (s > kFanout) {
    s = (s + kFanout - 1) / kFanout;
    t.offset[t.num_levels] = at;
    t.size[t.num_levels + 1] = s;
    at += pad_to_node(s);
    t.num_levels += 1;
  }
  *total = at;
  return t;
}

// Entry j of level l (l >= 1): the largest key of node j one level down.
RTX_HD uint64_t tree_entry(const uint64_t* below, uint64_t below_size, uint64_t j) {
  const uint64_t last = j * kFanout + kFanout - 1;
  return below[last < below_size ? last : below_size - 1];
}

RTX_HD uint32_t count_less(const uint64_t* node, uint64_t k) {
  uint32_t c = 0;
#pragma unroll
  for (int i = 0; i < kFanout; ++i) c += node[i] < k ? 1u : 0u;
  return c;
}

// Index of the first representative >= k. Requires k <= the largest representative. `level(l)` gives where
// level l (1-based) starts, so a caller can serve the top levels from faster memory.
template <typename LevelPtr>
RTX_HD uint64_t tree_lower_bound_with(const uint64_t* reps, const TreeLayout& t, uint64_t k, LevelPtr&& level) {
  uint64_t node = 0;
  for (int l = t.num_levels; l >= 1; --l) node = node * kFanout + count_less(level(l) + node * kFanout, k);
  return node * kFanout + count_less(reps + node * kFanout, k);
}

RTX_HD uint64_t tree_lower_bound(const uint64_t* reps, const uint64_t* tree, const TreeLayout& t, uint64_t k) {
  return tree_lower_bound_with(reps, t, k, [&](int l) { return tree + t.offset[l - 1]; });
}

// The top levels of the tree are stored last and contiguously; this many entries of them (from
// `top_levels_start` to the end of the tree array) fit a 16 KiB shared-memory copy per block.
constexpr uint64_t kSharedTreeEntries = 2048;

inline int shared_tree_from_level(const TreeLayout& t, uint64_t total, uint64_t* start) {
  int from = t.num_levels + 1;  // no level in shared memory
  *start = total;
  for (int l = t.num_levels; l >= 1; --l) {
    if (total - t.offset[l - 1] > kSharedTreeEntries) break;
    from = l;
    *start = t.offset[l - 1];
  }
  return from;
}

// The same answer by binary search over the representatives (the reference the other backends must match).
RTX_HD uint64_t reps_lower_bound(const uint64_t* reps, uint64_t m, uint64_t k) {
  uint64_t lo = 0, hi = m;
  while (lo < hi) {
    const uint64_t mid = (lo + hi) >> 1;
    if (reps[mid] < k) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// ---- From a bucket to an answer -------------------------------------------------------------------------
constexpr uint64_t kNoBucket = ~uint64_t(0);

// What a lookup needs to decide without any search: empty range, below the first or above the last key.
// Returns the bucket to start in when that is known (0), kNoBucket for "no match", or `search` to say a
// representative search is needed.
constexpr uint64_t kSearch = ~uint64_t(0) - 1;

RTX_HD uint64_t trivial_bucket(const Pairs& p, const uint64_t* reps, uint64_t lo, uint64_t hi) {
  if (p.n == 0 || lo > hi) return kNoBucket;
  if (lo > p.key(p.n - 1)) return kNoBucket;  // above the largest key: answered without tracing
  if (lo <= reps[0]) return 0;                // at or below the first representative: bucket 0
  return kSearch;
}

// Visits every pair with key in [lo, hi], starting in bucket b (the bucket of the first representative >= lo):
// duplicates and ranges continue past the bucket's end.
template <typename Visit>
RTX_HD void visit_from_bucket(const Pairs& p, uint64_t b, uint64_t lo, uint64_t hi, Visit&& visit) {
  for (uint64_t i = p.search_bucket(b, lo); i < p.n; ++i) {
    if (p.key(i) > hi) break;
    visit(p.row(i));
  }
}

}  // namespace rtindex::cgrx
