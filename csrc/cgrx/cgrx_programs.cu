// cgRX OptiX programs: one thread per query. The bucket of the first representative >= key is found with the
// closest-hit ray search of cgrx_scene.h (ray_search_step: the same code the CPU operator cgrx_scene_rays runs
// for the Embree test), in whichever representation the GAS holds: naive (at most three rays; a marker sits in
// the slot of its row's/plane's first bucket) or optimized (markers at the rows' and planes' ends, flipped
// triangles seen as back faces; at most five rays: one where the key's row holds a representative, two or
// three on sparse 64-bit keys). The representation is read from the GAS header's triangle count
// (representation_of_scene). The rest is the shared answer_query.
#include "../optix/optix_device_abi.h"
#include "cgrx_launch.h"

using namespace rtindex;
using namespace rtindex::cgrx;
using namespace rtindex::optix_abi;

extern "C" {
__constant__ LaunchParams params;
}

namespace {

// Payload 0: the primitive index of the closest hit (kRayMiss where the ray meets nothing); payload 1: 1 when
// that hit was a triangle's back face. The pipeline is created with 2 payload values (kCgrxPrograms).
__device__ __forceinline__ RayHit closest(const Ray& r) {
  unsigned prim = kRayMiss, back_face = 0;
  optixTrace(params.handle, make_float3(r.origin.x, r.origin.y, r.origin.z),
             make_float3(r.direction.x, r.direction.y, r.direction.z), r.tmin, r.tmax, 0.0f, kVisibilityAll,
             OPTIX_RAY_FLAG_DISABLE_ANYHIT, 0, 1, 0, prim, back_face);
  return RayHit{prim, back_face};
}

__device__ __forceinline__ uint64_t find_bucket_by_rays(const SceneView& view, uint64_t k) {
  RaySearch s = ray_search_start(k);
  RayHit hit{kRayMiss, 0};
  Ray ray;
  while (ray_search_step(view, s, hit, ray)) hit = closest(ray);
  return s.bucket;
}

}  // namespace

extern "C" __global__ void __raygen__cgrx() {
  const uint64_t q = params.query_base + optixGetLaunchIndex().x;
  answer_query(params, q, [](uint64_t k) { return find_bucket_by_rays(SceneView{params.reps, params.shape, params.scene}, k); });
}

extern "C" __global__ void __closesthit__cgrx() {
  optixSetPayload_0(optixGetPrimitiveIndex());
  optixSetPayload_1(optixIsTriangleBackFaceHit() ? 1u : 0u);
}

extern "C" __global__ void __miss__cgrx() {}
