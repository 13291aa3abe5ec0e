// RX OptiX programs: one thread per query. Point lookups fire the perpendicular ray of csrc/core/scene.h;
// range lookups fire one ray per row segment (or scan the keys when a range spans more rows than
// max_range_rays). Every hit goes through record_hit, whatever program sees it.
#include "../optix/optix_device_abi.h"
#include "rx_launch.h"

using namespace rtindex;
using namespace rtindex::optix_abi;

extern "C" {
__constant__ RxLaunchParams params;
}

namespace {

// Per-query state (csrc/core/results_device.h) travels in the ray payload: p0 = matches so far,
// p1 = smallest row ID, p2/p3 = sum bits.
__device__ __forceinline__ HitState load_payload() {
  HitState s;
  s.count = optixGetPayload_0();
  s.first = optixGetPayload_1();
  s.sum_lo = optixGetPayload_2();
  s.sum_hi = optixGetPayload_3();
  return s;
}

__device__ __forceinline__ void store_payload(const HitState& s) {
  optixSetPayload_0(s.count);
  optixSetPayload_1(s.first);
  optixSetPayload_2(s.sum_lo);
  optixSetPayload_3(s.sum_hi);
}

__device__ __forceinline__ void trace(const Ray& r, unsigned flags, HitState& s) {
  optixTrace(params.handle, make_float3(r.origin.x, r.origin.y, r.origin.z),
             make_float3(r.direction.x, r.direction.y, r.direction.z), r.tmin, r.tmax, 0.0f, kVisibilityAll,
             flags, 0, 1, 0, s.count, s.first, s.sum_lo, s.sum_hi);
}

// Duplicates share one place in the scene, so every lookup that may meet several triangles collects them
// in the any-hit program; a point lookup on unique keys stops at its one hit instead.
constexpr unsigned kCollectAll = OPTIX_RAY_FLAG_DISABLE_CLOSESTHIT;
constexpr unsigned kFirstHitOnly = OPTIX_RAY_FLAG_DISABLE_ANYHIT | OPTIX_RAY_FLAG_TERMINATE_ON_FIRST_HIT;

}  // namespace

extern "C" __global__ void __raygen__rx() {
  const unsigned long long q = params.query_base + optixGetLaunchIndex().x;
  HitState s;
  uint64_t lo, hi;
  params.queries.range(q, lo, hi);
  if (params.queries.hi == nullptr) {
    trace(point_ray(lo, params.scene), params.unique_keys ? kFirstHitOnly : kCollectAll, s);
  } else {
    const uint64_t segments = range_segment_count(lo, hi, params.scene);
    if (segments > params.max_range_rays) {
      for (uint64_t i = 0; i < params.num_keys; ++i) {
        const uint64_t k = params.keys[i];
        if (lo <= k && k <= hi) record_hit(params.results, s, static_cast<unsigned>(i), q);
      }
    } else {
      for (uint64_t i = 0; i < segments; ++i) trace(segment_ray(range_segment(lo, hi, i, params.scene), params.scene), kCollectAll, s);
    }
  }
  write_result(params.results, s, q);
}

extern "C" __global__ void __closesthit__rx() {
  HitState s = load_payload();
  record_hit(params.results, s, optixGetPrimitiveIndex(), params.query_base + optixGetLaunchIndex().x);
  store_payload(s);
}

extern "C" __global__ void __anyhit__rx() {
  HitState s = load_payload();
  record_hit(params.results, s, optixGetPrimitiveIndex(), params.query_base + optixGetLaunchIndex().x);
  store_payload(s);
  optixIgnoreIntersection();
}

extern "C" __global__ void __miss__rx() {}
