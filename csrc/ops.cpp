// The operator schemas of torch.ops.rtindex, in one place. Kernels live in one file per backend
// (*_cpu.cpp, *_cuda.cu); fake (meta) kernels for torch.compile live in torch_rtindex/_fake.py.
//
// Conventions shared by every schema:
//   - keys and queries are "ordered keys": uint64 values stored bit for bit in int64 tensors, produced by
//     map_keys / map_ranges from the user's dtype (csrc/core/keys.h);
//   - `int[] scene` is a SceneConfig: [bits_x, bits_y, bits_z, scale_y_log2, scale_z_log2];
//   - row IDs come back as int64; a miss is -1 in `first_row` and 0 in `count`;
//   - `Tensor? hi`: None means point lookups of `lo`; otherwise inclusive ranges [lo, hi];
//   - *_csr returns CSR (offsets [q + 1], rows [total]): its size depends on the data, so it synchronizes with
//     the host once. *_csr_capped is the fixed-capacity form: rows has `capacity` entries (-1 past the
//     matches; the matches at full-CSR positions >= capacity are dropped), offsets are the full CSR's, and
//     `total` (0-d int64) is the true number of matches; no host sync, capturable in a CUDA graph wherever the
//     lookup itself is.
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "cgrx/cgrx_args.h"
#include "distributed/partition_checks.h"
#include "rx/rx_args.h"

#if RTINDEX_WITH_CUDA
#include "core/l2_residency.h"
#include "optix/optix_runtime.h"
#endif

namespace {

std::vector<int64_t> optix_info(int64_t device) {
#if RTINDEX_WITH_CUDA
  return rtindex::optix::device_info(static_cast<int>(device));
#else
  (void)device;
  TORCH_CHECK(false, "torch_rtindex was built without CUDA, so OptiX is not available");
#endif
}

int64_t reserve_l2(int64_t device, int64_t bytes) {
#if RTINDEX_WITH_CUDA
  return rtindex::l2_reserve(static_cast<int>(device), bytes);
#else
  (void)device;
  (void)bytes;
  TORCH_CHECK(false, "torch_rtindex was built without CUDA: there is no GPU L2 cache to reserve");
#endif
}

void set_program_path(std::string name, std::string path) {
#if RTINDEX_WITH_CUDA
  rtindex::optix::set_program_path(name, path);
#else
  (void)name;
  (void)path;
#endif
}

void set_optix_disk_cache(std::string path) {
#if RTINDEX_WITH_CUDA
  rtindex::optix::set_disk_cache(path);
#else
  (void)path;
#endif
}

std::string optix_disk_cache(int64_t device) {
#if RTINDEX_WITH_CUDA
  return rtindex::optix::disk_cache(static_cast<int>(device));
#else
  (void)device;
  TORCH_CHECK(false, "torch_rtindex was built without CUDA, so OptiX is not available");
#endif
}

// OptiX launches cannot be captured in a CUDA graph (benchmarks/optix_capture_probe.py: every variant tried
// broke the capture or the context), so the operators that launch them are tagged for torch.compile: with
// mode="reduce-overhead" Inductor partitions its CUDA graphs around them instead of failing.
// (Const lvalues: the overload of Library::def that takes tags must win over the one that takes a kernel.)
const std::vector<at::Tag> kOptixTags{at::Tag::cudagraph_unsafe};
const std::vector<at::Tag> kNoTags{};

// The enums and configuration layouts the Python package mirrors (torch_rtindex/_config.py checks them at
// import, so a change on one side cannot silently shift the meaning of an integer on the other). The enums'
// names and values come from their definitions (core/config.h enum_schema); last, the columns and the width of
// the header that partition_padded writes in front of each owner's block.
std::string config_schema() {
  using rtindex::enum_schema;
  namespace cgrx = rtindex::cgrx;
  return "key_type:" + enum_schema<rtindex::KeyType>() + ";layout:" + enum_schema<cgrx::Layout>() +
         ";backend:" + enum_schema<cgrx::Backend>() + ";bucket_search:" + enum_schema<cgrx::BucketSearch>() +
         ";representation:" + enum_schema<cgrx::Representation>() +
         ";cgrx_config:" + rtindex::config_fields_schema(cgrx::kCgrxConfigFields) +
         ";rx_config:" + rtindex::config_fields_schema(rtindex::kRxConfigFields) +
         ";padded_header:" + std::to_string(rtindex::kPaddedHeader) +
         ";padded_columns:count=" + std::to_string(rtindex::kPaddedCount) +
         ",overflow=" + std::to_string(rtindex::kPaddedOverflow) + ",status=" + std::to_string(rtindex::kPaddedStatus);
}

}  // namespace

