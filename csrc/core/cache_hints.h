// Cache priorities for lookups. The queries and the answers stream through once: evict-first in L1 and L2
// (ld.global.cs / st.global.cs). The small search structure every lookup reads (the radix table and its
// units' words) is read evict-last in L2, so that a batch of random reads of the pairs does not push it out
// (without hints most of its reads missed L2). The pairs keep the default: evict-first there, in L1 and L2
// (ld.global.cs) or in L2 alone (createpolicy evict_first), made the lookups slower and read more device
// memory, and so did reading the line found by the radix table whole, at once, evict-first in L2 (the
// measurements: benchmarks/results/README.md).
//
// OptiX programs get plain loads: OptiX's compiler rejects these PTX forms (an internal assertion at module
// creation), and a ray costs far more than the bytes there. They are compiled with RTINDEX_OPTIX_PROGRAMS.
#pragma once

#include "keys.h"

#if defined(__CUDA_ARCH__) && !defined(RTINDEX_OPTIX_PROGRAMS)
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

// Read-only loads kept in L2 with evict-last priority (through the read-only path: never written meanwhile).
RTX_HD uint32_t load_resident(const uint32_t* p) {
#if defined(RTINDEX_CACHE_HINTS)
  uint32_t v;
  asm("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_last.b64 policy, 1.0;\n\t"
      "ld.global.nc.L2::cache_hint.u32 %0, [%1], policy;\n\t}"
      : "=r"(v)
      : "l"(p));
  return v;
#else
  return *p;
#endif
}

// Bytes load into a 32-bit register (PTX has no 8-bit registers).
RTX_HD uint8_t load_resident(const uint8_t* p) {
#if defined(RTINDEX_CACHE_HINTS)
  uint32_t v;
  asm("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_last.b64 policy, 1.0;\n\t"
      "ld.global.nc.L2::cache_hint.u8 %0, [%1], policy;\n\t}"
      : "=r"(v)
      : "l"(p));
  return static_cast<uint8_t>(v);
#else
  return *p;
#endif
}

// 16 bytes from a 16-byte aligned address, kept like load_resident.
struct Quad {
  uint32_t word[4];
};

RTX_HD Quad load_resident_quad(const uint32_t* p) {
  Quad q;
#if defined(RTINDEX_CACHE_HINTS)
  asm("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_last.b64 policy, 1.0;\n\t"
      "ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], policy;\n\t}"
      : "=r"(q.word[0]), "=r"(q.word[1]), "=r"(q.word[2]), "=r"(q.word[3])
      : "l"(p));
#else
  memcpy(&q, p, sizeof(q));
#endif
  return q;
}

}  // namespace rtindex
