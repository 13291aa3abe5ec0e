// OptiX through the driver alone: dlopen libnvoptix.so.1, ask it for the ABI-87 function table, and keep one
// device context per CUDA device and one pipeline per (device, program set) for the life of the process.
#include "optix_runtime.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

namespace rtindex::optix {
namespace {

std::mutex g_mutex;  // guards every cache below; they are touched only on first use per device/program

std::string load_function_table(abi::OptixFunctionTable* table) {
  void* lib = dlopen(abi::kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return std::string("could not load ") + abi::kLibraryName + " (" + (why ? why : "unknown reason") +
           "). OptiX is part of the NVIDIA driver (R535 or newer); it is not a separate download. In a "
           "container the driver's OptiX library is mounted only when NVIDIA_DRIVER_CAPABILITIES includes "
           "'graphics' (or is 'all'); run the container with -e NVIDIA_DRIVER_CAPABILITIES=all.";
  }
  using QueryFn = abi::OptixResult (*)(int, unsigned, void*, const void**, void*, size_t);
  auto query = reinterpret_cast<QueryFn>(dlsym(lib, abi::kQueryFunctionTableSymbol));
  if (query == nullptr) {
    return std::string(abi::kLibraryName) + " does not export " + abi::kQueryFunctionTableSymbol +
           "; this driver's OptiX is too old or broken. Install NVIDIA driver R535 or newer.";
  }
  const abi::OptixResult r = query(abi::kAbiVersion, 0, nullptr, nullptr, table, sizeof(*table));
  if (r != abi::OPTIX_SUCCESS) {
    return "the driver's OptiX does not offer ABI " + std::to_string(abi::kAbiVersion) +
           " (OptiX 8.0), error " + std::to_string(static_cast<int>(r)) + " (" + abi::optix_result_name(r) +
           "). Install NVIDIA driver R535 or newer.";
  }
  return "";
}

struct PipelineKey {
  int device;
  std::string name;
  bool operator<(const PipelineKey& o) const { return std::tie(device, name) < std::tie(o.device, o.name); }
};

std::map<int, abi::OptixDeviceContext> g_contexts;
std::map<std::string, std::string> g_program_paths;
std::string g_disk_cache;
std::map<PipelineKey, Pipeline> g_pipelines;

void log_callback(unsigned level, const char* tag, const char* message, void*) {
  std::fprintf(stderr, "[OptiX %u][%s] %s\n", level, tag, message);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TORCH_CHECK(f.good(), "cannot read the compiled OptiX programs at ", path,
              "; delete the build cache (~/.cache/torch_rtindex) and import torch_rtindex again");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

#define RTX_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    cudaError_t err_ = (expr);                                                            \
    TORCH_CHECK(err_ == cudaSuccess, #expr, " failed: ", cudaGetErrorString(err_));       \
  } while (0)

// Called with g_mutex held.
Pipeline create_pipeline(int device, abi::OptixDeviceContext ctx, const ProgramSet& ps) {
  const auto& o = api();
  auto path = g_program_paths.find(ps.name);
  TORCH_CHECK(path != g_program_paths.end(), "no compiled OptiX programs registered for '", ps.name,
              "' (torch_rtindex registers a JIT build's at load, a prebuilt one's at its first OptiX index)");
  const std::string ir = read_file(path->second);

  abi::OptixModuleCompileOptions mco{};
  mco.optLevel = abi::OPTIX_COMPILE_OPTIMIZATION_DEFAULT;
  mco.debugLevel = abi::OPTIX_COMPILE_DEBUG_LEVEL_NONE;
  abi::OptixPipelineCompileOptions pco{};
  pco.usesMotionBlur = 0;
  pco.traversableGraphFlags = abi::OPTIX_TRAVERSABLE_GRAPH_FLAG_ALLOW_SINGLE_GAS;
  pco.numPayloadValues = static_cast<int>(ps.num_payload_values);
  pco.numAttributeValues = 2;  // triangle barycentrics
  pco.exceptionFlags = abi::OPTIX_EXCEPTION_FLAG_NONE;
  pco.pipelineLaunchParamsVariableName = "params";
  pco.usesPrimitiveTypeFlags = abi::OPTIX_PRIMITIVE_TYPE_FLAGS_TRIANGLE;

  char log[4096];
  size_t log_size = sizeof(log);
  abi::OptixModule module = nullptr;
  abi::OptixResult r = o.optixModuleCreate(ctx, &mco, &pco, ir.data(), ir.size(), log, &log_size, &module);
  TORCH_CHECK(r == abi::OPTIX_SUCCESS, "optixModuleCreate for '", ps.name, "' failed: ",
              abi::optix_result_name(r), "\n", log);

  abi::OptixProgramGroupDesc desc[3] = {};
  desc[0].kind = abi::OPTIX_PROGRAM_GROUP_KIND_RAYGEN;
  desc[0].raygen.module = module;
  desc[0].raygen.entryFunctionName = ps.raygen;
  desc[1].kind = abi::OPTIX_PROGRAM_GROUP_KIND_MISS;
  desc[1].miss.module = module;
  desc[1].miss.entryFunctionName = ps.miss;
  desc[2].kind = abi::OPTIX_PROGRAM_GROUP_KIND_HITGROUP;
  if (ps.closest_hit) {
    desc[2].hitgroup.moduleCH = module;
    desc[2].hitgroup.entryFunctionNameCH = ps.closest_hit;
  }
  if (ps.any_hit) {
    desc[2].hitgroup.moduleAH = module;
    desc[2].hitgroup.entryFunctionNameAH = ps.any_hit;
  }
  abi::OptixProgramGroupOptions pgo{};
  abi::OptixProgramGroup groups[3] = {};
  log_size = sizeof(log);
  r = o.optixProgramGroupCreate(ctx, desc, 3, &pgo, log, &log_size, groups);
  TORCH_CHECK(r == abi::OPTIX_SUCCESS, "optixProgramGroupCreate for '", ps.name, "' failed: ",
              abi::optix_result_name(r), "\n", log);

  abi::OptixPipelineLinkOptions plo{};
  plo.maxTraceDepth = 1;
  Pipeline p;
  log_size = sizeof(log);
  r = o.optixPipelineCreate(ctx, &pco, &plo, groups, 3, log, &log_size, &p.pipeline);
  TORCH_CHECK(r == abi::OPTIX_SUCCESS, "optixPipelineCreate for '", ps.name, "' failed: ",
              abi::optix_result_name(r), "\n", log);

  // Stack sizes for trace depth 1 and no callables: raygen plus the deepest of (closest hit or miss) and
  // (intersection + any hit).
  abi::OptixStackSizes total{};
  for (auto* g : groups) {
    abi::OptixStackSizes s{};
    check(o.optixProgramGroupGetStackSize(g, &s, p.pipeline), "optixProgramGroupGetStackSize");
    total.cssRG = std::max(total.cssRG, s.cssRG);
    total.cssMS = std::max(total.cssMS, s.cssMS);
    total.cssCH = std::max(total.cssCH, s.cssCH);
    total.cssAH = std::max(total.cssAH, s.cssAH);
    total.cssIS = std::max(total.cssIS, s.cssIS);
  }
  const unsigned continuation =
      total.cssRG + std::max(std::max(total.cssCH, total.cssMS), total.cssIS + total.cssAH);
  check(o.optixPipelineSetStackSize(p.pipeline, 0, 0, continuation, 1), "optixPipelineSetStackSize");

  // One SBT record per group: header only, no per-record data.
  struct alignas(abi::OPTIX_SBT_RECORD_ALIGNMENT) Record {
    char header[abi::OPTIX_SBT_RECORD_HEADER_SIZE];
  };
  Record records[3];
  for (int i = 0; i < 3; ++i) check(o.optixSbtRecordPackHeader(groups[i], &records[i]), "optixSbtRecordPackHeader");
  c10::cuda::CUDAGuard guard(device);
  void* d_records = nullptr;
  // Lives as long as the process, like the pipeline it belongs to; not from the caching allocator because
  // it must never be returned to a pool that a graph capture could reuse.
  RTX_CUDA_CHECK(cudaMalloc(&d_records, sizeof(records)));
  RTX_CUDA_CHECK(cudaMemcpy(d_records, records, sizeof(records), cudaMemcpyHostToDevice));
  const auto base = reinterpret_cast<abi::CUdeviceptr>(d_records);
  p.sbt.raygenRecord = base;
  p.sbt.missRecordBase = base + sizeof(Record);
  p.sbt.missRecordStrideInBytes = sizeof(Record);
  p.sbt.missRecordCount = 1;
  p.sbt.hitgroupRecordBase = base + 2 * sizeof(Record);
  p.sbt.hitgroupRecordStrideInBytes = sizeof(Record);
  p.sbt.hitgroupRecordCount = 1;
  return p;
}

// Called with g_mutex held. OptiX caches compiled modules and pipelines on disk by default (a first lookup
// in a process otherwise spends most of its time compiling them), in a per-user temporary folder; the package's
// cache folder keeps them as long as its builds. The user's own choice wins: OPTIX_CACHE_PATH (a location) or
// OPTIX_CACHE_MAXSIZE (0 turns the cache off), both read by OptiX itself. A folder OptiX cannot use leaves its
// default in place: the cache saves time, it is never a reason to fail.
void configure_disk_cache(abi::OptixDeviceContext ctx) {
  if (g_disk_cache.empty() || std::getenv("OPTIX_CACHE_PATH") != nullptr ||
      std::getenv("OPTIX_CACHE_MAXSIZE") != nullptr) {
    return;
  }
  const abi::OptixResult r = api().optixDeviceContextSetCacheLocation(ctx, g_disk_cache.c_str());
  if (r != abi::OPTIX_SUCCESS) {
    TORCH_WARN_ONCE("torch_rtindex: OptiX cannot keep its disk cache in ", g_disk_cache, " (",
                    abi::optix_result_name(r), "); it uses its default location");
  }
}

}  // namespace

void set_disk_cache(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_disk_cache = path;
}

std::string disk_cache(int device) {
  const auto& o = api();
  abi::OptixDeviceContext ctx = device_context(device);
  int enabled = 0;
  check(o.optixDeviceContextGetCacheEnabled(ctx, &enabled), "optixDeviceContextGetCacheEnabled");
  if (!enabled) return "";
  char location[4096] = {};
  check(o.optixDeviceContextGetCacheLocation(ctx, location, sizeof(location)), "optixDeviceContextGetCacheLocation");
  return location;
}

const abi::OptixFunctionTable& api() {
  static abi::OptixFunctionTable table{};
  static const std::string error = load_function_table(&table);
  TORCH_CHECK(error.empty(), "torch_rtindex cannot use OptiX: ", error);
  return table;
}

void check(abi::OptixResult r, const char* what) {
  TORCH_CHECK(r == abi::OPTIX_SUCCESS, "OptiX call ", what, " failed: ", abi::optix_result_name(r), " (",
              static_cast<int>(r), ")");
}

abi::OptixDeviceContext device_context(int device) {
  const auto& o = api();
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_contexts.find(device);
  if (it != g_contexts.end()) return it->second;
  c10::cuda::CUDAGuard guard(device);
  RTX_CUDA_CHECK(cudaFree(nullptr));  // make the primary context current; OptiX takes the current context
  abi::OptixDeviceContextOptions options{};
  const char* log_level = std::getenv("TORCH_RTINDEX_OPTIX_LOG");
  if (log_level != nullptr) {
    options.logCallbackFunction = &log_callback;
    options.logCallbackLevel = std::atoi(log_level);
  }
  abi::OptixDeviceContext ctx = nullptr;
  check(o.optixDeviceContextCreate(nullptr, &options, &ctx), "optixDeviceContextCreate");
  configure_disk_cache(ctx);
  g_contexts.emplace(device, ctx);
  return ctx;
}

std::vector<int64_t> device_info(int device) {
  const auto& o = api();
  abi::OptixDeviceContext ctx = device_context(device);
  auto prop = [&](abi::OptixDeviceProperty p) {
    unsigned v = 0;
    check(o.optixDeviceContextGetProperty(ctx, p, &v, sizeof(v)), "optixDeviceContextGetProperty");
    return static_cast<int64_t>(v);
  };
  return {abi::kAbiVersion, prop(abi::OPTIX_DEVICE_PROPERTY_RTCORE_VERSION),
          prop(abi::OPTIX_DEVICE_PROPERTY_LIMIT_MAX_PRIMITIVES_PER_GAS),
          prop(abi::OPTIX_DEVICE_PROPERTY_LIMIT_MAX_SBT_RECORDS_PER_GAS),
          prop(abi::OPTIX_DEVICE_PROPERTY_LIMIT_MAX_TRACE_DEPTH)};
}

void set_program_path(const std::string& name, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_program_paths[name] = path;
}

const Pipeline& pipeline(int device, const ProgramSet& programs) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_pipelines.find(PipelineKey{device, programs.name});
    if (it != g_pipelines.end()) return it->second;
  }
  abi::OptixDeviceContext ctx = device_context(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pipelines.find(PipelineKey{device, programs.name});
  if (it != g_pipelines.end()) return it->second;
  return g_pipelines.emplace(PipelineKey{device, programs.name}, create_pipeline(device, ctx, programs))
      .first->second;
}

void launch(const Pipeline& p, cudaStream_t stream, const void* params, size_t params_size, unsigned width) {
  if (width == 0) return;
  check(api().optixLaunch(p.pipeline, reinterpret_cast<abi::CUstream>(stream),
                          reinterpret_cast<abi::CUdeviceptr>(params), params_size, &p.sbt, width, 1, 1),
        "optixLaunch");
}

}  // namespace rtindex::optix
