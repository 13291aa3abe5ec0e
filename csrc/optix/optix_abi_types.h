// Host- and device-side OptiX ABI types for torch_rtindex (the function table is in optix_abi.h).
//
// Why this file exists: the OptiX SDK headers may not be redistributed, so
// the project does not include or vendor them. OptiX itself ships inside the
// NVIDIA driver (libnvoptix.so.1); a client only needs to know (a) the entry
// point that hands out a table of function pointers and (b) the binary layout
// of the types passed through that table. This header (the types) and
// optix_abi.h (the table) state those facts for one fixed ABI revision,
// written independently for this project.
//
// ABI revision 87 corresponds to OptiX 8.0. Drivers from R535 on accept it, and
// newer drivers keep serving old revisions, so pinning 87 maximises the set of
// drivers we run on. Every layout below is for revision 87 exactly: fields must
// not be added, removed or reordered, even those the project leaves at zero.
//
// Names follow the SDK's spelling so code using them reads like ordinary
// OptiX code, but everything lives in namespace rtindex::optix_abi, so this
// header can coexist with cuda.h / cuda_runtime.h (and does not need them).
//
// Only the subset the project uses is declared. Function-table entries that
// the project never calls are declared as `void*` placeholders so the offsets
// of the entries that follow them remain correct.
//
// The layouts were checked field-by-field (sizeof, alignof, offsetof of every
// member and of every table entry, every enumerator value) against the OptiX
// 8.0 SDK headers in a separate, out-of-tree test. The static_asserts at the
// end of this file pin the verified numbers so an accidental edit fails to
// compile.

#pragma once

#include <cstddef>

// Forward declarations of the CUDA driver's opaque handle structs. They must
// sit in the global namespace so that `CUstream` / `cudaStream_t` values from
// cuda.h, cuda_runtime.h or PyTorch convert to ours without casts.
struct CUstream_st;
struct CUctx_st;

