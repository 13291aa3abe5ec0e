// Device-side OptiX intrinsics for torch_rtindex's ray-tracing programs.
//
// Why this file exists: OptiX programs (raygen, closest-hit, any-hit, ...) talk
// to the OptiX runtime by calling a fixed set of external PTX functions named
// `_optix_*`. OptiX recognises those calls when it compiles the module
// (from OptiX-IR or PTX) and replaces them with the real implementation. The
// SDK's device headers are thin inline-asm wrappers around these calls; as the
// project may not ship the SDK headers, this file provides its own wrappers
// for the calls the project needs, keeping the SDK's function names.
//
// Target: ABI revision 87 (OptiX 8.0), compiled with
//   nvcc --optix-ir -arch=sm_90 -std=c++17   (or -ptx)
// The emitted calls were checked to match, operand for operand, what the
// OptiX 8.0 SDK's own wrappers emit for the same program.
//
// Conventions kept from the SDK's wrappers, because the OptiX compiler relies
// on them:
//  * reads of per-ray/per-hit state use plain `asm` (pure; may be merged),
//  * payload reads/writes and control-flow calls (trace, report/ignore
//    intersection, terminate) use `asm volatile` so they are neither merged
//    nor reordered.
//
// Usage in a program file:
//   #include "optix_device_abi.h"
//   using namespace rtindex::optix_abi;
//   extern "C" __global__ void __raygen__main() { ... optixTrace(...); }

#pragma once

#if !defined(__CUDACC__)
#error "optix_device_abi.h is for OptiX device code compiled by nvcc"
#endif

#include <cuda_runtime.h>  // float2/float3/uint3 and make_* helpers

#include <type_traits>

#include "optix_abi_types.h"  // OptixTraversableHandle, OptixRayFlags, OptixHitKind, ...

