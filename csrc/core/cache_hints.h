// Cache priorities for lookups. The queries and the answers stream through once: evict-first in L1 and L2
// (ld.global.cs / st.global.cs). The small search structure every lookup reads (the radix table and its
// units' words) is read evict-last in L2, so that a batch of random bucket reads does not push it
// out (ncu on an H100 without hints: most of its reads missed L2). The bucket's pairs keep the default: a
// binary search reads the same line several times (evict-first there doubled the device-memory bytes).
#pragma once

#include "keys.h"

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

// Read-only loads kept in L2 with evict-last priority.
RTX_HD uint32_t load_resident(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
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
#if defined(__CUDA_ARCH__)
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

}  // namespace rtindex
