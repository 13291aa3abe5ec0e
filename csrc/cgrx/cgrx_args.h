// Argument checking and unpacking of the cgRX operators, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "../core/checks.h"
#include "../core/config.h"
#include "../core/key_dispatch.h"
#include "cgrx_answer.h"
#include "cgrx_core.h"
#include "cgrx_scene.h"

namespace rtindex::cgrx {

enum class Backend : int64_t { Radix = 0, OptiX = 1, BinarySearch = 2 };
enum class BucketSearch : int64_t { Binary = 0, Linear = 1 };  // within a bucket (Pairs::linear_search)

inline Layout layout_from_int(int64_t v) {
  TORCH_CHECK(v >= 0 && v <= 3, "layout must be 0 (packed row), 1 (aligned row), 2 (column) or 3 (nodes), got ", v);
  return static_cast<Layout>(v);
}

// The layouts of the read-only index's sorted pairs (cgrx_build, the optimized scene): not the node region.
inline Layout pairs_layout_from_int(int64_t v) {
  const Layout l = layout_from_int(v);
  TORCH_CHECK(l != Layout::Nodes, "layout 3 (nodes) belongs to the updatable index (cgrx_nodes_load); the sorted "
              "pairs take 0 (packed row), 1 (aligned row) or 2 (column)");
  return l;
}

inline void check_bucket_size(int64_t bucket_size) {
  TORCH_CHECK(bucket_size >= 1 && bucket_size <= (int64_t(1) << 30), "bucket_size must be in 1 .. 2^30");
}

inline void check_pairs_tensor(const at::Tensor& pairs) {
  TORCH_CHECK(pairs.dim() == 1 && pairs.scalar_type() == at::kInt && pairs.is_contiguous(),
              "pairs must be the int32 tensor cgrx_build returned");
}

inline int64_t num_pairs(const at::Tensor& pairs, Layout l) {
  return pairs.numel() / (l == Layout::AlignedRow ? 4 : 3);
}

// The sorted pairs cgrx_build returned, checked: a whole number of pairs in layout l.
inline Pairs pairs_view(const at::Tensor& pairs, Layout l, int64_t bucket_size, bool linear_search) {
  check_pairs_tensor(pairs);
  const int64_t n = num_pairs(pairs, l);
  TORCH_CHECK(pairs.numel() == layout_words(l, n), "pairs has ", pairs.numel(), " words, not a whole number of pairs");
  return Pairs{reinterpret_cast<const uint32_t*>(pairs.data_ptr<int32_t>()), static_cast<uint64_t>(n),
               static_cast<uint32_t>(l), static_cast<uint32_t>(bucket_size), linear_search ? 1u : 0u, 0u, 1u};
}

// cgrx_set_spare_rows's arguments, checked: aligned pairs and one int64 value per pair, indexed by row ID.
inline Pairs spare_rows_view(const at::Tensor& pairs, int64_t layout, const at::Tensor& rows) {
  const Layout l = pairs_layout_from_int(layout);
  TORCH_CHECK(l == Layout::AlignedRow, "spare rows need the aligned_row layout, got layout ", layout);
  const Pairs p = pairs_view(pairs, l, 1, false);
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "rows must be a contiguous 1-D int64 tensor");
  TORCH_CHECK(rows.numel() == static_cast<int64_t>(p.n), "rows must hold one value per pair (", p.n, "), got ", rows.numel());
  check_same_device(pairs, rows, "pairs", "rows");
  return p;
}

inline Representation representation_from_int(int64_t v) {
  TORCH_CHECK(v == 0 || v == 1, "representation must be 0 (naive) or 1 (optimized), got ", v);
  return static_cast<Representation>(v);
}

// cgrx_build_scene's representatives: int64, contiguous, at least num_reps of them.
inline void check_scene_reps(const at::Tensor& reps, int64_t num_reps) {
  TORCH_CHECK(reps.scalar_type() == at::kLong && reps.is_contiguous(), "reps must be a contiguous int64 tensor");
  TORCH_CHECK(num_reps >= 0 && num_reps <= reps.numel(), "num_reps must lie in [0, ", reps.numel(), "], got ", num_reps);
}

