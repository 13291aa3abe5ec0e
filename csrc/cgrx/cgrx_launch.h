// What a cgRX lookup launch (CUDA kernel or OptiX program) receives. Shared by host and device code.
#pragma once

#include "../core/queries.h"
#include "../core/results_device.h"
#include "../core/scene.h"
#include "../optix/gas_header.h"
#include "cgrx_answer.h"
#include "cgrx_core.h"
#include "cgrx_scene.h"

namespace rtindex::cgrx {

struct LaunchParams {
  uint64_t handle;          // OptiX backend: filled on the device from the GAS header
  const GasHeader* header;  // OptiX backend only
  SceneShape shape;         // OptiX backend: filled on the device from the representatives and the GAS
  Storage storage;
  const uint64_t* reps;
  uint64_t num_reps;
  const int32_t* table;  // radix table over the representatives
  uint32_t backend;  // Backend
  SceneConfig scene;
  QueryKeys queries;  // mapped to ordered keys where they are read
  uint64_t query_base;
  uint64_t num_queries;
  ResultParams results;
};

#if defined(__CUDACC__)
// One query, start to finish; `find` maps a key to the bucket of the first representative >= key, or is
// RadixSearch (visit_matches).
template <typename Find, typename Range>
__device__ __forceinline__ void answer_query(const LaunchParams& p, uint64_t q, Find&& find, Range&& range) {
  uint64_t lo, hi;
  range(q, lo, hi);
  HitState s;
  visit_matches(p.storage, p.reps, p.num_reps, p.table, lo, hi, find, [&](uint32_t row) { record_hit(p.results, s, row, q); });
  write_result(p.results, s, q);
}

// With the queries' key type read at run time (the OptiX programs, where a ray costs far more).
template <typename Find>
__device__ __forceinline__ void answer_query(const LaunchParams& p, uint64_t q, Find&& find) {
  answer_query(p, q, find, [&](uint64_t i, uint64_t& lo, uint64_t& hi) { p.queries.range(i, lo, hi); });
}
#endif

}  // namespace rtindex::cgrx
