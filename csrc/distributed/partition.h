// Routing of point queries in a sharded index (torch_rtindex/distributed/sharded.py), shared by the CPU and
// CUDA kernels of partition_queries: which rank owns an ordered key, and which send bucket a query goes to.
#pragma once

#include <cstdint>

#include "../core/keys.h"

namespace rtindex {

// The rank owning ordered key k: the number of splitters <= k. Splitters are ascending ordered keys, one fewer
// than ranks; rank r holds [splitters[r - 1], splitters[r]). (searchsorted(splitters, k, right=True).)
// Branch-free: the search takes the same steps for every key and its comparisons become selects, so random
// keys cost no mispredicted branches (on the CPU a mispredict per step was most of the partition's time).
RTX_HD int64_t owner_of(uint64_t k, const uint64_t* splitters, int64_t num_splitters) {
  if (num_splitters == 0) return 0;
  const uint64_t* base = splitters;
  int64_t n = num_splitters;
  while (n > 1) {  // the answer lies in [base, base + n]
    const int64_t half = n >> 1;
    base = base[half] <= k ? base + half : base;
    n -= half;
  }
  return (base - splitters) + (*base <= k ? 1 : 0);
}

// A local row ID as a global one (a chunk's rows in the out-of-core index: global_rows; a shard's: pack_answers):
// -1 (no row) stays -1; otherwise the map's offset for it (int32 maps hold unsigned 32-bit offsets) or, with no
// map (m = 0), the row's own 32-bit offset, plus base. A row past the map cannot come from the local index: it
// answers -1 and sets *bad.
template <typename Map>
RTX_HD int64_t global_row(int64_t v, const Map* map, int64_t m, int64_t base, bool* bad) {
  if (v < 0) return v;
  if (m == 0) return (v & 0xFFFFFFFFLL) + base;
  if (v >= m) {
    *bad = true;
    return -1;
  }
  return (sizeof(Map) == 4 ? (static_cast<int64_t>(map[v]) & 0xFFFFFFFFLL) : static_cast<int64_t>(map[v])) + base;
}

// Query i of n in `chunks` contiguous chunks: chunk c holds queries [ceil(c n / chunks), ceil((c + 1) n / chunks)).
// The caller checks that n * chunks fits in 64 bits.
RTX_HD int64_t chunk_of(uint64_t i, uint64_t n, uint64_t chunks) {
  return chunks == 1 ? 0 : static_cast<int64_t>(i * chunks / n);  // a 64-bit division only where there are chunks
}

// The send bucket: chunk-major, owner-minor, so that each chunk's send buffer is contiguous and in rank order.
// -1 (no bucket) where the owner is `skip`: a rank that answers its own queries where they lie leaves them out
// (skip < 0: none left out).
RTX_HD int64_t send_bucket(uint64_t i, uint64_t n, int64_t chunks, uint64_t key, const uint64_t* splitters,
                           int64_t num_splitters, int64_t skip) {
  const int64_t owner = owner_of(key, splitters, num_splitters);
  if (owner == skip) return -1;
  return chunk_of(i, n, static_cast<uint64_t>(chunks)) * (num_splitters + 1) + owner;
}

}  // namespace rtindex