// The sorted keys the optimized representation reads (the key after each representative), checked against
// the representatives; an empty view where the naive representation needs none.
inline Pairs scene_pairs(Representation r, const c10::optional<at::Tensor>& pairs, int64_t bucket_size, int64_t layout,
                         const at::Tensor& reps, int64_t num_reps) {
  if (r != Representation::Optimized) return Pairs{nullptr, 0, 0, 1, 0};
  TORCH_CHECK(pairs.has_value(), "the optimized cgRX scene needs the pairs (the sorted keys)");
  const Layout l = pairs_layout_from_int(layout);
  check_bucket_size(bucket_size);
  check_same_device(reps, *pairs, "reps", "pairs");
  const Pairs p = pairs_view(*pairs, l, bucket_size, false);
  TORCH_CHECK(static_cast<int64_t>(p.num_buckets()) == num_reps, "num_reps does not match pairs and bucket_size");
  return p;
}

struct IndexArgs {
  Storage storage;
  const uint64_t* reps;
  uint64_t num_reps;
  const int32_t* table;
  Backend backend;
  SceneConfig scene;
  bool cold;  // CgrxConfig::cold
};

// The index's typed configuration, one `int config` argument of every lookup operator (core/config.h), unpacked
// once per call. torch_rtindex/_config.py packs it by the table below, which it checks against config_schema().
struct CgrxConfig {
  KeyType key_type;   // of the queries (the index's keys are ordered keys already)
  int64_t layout;     // Layout
  int64_t bucket_size;  // the node size for the node layout
  bool linear_search;
  int64_t backend;    // Backend
  SceneConfig scene;
  bool spare_rows;    // answer with the aligned pairs' spare words (Pairs::spare_rows)
  bool cold;          // not in the CPU's caches when a call starts (an out-of-core chunk): prefetch whatever its size
};
enum CgrxField : size_t { kCgrxKeyType, kCgrxLayout, kCgrxBucketSearch, kCgrxBackend, kCgrxScene,
                          kCgrxBucketSize = kCgrxScene + kSceneFieldCount, kCgrxSpareRows, kCgrxCold };
constexpr ConfigField kCgrxConfigFields[] = {
    {"key_type", 3}, {"layout", 2}, {"bucket_search", 1}, {"backend", 2}, kSceneFields[0], kSceneFields[1],
    kSceneFields[2], kSceneFields[3], {"bucket_size", 31}, {"spare_rows", 1}, {"cold", 1}};
static_assert(sizeof(kCgrxConfigFields) / sizeof(ConfigField) == kCgrxCold + 1, "field table and enum differ");
static_assert(config_bits(kCgrxConfigFields) <= 63, "a cgRX config must fit a non-negative int64");

inline CgrxConfig cgrx_config(int64_t packed) {
  const auto f = unpack_config(packed, kCgrxConfigFields, "a cgRX config");
  return CgrxConfig{key_type_from_int(f[kCgrxKeyType]), f[kCgrxLayout], f[kCgrxBucketSize],
                    f[kCgrxBucketSearch] == static_cast<int64_t>(BucketSearch::Linear), f[kCgrxBackend],
                    scene_from_fields(&f[kCgrxScene]), f[kCgrxSpareRows] == 1, f[kCgrxCold] == 1};
}

inline IndexArgs index_args(const at::Tensor& pairs, const at::Tensor& reps, const at::Tensor& table,
                            const CgrxConfig& cfg) {
  const int64_t layout = cfg.layout, bucket_size = cfg.bucket_size, backend = cfg.backend;
  const bool linear_search = cfg.linear_search;
  const Layout l = layout_from_int(layout);
  check_bucket_size(bucket_size);
  TORCH_CHECK(backend >= 0 && backend <= 2, "backend must be 0 (radix table), 1 (optix) or 2 (binary search)");
  check_pairs_tensor(pairs);
  TORCH_CHECK(reps.dim() == 1 && reps.scalar_type() == at::kLong && reps.is_contiguous(),
              "reps must be the int64 tensor cgrx_build returned");
  TORCH_CHECK(table.dim() == 1 && table.scalar_type() == at::kInt && table.is_contiguous(),
              "table must be the int32 tensor cgrx_build returned");
  check_same_device(pairs, reps, "pairs", "reps");
  check_same_device(pairs, table, "pairs", "table");
  TORCH_CHECK(!cfg.spare_rows || l == Layout::AlignedRow, "spare rows need the aligned_row layout");
  IndexArgs a{};
  if (l == Layout::Nodes) {
    // Updatable index: `pairs` holds the node region, bucket_size is the node size, one bucket per representative.
    TORCH_CHECK(bucket_size % 2 == 0 && pairs.numel() % node_words(static_cast<uint32_t>(bucket_size)) == 0,
                "the node region does not match the node size");
    a.num_reps = static_cast<uint64_t>(reps.numel());
    a.storage.nodes = Nodes{reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>()), static_cast<uint32_t>(bucket_size),
                            a.num_reps};
    a.storage.use_nodes = true;
  } else {
    a.storage.pairs = pairs_view(pairs, l, bucket_size, linear_search);
    a.storage.pairs.spare_rows = cfg.spare_rows ? 1u : 0u;
    a.num_reps = a.storage.pairs.num_buckets();
    TORCH_CHECK(reps.numel() == static_cast<int64_t>(a.num_reps), "reps do not match pairs and bucket_size");
  }
  // The table's units: the buckets of an updatable index, lines of the pairs otherwise (cgrx_core.h).
  const uint64_t units = a.storage.use_nodes ? a.num_reps : radix_units(a.storage.pairs.n, l, bucket_size);
  TORCH_CHECK(table.numel() == radix_table_words(units), "table does not match the pairs and bucket_size");
  a.reps = reinterpret_cast<const uint64_t*>(reps.data_ptr<int64_t>());
  a.table = table.data_ptr<int32_t>();
  a.backend = static_cast<Backend>(backend);
  a.scene = cfg.scene;
  a.cold = cfg.cold;
  return a;
}

