// cgRX with batch updates (section 4 of the cgRX paper): every bucket is a chain of fixed-size nodes. The
// first node of bucket b is node b (representative nodes are contiguous and addressed by the bucket, i.e.
// the primitive index); further nodes come from a linked region behind them. Representatives never change
// after the build, so the representative search (radix table, rays) is never rebuilt by an update.
//
// Invariants, kept by the build and by every update:
//   - bucket b holds exactly the keys in (reps[b-1], reps[b]] (bucket 0 everything <= reps[0], the last
//     bucket everything > reps[m-2]); the build never splits a run of equal keys over two buckets, so every
//     key lives in one bucket and an update of a key touches one bucket only;
//   - a chain is sorted by (key, row ID): every node holds a sorted run of 0..N pairs, and each node's pairs
//     come before the next node's (only the representative node may be empty while others follow).
// An update batch is planned first (per bucket: sizes after deletions and insertions, and a bound on the new
// nodes its splits can need), the host reserves those nodes for the whole batch (growing the region if
// needed, before anything is changed), and then one thread per bucket applies it in place (apply_bucket).
// The same functions run on the CPU and in the CUDA kernels.
#pragma once

#include <cstdint>

#include "../core/keys.h"
#include "cgrx_core.h"

namespace rtindex::cgrx {

constexpr uint32_t kNoNode = 0xFFFFFFFFu;

struct Nodes {
  uint32_t* data;
  uint32_t node_size;  // N, even (keeps every node's 64-bit keys 8-byte aligned)
  uint64_t num_buckets;

  RTX_HD uint64_t stride() const { return 3ull * node_size + 2; }  // int32 words per node
  RTX_HD uint32_t* node(uint32_t i) const { return data + uint64_t(i) * stride(); }
  RTX_HD uint64_t& key(uint32_t i, uint32_t s) const { return reinterpret_cast<uint64_t*>(node(i))[s]; }
  RTX_HD uint32_t& row(uint32_t i, uint32_t s) const { return node(i)[2 * node_size + s]; }
  RTX_HD uint32_t& size(uint32_t i) const { return node(i)[3 * node_size]; }
  RTX_HD uint32_t& next(uint32_t i) const { return node(i)[3 * node_size + 1]; }
};

RTX_HD int64_t node_words(uint32_t node_size) { return 3ll * node_size + 2; }

// Keys of the updatable index belong to bucket min(first representative >= key, last bucket).
RTX_HD uint64_t clamp_bucket(uint64_t b, uint64_t m) { return b < m ? b : m - 1; }

// The bucket of key k in an updatable index with m >= 1 buckets: keys at or below the first representative
// go to bucket 0, keys above the last one (inserted since the build) to the last; `find(k)` is the
// representative search (it may answer kNoBucket: no match).
template <typename Find>
RTX_HD uint64_t node_bucket(const uint64_t* reps, uint64_t m, uint64_t k, Find&& find) {
  if (k <= reps[0]) return 0;
  if (k > reps[m - 1]) return m - 1;
  const uint64_t b = find(k);
  return b == kNoBucket ? b : clamp_bucket(b, m);
}

// Every pair with key in [lo, hi], from bucket b on, in (key, row ID) order.
template <typename Visit>
RTX_HD void visit_nodes_from_bucket(const Nodes& ns, uint64_t b, uint64_t lo, uint64_t hi, Visit&& visit) {
  for (; b < ns.num_buckets; ++b) {
    for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode; n = ns.next(n)) {
      const uint32_t sz = ns.size(n);
      if (sz == 0 || ns.key(n, sz - 1) < lo) continue;
      uint32_t s = 0, e = sz;  // first slot with key >= lo
      while (s < e) {
        const uint32_t mid = (s + e) >> 1;
        if (ns.key(n, mid) < lo) s = mid + 1; else e = mid;
      }
      for (; s < sz; ++s) {
        if (ns.key(n, s) > hi) return;
        visit(ns.row(n, s));
      }
    }
  }
}

// One bucket's part of an update batch: sorted slices of the deletions and insertions.
struct BucketBatch {
  const uint64_t* del_keys;
  const uint32_t* del_rows;  // nullptr: delete every pair with the key
  uint64_t del_count;
  const uint64_t* ins_keys;
  const uint32_t* ins_rows;
  uint64_t ins_count;
};

