// cgRX, the parts every backend shares (CPU, CUDA kernels, OptiX programs): the sorted key/rowID pairs in
// one of three layouts, bucket search, the static search tree over the representatives, and the scan that
// turns "the bucket of the first representative >= key" into an answer. Only how that bucket is found
// differs between backends: rays through the representatives' scene (cgrx_scene.h) or the tree below.
#pragma once

#include <cstdint>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include "../core/cache_hints.h"
#include "../core/keys.h"

namespace rtindex::cgrx {

// How the sorted (key, rowID) pairs sit in memory; all three live in one int32 tensor.
enum class Layout : uint32_t {
  PackedRow = 0,   // 12 bytes per pair: key low word, key high word, rowID (the paper's choice)
  AlignedRow = 1,  // 16 bytes per pair: 64-bit key, rowID, a spare word (spare rows: below)
  Column = 2,      // all keys (8 bytes each), then all rowIDs (4 bytes each)
  Nodes = 3,       // updatable: chains of fixed-size nodes per bucket (cgrx_nodes.h)
};

RTX_HD int64_t layout_words(Layout l, int64_t n) {  // int32 words the pairs take
  return l == Layout::AlignedRow ? 4 * n : 3 * n;
}

// Read-only view of the sorted pairs, with the bucket size and search method.
struct Pairs {
  static constexpr uint32_t kLineKeys = 8;  // the most keys one 64-byte line holds (column layout)

  const uint32_t* data;
  uint64_t n;
  uint32_t layout;
  uint32_t bucket_size;
  uint32_t linear_search;  // 0: binary search in the bucket (default), 1: linear scan
  // 1: aligned rows answer with their spare word instead of their row ID. A sharded index's shard writes each
  // pair's global row there (cgrx_set_spare_rows), so that its lookups answer in global rows without a map;
  // aggregates keep reading the row ID, which indexes the values.
  uint32_t spare_rows;
  // 1: a point lookup's line of aligned pairs is read evict-first in L2 (the batch's lines outnumber L2's; set per
  // launch, lines_stream_through_l2); 0: with L2's default priority.
  uint32_t stream_lines;

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
      case Layout::AlignedRow: return data[4 * i + 2 + spare_rows];
      default: return data[2 * n + i];
    }
  }
#if defined(__CUDACC__)
  // Pairs [begin, begin + 4) of aligned rows (one 64-byte line where the pairs are 16-byte aligned): keys and
  // row IDs read together, 16 bytes a load, so a point lookup on the GPU answers from registers (visit_matches).
  // Read once by this batch: evict-first in L2 where the batch streams through it (stream_lines).
  struct Line {
    uint64_t key[4];
    uint32_t row[4];
  };
  RTX_HD bool is_line(uint64_t begin, uint64_t end) const {
    return layout == static_cast<uint32_t>(Layout::AlignedRow) && end - begin == 4 &&
           (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  }
  RTX_HD Line line(uint64_t begin) const {
    Line l;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const Quad v = stream_lines ? load_streamed_quad(data + 4 * (begin + t)) : load_quad(data + 4 * (begin + t));
      l.key[t] = uint64_t(v.word[0]) | (uint64_t(v.word[1]) << 32);
      l.row[t] = spare_rows ? v.word[3] : v.word[2];
    }
    return l;
  }
