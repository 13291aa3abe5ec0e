// cgRX, the parts every backend shares (CPU, CUDA kernels, OptiX programs): the sorted key/rowID pairs in
// one of three layouts, bucket search, the static search tree over the representatives, and the scan that
// turns "the bucket of the first representative >= key" into an answer. Only how that bucket is found
// differs between backends: rays through the representatives' scene (cgrx_scene.h) or the tree below.
#pragma once

#include <cstdint>

#include "../core/cache_hints.h"
#include "../core/keys.h"

namespace rtindex::cgrx {

// How the sorted (key, rowID) pairs sit in memory; all three live in one int32 tensor.
enum class Layout : uint32_t {
  PackedRow = 0,   // 12 bytes per pair: key low word, key high word, rowID (the paper's choice)
  AlignedRow = 1,  // 16 bytes per pair: 64-bit key, rowID, padding
  Column = 2,      // all keys (8 bytes each), then all rowIDs (4 bytes each)
  Nodes = 3,       // updatable: chains of fixed-size nodes per bucket (cgrx_nodes.h)
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

// ---- The radix table over the representatives (for GPUs without RT cores) -------------------------------
// Finding "the first representative >= key" should not cost a trip to device memory: the bucket read that
// follows already does. So the search structure is sized to stay in L2 and does not touch the 64-bit
// representatives on the way:
//   - 2^R + 1 entries split the representatives' key range [first, last] into 2^R equal slices of 2^shift keys:
//     entry j is the index of the first representative >= first + j * 2^shift. R is about log2(#reps) - 3, so
//     a slice holds about 4 to 8 representatives (16 bytes of the array below);
//   - one 16-bit word per representative: its offset inside its own slice, cut to the top 16 bits. Inside a
//     slice these words are ordered like the representatives, so a key's slice and its own word give the
//     answer by comparing words only, except where the cut dropped bits and a word equals the key's word:
//     then the exact representatives decide (uniform 64-bit keys: about one lookup in 2^13).
// Skewed keys make some slices wide; the search inside a slice bounds the cost by log2 of its width.
// Measured on an H100 (2^26 uniform 64-bit keys, B = 16, 2^27 lookups): a table over the 64-bit representatives
// themselves 23.2 ms; 32-bit words (18 MB in all) 17.6 ms, with most of their reads still missing L2; 16-bit
// words (10 MB) 14.2 ms, leaving the bucket as nearly all of the 164 bytes a lookup reads from device memory.
// Layout (int32 words): [shift, R, entry 0 .. entry 2^R, words of representatives 0 .. m - 1, 2 per int32].
constexpr int kRadixHeaderWords = 2;
constexpr int kRadixRepsPerSlice = 3;  // log2 of the representatives a slice holds on average (4 .. 8)

inline int radix_log2_slots(uint64_t num_reps) {
  int r = 0;
  while ((uint64_t(1) << (r + kRadixRepsPerSlice)) < num_reps && r < 30) ++r;
  return r;
}

// The representatives' words: the offset's top bits, as many as fit.
using RadixWord = uint16_t;
constexpr int kRadixWordBits = 16;

inline int64_t radix_table_words(uint64_t num_reps) {
  if (num_reps == 0) return kRadixHeaderWords;
  const int64_t word_space = (static_cast<int64_t>(num_reps) * sizeof(RadixWord) + 3) / 4;
  return kRadixHeaderWords + (int64_t(1) << radix_log2_slots(num_reps)) + 1 + word_space;
}

RTX_HD int bit_length(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(v));
#else
  return v ? 64 - __builtin_clzll(v) : 0;
#endif
}

// The slice width (as a shift) for representatives spanning [first, last] in 2^r slices.
RTX_HD int radix_shift(uint64_t first, uint64_t last, int r) {
  const int bits = bit_length(last - first);
  return bits > r ? bits - r : 0;
}

// A key's word: its offset inside its slice, cut to the word's width. Exact when shift <= kRadixWordBits.
RTX_HD RadixWord radix_word(uint64_t k, uint64_t first, int shift) {
  const uint64_t offset = shift >= 64 ? k - first : (k - first) & ((uint64_t(1) << shift) - 1);
  return static_cast<RadixWord>(shift > kRadixWordBits ? offset >> (shift - kRadixWordBits) : offset);
}

RTX_HD uint64_t reps_lower_bound_in(const uint64_t* reps, uint64_t lo, uint64_t hi, uint64_t k) {
  while (lo < hi) {
    const uint64_t mid = (lo + hi) >> 1;
    if (reps[mid] < k) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Entry j of the table (j in 0 .. 2^r) for m >= 1 representatives and shift = radix_shift(first, last, r):
// for 0 < j < 2^r, j << shift < 2^64 (the span has at most r + shift bits), and shift < 64 (shift = 64 only
// when r = 0, where no such j exists).
RTX_HD uint32_t radix_entry(const uint64_t* reps, uint64_t m, int r, int shift, uint64_t j) {
  const uint64_t first = reps[0], span = reps[m - 1] - first;
  if (j == 0) return 0;
  if (j >= (uint64_t(1) << r) || (j << shift) > span) return static_cast<uint32_t>(m);
  return static_cast<uint32_t>(reps_lower_bound_in(reps, 0, m, first + (j << shift)));
}

// Read-only view of a built table.
struct RadixTable {
  int shift;
  const uint32_t* entries;  // 2^R + 1
  const RadixWord* words;   // one per representative

  RTX_HD explicit RadixTable(const int32_t* table)
      : shift(table[0]),
        entries(reinterpret_cast<const uint32_t*>(table + kRadixHeaderWords)),
        words(reinterpret_cast<const RadixWord*>(entries + (uint64_t(1) << table[1]) + 1)) {}

  // The slice of k as a range [begin, end) of representatives; the first one >= k lies in [begin, end].
  RTX_HD void slice(uint64_t k, uint64_t first, uint64_t& begin, uint64_t& end) const {
    const uint64_t j = shift >= 64 ? 0 : (k - first) >> shift;
    begin = load_resident(entries + j);
    end = load_resident(entries + j + 1);
  }
  // Whether cutting offsets to words lost bits (then equal words need the exact representatives).
  RTX_HD bool cut() const { return shift > kRadixWordBits; }
};

// Index of the first representative >= k, for reps[0] < k <= reps[m - 1].
RTX_HD uint64_t radix_lower_bound(const uint64_t* reps, const int32_t* table, uint64_t k) {
  const RadixTable t(table);
  uint64_t lo, hi;
  t.slice(k, reps[0], lo, hi);
  const uint64_t end = hi;
  const RadixWord w = radix_word(k, reps[0], t.shift);
  while (lo < hi) {
    const uint64_t mid = (lo + hi) >> 1;
    if (load_resident(t.words + mid) < w) lo = mid + 1; else hi = mid;
  }
  if (t.cut() && lo < end && load_resident(t.words + lo) == w) return reps_lower_bound_in(reps, lo, end, k);
  return lo;
}

// The same answer by binary search over all representatives (the reference the other backends must match).
RTX_HD uint64_t reps_lower_bound(const uint64_t* reps, uint64_t m, uint64_t k) {
  return reps_lower_bound_in(reps, 0, m, k);
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