namespace rtindex::optix_abi {

// --------------------------------------------------------------------------
// Basic scalar and handle types
// --------------------------------------------------------------------------

// Same underlying types as cuda.h on 64-bit platforms; declared inside our
// namespace so that they never conflict with cuda.h's global typedefs.
using CUdeviceptr = unsigned long long;
using CUstream = ::CUstream_st*;
using CUcontext = ::CUctx_st*;

// OptiX objects are opaque pointers owned by the driver. The tag structs are
// declared explicitly so they always belong to this namespace.
struct OptixDeviceContext_t;
struct OptixModule_t;
struct OptixProgramGroup_t;
struct OptixPipeline_t;
struct OptixDenoiser_t;
struct OptixTask_t;
using OptixDeviceContext = OptixDeviceContext_t*;
using OptixModule = OptixModule_t*;
using OptixProgramGroup = OptixProgramGroup_t*;
using OptixPipeline = OptixPipeline_t*;
using OptixDenoiser = OptixDenoiser_t*;  // only named in the table
using OptixTask = OptixTask_t*;          // only named in the table

// A traversable handle is a 64-bit value usable from device code.
using OptixTraversableHandle = unsigned long long;
using OptixVisibilityMask = unsigned int;

// --------------------------------------------------------------------------
// Constants
// --------------------------------------------------------------------------

constexpr int kAbiVersion = 87;  // OptiX 8.0

// Where the implementation lives and what it exports.
constexpr const char* kLibraryName = "libnvoptix.so.1";
constexpr const char* kQueryFunctionTableSymbol = "optixQueryFunctionTable";

// The SDK spells the following as macros; that is one reason this header and
// the SDK headers must never be included into the same translation unit.
//
// Every SBT record starts with an opaque header filled in by
// optixSbtRecordPackHeader; records must be aligned to
// OPTIX_SBT_RECORD_ALIGNMENT.
constexpr std::size_t OPTIX_SBT_RECORD_HEADER_SIZE = 32;
constexpr std::size_t OPTIX_SBT_RECORD_ALIGNMENT = 16;
// Required alignment of acceleration-structure output/temp buffers.
constexpr std::size_t OPTIX_ACCEL_BUFFER_BYTE_ALIGNMENT = 128;
// Required alignment of an AABB buffer for custom primitives.
constexpr std::size_t OPTIX_AABB_BUFFER_BYTE_ALIGNMENT = 8;
// Required alignment of an OptixInstance array.
constexpr std::size_t OPTIX_INSTANCE_BYTE_ALIGNMENT = 16;

// --------------------------------------------------------------------------
// Result codes
// --------------------------------------------------------------------------

enum OptixResult : int {
  OPTIX_SUCCESS = 0,
  OPTIX_ERROR_INVALID_VALUE = 7001,
  OPTIX_ERROR_HOST_OUT_OF_MEMORY = 7002,
  OPTIX_ERROR_INVALID_OPERATION = 7003,
  OPTIX_ERROR_FILE_IO_ERROR = 7004,
  OPTIX_ERROR_INVALID_FILE_FORMAT = 7005,
  OPTIX_ERROR_DISK_CACHE_INVALID_PATH = 7010,
  OPTIX_ERROR_DISK_CACHE_PERMISSION_ERROR = 7011,
  OPTIX_ERROR_DISK_CACHE_DATABASE_ERROR = 7012,
  OPTIX_ERROR_DISK_CACHE_INVALID_DATA = 7013,
  OPTIX_ERROR_LAUNCH_FAILURE = 7050,
  OPTIX_ERROR_INVALID_DEVICE_CONTEXT = 7051,
  OPTIX_ERROR_CUDA_NOT_INITIALIZED = 7052,
  OPTIX_ERROR_VALIDATION_FAILURE = 7053,
  OPTIX_ERROR_INVALID_INPUT = 7200,
  OPTIX_ERROR_INVALID_LAUNCH_PARAMETER = 7201,
  OPTIX_ERROR_INVALID_PAYLOAD_ACCESS = 7202,
  OPTIX_ERROR_INVALID_ATTRIBUTE_ACCESS = 7203,
  OPTIX_ERROR_INVALID_FUNCTION_USE = 7204,
  OPTIX_ERROR_INVALID_FUNCTION_ARGUMENTS = 7205,
  OPTIX_ERROR_PIPELINE_OUT_OF_CONSTANT_MEMORY = 7250,
  OPTIX_ERROR_PIPELINE_LINK_ERROR = 7251,
  OPTIX_ERROR_ILLEGAL_DURING_TASK_EXECUTE = 7270,
  OPTIX_ERROR_INTERNAL_COMPILER_ERROR = 7299,
  OPTIX_ERROR_DENOISER_MODEL_NOT_SET = 7300,
  OPTIX_ERROR_DENOISER_NOT_INITIALIZED = 7301,
  OPTIX_ERROR_NOT_COMPATIBLE = 7400,
  OPTIX_ERROR_PAYLOAD_TYPE_MISMATCH = 7500,
  OPTIX_ERROR_PAYLOAD_TYPE_RESOLUTION_FAILED = 7501,
  OPTIX_ERROR_PAYLOAD_TYPE_ID_INVALID = 7502,
  OPTIX_ERROR_NOT_SUPPORTED = 7800,
  OPTIX_ERROR_UNSUPPORTED_ABI_VERSION = 7801,
  OPTIX_ERROR_FUNCTION_TABLE_SIZE_MISMATCH = 7802,
  OPTIX_ERROR_INVALID_ENTRY_FUNCTION_OPTIONS = 7803,
  OPTIX_ERROR_LIBRARY_NOT_FOUND = 7804,
  OPTIX_ERROR_ENTRY_SYMBOL_NOT_FOUND = 7805,
  OPTIX_ERROR_LIBRARY_UNLOAD_FAILURE = 7806,
  OPTIX_ERROR_DEVICE_OUT_OF_MEMORY = 7807,
  OPTIX_ERROR_CUDA_ERROR = 7900,
  OPTIX_ERROR_INTERNAL_ERROR = 7990,
  OPTIX_ERROR_UNKNOWN = 7999,
};

// Name of a result code, usable before a function table exists (e.g. when
// optixQueryFunctionTable itself fails). The switch deliberately has no
// `default:` so -Wswitch flags an enumerator that was added without a name.
inline const char* optix_result_name(OptixResult result) {
#define RTINDEX_OPTIX_RESULT_CASE(code) \
  case code:                            \
    return #code
  switch (result) {
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_SUCCESS);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_VALUE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_HOST_OUT_OF_MEMORY);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_OPERATION);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_FILE_IO_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_FILE_FORMAT);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DISK_CACHE_INVALID_PATH);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DISK_CACHE_PERMISSION_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DISK_CACHE_DATABASE_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DISK_CACHE_INVALID_DATA);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_LAUNCH_FAILURE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_DEVICE_CONTEXT);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_CUDA_NOT_INITIALIZED);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_VALIDATION_FAILURE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_INPUT);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_LAUNCH_PARAMETER);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_PAYLOAD_ACCESS);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_ATTRIBUTE_ACCESS);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_FUNCTION_USE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_FUNCTION_ARGUMENTS);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_PIPELINE_OUT_OF_CONSTANT_MEMORY);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_PIPELINE_LINK_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_ILLEGAL_DURING_TASK_EXECUTE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INTERNAL_COMPILER_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DENOISER_MODEL_NOT_SET);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DENOISER_NOT_INITIALIZED);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_NOT_COMPATIBLE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_PAYLOAD_TYPE_MISMATCH);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_PAYLOAD_TYPE_RESOLUTION_FAILED);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_PAYLOAD_TYPE_ID_INVALID);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_NOT_SUPPORTED);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_UNSUPPORTED_ABI_VERSION);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_FUNCTION_TABLE_SIZE_MISMATCH);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INVALID_ENTRY_FUNCTION_OPTIONS);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_LIBRARY_NOT_FOUND);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_ENTRY_SYMBOL_NOT_FOUND);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_LIBRARY_UNLOAD_FAILURE);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_DEVICE_OUT_OF_MEMORY);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_CUDA_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_INTERNAL_ERROR);
    RTINDEX_OPTIX_RESULT_CASE(OPTIX_ERROR_UNKNOWN);
  }