RTX_HD bool pair_less(uint64_t ka, uint32_t ra, uint64_t kb, uint32_t rb) { return ka < kb || (ka == kb && ra < rb); }

// Walks deletions against a sorted chain: for each pair, whether it is deleted. `found` counts the
// deletion entries that removed at least one pair, or (by key) whose key did: a key named twice is found
// twice. The rest name absent pairs: no-ops, reported.
struct DeleteMatcher {
  BucketBatch batch;
  uint64_t d = 0;
  uint64_t found = 0;
  bool current_found = false;
  bool any_found = false;
  uint64_t last_found = 0;  // by key: the last key that removed pairs

  // Done with deletion d: was it (or, by key, the same key named earlier) found?
  RTX_HD void advance() {
    const bool by_key = batch.del_rows == nullptr;
    if (current_found) {
      any_found = true;
      last_found = batch.del_keys[d];
    }
    found += current_found || (by_key && any_found && batch.del_keys[d] == last_found);
    current_found = false;
    ++d;
  }

  RTX_HD bool deletes(uint64_t k, uint32_t r) {
    while (d < batch.del_count) {
      const uint64_t dk = batch.del_keys[d];
      const bool by_key = batch.del_rows == nullptr;
      const uint32_t dr = by_key ? 0u : batch.del_rows[d];
      if (by_key ? dk < k : pair_less(dk, dr, k, r)) {  // this deletion is behind the chain: done with it
        advance();
        continue;
      }
      const bool hit = by_key ? dk == k : (dk == k && dr == r);
      if (!hit) return false;
      current_found = true;
      if (!by_key) {  // a (key, row) deletion removes one pair
        found += 1;
        current_found = false;
        ++d;
      }
      return true;
    }
    return false;
  }
  // Whether no deletion can touch a node whose largest key is `last` (all deletions left are beyond it).
  RTX_HD bool passes_over(uint64_t last) const { return d >= batch.del_count || batch.del_keys[d] > last; }
  // After the chain: the deletion in progress, and by key the repeats of a found key after it.
  RTX_HD uint64_t finish() {
    if (current_found) advance();
    while (batch.del_rows == nullptr && any_found && d < batch.del_count && batch.del_keys[d] == last_found) advance();
    return found;
  }
};

RTX_HD uint64_t nodes_needed(uint64_t pairs, uint32_t node_size) {
  const uint64_t n = (pairs + node_size - 1) / node_size;
  return n ? n : 1;
}

// Plan of one bucket: [pairs before, nodes in chain, pairs after deletions, pairs after the batch, deletion
// entries that found something, nodes to reserve for the bucket's splits].
constexpr int kPlanFields = 6;

// How many new nodes a bucket's insertions can need at most (the plan reserves them before anything changes).
// A split turns a full node (N pairs) into two nodes of N/2; with Phi = sum over nodes of max(0, size - N/2),
// a split lowers Phi by N/2 and an insertion raises it by at most 1, and Phi >= 0, so
// splits <= (Phi after the deletions + insertions) / (N/2). Reserved nodes a batch does not use stay empty
// and unlinked (free space until rebuild() compacts the region).
RTX_HD uint64_t split_bound(uint64_t phi, uint64_t insertions, uint32_t node_size) {
  return (phi + insertions) / (node_size / 2);
}

RTX_HD void plan_bucket(const Nodes& ns, uint64_t b, const BucketBatch& batch, int64_t* plan) {
  DeleteMatcher m{batch};
  uint64_t before = 0, chain = 0, kept = 0, phi = 0;
  for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode; n = ns.next(n)) {
    ++chain;
    const uint32_t size = ns.size(n);
    uint64_t kept_here = size;
    before += size;
    // Only nodes a deletion can reach are read; the rest contribute their header's size.
    if (size > 0 && !m.passes_over(ns.key(n, size - 1))) {
      for (uint32_t s = 0; s < size; ++s) kept_here -= m.deletes(ns.key(n, s), ns.row(n, s)) ? 1 : 0;
    }
    kept += kept_here;
    phi += kept_here > ns.node_size / 2 ? kept_here - ns.node_size / 2 : 0;
  }
  plan[0] = static_cast<int64_t>(before);
  plan[1] = static_cast<int64_t>(chain);
  plan[2] = static_cast<int64_t>(kept);
  plan[3] = static_cast<int64_t>(kept + batch.ins_count);
  plan[4] = static_cast<int64_t>(m.finish());
  plan[5] = static_cast<int64_t>(split_bound(phi, batch.ins_count, ns.node_size));
}

