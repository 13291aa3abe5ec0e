// Loads and stores of data a lookup touches once: the bucket's pairs, the queries, the answers. On the GPU they
// are cached evict-first in L1 and L2 (ld.global.cs / st.global.cs), so that a batch of random lookups does not
// push out of L2 the small search structures every lookup reads (the radix table and the representatives'
// words: measured on an H100 without hints, most of their reads missed L2 and went to device memory).
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

}  // namespace rtindex
