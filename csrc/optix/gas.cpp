// GAS build, compaction and refit through the OptiX function table; memory from PyTorch's caching allocator.
#include "gas.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "optix_runtime.h"

namespace rtindex::gas {
namespace {

namespace abi = optix_abi;

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

abi::CUdeviceptr ptr(const at::Tensor& t, int64_t offset = 0) {
  return reinterpret_cast<abi::CUdeviceptr>(static_cast<char*>(t.data_ptr()) + offset);
}

struct TriangleInput {
  abi::CUdeviceptr vertex_buffer;
  unsigned geometry_flags = abi::OPTIX_GEOMETRY_FLAG_REQUIRE_SINGLE_ANYHIT_CALL;  // exact hit counts
  abi::OptixBuildInput input{};

  TriangleInput(const at::Tensor& vertices, int64_t n) : vertex_buffer(ptr(vertices)) {
    input.type = abi::OPTIX_BUILD_INPUT_TYPE_TRIANGLES;
    auto& t = input.triangleArray;
    t.vertexBuffers = &vertex_buffer;
    t.numVertices = static_cast<unsigned>(3 * n);
    t.vertexFormat = abi::OPTIX_VERTEX_FORMAT_FLOAT3;
    t.vertexStrideInBytes = 3 * sizeof(float);
    t.indexFormat = abi::OPTIX_INDICES_FORMAT_NONE;
    t.flags = &geometry_flags;
    t.numSbtRecords = 1;
  }
  TriangleInput(const TriangleInput&) = delete;
};

void write_header(at::Tensor& structure, const GasHeader& h) {
  C10_CUDA_CHECK(cudaMemcpyAsync(structure.data_ptr(), &h, sizeof(h), cudaMemcpyHostToDevice, stream()));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream()));  // h lives on this stack frame
}

void check_vertices(const at::Tensor& vertices, int64_t n) {
  TORCH_CHECK(vertices.is_cuda() && vertices.scalar_type() == at::kFloat && vertices.is_contiguous() &&
                  vertices.numel() == 9 * n,
              "GAS vertices must be a contiguous CUDA float32 tensor of 9 values per triangle");
}

}  // namespace

void check_structure(const at::Tensor& structure) {
  TORCH_CHECK(structure.is_cuda() && structure.dim() == 1 && structure.scalar_type() == at::kByte &&
                  structure.numel() >= kGasHeaderBytes,
              "not a GAS structure (expected the uint8 CUDA tensor a build returned)");
}

GasHeader read_header(const at::Tensor& structure) {
  check_structure(structure);
  GasHeader h;
  C10_CUDA_CHECK(cudaMemcpyAsync(&h, structure.data_ptr(), sizeof(h), cudaMemcpyDeviceToHost, stream()));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return h;
}