#endif
  RTX_HD uint64_t num_buckets() const { return (n + bucket_size - 1) / bucket_size; }
  // Where pair i's key and row ID lie (for prefetching).
  RTX_HD const uint32_t* key_address(uint64_t i) const {
    return data + (layout == static_cast<uint32_t>(Layout::PackedRow) ? 3 * i
                   : layout == static_cast<uint32_t>(Layout::AlignedRow) ? 4 * i : 2 * i);
  }
  RTX_HD const uint32_t* row_address(uint64_t i) const {
    return layout == static_cast<uint32_t>(Layout::Column) ? data + 2 * n + i : key_address(i);
  }

  // First position in [begin, end) whose key is >= k; the pair at end - 1 is >= k (or end is n).
  RTX_HD uint64_t lower_bound_in(uint64_t begin, uint64_t end, uint64_t k) const {
    // At most one 64-byte line of aligned rows or column keys (a radix unit, a small bucket): its keys are
    // loaded together and counted, where a bisection waits for each probe in turn.
    if (end - begin <= kLineKeys && layout != static_cast<uint32_t>(Layout::PackedRow)) {
      uint64_t at = begin;
#pragma unroll
      for (uint32_t t = 0; t < kLineKeys; ++t)
        if (begin + t < end) at += key(begin + t) < k;
      return at;
    }
    if (linear_search) {
      while (begin < end && key(begin) < k) ++begin;
      return begin;
    }
    while (begin < end) {
      const uint64_t mid = (begin + end) >> 1;
      if (key(mid) < k) begin = mid + 1; else end = mid;
    }
    return begin;
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

// Writes aligned pair i's spare word: rows[its row ID] (the low 32 bits; Pairs::spare_rows answers with it).
RTX_HD void store_spare_row(uint32_t* data, uint64_t i, const int64_t* rows) {
  data[4 * i + 3] = static_cast<uint32_t>(rows[data[4 * i + 2]]);
}

// ---- The radix table (for GPUs without RT cores) ----------------------------------------------------------
// Finding where a key's first match lies should not cost a trip to device memory: the read of the pairs that
// follows already does, and on this hardware a lookup's time follows the bytes it reads from device memory
// (benchmarks/results/README.md). So the search structure stays in L2 and ends the search one cache line
// early: it indexes "units" of the sorted pairs, each with the largest key it holds as its representative.
//   - Read-only index: a unit is one 64-byte line of the pairs (4 pairs aligned_row, 8 keys column; for
//     packed_row, whose 12-byte pairs straddle lines, 16 pairs = 3 whole lines), or the bucket where buckets
//     are smaller (units count from the first pair, independent of the buckets). A key's first match lies in
//     the unit found, so the search after it reads one line where a binary search over the whole bucket
//     reads two or three.
//   - Updatable index: a unit is a bucket and its representative the bucket's own, fixed at build time
//     (node chains have no fixed lines); updates never touch the table.
// The table over m units:
//   - 2^R + 1 entries split the units' key range [first, last] into 2^R equal slices of 2^shift keys: entry j
//     is the first unit whose representative is >= first + j * 2^shift. R is about log2(m) - 4, so a slice
//     holds about 16 units;
//   - one 8-bit word per unit: its representative's offset inside its slice, cut to the top 8 bits. Inside a
//     slice the words are ordered like the representatives, so the key's slice and its own word answer by
//     comparing words, except where the cut dropped bits and a word equals the key's: then the units'
//     representatives decide (uniform keys: about one lookup in 16 sees such a word, half of those read one
//     more line; for a line unit that representative sits in the line the lookup reads anyway).
//   - a flag for "no two pairs share a key": point lookups then stop at their first match instead of reading
//     the next pair (often in the next line).
// Skewed keys make some slices wide; the search inside a slice is binary, bounded by log2 of its width.
// Line units read fewer device-memory bytes per lookup than bucket units (the query, one line and the table's
// L2 misses against two or three lines of the bucket); the measurements are in benchmarks/results/README.md.
// Layout (int32 words): [shift, R, flags, 0, first (2 words), entry 0 .. entry 2^R, words, 4 per int32].
constexpr int kRadixHeaderWords = 6;
constexpr int kRadixUnitsPerSlice = 4;  // log2 of the units a slice holds on average
constexpr uint32_t kRadixUniqueKeys = 1;  // flags: no two pairs share a key

// Pairs per unit of a read-only index: one 64-byte line (see above), at most one bucket.
RTX_HD uint64_t radix_unit_pairs(Layout l, uint64_t bucket_size) {
  const uint64_t line = l == Layout::AlignedRow ? 4 : l == Layout::Column ? 8 : 16;
  return bucket_size < line ? bucket_size : line;
}

// Position of the last of the `group` consecutive pairs that make group g (a bucket or a unit) among n pairs:
// that pair's key is the group's representative.
RTX_HD uint64_t group_last(uint64_t g, uint64_t group, uint64_t n) {
  return ((g + 1) * group < n ? (g + 1) * group : n) - 1;
}

// How many units the table of a read-only index over n pairs holds.
RTX_HD uint64_t radix_units(uint64_t n, Layout l, uint64_t bucket_size) {
  const uint64_t unit = radix_unit_pairs(l, bucket_size);
  return (n + unit - 1) / unit;
}

inline int radix_log2_slots(uint64_t units) {
  int r = 0;
  while ((uint64_t(1) << (r + kRadixUnitsPerSlice)) < units && r < 30) ++r;
  return r;
}

// From 2^20 slices on (a table of about 20 MiB and more), GPU lookups guess a slice's word block
// (RadixTable::word_bounds).
constexpr int kRadixGuessLog2Slots = 20;

// The units' words: the offset's top bits, as many as fit.
using RadixWord = uint8_t;
constexpr int kRadixWordBits = 8;

inline int64_t radix_table_words(uint64_t units) {
  if (units == 0) return kRadixHeaderWords;
  const int64_t word_space = (static_cast<int64_t>(units) * sizeof(RadixWord) + 3) / 4;
  return kRadixHeaderWords + (int64_t(1) << radix_log2_slots(units)) + 1 + word_space;
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

// Entry j of the table (j in 0 .. 2^r) for m >= 1 units and shift = radix_shift(first, last, r): for
// 0 < j < 2^r, j << shift < 2^64 (the span has at most r + shift bits), and shift < 64 (shift = 64 only when
// r = 0, where no such j exists).
RTX_HD uint32_t radix_entry(const uint64_t* reps, uint64_t m, int r, int shift, uint64_t j) {
  const uint64_t first = reps[0], span = reps[m - 1] - first;
  if (j == 0) return 0;
  if (j >= (uint64_t(1) << r) || (j << shift) > span) return static_cast<uint32_t>(m);
  return static_cast<uint32_t>(reps_lower_bound_in(reps, 0, m, first + (j << shift)));
}

// A slice's words are read a block at a time (RadixTable::word_bounds). A GPU lookup is bound by L2 requests
// (benchmarks/results/): 16 bytes, one load, the answer's block in most slices. A CPU core turns the loop fewer
// times with 32 bytes, two SSE compares.
#if defined(__CUDA_ARCH__)
constexpr uint32_t kWordBlock = 16;
#else
constexpr uint32_t kWordBlock = 32;
#endif
struct WordBlock {
  uint32_t word[kWordBlock / 4];
};

// A block from a kWordBlock-aligned address, kept in L2 like load_resident.
RTX_HD WordBlock load_word_block(const RadixWord* p) {
  WordBlock b;
#if defined(__CUDA_ARCH__)
  const Quad q = load_resident_quad(reinterpret_cast<const uint32_t*>(p));
#pragma unroll
  for (int i = 0; i < 4; ++i) b.word[i] = q.word[i];
#else
  memcpy(&b, p, sizeof(b));
#endif
  return b;
}

// How many of a block's bytes marked in `in_range` (one bit per byte) are below kw (lt) and at most kw (le):
// per-byte compares of packed words on the GPU, SSE2 on x86 hosts.
RTX_HD void count_words(const WordBlock& b, uint8_t kw, uint32_t in_range, uint32_t& lt, uint32_t& le) {
#if defined(__CUDA_ARCH__)
  const uint32_t kw4 = uint32_t(kw) * 0x01010101u;
  lt = le = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t bits = (in_range >> (4 * w)) & 0xF;  // this word's four bytes, spread to 0xFF bytes
    const uint32_t mask = ((bits & 1) * 0xFFu) | ((bits & 2) * 0x7F80u) | ((bits & 4) * 0x3FC000u) | ((bits & 8) * 0x1FE00000u);
    lt += __popc(__vcmpltu4(b.word[w], kw4) & mask);
    le += __popc(__vcmpleu4(b.word[w], kw4) & mask);
  }
  lt >>= 3;
  le >>= 3;
#elif defined(__SSE2__)
  // Signed byte compares on values moved by 0x80 order like unsigned ones.
  const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
  const __m128i k = _mm_set1_epi8(static_cast<char>(kw ^ 0x80));
  uint32_t below = 0, above = 0;
  for (uint32_t h = 0; h < kWordBlock / 16; ++h) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.word + 4 * h)), bias);
    below |= static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmplt_epi8(v, k))) << (16 * h);
    above |= static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpgt_epi8(v, k))) << (16 * h);
  }
  // The marked bytes are one slice's words, in order: those below kw (at most kw) are a prefix of them, whose
  // length a trailing-zero count gives (no popcount instruction in baseline x86-64).
  const int off = __builtin_ctz(in_range);
  lt = static_cast<uint32_t>(__builtin_ctzll(~(uint64_t(below & in_range) >> off)));
  le = static_cast<uint32_t>(__builtin_ctzll(~(uint64_t(~above & in_range) >> off)));
