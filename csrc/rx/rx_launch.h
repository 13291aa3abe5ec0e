// What the host hands the RX OptiX programs for one launch, and the header in front of a CUDA RX structure.
// Shared by rx_cuda.cu (host) and rx_programs.cu (device), so both agree on the layout by construction.
#pragma once

#include <cstdint>

#include "../core/scene.h"
#include "../optix/gas_header.h"

namespace rtindex {

// What each lookup thread produces.
enum class RxMode : uint32_t {
  First = 0,      // first_row + count
  Count = 1,      // count only (pass 1 of a CSR result)
  Fill = 2,       // rows[offsets[q] + i] (pass 2 of a CSR result)
  Aggregate = 3,  // count + sum of values[row]
};

enum class ValueKind : uint32_t { Int64 = 0, Int32 = 1, Float32 = 2, Float64 = 3 };

struct RxLaunchParams {
  uint64_t handle;  // filled on the device from the structure header (no host sync)
  const GasHeader* header;
  const uint64_t* keys;  // ordered keys by row ID, for ranges too wide to trace row by row
  uint64_t num_keys;
  const uint64_t* lo;  // ordered query keys, or range lower bounds
  const uint64_t* hi;  // nullptr for point lookups
  uint64_t query_base; // launch index i answers query query_base + i
  SceneConfig scene;
  uint32_t mode;
  uint32_t unique_keys;
  uint64_t max_range_rays;
  int64_t* first_row;
  int64_t* count;
  const int64_t* offsets;
  int64_t* rows;
  const void* values;
  uint32_t value_kind;
  void* sums;
};

}  // namespace rtindex