TORCH_LIBRARY(rtindex, m) {
  // Key mapping.
  m.def("map_keys(Tensor keys, int key_type) -> Tensor");
  m.def("map_ranges(Tensor lo, Tensor hi, int key_type) -> (Tensor, Tensor)");
  // The inverse of map_keys into a tensor of `dtype` (what an index exports for its state).
  m.def("unmap_keys(Tensor ordered, int key_type, ScalarType dtype) -> Tensor");
  // Query order: ordered keys sorted by their bits [begin_bit, end_bit) (a stable radix sort of those bits
  // only), with each sorted key's position in the input. Lookups in key order walk the index coherently.
  m.def("sort_queries(Tensor keys, int begin_bit, int end_bit) -> (Tensor sorted_keys, Tensor order)");

  // RX: one triangle per key. `structure` is backend specific: on CUDA the compacted OptiX GAS behind a
  // 128-byte header; on the CPU the keys sorted with their row IDs ([2, n] int64).
  m.def("rx_build(Tensor keys, int[] scene, bool allow_update) -> Tensor");
  m.def("rx_refit(Tensor(a!) structure, Tensor keys, int[] scene) -> ()");
  // Lookups: `config` is the index's packed configuration (rx/rx_args.h, core/config.h); the queries come in
  // the key dtype (or as ordered keys with key_type uint64) and are mapped where the kernels read them.
#define RTINDEX_RX_INDEX "Tensor structure, Tensor keys, int config, Tensor lo, Tensor? hi"
  m.def(torch::schema("rx_lookup(" RTINDEX_RX_INDEX ") -> (Tensor first_row, Tensor count)"), kOptixTags);
  m.def(torch::schema("rx_lookup_rows(" RTINDEX_RX_INDEX ", int miss_row) -> Tensor first_row"), kOptixTags);
  m.def(torch::schema("rx_lookup_csr(" RTINDEX_RX_INDEX ") -> (Tensor offsets, Tensor rows)"), kOptixTags);
  m.def(torch::schema("rx_lookup_csr_capped(" RTINDEX_RX_INDEX
                      ", SymInt capacity) -> (Tensor offsets, Tensor rows, Tensor total)"),
        kOptixTags);
  m.def(torch::schema("rx_aggregate(" RTINDEX_RX_INDEX ", Tensor values) -> (Tensor count, Tensor sum)"), kOptixTags);

  // cgRX: sorted key/rowID pairs in buckets, one representative per bucket. `pairs` (int32 words in the given
  // layout), `reps` (the representatives) and `table` (the radix table over them, int32) come from
  // cgrx_build; `scene_structure` is the representatives' OptiX GAS (CUDA) or triangles (CPU) from
  // cgrx_build_scene. backend: 0 = radix table, 1 = OptiX rays, 2 = binary search over the representatives.
  // keys: of key_type (map_keys's numbering), mapped where the build reads them; the default, uint64, takes ordered
  // keys as they are.
  m.def("cgrx_build(Tensor keys, int bucket_size, int layout, int key_type=2) -> (Tensor pairs, Tensor reps, Tensor table)");
  // The sorted pairs back as (ordered keys, int64 row IDs), in (key, row ID) order: what the index holds.
  m.def("cgrx_pairs_export(Tensor pairs, int layout) -> (Tensor keys, Tensor rows)");
  // Writes rows[row ID] (its low 32 bits) into each aligned pair's spare word, which lookups with the config's
  // spare_rows set answer with (a sharded index's global rows, cgrx_core.h Pairs::spare_rows).
  m.def("cgrx_set_spare_rows(Tensor(a!) pairs, int layout, Tensor rows) -> ()");
  // representation: 0 = naive (markers at x = -1), 1 = optimized (the paper's §3.3; needs the pairs, bucket_size
  // and layout cgrx_build was given, for the key after each representative).
  m.def(
      "cgrx_build_scene(Tensor reps, int num_reps, int[] scene, int representation=0, Tensor? pairs=None, "
      "int bucket_size=1, int layout=0) -> Tensor");
  // Lookups: `config` is the index's packed typed configuration (cgrx_args.h, core/config.h,
  // torch_rtindex/_config.py); the queries come in the key dtype (or as ordered keys
  // with key_type uint64) and are mapped inside the kernels.
  // The cgrx_optix_* operators are the same kernels for indexes whose backend traces rays: a separate name, so
  // that they alone carry the cudagraph_unsafe tag.
#define RTINDEX_CGRX_INDEX "Tensor pairs, Tensor reps, Tensor table, Tensor scene_structure, int config, Tensor lo, Tensor? hi"
#define RTINDEX_CGRX_LOOKUPS(prefix, tags)                                                                        \
  m.def(torch::schema(prefix "_lookup(" RTINDEX_CGRX_INDEX ") -> (Tensor first_row, Tensor count)"), tags);     \
  m.def(torch::schema(prefix "_lookup_rows(" RTINDEX_CGRX_INDEX ", int miss_row) -> Tensor first_row"), tags);  \
  m.def(torch::schema(prefix "_lookup_csr(" RTINDEX_CGRX_INDEX ") -> (Tensor offsets, Tensor rows)"), tags);    \
  m.def(torch::schema(prefix "_lookup_csr_capped(" RTINDEX_CGRX_INDEX                                          \
                      ", SymInt capacity) -> (Tensor offsets, Tensor rows, Tensor total)"),                      \
        tags);                                                                                                   \
  m.def(torch::schema(prefix "_aggregate(" RTINDEX_CGRX_INDEX ", Tensor values) -> (Tensor count, Tensor sum)"), tags)
  RTINDEX_CGRX_LOOKUPS("cgrx", kNoTags);
  RTINDEX_CGRX_LOOKUPS("cgrx_optix", kOptixTags);
  // Range counts [lo[i], hi[i]] from the positions of each range's two ends (two searches, no visit of the
  // matches): for every backend, searched through the radix table (binary search for that backend), so no rays
  // and no tag. Node chains (layout 3) count by visiting. `hi` is required.
  m.def("cgrx_range_count(" RTINDEX_CGRX_INDEX ") -> Tensor count");

  // cgRX with batch updates (node chains, csrc/cgrx/cgrx_nodes.h). Lookups use the cgrx_lookup* operators with
  // layout 3 and the node region as `pairs`, the node size as `bucket_size`. An update is planned
  // (cgrx_nodes_plan), nodes are reserved by the caller, then applied in place (cgrx_nodes_apply, which returns
  // per bucket the pairs it removed and the deletion entries that found something; a batch of deletions alone
  // reserves nothing and skips the plan).
  // Batches are sorted by (key, row ID); *_offsets[b] .. *_offsets[b + 1] is bucket b's slice.
  m.def(
      "cgrx_nodes_load(Tensor keys, Tensor rows, int node_size, float growth) -> (Tensor nodes, Tensor reps, Tensor table, "
      "SymInt used)");  // SymInt: the node count is data dependent (an unbacked size under torch.compile)
  m.def("cgrx_find_buckets(Tensor reps, Tensor table, Tensor keys) -> Tensor");
  m.def(
      "cgrx_nodes_plan(Tensor nodes, int node_size, Tensor del_keys, Tensor? del_rows, Tensor del_offsets, "
      "Tensor ins_keys, Tensor ins_rows, Tensor ins_offsets) -> Tensor");
  m.def(
      "cgrx_nodes_apply(Tensor(a!) nodes, int node_size, Tensor del_keys, Tensor? del_rows, Tensor del_offsets, "
      "Tensor ins_keys, Tensor ins_rows, Tensor ins_offsets, Tensor first_new) -> Tensor applied");
  m.def("cgrx_nodes_export(Tensor nodes, int node_size, int num_buckets) -> (Tensor keys, Tensor rows)");
  // Per bucket: nodes in its chain, pairs, and node reads of a lookup of each pair summed (the rebuild policy's
  // measure of how far updates have stretched the chains), [num_buckets, 3] int64.
  m.def("cgrx_nodes_stats(Tensor nodes, int node_size, int num_buckets) -> Tensor");

  // Runtime facts about the OptiX layer (CUDA builds).
  m.def("optix_info(int device) -> int[]", &optix_info);
}

