// Host-side OptiX ABI for torch_rtindex: the function table libnvoptix.so.1 hands out for ABI revision 87,
// over the types of optix_abi_types.h (why the project declares them itself, and how the layouts were
// verified, is said there). Device code needs only the types.

#pragma once

#include <cstddef>

#include "optix_abi_types.h"

namespace rtindex::optix_abi {

// --------------------------------------------------------------------------
// Function table
// --------------------------------------------------------------------------

// The only symbol exported by libnvoptix.so.1. It fills `functionTable`
// (sizeOfTable bytes) with the entry points of ABI revision `abiId`. The SDK
// types optionKeys as a pointer to an enum; an int* is the same at the ABI
// level. The project passes numOptions = 0 and null option arrays.
using OptixQueryFunctionTableFn = OptixResult (*)(int abiId,
                                                  unsigned int numOptions,
                                                  int* optionKeys,
                                                  const void** optionValues,
                                                  void* functionTable,
                                                  std::size_t sizeOfTable);

// Entry order is the ABI: do not reorder, insert or delete. Entries the
// project does not call are `void*` placeholders (same size as a function
// pointer on every platform CUDA supports).
struct OptixFunctionTable {
  // Error handling
  const char* (*optixGetErrorName)(OptixResult result);
  const char* (*optixGetErrorString)(OptixResult result);

  // Device context
  OptixResult (*optixDeviceContextCreate)(CUcontext fromContext,
                                          const OptixDeviceContextOptions* options,
                                          OptixDeviceContext* context);
  OptixResult (*optixDeviceContextDestroy)(OptixDeviceContext context);
  OptixResult (*optixDeviceContextGetProperty)(OptixDeviceContext context,
                                               OptixDeviceProperty property,
                                               void* value,
                                               std::size_t sizeInBytes);
  OptixResult (*optixDeviceContextSetLogCallback)(OptixDeviceContext context,
                                                  OptixLogCallback callbackFunction,
                                                  void* callbackData,
                                                  unsigned int callbackLevel);
  // The disk cache of compiled modules and pipelines (optix_runtime.cpp points it at the package's cache).
  OptixResult (*optixDeviceContextSetCacheEnabled)(OptixDeviceContext context, int enabled);
  OptixResult (*optixDeviceContextSetCacheLocation)(OptixDeviceContext context, const char* location);
  void* optixDeviceContextSetCacheDatabaseSizes;
  OptixResult (*optixDeviceContextGetCacheEnabled)(OptixDeviceContext context, int* enabled);
  OptixResult (*optixDeviceContextGetCacheLocation)(OptixDeviceContext context,
                                                    char* location,
                                                    std::size_t locationSize);
  void* optixDeviceContextGetCacheDatabaseSizes;

  // Modules
  OptixResult (*optixModuleCreate)(OptixDeviceContext context,
                                   const OptixModuleCompileOptions* moduleCompileOptions,
                                   const OptixPipelineCompileOptions* pipelineCompileOptions,
                                   const char* input,
                                   std::size_t inputSize,
                                   char* logString,
                                   std::size_t* logStringSize,
                                   OptixModule* module);
  void* optixModuleCreateWithTasks;
  void* optixModuleGetCompilationState;
  OptixResult (*optixModuleDestroy)(OptixModule module);
  void* optixBuiltinISModuleGet;

  // Tasks
  void* optixTaskExecute;

  // Program groups
  OptixResult (*optixProgramGroupCreate)(OptixDeviceContext context,
                                         const OptixProgramGroupDesc* programDescriptions,
                                         unsigned int numProgramGroups,
                                         const OptixProgramGroupOptions* options,
                                         char* logString,
                                         std::size_t* logStringSize,
                                         OptixProgramGroup* programGroups);
  OptixResult (*optixProgramGroupDestroy)(OptixProgramGroup programGroup);
  OptixResult (*optixProgramGroupGetStackSize)(OptixProgramGroup programGroup,
                                               OptixStackSizes* stackSizes,
                                               OptixPipeline pipeline);

  // Pipelines
  OptixResult (*optixPipelineCreate)(OptixDeviceContext context,
                                     const OptixPipelineCompileOptions* pipelineCompileOptions,
                                     const OptixPipelineLinkOptions* pipelineLinkOptions,
                                     const OptixProgramGroup* programGroups,
                                     unsigned int numProgramGroups,
                                     char* logString,
                                     std::size_t* logStringSize,
                                     OptixPipeline* pipeline);
  OptixResult (*optixPipelineDestroy)(OptixPipeline pipeline);
  OptixResult (*optixPipelineSetStackSize)(OptixPipeline pipeline,
                                           unsigned int directCallableStackSizeFromTraversal,
                                           unsigned int directCallableStackSizeFromState,
                                           unsigned int continuationStackSize,
                                           unsigned int maxTraversableGraphDepth);