#undef RTINDEX_OPTIX_RESULT_CASE
  // A newer driver may report a code this revision does not know about.
  return "OPTIX_ERROR_<unrecognized code>";
}

// --------------------------------------------------------------------------
// Enumerations and flag sets
//
// Plain (unscoped) enums so flags combine with `|` into the `unsigned int`
// fields of the option structs, as in SDK code. A fixed underlying type pins
// their size to 4 bytes, which is what the SDK's C enums occupy.
// --------------------------------------------------------------------------

enum OptixDeviceProperty : int {
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_TRACE_DEPTH = 0x2001,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_TRAVERSABLE_GRAPH_DEPTH = 0x2002,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_PRIMITIVES_PER_GAS = 0x2003,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_INSTANCES_PER_IAS = 0x2004,
  OPTIX_DEVICE_PROPERTY_RTCORE_VERSION = 0x2005,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_INSTANCE_ID = 0x2006,
  OPTIX_DEVICE_PROPERTY_LIMIT_NUM_BITS_INSTANCE_VISIBILITY_MASK = 0x2007,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_SBT_RECORDS_PER_GAS = 0x2008,
  OPTIX_DEVICE_PROPERTY_LIMIT_MAX_SBT_OFFSET = 0x2009,
  OPTIX_DEVICE_PROPERTY_SHADER_EXECUTION_REORDERING = 0x200A,
};

// ALL is 0xFFFFFFFF, hence the unsigned underlying type.
enum OptixDeviceContextValidationMode : unsigned int {
  OPTIX_DEVICE_CONTEXT_VALIDATION_MODE_OFF = 0,
  OPTIX_DEVICE_CONTEXT_VALIDATION_MODE_ALL = 0xFFFFFFFFu,
};

enum OptixGeometryFlags : unsigned int {
  OPTIX_GEOMETRY_FLAG_NONE = 0,
  OPTIX_GEOMETRY_FLAG_DISABLE_ANYHIT = 1u << 0,
  OPTIX_GEOMETRY_FLAG_REQUIRE_SINGLE_ANYHIT_CALL = 1u << 1,
  OPTIX_GEOMETRY_FLAG_DISABLE_TRIANGLE_FACE_CULLING = 1u << 2,
};

// Values reported by optixGetHitKind() for built-in triangles.
enum OptixHitKind : unsigned int {
  OPTIX_HIT_KIND_TRIANGLE_FRONT_FACE = 0xFE,
  OPTIX_HIT_KIND_TRIANGLE_BACK_FACE = 0xFF,
};

enum OptixIndicesFormat : int {
  OPTIX_INDICES_FORMAT_NONE = 0,
  OPTIX_INDICES_FORMAT_UNSIGNED_SHORT3 = 0x2102,
  OPTIX_INDICES_FORMAT_UNSIGNED_INT3 = 0x2103,
};

enum OptixVertexFormat : int {
  OPTIX_VERTEX_FORMAT_NONE = 0,
  OPTIX_VERTEX_FORMAT_FLOAT3 = 0x2121,
  OPTIX_VERTEX_FORMAT_FLOAT2 = 0x2122,
  OPTIX_VERTEX_FORMAT_HALF3 = 0x2123,
  OPTIX_VERTEX_FORMAT_HALF2 = 0x2124,
  OPTIX_VERTEX_FORMAT_SNORM16_3 = 0x2125,
  OPTIX_VERTEX_FORMAT_SNORM16_2 = 0x2126,
};

// Format of OptixBuildInputTriangleArray::preTransform.
enum OptixTransformFormat : int {
  OPTIX_TRANSFORM_FORMAT_NONE = 0,
  OPTIX_TRANSFORM_FORMAT_MATRIX_FLOAT12 = 0x21E1,
};

enum OptixBuildInputType : int {
  OPTIX_BUILD_INPUT_TYPE_TRIANGLES = 0x2141,
  OPTIX_BUILD_INPUT_TYPE_CUSTOM_PRIMITIVES = 0x2142,
  OPTIX_BUILD_INPUT_TYPE_INSTANCES = 0x2143,
  OPTIX_BUILD_INPUT_TYPE_INSTANCE_POINTERS = 0x2144,
  OPTIX_BUILD_INPUT_TYPE_CURVES = 0x2145,
  OPTIX_BUILD_INPUT_TYPE_SPHERES = 0x2146,
};