at::Tensor build(at::Tensor vertices, int64_t n, bool allow_update) {
  const c10::cuda::CUDAGuard guard(vertices.device());
  const auto u8 = vertices.options().dtype(at::kByte);
  GasHeader header{0, 0, static_cast<uint64_t>(n), 0, allow_update ? 1u : 0u};
  if (n == 0) {  // OptiX builds no empty GAS; the indexes answer empty scenes without tracing
    at::Tensor structure = at::empty({kGasHeaderBytes}, u8);
    write_header(structure, header);
    return structure;
  }
  check_vertices(vertices, n);
  const int device = vertices.device().index();
  const int64_t max_primitives = optix::device_info(device)[2];
  TORCH_CHECK(n <= max_primitives, "one OptiX GAS holds at most ", max_primitives,
              " triangles on this device; this index needs ", n, ". Split the keys over several indexes.");
  abi::OptixDeviceContext ctx = optix::device_context(device);
  const auto& o = optix::api();
  TriangleInput in(vertices, n);
  abi::OptixAccelBuildOptions options{};
  // The RX paper's choice: compaction for a static index; refit needs ALLOW_UPDATE and skips compaction.
  options.buildFlags = abi::OPTIX_BUILD_FLAG_PREFER_FAST_TRACE |
                       (allow_update ? abi::OPTIX_BUILD_FLAG_ALLOW_UPDATE : abi::OPTIX_BUILD_FLAG_ALLOW_COMPACTION);
  options.operation = abi::OPTIX_BUILD_OPERATION_BUILD;
  abi::OptixAccelBufferSizes sizes{};
  optix::check(o.optixAccelComputeMemoryUsage(ctx, &options, &in.input, 1, &sizes), "optixAccelComputeMemoryUsage");
  at::Tensor temp = at::empty({static_cast<int64_t>(sizes.tempSizeInBytes)}, u8);
  const auto s = reinterpret_cast<abi::CUstream>(stream());
  abi::OptixTraversableHandle handle = 0;
  at::Tensor structure;
  if (allow_update) {
    structure = at::empty({kGasHeaderBytes + static_cast<int64_t>(sizes.outputSizeInBytes)}, u8);
    optix::check(o.optixAccelBuild(ctx, s, &options, &in.input, 1, ptr(temp), sizes.tempSizeInBytes,
                                   ptr(structure, kGasHeaderBytes), sizes.outputSizeInBytes, &handle, nullptr, 0),
                 "optixAccelBuild");
    header.gas_bytes = sizes.outputSizeInBytes;
  } else {
    at::Tensor uncompacted = at::empty({static_cast<int64_t>(sizes.outputSizeInBytes)}, u8);
    at::Tensor compacted_size = at::empty({1}, vertices.options().dtype(at::kLong));
    abi::OptixAccelEmitDesc emit{ptr(compacted_size), abi::OPTIX_PROPERTY_TYPE_COMPACTED_SIZE};
    optix::check(o.optixAccelBuild(ctx, s, &options, &in.input, 1, ptr(temp), sizes.tempSizeInBytes,
                                   ptr(uncompacted), sizes.outputSizeInBytes, &handle, &emit, 1),
                 "optixAccelBuild");
    // Neither is read again: their memory goes back before the compacted copy is made (the build's peak).
    temp.reset();
    vertices.reset();
    const int64_t bytes = compacted_size.item<int64_t>();  // the one host sync of a build
    structure = at::empty({kGasHeaderBytes + bytes}, u8);
    optix::check(o.optixAccelCompact(ctx, s, handle, ptr(structure, kGasHeaderBytes), bytes, &handle),
                 "optixAccelCompact");
    header.gas_bytes = bytes;
  }
  header.handle = handle;
  header.gas_address = ptr(structure, kGasHeaderBytes);
  write_header(structure, header);
  return structure;
}

void refit(at::Tensor& structure, const at::Tensor& vertices, int64_t n) {
  const c10::cuda::CUDAGuard guard(vertices.device());
  GasHeader header = read_header(structure);
  TORCH_CHECK(header.updatable, "refit needs a structure built with allow_update=True");
  TORCH_CHECK(header.num_triangles == static_cast<uint64_t>(n), "refit keeps the number of keys: the index has ",
              header.num_triangles, ", the new keys ", n);
  TORCH_CHECK(header.gas_address == ptr(structure, kGasHeaderBytes),
              "this structure was moved or copied; rebuild it instead of refitting");
  if (n == 0) return;
  check_vertices(vertices, n);
  const auto& o = optix::api();
  abi::OptixDeviceContext ctx = optix::device_context(vertices.device().index());
  TriangleInput in(vertices, n);
  abi::OptixAccelBuildOptions options{};
  options.buildFlags = abi::OPTIX_BUILD_FLAG_PREFER_FAST_TRACE | abi::OPTIX_BUILD_FLAG_ALLOW_UPDATE;
  options.operation = abi::OPTIX_BUILD_OPERATION_UPDATE;
  abi::OptixAccelBufferSizes sizes{};
  optix::check(o.optixAccelComputeMemoryUsage(ctx, &options, &in.input, 1, &sizes), "optixAccelComputeMemoryUsage");
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(sizes.tempUpdateSizeInBytes, 8))},
                              vertices.options().dtype(at::kByte));
  abi::OptixTraversableHandle handle = header.handle;
  optix::check(o.optixAccelBuild(ctx, reinterpret_cast<abi::CUstream>(stream()), &options, &in.input, 1, ptr(temp),
                                 sizes.tempUpdateSizeInBytes, header.gas_address, header.gas_bytes, &handle, nullptr, 0),
               "optixAccelBuild (update)");
  header.handle = handle;
  write_header(structure, header);
}

}  // namespace rtindex::gas
