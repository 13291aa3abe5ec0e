// Cache priorities for lookups. The queries and the answers stream through once: evict-first in L1 and L2
// (ld.global.cs / st.global.cs). The small search structure every lookup reads (the radix table and its
// units' words) is read evict-last in L2 (load_resident). The line of pairs a point lookup reads whole, once
// (load_streamed_quad), is read evict-first in L2 where a batch's lines outnumber what L2 holds: such a batch
// streams a line per query through L2, and those lines, not the table, should be the first to go. A smaller
// batch's lines keep the default (load_quad): the next batch may read them again from L2. (Evict-first lost
// while a bisection reread the same line, which then missed: benchmarks/results/README.md.) Reads of pairs that
// a search may repeat keep the default.
//
// The PTX forms (createpolicy, ld.global.L2::cache_hint) exist from sm_80 on; older GPUs get plain loads.
// OptiX programs get plain loads too: OptiX's compiler rejects these PTX forms (an internal assertion at module
// creation), and a ray costs far more than the bytes there. They are compiled with RTINDEX_OPTIX_PROGRAMS.
#pragma once

#include "keys.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(RTINDEX_OPTIX_PROGRAMS)
#define RTINDEX_CACHE_HINTS 1
#endif

namespace rtindex {

template <typename T>
RTX_HD T load_once(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldcs(p);
#else
  return *p;
#endif
}

template <typename T>
RTX_HD void store_once(T* p, T v) {
#if defined(__CUDA_ARCH__)
  __stcs(p, v);
#else
  *p = v;
#endif
}

#if defined(RTINDEX_CACHE_HINTS)
// L2 access policies (a 64-bit descriptor a load names). Pure asm without inputs: the compiler may reuse one.
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
#endif

// Read-only loads kept in L2 with evict-last priority (through the read-only path: never written meanwhile).
RTX_HD uint32_t load_resident(const uint32_t* p) {
#if defined(RTINDEX_CACHE_HINTS)
  uint32_t v;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(l2_evict_last()));
  return v;
#else
  return *p;
#endif
}

// Bytes load into a 32-bit register (PTX has no 8-bit registers).
RTX_HD uint8_t load_resident(const uint8_t* p) {
#if defined(RTINDEX_CACHE_HINTS)
  uint32_t v;
  asm("ld.global.nc.L2::cache_hint.u8 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(l2_evict_last()));
  return static_cast<uint8_t>(v);
#else
  return *p;
#endif
}

// 16 bytes from a 16-byte aligned address.
struct Quad {
  uint32_t word[4];
};

// 16 bytes kept like load_resident.
RTX_HD Quad load_resident_quad(const uint32_t* p) {
  Quad q;
#if defined(RTINDEX_CACHE_HINTS)
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(q.word[0]), "=r"(q.word[1]), "=r"(q.word[2]), "=r"(q.word[3])
      : "l"(p), "l"(l2_evict_last()));
#else
  memcpy(&q, p, sizeof(q));
#endif
  return q;
}

// 16 bytes with L2's default priority (read-only meanwhile).
RTX_HD Quad load_quad(const uint32_t* p) {
  Quad q;
#if defined(RTINDEX_CACHE_HINTS)
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  q.word[0] = v.x, q.word[1] = v.y, q.word[2] = v.z, q.word[3] = v.w;
#else
  memcpy(&q, p, sizeof(q));
#endif
  return q;
}

// 16 bytes read once (read-only meanwhile), evict-first in L2. L1 keeps its default: a thread that reads a line
// in several such loads finds the later ones there or in flight.
RTX_HD Quad load_streamed_quad(const uint32_t* p) {
  Quad q;
#if defined(RTINDEX_CACHE_HINTS)
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(q.word[0]), "=r"(q.word[1]), "=r"(q.word[2]), "=r"(q.word[3])
      : "l"(p), "l"(l2_evict_first()));
#else
  memcpy(&q, p, sizeof(q));
#endif
  return q;
}

}  // namespace rtindex