enum OptixBuildFlags : unsigned int {
  OPTIX_BUILD_FLAG_NONE = 0,
  OPTIX_BUILD_FLAG_ALLOW_UPDATE = 1u << 0,
  OPTIX_BUILD_FLAG_ALLOW_COMPACTION = 1u << 1,
  OPTIX_BUILD_FLAG_PREFER_FAST_TRACE = 1u << 2,
  OPTIX_BUILD_FLAG_PREFER_FAST_BUILD = 1u << 3,
  OPTIX_BUILD_FLAG_ALLOW_RANDOM_VERTEX_ACCESS = 1u << 4,
  OPTIX_BUILD_FLAG_ALLOW_RANDOM_INSTANCE_ACCESS = 1u << 5,
  OPTIX_BUILD_FLAG_ALLOW_OPACITY_MICROMAP_UPDATE = 1u << 6,
  OPTIX_BUILD_FLAG_ALLOW_DISABLE_OPACITY_MICROMAPS = 1u << 7,
};

enum OptixBuildOperation : int {
  OPTIX_BUILD_OPERATION_BUILD = 0x2161,
  OPTIX_BUILD_OPERATION_UPDATE = 0x2162,
};

enum OptixMotionFlags : unsigned int {
  OPTIX_MOTION_FLAG_NONE = 0,
  OPTIX_MOTION_FLAG_START_VANISH = 1u << 0,
  OPTIX_MOTION_FLAG_END_VANISH = 1u << 1,
};

enum OptixAccelPropertyType : int {
  OPTIX_PROPERTY_TYPE_COMPACTED_SIZE = 0x2181,
  OPTIX_PROPERTY_TYPE_AABBS = 0x2182,
};

// Only the transform node types exist in this revision: a GAS/IAS handle is
// produced by optixAccelBuild / optixAccelCompact / optixAccelRelocate, never
// by optixConvertPointerToTraversableHandle, so there is no "GAS" enumerator.
enum OptixTraversableType : int {
  OPTIX_TRAVERSABLE_TYPE_STATIC_TRANSFORM = 0x21C1,
  OPTIX_TRAVERSABLE_TYPE_MATRIX_MOTION_TRANSFORM = 0x21C2,
  OPTIX_TRAVERSABLE_TYPE_SRT_MOTION_TRANSFORM = 0x21C3,
};

// Note the SDK's numbering: FULL (0x2352) comes before MODERATE (0x2353).
enum OptixCompileOptimizationLevel : int {
  OPTIX_COMPILE_OPTIMIZATION_DEFAULT = 0,
  OPTIX_COMPILE_OPTIMIZATION_LEVEL_0 = 0x2340,
  OPTIX_COMPILE_OPTIMIZATION_LEVEL_1 = 0x2341,
  OPTIX_COMPILE_OPTIMIZATION_LEVEL_2 = 0x2342,
  OPTIX_COMPILE_OPTIMIZATION_LEVEL_3 = 0x2343,
};

enum OptixCompileDebugLevel : int {
  OPTIX_COMPILE_DEBUG_LEVEL_DEFAULT = 0,
  OPTIX_COMPILE_DEBUG_LEVEL_NONE = 0x2350,
  OPTIX_COMPILE_DEBUG_LEVEL_MINIMAL = 0x2351,
  OPTIX_COMPILE_DEBUG_LEVEL_MODERATE = 0x2353,
  OPTIX_COMPILE_DEBUG_LEVEL_FULL = 0x2352,
};

enum OptixTraversableGraphFlags : unsigned int {
  OPTIX_TRAVERSABLE_GRAPH_FLAG_ALLOW_ANY = 0,
  OPTIX_TRAVERSABLE_GRAPH_FLAG_ALLOW_SINGLE_GAS = 1u << 0,
  OPTIX_TRAVERSABLE_GRAPH_FLAG_ALLOW_SINGLE_LEVEL_INSTANCING = 1u << 1,
};

// OptiX 8.0 removed the DEBUG exception flag (1u << 3) that 7.x had; setting
// it with ABI 87 is rejected, so it is intentionally absent here.
enum OptixExceptionFlags : unsigned int {
  OPTIX_EXCEPTION_FLAG_NONE = 0,
  OPTIX_EXCEPTION_FLAG_STACK_OVERFLOW = 1u << 0,
  OPTIX_EXCEPTION_FLAG_TRACE_DEPTH = 1u << 1,
  OPTIX_EXCEPTION_FLAG_USER = 1u << 2,
};

// For OptixPipelineCompileOptions::usesPrimitiveTypeFlags. Zero means
// "custom + triangle". TRIANGLE is the top bit (the SDK writes it as a
// signed 1 << 31; the bit pattern is the same).
enum OptixPrimitiveTypeFlags : unsigned int {
  OPTIX_PRIMITIVE_TYPE_FLAGS_CUSTOM = 1u << 0,
  OPTIX_PRIMITIVE_TYPE_FLAGS_ROUND_QUADRATIC_BSPLINE = 1u << 1,
  OPTIX_PRIMITIVE_TYPE_FLAGS_ROUND_CUBIC_BSPLINE = 1u << 2,
  OPTIX_PRIMITIVE_TYPE_FLAGS_ROUND_LINEAR = 1u << 3,
  OPTIX_PRIMITIVE_TYPE_FLAGS_ROUND_CATMULLROM = 1u << 4,
  OPTIX_PRIMITIVE_TYPE_FLAGS_FLAT_QUADRATIC_BSPLINE = 1u << 5,
  OPTIX_PRIMITIVE_TYPE_FLAGS_SPHERE = 1u << 6,
  OPTIX_PRIMITIVE_TYPE_FLAGS_ROUND_CUBIC_BEZIER = 1u << 7,
  OPTIX_PRIMITIVE_TYPE_FLAGS_DISPLACED_MICROMESH_TRIANGLE = 1u << 30,
  OPTIX_PRIMITIVE_TYPE_FLAGS_TRIANGLE = 1u << 31,
};