// Applies one bucket's batch as the paper does, deletions first: each deletion shifts the pairs after it in
// its node to the left (a linked node left empty is unlinked; the representative node always stays); then
// each insertion goes into the first node whose largest pair is not smaller (or the last node), shifting the
// pairs after it to the right; an insertion into a full node first splits it, moving its upper half into a
// new node linked right after it. `first_new` is the first of the plan's reserved nodes for this bucket (unused
// without insertions). Returns what the deletions did, as the plan counts it (fields 0 - 2 and 4), so that a
// batch of deletions alone needs no plan: it reserves nothing.
struct Applied {
  uint64_t removed;  // pairs
  uint64_t found;    // deletion entries that found something (DeleteMatcher)
};

RTX_HD Applied apply_bucket(const Nodes& ns, uint64_t b, const BucketBatch& batch, uint32_t first_new) {
  const uint32_t N = ns.node_size, half = N / 2;
  Applied done{0, 0};
  if (batch.del_count > 0) {
    DeleteMatcher m{batch};
    uint32_t prev = kNoNode;
    for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode;) {
      const uint32_t next = ns.next(n);
      const uint32_t size = ns.size(n);
      if (size == 0 || m.passes_over(ns.key(n, size - 1))) {  // no deletion in this node
        prev = n;
        n = next;
        continue;
      }
      uint32_t w = 0;
      for (uint32_t s = 0; s < size; ++s) {
        const uint64_t k = ns.key(n, s);
        const uint32_t r = ns.row(n, s);
        if (m.deletes(k, r)) {
          ++done.removed;
          continue;
        }
        ns.key(n, w) = k;
        ns.row(n, w) = r;
        ++w;
      }
      ns.size(n) = w;
      if (w == 0 && prev != kNoNode) {
        ns.next(prev) = next;
        ns.next(n) = kNoNode;
      } else {
        prev = n;
      }
      n = next;
    }
    done.found = m.finish();
  }
  uint32_t cur = static_cast<uint32_t>(b), fresh = first_new;
  auto last_less = [&](uint32_t n, uint64_t k, uint32_t r) {  // node n's largest pair < (k, r)
    const uint32_t sz = ns.size(n);
    return pair_less(ns.key(n, sz - 1), ns.row(n, sz - 1), k, r);
  };
  for (uint64_t i = 0; i < batch.ins_count; ++i) {
    const uint64_t k = batch.ins_keys[i];
    const uint32_t r = batch.ins_rows[i];
    // Insertions are sorted, so the node they go into only moves forward.
    while (ns.next(cur) != kNoNode && (ns.size(cur) == 0 || last_less(cur, k, r))) cur = ns.next(cur);
    if (ns.size(cur) == N) {
      const uint32_t x = fresh++;
      for (uint32_t s = 0; s < half; ++s) {
        ns.key(x, s) = ns.key(cur, half + s);
        ns.row(x, s) = ns.row(cur, half + s);
      }
      ns.size(x) = half;
      ns.next(x) = ns.next(cur);
      ns.size(cur) = half;
      ns.next(cur) = x;
      if (last_less(cur, k, r)) cur = x;
    }
    uint32_t s = ns.size(cur);
    for (; s > 0 && pair_less(k, r, ns.key(cur, s - 1), ns.row(cur, s - 1)); --s) {
      ns.key(cur, s) = ns.key(cur, s - 1);
      ns.row(cur, s) = ns.row(cur, s - 1);
    }
    ns.key(cur, s) = k;
    ns.row(cur, s) = r;
    ns.size(cur) += 1;
  }
  return done;
}

}  // namespace rtindex::cgrx