// Inspection and plumbing, apart from the public operators: what the tests and the package itself call.
TORCH_LIBRARY(rtindex_internal, m) {
  // Scene inspection (CPU): the triangles of a key set and the rays of a batch, for the Embree check.
  m.def("scene_triangles(Tensor keys, int[] scene) -> Tensor");
  m.def("scene_point_rays(Tensor queries, int[] scene) -> Tensor");
  m.def("scene_range_rays(Tensor lo, Tensor hi, int[] scene, int max_range_rays) -> (Tensor, Tensor)");
  // One step of the OptiX ray search for every query (CPU; for the Embree test): state and hits of the last
  // step in (None at the start), the new state and the next rays out (cgrx_cpu.cpp).
  m.def(
      "cgrx_scene_rays(Tensor queries, int[] scene, Tensor reps, int num_reps, int representation=0, "
      "Tensor? state=None, Tensor? hits=None) -> (Tensor state, Tensor rays)");
  // Routing of a sharded index's point lookups (torch_rtindex/distributed/sharded.py, csrc/distributed): the
  // queries (key dtype, mapped in the kernel) split into `chunks` contiguous chunks and grouped by send bucket
  // (chunk-major, owner-minor; owner = searchsorted(splitters, key, right=True), splitters ascending ordered
  // keys), as (ordered keys, each one's position in `queries`, counts [chunks, splitters + 1]). Stable on the
  // CPU; on CUDA the order within a bucket may differ from call to call (at most 2048 buckets). skip >= 0: the
  // queries that owner holds are left out (their counts 0; keys and positions: the others, at the front; the
  // rest zeros on the CPU, unspecified on CUDA).
  m.def("partition_queries(Tensor queries, int key_type, Tensor splitters, int chunks, int skip=-1) -> (Tensor keys, Tensor positions, Tensor counts)");
  // Point queries of a sharded index's fixed-capacity exchange (one chunk), grouped by owner into padded
  // blocks, each behind the exchange's header, so that the block goes out as it is: (block [owners, 3 +
  // capacity]: row d is (queries to owner d, also those past the capacity; this rank's overflow flag, 1 if any
  // owner got more than `capacity`, the same in every row; status 0; then owner d's queries as ordered keys,
  // zeros past its count), slots [n]: where query i's key lies in the flattened block (so also its answer's
  // row when the block is answered entry by entry), -1 where its owner's block was full). Which queries of an
  // overfull owner fill its block: the first in query order on the CPU, any on CUDA.
  m.def("partition_padded(Tensor queries, int key_type, Tensor splitters, int capacity) -> (Tensor block, Tensor slots)");
  // The answers [m, 2] of the slots back in the caller's order: output j of query i is answers[slots[i], j], or
  // fill_j where slots[i] is -1 (partition_padded's dropped queries); and whether any row of `received` (the
  // query exchange's received blocks, [owners, 3 + capacity]) has its overflow flag set (0-d bool), read in
  // the same launch rather than a reduction kernel of its own.
  m.def("gather_answers(Tensor answers, Tensor slots, int fill_first, int fill_second, Tensor received) -> (Tensor, Tensor, Tensor overflowed)");
  // Local answers as the [n, 2] int64 rows of the return exchange; `a` (local row IDs, -1 none) goes through
  // local_to_global unless that is empty; `b` is int64 or int32 (a lookup's counts, widened here).
  m.def("pack_answers(Tensor a, Tensor b, Tensor local_to_global) -> Tensor");
  // Answer rows [m, 2] into existing int64 columns of length n: column j of row i written at positions[i] of
  // `first` / `second`; the other entries keep their values. Positions must be distinct (not checked: which
  // row lands is undefined otherwise) and in 0 .. n - 1 (the CPU kernel raises after writing the others; CUDA
  // drops those rows).
  m.def("scatter_answers_into(Tensor answers, Tensor positions, Tensor(a!) first, Tensor(b!) second) -> ()");
  // A chunk's local row IDs as global ones in one pass (global_row, csrc/distributed/partition.h): -1 stays,
  // others through local_to_global (int32: unsigned offsets; empty: the row is its own offset) plus base.
  m.def("global_rows(Tensor local, Tensor local_to_global, int base) -> Tensor");
  // Point lookups of many queues, each in its own cgRX index (an out-of-core index's chunks), in one call:
  // queue j is queries[starts[j] : starts[j] + sizes[j]] in (pairs[j], reps[j], tables[j]) under one `config`,
  // whose pairs hold row offsets from bases[j]. Returns (first global row or -1, count) per query, the queues'
  // answers concatenated in queue order. The radix table answers for the OptiX backend (no scenes here).
  // window > 0 (CUDA): at most about that many queries in flight, swept in queue order, so that the lookups at
  // any moment touch a few queues' indexes (chunks read in place over PCIe: the GPU's address translation of
  // host memory covers a few hundred MB at full speed); 0: the whole GPU. The CPU ignores it.
  m.def("cgrx_lookup_queues(Tensor[] pairs, Tensor[] reps, Tensor[] tables, int config, Tensor queries, int[] starts, "
        "int[] sizes, int[] bases, int window=0) -> (Tensor first_row, Tensor count)");
  // Where the JIT build left the OptiX programs, and the configuration schema _config.py checks.
  m.def("set_program_path(str name, str path) -> ()", &set_program_path);
  // OptiX's disk cache of compiled modules and pipelines: where new device contexts keep it, and where a
  // device's context does ("" where it is off).
  m.def("set_optix_disk_cache(str path) -> ()", &set_optix_disk_cache);
  m.def("optix_disk_cache(int device) -> str", &optix_disk_cache);
  // The persisting-L2 set-aside of a CUDA device (bytes granted); radix lookups keep their table there.
  m.def("reserve_l2(int device, int bytes) -> int", &reserve_l2);
  m.def("config_schema() -> str", &config_schema);
}