enum OptixProgramGroupKind : int {
  OPTIX_PROGRAM_GROUP_KIND_RAYGEN = 0x2421,
  OPTIX_PROGRAM_GROUP_KIND_MISS = 0x2422,
  OPTIX_PROGRAM_GROUP_KIND_EXCEPTION = 0x2423,
  OPTIX_PROGRAM_GROUP_KIND_HITGROUP = 0x2424,
  OPTIX_PROGRAM_GROUP_KIND_CALLABLES = 0x2425,
};

enum OptixProgramGroupFlags : unsigned int {
  OPTIX_PROGRAM_GROUP_FLAGS_NONE = 0,
};

// Ray flags passed to optixTrace (device side); declared here so host and
// device code share one definition.
enum OptixRayFlags : unsigned int {
  OPTIX_RAY_FLAG_NONE = 0u,
  OPTIX_RAY_FLAG_DISABLE_ANYHIT = 1u << 0,
  OPTIX_RAY_FLAG_ENFORCE_ANYHIT = 1u << 1,
  OPTIX_RAY_FLAG_TERMINATE_ON_FIRST_HIT = 1u << 2,
  OPTIX_RAY_FLAG_DISABLE_CLOSESTHIT = 1u << 3,
  OPTIX_RAY_FLAG_CULL_BACK_FACING_TRIANGLES = 1u << 4,
  OPTIX_RAY_FLAG_CULL_FRONT_FACING_TRIANGLES = 1u << 5,
  OPTIX_RAY_FLAG_CULL_DISABLED_ANYHIT = 1u << 6,
  OPTIX_RAY_FLAG_CULL_ENFORCED_ANYHIT = 1u << 7,
  OPTIX_RAY_FLAG_FORCE_OPACITY_MICROMAP_2_STATE = 1u << 10,
};

// DEFAULT (0) means "the payload layout given by numPayloadValues in the
// pipeline compile options"; the project uses only that one.
enum OptixPayloadTypeID : unsigned int {
  OPTIX_PAYLOAD_TYPE_DEFAULT = 0,
  OPTIX_PAYLOAD_TYPE_ID_0 = 1u << 0,
  OPTIX_PAYLOAD_TYPE_ID_1 = 1u << 1,
  OPTIX_PAYLOAD_TYPE_ID_2 = 1u << 2,
  OPTIX_PAYLOAD_TYPE_ID_3 = 1u << 3,
  OPTIX_PAYLOAD_TYPE_ID_4 = 1u << 4,
  OPTIX_PAYLOAD_TYPE_ID_5 = 1u << 5,
  OPTIX_PAYLOAD_TYPE_ID_6 = 1u << 6,
  OPTIX_PAYLOAD_TYPE_ID_7 = 1u << 7,
};

// Enums that only appear as fields of the micromap sub-structs embedded in
// OptixBuildInputTriangleArray. The project leaves those sub-structs zeroed
// (= NONE), but the enums are needed to spell the fields.
enum OptixOpacityMicromapFormat : int {
  OPTIX_OPACITY_MICROMAP_FORMAT_NONE = 0,
  OPTIX_OPACITY_MICROMAP_FORMAT_2_STATE = 1,
  OPTIX_OPACITY_MICROMAP_FORMAT_4_STATE = 2,
};

enum OptixOpacityMicromapArrayIndexingMode : int {
  OPTIX_OPACITY_MICROMAP_ARRAY_INDEXING_MODE_NONE = 0,
  OPTIX_OPACITY_MICROMAP_ARRAY_INDEXING_MODE_LINEAR = 1,
  OPTIX_OPACITY_MICROMAP_ARRAY_INDEXING_MODE_INDEXED = 2,
};

enum OptixDisplacementMicromapFormat : int {
  OPTIX_DISPLACEMENT_MICROMAP_FORMAT_NONE = 0,
  OPTIX_DISPLACEMENT_MICROMAP_FORMAT_64_MICRO_TRIS_64_BYTES = 1,
  OPTIX_DISPLACEMENT_MICROMAP_FORMAT_256_MICRO_TRIS_128_BYTES = 2,
  OPTIX_DISPLACEMENT_MICROMAP_FORMAT_1024_MICRO_TRIS_128_BYTES = 3,
};

