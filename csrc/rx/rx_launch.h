// What the host hands the RX OptiX programs for one launch, and the header in front of a CUDA RX structure.
// Shared by rx_cuda.cu (host) and rx_programs.cu (device), so both agree on the layout by construction.
#pragma once

#include <cstdint>

#include "../core/queries.h"
#include "../core/scene.h"
#include "../core/results_device.h"
#include "../optix/gas_header.h"

namespace rtindex {

struct RxLaunchParams {
  uint64_t handle;  // filled on the device from the structure header (no host sync)
  const GasHeader* header;
  const uint64_t* keys;  // ordered keys by row ID, for ranges too wide to trace row by row
  uint64_t num_keys;
  QueryKeys queries;   // mapped to ordered keys where they are read
  uint64_t query_base; // launch index i answers query query_base + i
  SceneConfig scene;
  uint32_t unique_keys;
  uint64_t max_range_rays;
  ResultParams results;
};

}  // namespace rtindex