namespace rtindex::cgrx {

// The bulk load's buckets: about per = node_size / 2 pairs each (the paper's half-full nodes), never splitting a
// run of equal keys. Candidate j < n / per ends its bucket where the run of the key at position (j + 1) * per - 1
// ends; the last candidate, at the last pair. Candidates whose runs end at one pair make one bucket (the buckets'
// last positions are the candidates' ends, each once). `sorted`: the n >= 1 ordered keys ascending.
RTX_HD uint64_t load_candidates(uint64_t n, uint64_t per) { return n / per + 1; }

RTX_HD uint64_t load_candidate_end(const uint64_t* sorted, uint64_t n, uint64_t per, uint64_t j) {
  const uint64_t c = j + 1 < load_candidates(n, per) ? (j + 1) * per - 1 : n - 1;
  const uint64_t k = sorted[c];
  uint64_t lo = c + 1, hi = n;  // the first position past c holding a larger key
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] <= k) lo = mid + 1; else hi = mid;
  }
  return lo - 1;
}

// Bucket b's slice of the sorted pairs from the buckets' last positions (-1 alone: one empty bucket), and the
// nodes it needs beyond its own.
struct LoadSlice {
  uint64_t start, count, extra;
};
RTX_HD LoadSlice load_slice(const int64_t* ends, uint64_t b, uint32_t node_size) {
  const uint64_t start = b == 0 ? 0 : static_cast<uint64_t>(ends[b - 1]) + 1;
  const uint64_t count = static_cast<uint64_t>(ends[b]) + 1 - start;
  return {start, count, nodes_needed(count, node_size) - 1};
}

// Bulk load of bucket b: `count` sorted pairs starting at `start`, into node b and then nodes first_extra,
// first_extra + 1, ... (packed).
RTX_HD void load_bucket(const Nodes& ns, uint64_t b, const uint64_t* keys, const int32_t* rows, uint64_t start,
                        uint64_t count, uint32_t first_extra) {
  const uint32_t N = ns.node_size;
  const uint64_t needed = nodes_needed(count, N);
  auto node_of = [&](uint64_t i) { return i == 0 ? static_cast<uint32_t>(b) : first_extra + static_cast<uint32_t>(i - 1); };
  for (uint64_t f = 0; f < count; ++f) {
    const uint32_t n = node_of(f / N);
    ns.key(n, static_cast<uint32_t>(f % N)) = keys[start + f];
    ns.row(n, static_cast<uint32_t>(f % N)) = static_cast<uint32_t>(rows[start + f]);
  }
  for (uint64_t i = 0; i < needed; ++i) {
    const uint32_t n = node_of(i);
    const uint64_t s = i * N;
    ns.size(n) = static_cast<uint32_t>(count > s ? (count - s < N ? count - s : N) : 0);
    ns.next(n) = i + 1 < needed ? node_of(i + 1) : kNoNode;
  }
}

// Number of pairs in bucket b's chain, and writing them out (for exports and rebuilds).
RTX_HD uint64_t chain_pairs(const Nodes& ns, uint64_t b) {
  uint64_t c = 0;
  for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode; n = ns.next(n)) c += ns.size(n);
  return c;
}

// Bucket b's chain: its nodes, its pairs, and the nodes read by a lookup of each of its pairs, summed (a pair
// in the chain's j-th node costs j + 1 node reads). The last over the pairs is what the rebuild policy watches.
RTX_HD void chain_stats(const Nodes& ns, uint64_t b, int64_t* out) {
  int64_t nodes = 0, pairs = 0, reads = 0;
  for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode; n = ns.next(n)) {
    ++nodes;
    pairs += ns.size(n);
    reads += nodes * static_cast<int64_t>(ns.size(n));
  }
  out[0] = nodes;
  out[1] = pairs;
  out[2] = reads;
}

RTX_HD void export_chain(const Nodes& ns, uint64_t b, uint64_t* keys, int32_t* rows) {
  uint64_t f = 0;
  for (uint32_t n = static_cast<uint32_t>(b); n != kNoNode; n = ns.next(n))
    for (uint32_t s = 0; s < ns.size(n); ++s, ++f) {
      keys[f] = ns.key(n, s);
      rows[f] = static_cast<int32_t>(ns.row(n, s));
    }
}

}  // namespace rtindex::cgrx