enum OptixDisplacementMicromapArrayIndexingMode : int {
  OPTIX_DISPLACEMENT_MICROMAP_ARRAY_INDEXING_MODE_NONE = 0,
  OPTIX_DISPLACEMENT_MICROMAP_ARRAY_INDEXING_MODE_LINEAR = 1,
  OPTIX_DISPLACEMENT_MICROMAP_ARRAY_INDEXING_MODE_INDEXED = 2,
};

enum OptixDisplacementMicromapDirectionFormat : int {
  OPTIX_DISPLACEMENT_MICROMAP_DIRECTION_FORMAT_NONE = 0,
  OPTIX_DISPLACEMENT_MICROMAP_DIRECTION_FORMAT_FLOAT3 = 0x2261,
  OPTIX_DISPLACEMENT_MICROMAP_DIRECTION_FORMAT_HALF3 = 0x2262,
};

enum OptixDisplacementMicromapBiasAndScaleFormat : int {
  OPTIX_DISPLACEMENT_MICROMAP_BIAS_AND_SCALE_FORMAT_NONE = 0,
  OPTIX_DISPLACEMENT_MICROMAP_BIAS_AND_SCALE_FORMAT_FLOAT2 = 0x2241,
  OPTIX_DISPLACEMENT_MICROMAP_BIAS_AND_SCALE_FORMAT_HALF2 = 0x2242,
};

// --------------------------------------------------------------------------
// Device context
// --------------------------------------------------------------------------

// Called by OptiX with messages; level 1 = fatal ... 4 = print.
using OptixLogCallback = void (*)(unsigned int level, const char* tag,
                                  const char* message, void* cbdata);

struct OptixDeviceContextOptions {
  OptixLogCallback logCallbackFunction;
  void* logCallbackData;
  int logCallbackLevel;
  OptixDeviceContextValidationMode validationMode;
};

// --------------------------------------------------------------------------
// Acceleration-structure build inputs
// --------------------------------------------------------------------------

struct OptixOpacityMicromapUsageCount {
  unsigned int count;
  unsigned int subdivisionLevel;
  OptixOpacityMicromapFormat format;
};

// Embedded in OptixBuildInputTriangleArray; zero = no opacity micromaps.
struct OptixBuildInputOpacityMicromap {
  OptixOpacityMicromapArrayIndexingMode indexingMode;
  CUdeviceptr opacityMicromapArray;
  CUdeviceptr indexBuffer;
  unsigned int indexSizeInBytes;
  unsigned int indexStrideInBytes;
  unsigned int indexOffset;
  unsigned int numMicromapUsageCounts;
  const OptixOpacityMicromapUsageCount* micromapUsageCounts;
};

struct OptixDisplacementMicromapUsageCount {
  unsigned int count;
  unsigned int subdivisionLevel;
  OptixDisplacementMicromapFormat format;
};

// Embedded in OptixBuildInputTriangleArray; zero = no displacement.
struct OptixBuildInputDisplacementMicromap {
  OptixDisplacementMicromapArrayIndexingMode indexingMode;
  CUdeviceptr displacementMicromapArray;
  CUdeviceptr displacementMicromapIndexBuffer;
  CUdeviceptr vertexDirectionsBuffer;
  CUdeviceptr vertexBiasAndScaleBuffer;
  CUdeviceptr triangleFlagsBuffer;
  unsigned int displacementMicromapIndexOffset;
  unsigned int displacementMicromapIndexStrideInBytes;
  unsigned int displacementMicromapIndexSizeInBytes;
  OptixDisplacementMicromapDirectionFormat vertexDirectionFormat;
  unsigned int vertexDirectionStrideInBytes;
  OptixDisplacementMicromapBiasAndScaleFormat vertexBiasAndScaleFormat;
  unsigned int vertexBiasAndScaleStrideInBytes;
  unsigned int triangleFlagsStrideInBytes;
  unsigned int numDisplacementMicromapUsageCounts;
  const OptixDisplacementMicromapUsageCount* displacementMicromapUsageCounts;
};

struct OptixBuildInputTriangleArray {
  // Host array of device pointers, one per motion key (1 without motion).
  const CUdeviceptr* vertexBuffers;
  unsigned int numVertices;
  OptixVertexFormat vertexFormat;
  unsigned int vertexStrideInBytes;  // 0 = tightly packed
  CUdeviceptr indexBuffer;
  unsigned int numIndexTriplets;
  OptixIndicesFormat indexFormat;
  unsigned int indexStrideInBytes;  // 0 = tightly packed
  CUdeviceptr preTransform;
  // Host array of OptixGeometryFlags, numSbtRecords entries.
  const unsigned int* flags;
  unsigned int numSbtRecords;
  CUdeviceptr sbtIndexOffsetBuffer;
  unsigned int sbtIndexOffsetSizeInBytes;
  unsigned int sbtIndexOffsetStrideInBytes;
  unsigned int primitiveIndexOffset;
  OptixTransformFormat transformFormat;
  OptixBuildInputOpacityMicromap opacityMicromap;
  OptixBuildInputDisplacementMicromap displacementMicromap;
};

