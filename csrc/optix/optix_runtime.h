// The package's OptiX runtime: the driver's libnvoptix.so.1 loaded through our own ABI declarations, one
// device context per CUDA device (created lazily, shared by every index), and pipelines compiled once per
// process and device. Index code asks for a pipeline by program-set name and launches it on a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "optix_abi.h"

namespace rtindex::optix {

namespace abi = ::rtindex::optix_abi;

// The function table of the driver's OptiX; raises a clear error (what is missing, how to get it) when the
// library or a suitable ABI is not there.
const abi::OptixFunctionTable& api();

// Raises with the OptiX error's name when r is not OPTIX_SUCCESS.
void check(abi::OptixResult r, const char* what);

abi::OptixDeviceContext device_context(int device);

// [abi, rtcore_version, max_primitives_per_gas, max_sbt_records_per_gas, max_trace_depth]
std::vector<int64_t> device_info(int device);

// What a pipeline is made of: programs in one OptiX-IR module, registered by the index that uses them.
struct ProgramSet {
  const char* name;         // also the key for set_program_path
  const char* raygen;       // entry function names
  const char* miss;
  const char* closest_hit;  // may be nullptr
  const char* any_hit;      // may be nullptr
  unsigned num_payload_values;
};

struct Pipeline {
  abi::OptixPipeline pipeline = nullptr;
  abi::OptixShaderBindingTable sbt{};
};

// Where the build put the compiled OptiX-IR of a program set (torch_rtindex/_extension.py calls this).
void set_program_path(const std::string& name, const std::string& path);

// Where OptiX keeps its disk cache of compiled modules and pipelines (torch_rtindex/_extension.py passes a
// folder of the package's build cache); applies to device contexts created afterwards. Empty: OptiX's default.
void set_disk_cache(const std::string& path);

// The disk cache a device's context uses: its folder, or "" where the cache is off.
std::string disk_cache(int device);

// The pipeline of a program set on a device, compiled on first use.
const Pipeline& pipeline(int device, const ProgramSet& programs);

// optixLaunch of a 1-D grid on `stream`; `params` is a device pointer to the launch parameters.
void launch(const Pipeline& p, cudaStream_t stream, const void* params, size_t params_size, unsigned width);

}  // namespace rtindex::optix