namespace rtindex::optix_abi {

// Visibility mask that matches every instance (the mask is 8 bits wide).
constexpr OptixVisibilityMask kVisibilityAll = 0xFFu;

// --------------------------------------------------------------------------
// Tracing
// --------------------------------------------------------------------------

namespace detail {

// _optix_trace_typed_32 has a fixed signature: 32 payload registers in and
// 32 out, plus a count saying how many of them are live. Unused slots are
// passed as 0 and their outputs discarded. Operand order:
//   outputs  %0..%31   payload values after the trace
//   inputs   %32       payload type id
//            %33       traversable handle (64-bit)
//            %34..%39  ray origin xyz, direction xyz
//            %40..%42  tmin, tmax, ray time
//            %43..%47  visibility mask, ray flags, SBT offset, SBT stride,
//                      miss SBT index
//            %48       number of live payload registers
//            %49..%80  payload values before the trace
static __forceinline__ __device__ void trace_typed_32(
    OptixPayloadTypeID type, OptixTraversableHandle handle, float3 origin,
    float3 direction, float tmin, float tmax, float rayTime,
    OptixVisibilityMask visibilityMask, unsigned int rayFlags,
    unsigned int sbtOffset, unsigned int sbtStride, unsigned int missSbtIndex,
    int payloadCount, unsigned int (&p)[32]) {
// Eight consecutive payload registers as asm outputs / inputs.
#define RTINDEX_PAYLOAD_OUT8(i)                                        \
  "=r"(p[i]), "=r"(p[i + 1]), "=r"(p[i + 2]), "=r"(p[i + 3]),          \
      "=r"(p[i + 4]), "=r"(p[i + 5]), "=r"(p[i + 6]), "=r"(p[i + 7])
#define RTINDEX_PAYLOAD_IN8(i)                                         \
  "r"(p[i]), "r"(p[i + 1]), "r"(p[i + 2]), "r"(p[i + 3]), "r"(p[i + 4]), \
      "r"(p[i + 5]), "r"(p[i + 6]), "r"(p[i + 7])
  asm volatile(
      "call"
      "(%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31),"
      "_optix_trace_typed_32,"
      "(%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,"
      "%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,"
      "%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80);"
      : RTINDEX_PAYLOAD_OUT8(0), RTINDEX_PAYLOAD_OUT8(8),
        RTINDEX_PAYLOAD_OUT8(16), RTINDEX_PAYLOAD_OUT8(24)
      : "r"(type), "l"(handle),
        "f"(origin.x), "f"(origin.y), "f"(origin.z),
        "f"(direction.x), "f"(direction.y), "f"(direction.z),
        "f"(tmin), "f"(tmax), "f"(rayTime),
        "r"(visibilityMask), "r"(rayFlags), "r"(sbtOffset), "r"(sbtStride),
        "r"(missSbtIndex), "r"(payloadCount),
        RTINDEX_PAYLOAD_IN8(0), RTINDEX_PAYLOAD_IN8(8),
        RTINDEX_PAYLOAD_IN8(16), RTINDEX_PAYLOAD_IN8(24)
      :);
#undef RTINDEX_PAYLOAD_OUT8
#undef RTINDEX_PAYLOAD_IN8
}

}  // namespace detail

// Trace a ray with the default payload type (the pipeline's
// numPayloadValues). Each payload argument is an `unsigned int` lvalue that
// is sent with the ray and updated with the value the hit/miss programs left
// in that slot. Call as optixTrace(handle, o, d, tmin, tmax, 0.0f,
// kVisibilityAll, OPTIX_RAY_FLAG_NONE, 0, 1, 0, p0, p1).
template <typename... Payload>
static __forceinline__ __device__ void optixTrace(
    OptixTraversableHandle handle, float3 rayOrigin, float3 rayDirection,
    float tmin, float tmax, float rayTime, OptixVisibilityMask visibilityMask,
    unsigned int rayFlags, unsigned int SBToffset, unsigned int SBTstride,
    unsigned int missSBTIndex, Payload&... payload) {
  static_assert(sizeof...(Payload) <= 32, "OptiX allows at most 32 payload values");
  static_assert((std::is_same<Payload, unsigned int>::value && ...),
                "payload values must be unsigned int lvalues");
  unsigned int p[32] = {payload...};  // unused slots are zero
  detail::trace_typed_32(OPTIX_PAYLOAD_TYPE_DEFAULT, handle, rayOrigin,
                         rayDirection, tmin, tmax, rayTime, visibilityMask,
                         rayFlags, SBToffset, SBTstride, missSBTIndex,
                         static_cast<int>(sizeof...(Payload)), p);
  unsigned int slot = 0;
  ((payload = p[slot++]), ...);
  (void)slot;
}

// --------------------------------------------------------------------------
// Payload access (closest-hit, any-hit, miss, intersection)
// --------------------------------------------------------------------------

namespace detail {

static __forceinline__ __device__ unsigned int get_payload(unsigned int slot) {
  unsigned int value;
  asm volatile("call (%0), _optix_get_payload, (%1);" : "=r"(value) : "r"(slot) :);
  return value;
}

static __forceinline__ __device__ void set_payload(unsigned int slot, unsigned int value) {
  asm volatile("call _optix_set_payload, (%0, %1);" : : "r"(slot), "r"(value) :);
}

}  // namespace detail

// The slot index must be a compile-time constant for OptiX, hence one
// function per slot as in the SDK.
static __forceinline__ __device__ unsigned int optixGetPayload_0() { return detail::get_payload(0); }
static __forceinline__ __device__ unsigned int optixGetPayload_1() { return detail::get_payload(1); }
static __forceinline__ __device__ unsigned int optixGetPayload_2() { return detail::get_payload(2); }
static __forceinline__ __device__ unsigned int optixGetPayload_3() { return detail::get_payload(3); }

static __forceinline__ __device__ void optixSetPayload_0(unsigned int v) { detail::set_payload(0, v); }
static __forceinline__ __device__ void optixSetPayload_1(unsigned int v) { detail::set_payload(1, v); }
static __forceinline__ __device__ void optixSetPayload_2(unsigned int v) { detail::set_payload(2, v); }
static __forceinline__ __device__ void optixSetPayload_3(unsigned int v) { detail::set_payload(3, v); }

// --------------------------------------------------------------------------
// Launch geometry (any program)
// --------------------------------------------------------------------------

static __forceinline__ __device__ uint3 optixGetLaunchIndex() {
  unsigned int x, y, z;
  asm("call (%0), _optix_get_launch_index_x, ();" : "=r"(x) :);
  asm("call (%0), _optix_get_launch_index_y, ();" : "=r"(y) :);
  asm("call (%0), _optix_get_launch_index_z, ();" : "=r"(z) :);
  return make_uint3(x, y, z);
}

static __forceinline__ __device__ uint3 optixGetLaunchDimensions() {
  unsigned int x, y, z;
  asm("call (%0), _optix_get_launch_dimension_x, ();" : "=r"(x) :);
  asm("call (%0), _optix_get_launch_dimension_y, ();" : "=r"(y) :);
  asm("call (%0), _optix_get_launch_dimension_z, ();" : "=r"(z) :);
  return make_uint3(x, y, z);
}

// Device address of the data that follows the header in the current
// program's SBT record.
static __forceinline__ __device__ CUdeviceptr optixGetSbtDataPointer() {
  unsigned long long ptr;
  asm("call (%0), _optix_get_sbt_data_ptr_64, ();" : "=l"(ptr) :);
  return static_cast<CUdeviceptr>(ptr);
}

// --------------------------------------------------------------------------
// Current ray (intersection, any-hit, closest-hit, miss)
// --------------------------------------------------------------------------

static __forceinline__ __device__ float optixGetRayTmin() {
  float t;
  asm("call (%0), _optix_get_ray_tmin, ();" : "=f"(t) :);
  return t;
}

// In any-hit/closest-hit: distance of the current hit; in miss: the tmax
// passed to optixTrace.
static __forceinline__ __device__ float optixGetRayTmax() {
  float t;
  asm("call (%0), _optix_get_ray_tmax, ();" : "=f"(t) :);
  return t;
}

static __forceinline__ __device__ float3 optixGetWorldRayOrigin() {
  float x, y, z;
  asm("call (%0), _optix_get_world_ray_origin_x, ();" : "=f"(x) :);
  asm("call (%0), _optix_get_world_ray_origin_y, ();" : "=f"(y) :);
  asm("call (%0), _optix_get_world_ray_origin_z, ();" : "=f"(z) :);
  return make_float3(x, y, z);
}

static __forceinline__ __device__ float3 optixGetWorldRayDirection() {
  float x, y, z;
  asm("call (%0), _optix_get_world_ray_direction_x, ();" : "=f"(x) :);
  asm("call (%0), _optix_get_world_ray_direction_y, ();" : "=f"(y) :);
  asm("call (%0), _optix_get_world_ray_direction_z, ();" : "=f"(z) :);
  return make_float3(x, y, z);
}

// Object-space ray; only meaningful in intersection / any-hit / closest-hit.
static __forceinline__ __device__ float3 optixGetObjectRayOrigin() {
  float x, y, z;
  asm("call (%0), _optix_get_object_ray_origin_x, ();" : "=f"(x) :);
  asm("call (%0), _optix_get_object_ray_origin_y, ();" : "=f"(y) :);
  asm("call (%0), _optix_get_object_ray_origin_z, ();" : "=f"(z) :);
  return make_float3(x, y, z);
}

static __forceinline__ __device__ float3 optixGetObjectRayDirection() {
  float x, y, z;
  asm("call (%0), _optix_get_object_ray_direction_x, ();" : "=f"(x) :);
  asm("call (%0), _optix_get_object_ray_direction_y, ();" : "=f"(y) :);
  asm("call (%0), _optix_get_object_ray_direction_z, ();" : "=f"(z) :);
  return make_float3(x, y, z);
}

// --------------------------------------------------------------------------
// Current hit (intersection, any-hit, closest-hit)
// --------------------------------------------------------------------------

// Index of the primitive within its build input, plus primitiveIndexOffset.
static __forceinline__ __device__ unsigned int optixGetPrimitiveIndex() {
  unsigned int index;
  asm("call (%0), _optix_read_primitive_idx, ();" : "=r"(index) :);
  return index;
}

// For built-in triangles one of OptixHitKind; for custom primitives the
// value (0..127) passed to optixReportIntersection.
static __forceinline__ __device__ unsigned int optixGetHitKind() {
  unsigned int kind;
  asm("call (%0), _optix_get_hit_kind, ();" : "=r"(kind) :);
  return kind;
}

// Back-face test valid for every primitive type (OptiX decodes the kind).
static __forceinline__ __device__ bool optixIsBackFaceHit(unsigned int hitKind) {
  unsigned int backface;
  asm("call (%0), _optix_get_backface_from_hit_kind, (%1);" : "=r"(backface) : "r"(hitKind));
  return backface == 1u;
}

static __forceinline__ __device__ bool optixIsFrontFaceHit(unsigned int hitKind) {
  return !optixIsBackFaceHit(hitKind);
}

static __forceinline__ __device__ bool optixIsBackFaceHit() { return optixIsBackFaceHit(optixGetHitKind()); }
static __forceinline__ __device__ bool optixIsFrontFaceHit() { return optixIsFrontFaceHit(optixGetHitKind()); }

// Built-in triangle hits are recognised by their fixed hit-kind values.
static __forceinline__ __device__ bool optixIsTriangleFrontFaceHit() {
  return optixGetHitKind() == OPTIX_HIT_KIND_TRIANGLE_FRONT_FACE;
}

static __forceinline__ __device__ bool optixIsTriangleBackFaceHit() {
  return optixGetHitKind() == OPTIX_HIT_KIND_TRIANGLE_BACK_FACE;
}

static __forceinline__ __device__ bool optixIsTriangleHit() {
  return optixIsTriangleFrontFaceHit() || optixIsTriangleBackFaceHit();
}

// Attribute registers written by optixReportIntersection (custom primitives);
// the SDK offers 0..7, the project needs at most two.
static __forceinline__ __device__ unsigned int optixGetAttribute_0() {
  unsigned int a;
  asm("call (%0), _optix_get_attribute_0, ();" : "=r"(a) :);
  return a;
}

static __forceinline__ __device__ unsigned int optixGetAttribute_1() {
  unsigned int a;
  asm("call (%0), _optix_get_attribute_1, ();" : "=r"(a) :);
  return a;
}

// --------------------------------------------------------------------------
// Control flow
// --------------------------------------------------------------------------

// Intersection program: report a candidate hit at distance hitT with a
// user hit kind (0..127) and 0, 1 or 2 attribute registers. Returns true if
// the hit was accepted (i.e. not ignored by an any-hit program).
static __forceinline__ __device__ bool optixReportIntersection(float hitT, unsigned int hitKind) {
  int accepted;
  asm volatile("call (%0), _optix_report_intersection_0, (%1, %2);"
               : "=r"(accepted)
               : "f"(hitT), "r"(hitKind)
               :);
  return accepted;
}

static __forceinline__ __device__ bool optixReportIntersection(float hitT, unsigned int hitKind,
                                                               unsigned int a0) {
  int accepted;
  asm volatile("call (%0), _optix_report_intersection_1, (%1, %2, %3);"
               : "=r"(accepted)
               : "f"(hitT), "r"(hitKind), "r"(a0)
               :);
  return accepted;
}

static __forceinline__ __device__ bool optixReportIntersection(float hitT, unsigned int hitKind,
                                                               unsigned int a0, unsigned int a1) {
  int accepted;
  asm volatile("call (%0), _optix_report_intersection_2, (%1, %2, %3, %4);"
               : "=r"(accepted)
               : "f"(hitT), "r"(hitKind), "r"(a0), "r"(a1)
               :);
  return accepted;
}

// Any-hit program: discard the current candidate and continue traversal.
// Does not return.
static __forceinline__ __device__ void optixIgnoreIntersection() {
  asm volatile("call _optix_ignore_intersection, ();");
}

// Any-hit program: accept the current candidate and stop traversal (the
// closest-hit program then runs unless disabled). Does not return.
static __forceinline__ __device__ void optixTerminateRay() {
  asm volatile("call _optix_terminate_ray, ();");
}

}  // namespace rtindex::optix_abi