// One AABB as stored in a custom-primitive AABB buffer.
struct OptixAabb {
  float minX, minY, minZ;
  float maxX, maxY, maxZ;
};

struct OptixBuildInputCustomPrimitiveArray {
  // Host array of device pointers to OptixAabb arrays, one per motion key.
  const CUdeviceptr* aabbBuffers;
  unsigned int numPrimitives;
  unsigned int strideInBytes;  // 0 = sizeof(OptixAabb)
  // Host array of OptixGeometryFlags, numSbtRecords entries.
  const unsigned int* flags;
  unsigned int numSbtRecords;
  CUdeviceptr sbtIndexOffsetBuffer;
  unsigned int sbtIndexOffsetSizeInBytes;
  unsigned int sbtIndexOffsetStrideInBytes;
  unsigned int primitiveIndexOffset;
};

struct OptixBuildInputInstanceArray {
  CUdeviceptr instances;  // device array of OptixInstance (or pointers)
  unsigned int numInstances;
  unsigned int instanceStride;  // 0 = tightly packed
};

// One entry of an instance array for an instance AS (IAS).
struct OptixInstance {
  float transform[12];  // row-major 3x4 object-to-world
  unsigned int instanceId;
  unsigned int sbtOffset;
  unsigned int visibilityMask;
  unsigned int flags;
  OptixTraversableHandle traversableHandle;
  unsigned int pad[2];
};

// The SDK sizes this union with a 1024-byte pad member so that build-input
// kinds we do not declare (curves, spheres) fit too; the driver reads the
// full 8 + 1024 bytes per input. Always zero-initialise before filling in.
struct OptixBuildInput {
  OptixBuildInputType type;
  union {
    OptixBuildInputTriangleArray triangleArray;
    OptixBuildInputCustomPrimitiveArray customPrimitiveArray;
    OptixBuildInputInstanceArray instanceArray;
    char pad[1024];
  };
};

// --------------------------------------------------------------------------
// Acceleration-structure build / query / relocation
// --------------------------------------------------------------------------

struct OptixMotionOptions {
  unsigned short numKeys;  // 0 or 1 = no motion
  unsigned short flags;    // OptixMotionFlags
  float timeBegin;
  float timeEnd;
};

struct OptixAccelBuildOptions {
  unsigned int buildFlags;  // OptixBuildFlags
  OptixBuildOperation operation;
  OptixMotionOptions motionOptions;
};

struct OptixAccelBufferSizes {
  std::size_t outputSizeInBytes;
  std::size_t tempSizeInBytes;
  std::size_t tempUpdateSizeInBytes;
};

// Asks optixAccelBuild to write a property (e.g. compacted size, 8 bytes) to
// device memory at `result`.
struct OptixAccelEmitDesc {
  CUdeviceptr result;
  OptixAccelPropertyType type;
};

// Opaque blob describing an AS for relocation compatibility checks.
struct OptixRelocationInfo {
  unsigned long long info[4];
};

struct OptixRelocateInputInstanceArray {
  unsigned int numInstances;
  CUdeviceptr traversableHandles;
};

struct OptixRelocateInputOpacityMicromap {
  CUdeviceptr opacityMicromapArray;
};

struct OptixRelocateInputTriangleArray {
  unsigned int numSbtRecords;
  OptixRelocateInputOpacityMicromap opacityMicromap;
};

// Per-build-input data for optixAccelRelocate (triangle GASes and IASes only;
// a custom-primitive GAS needs none, so pass nullptr / 0).
struct OptixRelocateInput {
  OptixBuildInputType type;
  union {
    OptixRelocateInputInstanceArray instanceArray;
    OptixRelocateInputTriangleArray triangleArray;
  };
};

// --------------------------------------------------------------------------
// Modules, program groups, pipelines
// --------------------------------------------------------------------------

struct OptixModuleCompileBoundValueEntry {
  std::size_t pipelineParamOffsetInBytes;
  std::size_t sizeInBytes;
  const void* boundValuePtr;
  const char* annotation;
};

struct OptixPayloadType {
  unsigned int numPayloadValues;
  const unsigned int* payloadSemantics;  // OptixPayloadSemantics per value
};

struct OptixModuleCompileOptions {
  int maxRegisterCount;  // 0 = OptiX chooses
  OptixCompileOptimizationLevel optLevel;
  OptixCompileDebugLevel debugLevel;
  const OptixModuleCompileBoundValueEntry* boundValues;
  unsigned int numBoundValues;
  unsigned int numPayloadTypes;  // 0 = use the pipeline's numPayloadValues
  const OptixPayloadType* payloadTypes;
};

struct OptixPipelineCompileOptions {
  int usesMotionBlur;
  unsigned int traversableGraphFlags;  // OptixTraversableGraphFlags
  int numPayloadValues;
  int numAttributeValues;
  unsigned int exceptionFlags;  // OptixExceptionFlags
  const char* pipelineLaunchParamsVariableName;
  unsigned int usesPrimitiveTypeFlags;  // OptixPrimitiveTypeFlags, 0 = default
  int allowOpacityMicromaps;
};