#else
  lt = le = 0;
  for (uint32_t i = 0; i < kWordBlock; ++i) {
    if (!((in_range >> i) & 1)) continue;
    const uint32_t v = (b.word[i / 4] >> (8 * (i % 4))) & 0xFF;
    lt += v < kw;
    le += v <= kw;
  }
#endif
}

// Read-only view of a built table.
struct RadixTable {
  const int32_t* header;

  RTX_HD explicit RadixTable(const int32_t* table) : header(table) {}

  // The header, read by every lookup, through the read-only path (load_resident): plain loads must be repeated
  // after each answer's store, which measurably slowed the lookups (benchmarks/results/README.md).
  RTX_HD uint32_t header_word(int i) const { return load_resident(reinterpret_cast<const uint32_t*>(header) + i); }
  RTX_HD int shift() const { return static_cast<int>(header_word(0)); }
  RTX_HD int log2_slots() const { return static_cast<int>(header_word(1)); }
  RTX_HD bool unique_keys() const { return header_word(2) & kRadixUniqueKeys; }
  RTX_HD uint64_t first() const { return uint64_t(header_word(4)) | (uint64_t(header_word(5)) << 32); }
  RTX_HD const uint32_t* entries() const { return reinterpret_cast<const uint32_t*>(header + kRadixHeaderWords); }
  RTX_HD const RadixWord* words() const {
    return reinterpret_cast<const RadixWord*>(entries() + (uint64_t(1) << log2_slots()) + 1);
  }
  // The slice of key k (first() <= k): entries j and j + 1 bound the units that may hold the first >= k.
  RTX_HD static uint64_t slot_of(uint64_t k, uint64_t first, int shift) { return shift >= 64 ? 0 : (k - first) >> shift; }
  RTX_HD uint64_t slot(uint64_t k) const { return slot_of(k, first(), shift()); }