  // Acceleration structures. Note the SDK order: relocation entries come
  // before optixAccelCompact.
  OptixResult (*optixAccelComputeMemoryUsage)(OptixDeviceContext context,
                                              const OptixAccelBuildOptions* accelOptions,
                                              const OptixBuildInput* buildInputs,
                                              unsigned int numBuildInputs,
                                              OptixAccelBufferSizes* bufferSizes);
  OptixResult (*optixAccelBuild)(OptixDeviceContext context,
                                 CUstream stream,
                                 const OptixAccelBuildOptions* accelOptions,
                                 const OptixBuildInput* buildInputs,
                                 unsigned int numBuildInputs,
                                 CUdeviceptr tempBuffer,
                                 std::size_t tempBufferSizeInBytes,
                                 CUdeviceptr outputBuffer,
                                 std::size_t outputBufferSizeInBytes,
                                 OptixTraversableHandle* outputHandle,
                                 const OptixAccelEmitDesc* emittedProperties,
                                 unsigned int numEmittedProperties);
  OptixResult (*optixAccelGetRelocationInfo)(OptixDeviceContext context,
                                             OptixTraversableHandle handle,
                                             OptixRelocationInfo* info);
  OptixResult (*optixCheckRelocationCompatibility)(OptixDeviceContext context,
                                                   const OptixRelocationInfo* info,
                                                   int* compatible);
  OptixResult (*optixAccelRelocate)(OptixDeviceContext context,
                                    CUstream stream,
                                    const OptixRelocationInfo* info,
                                    const OptixRelocateInput* relocateInputs,
                                    std::size_t numRelocateInputs,
                                    CUdeviceptr targetAccel,
                                    std::size_t targetAccelSizeInBytes,
                                    OptixTraversableHandle* targetHandle);
  OptixResult (*optixAccelCompact)(OptixDeviceContext context,
                                   CUstream stream,
                                   OptixTraversableHandle inputHandle,
                                   CUdeviceptr outputBuffer,
                                   std::size_t outputBufferSizeInBytes,
                                   OptixTraversableHandle* outputHandle);
  void* optixAccelEmitProperty;
  OptixResult (*optixConvertPointerToTraversableHandle)(OptixDeviceContext onDevice,
                                                        CUdeviceptr pointer,
                                                        OptixTraversableType traversableType,
                                                        OptixTraversableHandle* traversableHandle);
  void* optixOpacityMicromapArrayComputeMemoryUsage;
  void* optixOpacityMicromapArrayBuild;
  void* optixOpacityMicromapArrayGetRelocationInfo;
  void* optixOpacityMicromapArrayRelocate;
  void* optixDisplacementMicromapArrayComputeMemoryUsage;
  void* optixDisplacementMicromapArrayBuild;

  // Launch
  OptixResult (*optixSbtRecordPackHeader)(OptixProgramGroup programGroup,
                                          void* sbtRecordHeaderHostPointer);
  OptixResult (*optixLaunch)(OptixPipeline pipeline,
                             CUstream stream,
                             CUdeviceptr pipelineParams,
                             std::size_t pipelineParamsSize,
                             const OptixShaderBindingTable* sbt,
                             unsigned int width,
                             unsigned int height,
                             unsigned int depth);

  // Denoiser (unused by the project)
  void* optixDenoiserCreate;
  void* optixDenoiserDestroy;
  void* optixDenoiserComputeMemoryResources;
  void* optixDenoiserSetup;
  void* optixDenoiserInvoke;
  void* optixDenoiserComputeIntensity;
  void* optixDenoiserComputeAverageColor;
  void* optixDenoiserCreateWithUserModel;
};

// Layout pins of the table (LP64), verified against the OptiX 8.0 SDK headers like the types'.
// 48 entries in ABI 87.
static_assert(sizeof(OptixFunctionTable) == 48 * sizeof(void*), "");
static_assert(offsetof(OptixFunctionTable, optixDeviceContextCreate) == 2 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixModuleCreate) == 12 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixProgramGroupCreate) == 18 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixPipelineCreate) == 21 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixAccelComputeMemoryUsage) == 24 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixAccelBuild) == 25 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixAccelRelocate) == 28 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixAccelCompact) == 29 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixConvertPointerToTraversableHandle) == 31 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixSbtRecordPackHeader) == 38 * 8, "");
static_assert(offsetof(OptixFunctionTable, optixLaunch) == 39 * 8, "");

}  // namespace rtindex::optix_abi