struct OptixPipelineLinkOptions {
  unsigned int maxTraceDepth;
};

struct OptixProgramGroupSingleModule {
  OptixModule module;
  const char* entryFunctionName;
};

struct OptixProgramGroupHitgroup {
  OptixModule moduleCH;
  const char* entryFunctionNameCH;
  OptixModule moduleAH;
  const char* entryFunctionNameAH;
  OptixModule moduleIS;  // nullptr = built-in triangle intersection
  const char* entryFunctionNameIS;
};

struct OptixProgramGroupCallables {
  OptixModule moduleDC;
  const char* entryFunctionNameDC;
  OptixModule moduleCC;
  const char* entryFunctionNameCC;
};

struct OptixProgramGroupDesc {
  OptixProgramGroupKind kind;
  unsigned int flags;  // OptixProgramGroupFlags
  union {
    OptixProgramGroupSingleModule raygen;
    OptixProgramGroupSingleModule miss;
    OptixProgramGroupSingleModule exception;
    OptixProgramGroupCallables callables;
    OptixProgramGroupHitgroup hitgroup;
  };
};

struct OptixProgramGroupOptions {
  const OptixPayloadType* payloadType;  // nullptr = default payload type
};

struct OptixShaderBindingTable {
  CUdeviceptr raygenRecord;
  CUdeviceptr exceptionRecord;
  CUdeviceptr missRecordBase;
  unsigned int missRecordStrideInBytes;
  unsigned int missRecordCount;
  CUdeviceptr hitgroupRecordBase;
  unsigned int hitgroupRecordStrideInBytes;
  unsigned int hitgroupRecordCount;
  CUdeviceptr callablesRecordBase;
  unsigned int callablesRecordStrideInBytes;
  unsigned int callablesRecordCount;
};

// Continuation (css*) and direct (dss*) stack sizes of one program group.
struct OptixStackSizes {
  unsigned int cssRG;
  unsigned int cssMS;
  unsigned int cssCH;
  unsigned int cssAH;
  unsigned int cssIS;
  unsigned int cssCC;
  unsigned int dssDC;
};

// --------------------------------------------------------------------------
// Layout pins (LP64) of the types. These numbers were verified against the OptiX
// 8.0 SDK headers; if one fires, the declaration above was edited incorrectly.
// --------------------------------------------------------------------------

static_assert(sizeof(void*) == 8, "OptiX is only supported on 64-bit hosts");

static_assert(sizeof(OptixResult) == 4, "");
static_assert(sizeof(OptixDeviceContextOptions) == 24, "");
static_assert(sizeof(OptixBuildInputOpacityMicromap) == 48, "");
static_assert(sizeof(OptixBuildInputDisplacementMicromap) == 96, "");
static_assert(sizeof(OptixBuildInputTriangleArray) == 240, "");
static_assert(offsetof(OptixBuildInputTriangleArray, opacityMicromap) == 96, "");
static_assert(offsetof(OptixBuildInputTriangleArray, displacementMicromap) == 144, "");
static_assert(sizeof(OptixBuildInputCustomPrimitiveArray) == 56, "");
static_assert(sizeof(OptixBuildInputInstanceArray) == 16, "");
static_assert(sizeof(OptixInstance) == 80, "");
static_assert(sizeof(OptixBuildInput) == 8 + 1024, "");
static_assert(alignof(OptixBuildInput) == 8, "");
static_assert(offsetof(OptixBuildInput, triangleArray) == 8, "");
static_assert(sizeof(OptixMotionOptions) == 12, "");
static_assert(sizeof(OptixAccelBuildOptions) == 20, "");
static_assert(sizeof(OptixAccelBufferSizes) == 24, "");
static_assert(sizeof(OptixAccelEmitDesc) == 16, "");
static_assert(sizeof(OptixRelocationInfo) == 32, "");
static_assert(sizeof(OptixRelocateInput) == 24, "");
static_assert(sizeof(OptixModuleCompileBoundValueEntry) == 32, "");
static_assert(sizeof(OptixPayloadType) == 16, "");
static_assert(sizeof(OptixModuleCompileOptions) == 40, "");
static_assert(sizeof(OptixPipelineCompileOptions) == 40, "");
static_assert(offsetof(OptixPipelineCompileOptions, pipelineLaunchParamsVariableName) == 24, "");
static_assert(sizeof(OptixPipelineLinkOptions) == 4, "");
static_assert(sizeof(OptixProgramGroupDesc) == 56, "");
static_assert(offsetof(OptixProgramGroupDesc, hitgroup) == 8, "");
static_assert(sizeof(OptixProgramGroupOptions) == 8, "");
static_assert(sizeof(OptixShaderBindingTable) == 64, "");
static_assert(sizeof(OptixStackSizes) == 28, "");

}  // namespace rtindex::optix_abi