// cgrx_lookup_queues: queue j is queries[starts[j], starts[j] + sizes[j]) looked up in index j (pairs[j], reps[j],
// tables[j], all under one config), whose pairs hold each row's offset from bases[j]. Answers are concatenated in
// queue order: queue j's at [out_begin, out_begin + sizes[j]).
struct QueueArgs {
  IndexArgs index;
  QueryKeys keys;     // the queue's queries (from its start)
  int64_t size;
  int64_t out_begin;  // its first answer in the output
  int64_t base;       // added to every row the index answers
};

inline std::vector<QueueArgs> queues_args(at::TensorList pairs, at::TensorList reps, at::TensorList tables, int64_t config,
                                          const at::Tensor& queries, at::IntArrayRef starts, at::IntArrayRef sizes,
                                          at::IntArrayRef bases, int64_t& total) {
  const size_t n = pairs.size();
  TORCH_CHECK(reps.size() == n && tables.size() == n && starts.size() == n && sizes.size() == n && bases.size() == n,
              "cgrx_lookup_queues needs one pairs, reps, table, start, size and base per queue; got ", n, ", ",
              reps.size(), ", ", tables.size(), ", ", starts.size(), ", ", sizes.size(), " and ", bases.size());
  TORCH_CHECK(queries.dim() == 1 && queries.is_contiguous(), "queries must be a contiguous 1-D tensor");
  const CgrxConfig cfg = cgrx_config(config);
  std::vector<QueueArgs> out;
  out.reserve(n);
  total = 0;
  for (size_t j = 0; j < n; ++j) {
    IndexArgs a = index_args(pairs[j], reps[j], tables[j], cfg);
    // Every index has its radix table, whatever its backend: the OptiX backend's queues search it (no scenes).
    if (a.backend == Backend::OptiX) a.backend = Backend::Radix;
    QueryKeys k = query_keys(pairs[j], queries, c10::nullopt, cfg.key_type);
    TORCH_CHECK(starts[j] >= 0 && sizes[j] >= 0 && starts[j] <= queries.numel() - sizes[j], "queue ", j, " (start ",
                starts[j], ", size ", sizes[j], ") is not within the ", queries.numel(), " queries");
    TORCH_CHECK(bases[j] >= 0, "queue ", j, ": bases must be >= 0, got ", bases[j]);
    k.lo = static_cast<const char*>(k.lo) + starts[j] * queries.element_size();
    out.push_back(QueueArgs{a, k, sizes[j], total, bases[j]});
    total += sizes[j];
  }
  return out;
}

// Values are indexed by row ID: for the read-only index at least one per key (its rows are positions below the
// key count; an out-of-core chunk whose pairs hold row offsets gets the values from its smallest row on, which
// cover every offset); for the updatable index the Python API checks that they cover every row ID it handed out.
inline void check_cgrx_values(const at::Tensor& values, const Storage& st, const at::Tensor& index) {
  TORCH_CHECK(st.use_nodes || !st.pairs.spare_rows, "aggregates index their values by row ID: not with spare rows");
  check_values(values, st.use_nodes ? values.numel() : static_cast<int64_t>(st.pairs.n), index, true);
}

}  // namespace rtindex::cgrx