  // The units' count: the last entry.
  RTX_HD uint64_t units() const { return load_resident(entries() + (uint64_t(1) << log2_slots())); }

  // Entries j and j + 1 (the units of slice j). On the GPU one 16-byte load where both lie in it (three slices in
  // four): fewer scattered loads for the SM's load units to serve (on a CPU core two loads cost the same). The
  // aligned block starts inside the table (the header is 24 bytes) and ends inside it: it reaches at most two
  // int32 words past the last entry, into the words, which hold more than four units once 2^R > 1.
  RTX_HD void entry_pair(uint64_t j, uint64_t& lo, uint64_t& hi) const {
    const uint32_t* e = entries() + j;
#if defined(__CUDA_ARCH__)
    if (log2_slots() > 0) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(e);
      const Quad q = load_resident_quad(reinterpret_cast<const uint32_t*>(at & ~uintptr_t(15)));
      const uint32_t s = static_cast<uint32_t>(at >> 2) & 3;  // selects, not an indexed array (kept in registers)
      lo = s == 0 ? q.word[0] : s == 1 ? q.word[1] : s == 2 ? q.word[2] : q.word[3];
      hi = s == 0 ? q.word[1] : s == 1 ? q.word[2] : s == 2 ? q.word[3] : load_resident(e + 1);
      return;
    }
#endif
    lo = load_resident(e);
    hi = load_resident(e + 1);
  }

  // In slice j, the first unit whose word is >= kw (ge) and, with `need_gt`, the first whose word is > kw (gt).
  // A slice's words lie side by side and in order, so both are counts: the words are read a block at a time
  // (kWordBlock) and counted in registers, a load per block where a binary search waits for a load per step,
  // stopping at the block that holds the answers. Beyond the first kScanWords words (a wide slice: skewed keys),
  // or where a block would reach past the table, the rest is bisected: a slice costs at most log2 of its width.
  // (A bound on words, not a count of blocks: a counter in the loop slowed uniform lookups, benchmarks/results/.)
  RTX_HD void word_bounds(uint64_t j, RadixWord kw, bool need_gt, uint64_t& ge, uint64_t& gt) const {
    constexpr uint64_t kScanWords = 4 * kWordBlock;  // a slice holds about 16 words, rarely more than 48 (uniform keys)
    const RadixWord* w = words();
    uint64_t i, hi;
    entry_pair(j, i, hi);
    const RadixWord* valid_end = w + ((units() + 3) & ~uint64_t(3));  // the table's int32 words end here
    const uint64_t scan_end = hi - i < kScanWords ? hi : i + kScanWords;
    ge = gt = i;
    bool ge_done = false, gt_done = !need_gt;
#if defined(__CUDA_ARCH__)
    // A large table shares L2 with the pairs' lines, and a lookup's time follows its L2 requests: there the first
    // block read is the one where the key's word would sit if the slice's words were spread evenly over its
    // offsets (uniform keys nearly are), so one load answers most lookups also where a slice spans two blocks.
    // Where its first word is below kw, so are all before it. A small table stays in L2 and the guess's
    // arithmetic costs more than it saves (benchmarks/results/).
    if (log2_slots() >= kRadixGuessLog2Slots) {
      const uint64_t guess = i + (((hi - i) * kw) >> kRadixWordBits);
      const uintptr_t at = reinterpret_cast<uintptr_t>(w + guess);
      const uint32_t off = static_cast<uint32_t>(at & (kWordBlock - 1));
      const auto* block = reinterpret_cast<const RadixWord*>(at - off);
      if (guess - i > off && block + kWordBlock <= valid_end) {
        const uint64_t start = guess - off;
        const uint32_t len = hi - start < kWordBlock ? static_cast<uint32_t>(hi - start) : kWordBlock;
        uint32_t lt, le;
        count_words(load_word_block(block), kw, (1u << len) - 1, lt, le);
        if (lt > 0) {
          ge = start + lt, ge_done = lt < len;
          if (!gt_done) gt = start + le, gt_done = le < len;
          if (ge_done && gt_done) return;
          i = start + len;
        }
      }
    }
#endif
    while (i < scan_end) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(w + i);
      const auto* block = reinterpret_cast<const RadixWord*>(at & ~uintptr_t(kWordBlock - 1));
      if (block + kWordBlock > valid_end) break;
      const uint32_t off = static_cast<uint32_t>(at & (kWordBlock - 1));
      const uint32_t len = scan_end - i < kWordBlock - off ? static_cast<uint32_t>(scan_end - i) : kWordBlock - off;
      const uint32_t in_range = (len == 32 ? ~0u : (1u << len) - 1) << off;  // one bit per byte of the block
      uint32_t lt, le;
      count_words(load_word_block(block), kw, in_range, lt, le);
      if (!ge_done) ge = i + lt, ge_done = lt < len;
      if (!gt_done) gt = i + le, gt_done = le < len;
      if (ge_done && gt_done) return;
      i += len;
    }
    if (!ge_done) ge = bisect(w, i, hi, [&](RadixWord v) { return v < kw; });
    if (!gt_done) gt = bisect(w, ge > i ? ge : i, hi, [&](RadixWord v) { return v <= kw; });
  }

  // For key k (first() < k), the first unit of its slice whose word is >= the key's: the unit lower_bound
  // answers with, or the first it reads to decide.
  RTX_HD uint64_t candidate(uint64_t k) const {
    const int s = shift();
    const uint64_t f = first();
    uint64_t ge, gt;
    word_bounds(slot_of(k, f, s), radix_word(k, f, s), false, ge, gt);
    return ge;
  }

  // The first unit whose representative is >= k, for first() < k <= the last representative; rep(c) reads
  // unit c's representative (only for words equal to the key's).
  template <typename Rep>
  RTX_HD uint64_t lower_bound(uint64_t k, Rep&& rep) const {
    const int s = shift();
    const uint64_t f = first();
    // Exact words (s <= kRadixWordBits): an equal word is an equal representative. Otherwise the units whose
    // word equals the key's, [lo, end), are told apart by their representatives.
    uint64_t lo, end;
    word_bounds(slot_of(k, f, s), radix_word(k, f, s), s > kRadixWordBits, lo, end);
    if (s <= kRadixWordBits) return lo;
    while (lo < end) {
      const uint64_t mid = (lo + end) >> 1;
      if (rep(mid) < k) lo = mid + 1; else end = mid;
    }
    return lo;
  }

 private:
  // The first position in [lo, hi) where pred(word) is false (pred holds on a prefix).
  template <typename Pred>
  RTX_HD static uint64_t bisect(const RadixWord* w, uint64_t lo, uint64_t hi, Pred&& pred) {
    while (lo < hi) {
      const uint64_t mid = (lo + hi) >> 1;
      if (pred(load_resident(w + mid))) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
};

// The bucket of the first representative >= k, for reps[0] < k <= reps[m - 1], from a table over buckets.
RTX_HD uint64_t radix_lower_bound(const uint64_t* reps, const int32_t* table, uint64_t k) {
  return RadixTable(table).lower_bound(k, [&](uint64_t c) { return reps[c]; });
}

// The same answer by binary search over all representatives (the reference the other backends must match).
RTX_HD uint64_t reps_lower_bound(const uint64_t* reps, uint64_t m, uint64_t k) {
  return reps_lower_bound_in(reps, 0, m, k);
}

// ---- From the search's result to an answer ---------------------------------------------------------------
constexpr uint64_t kNoBucket = ~uint64_t(0);

// Visits every pair with key <= hi from position i (the first pair >= the range's low end) on: duplicates and
// ranges continue past the bucket's end. `first_only` (a point lookup where no two pairs share a key) stops
// at the first match instead of reading the next pair, which often lies in the next line.
template <typename Visit>
RTX_HD void visit_from(const Pairs& p, uint64_t i, uint64_t hi, bool first_only, Visit&& visit) {
  for (; i < p.n; ++i) {
    if (p.key(i) > hi) break;
    visit(p.row(i));
    if (first_only) break;
  }
}

}  // namespace rtindex::cgrx
