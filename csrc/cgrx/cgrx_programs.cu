// cgRX OptiX programs: one thread per query. The bucket of the first representative >= key is found with
// at most three closest-hit rays (same row, next row's marker, next plane's marker: csrc/core/scene.h,
// cgrx_rays); a marker sits in the slot of its row's/plane's first bucket, which is then the answer, so the
// paper's final ray along the found row is not needed. The rest is the shared answer_query.
#include "../optix/optix_device_abi.h"
#include "cgrx_launch.h"

using namespace rtindex;
using namespace rtindex::cgrx;
using namespace rtindex::optix_abi;

extern "C" {
__constant__ LaunchParams params;
}

namespace {

constexpr unsigned kMiss = 0xFFFFFFFFu;

__device__ __forceinline__ unsigned closest(const Ray& r) {
  unsigned prim = kMiss;
  optixTrace(params.handle, make_float3(r.origin.x, r.origin.y, r.origin.z),
             make_float3(r.direction.x, r.direction.y, r.direction.z), r.tmin, r.tmax, 0.0f, kVisibilityAll,
             OPTIX_RAY_FLAG_DISABLE_ANYHIT, 0, 1, 0, prim);
  return prim;
}

__device__ __forceinline__ uint64_t find_bucket_by_rays(uint64_t k) {
  const CgrxRays rays = cgrx_rays(k, params.scene);
  unsigned prim = closest(rays.same_row);
  if (prim == kMiss && params.shape.multi_row && rays.has_next_row) prim = closest(rays.next_row);
  if (prim == kMiss && params.shape.multi_plane && rays.has_next_plane) prim = closest(rays.next_plane);
  return prim == kMiss ? kNoBucket : params.shape.bucket_of_primitive(prim);
}

}  // namespace

extern "C" __global__ void __raygen__cgrx() {
  const uint64_t q = params.query_base + optixGetLaunchIndex().x;
  answer_query(params, q, [](uint64_t k) { return find_bucket_by_rays(k); });
}

extern "C" __global__ void __closesthit__cgrx() { optixSetPayload_0(optixGetPrimitiveIndex()); }

extern "C" __global__ void __miss__cgrx() {}
