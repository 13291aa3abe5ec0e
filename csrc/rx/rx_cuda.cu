// RX on CUDA: triangles from keys, an OptiX GAS over them (csrc/optix/gas.h), and lookups as OptiX launches on
// PyTorch's current stream. Lookups neither synchronize nor allocate host memory, except the CSR forms,
// which must learn their output size (the fixed-capacity CSR form does not).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "../core/checks.h"
#include "../core/cuda_utils.h"
#include "../core/results_cuda.h"
#include "../core/scene.h"
#include "../optix/gas.h"
#include "../optix/optix_runtime.h"
#include "rx_args.h"
#include "rx_launch.h"

namespace rtindex {
namespace {

const optix::ProgramSet kRxPrograms{"rx", "__raygen__rx", "__miss__rx", "__closesthit__rx", "__anyhit__rx", 4};

__global__ void key_triangles_kernel(const uint64_t* __restrict__ keys, Vec3* __restrict__ vertices, int64_t n,
                                     SceneConfig c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    key_triangle(keys[i], c, vertices + 3 * i);
}

// Launch parameters are written by a kernel rather than copied from the host: the values travel as kernel
// arguments, which CUDA graphs capture by value, and the GAS handle comes straight from the structure header.
__global__ void write_params_kernel(RxLaunchParams p, RxLaunchParams* out) {
  p.handle = gas_handle(p.header);
  *out = p;
}

at::Tensor make_vertices(const at::Tensor& keys, const SceneConfig& c) {
  at::Tensor vertices = at::empty({keys.numel() * 9}, keys.options().dtype(at::kFloat));
  if (keys.numel() == 0) return vertices;
  key_triangles_kernel<<<grid_for(keys.numel()), kBlock, 0, current_stream()>>>(
      reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>()), reinterpret_cast<Vec3*>(vertices.data_ptr<float>()),
      keys.numel(), c);
  RTX_CHECK_LAUNCH();
  return vertices;
}

at::Tensor rx_build_cuda(const at::Tensor& keys, at::IntArrayRef scene, bool allow_update) {
  check_ordered_keys(keys, "keys");
  const SceneConfig c = scene_from_list(scene);
  const c10::cuda::CUDAGuard guard(keys.device());
  return gas::build(make_vertices(keys, c), keys.numel(), allow_update);
}

void rx_refit_cuda(at::Tensor& structure, const at::Tensor& keys, at::IntArrayRef scene) {
  check_ordered_keys(keys, "keys");
  const SceneConfig c = scene_from_list(scene);
  const c10::cuda::CUDAGuard guard(keys.device());
  gas::refit(structure, make_vertices(keys, c), keys.numel());
}

// The parts of a launch every result form shares.
struct Launch {
  RxLaunchParams p{};
  int device;
  int64_t q;

  Launch(const at::Tensor& structure, const at::Tensor& keys, const RxConfig& cfg, const at::Tensor& lo,
         const c10::optional<at::Tensor>& hi) {
    check_ordered_keys(keys, "keys");
    check_same_device(structure, keys, "the structure", "the keys");
    gas::check_structure(structure);
    p.queries = query_keys(keys, lo, hi, cfg.key_type);
    device = keys.device().index();
    q = lo.numel();
    p.header = reinterpret_cast<const GasHeader*>(structure.data_ptr());
    p.keys = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
    p.num_keys = static_cast<uint64_t>(keys.numel());
    p.scene = cfg.scene;
    p.unique_keys = cfg.unique_keys ? 1u : 0u;
    p.max_range_rays = static_cast<uint64_t>(cfg.max_range_rays);
    record_uses({&structure, &keys, &lo, hi ? &*hi : nullptr});
  }

  // One optixLaunch per 2^30 queries (OptiX's launch-size limit); parameters go to a device buffer from the
  // caching allocator, written on the stream by write_params_kernel.
  void run(ResultMode mode) {
    if (q == 0 || p.num_keys == 0) return;
    p.results.mode = static_cast<uint32_t>(mode);
    const optix::Pipeline& pipe = optix::pipeline(device, kRxPrograms);
    constexpr int64_t kMaxLaunch = int64_t(1) << 30;
    const int64_t chunks = (q + kMaxLaunch - 1) / kMaxLaunch;
    at::Tensor buf = at::empty({chunks * static_cast<int64_t>(sizeof(RxLaunchParams))},
                               at::TensorOptions().device(at::kCUDA, device).dtype(at::kByte));
    auto* dev = reinterpret_cast<RxLaunchParams*>(buf.data_ptr());
    for (int64_t c = 0; c < chunks; ++c) {
      p.query_base = static_cast<uint64_t>(c * kMaxLaunch);
      write_params_kernel<<<1, 1, 0, current_stream()>>>(p, dev + c);
      RTX_CHECK_LAUNCH();
      optix::launch(pipe, current_stream(), dev + c, sizeof(RxLaunchParams),
                    static_cast<unsigned>(std::min(kMaxLaunch, q - c * kMaxLaunch)));
    }
  }
};

std::tuple<at::Tensor, at::Tensor> rx_lookup_cuda(const at::Tensor& structure, const at::Tensor& keys, int64_t config, const at::Tensor& lo,
    const c10::optional<at::Tensor>& hi) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const RxConfig cfg = rx_config(config);
  Launch l(structure, keys, cfg, lo, hi);
  return cuda_results::first_and_count(l, l.q, keys.options(), l.p.num_keys == 0);
}

at::Tensor rx_lookup_rows_cuda(const at::Tensor& structure, const at::Tensor& keys, int64_t config,
                              const at::Tensor& lo, const c10::optional<at::Tensor>& hi, int64_t miss_row) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const RxConfig cfg = rx_config(config);
  Launch l(structure, keys, cfg, lo, hi);
  return cuda_results::first_rows(l, l.q, keys.options(), l.p.num_keys == 0, miss_row);
}

std::tuple<at::Tensor, at::Tensor> rx_lookup_csr_cuda(const at::Tensor& structure, const at::Tensor& keys, int64_t config, const at::Tensor& lo,
    const c10::optional<at::Tensor>& hi) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const RxConfig cfg = rx_config(config);
  Launch l(structure, keys, cfg, lo, hi);
  auto [offsets, rows, counts] = cuda_results::csr(l, l.q, keys.options(), l.p.num_keys == 0);
  const bool at_most_one = cfg.unique_keys && !hi.has_value();
  if (!at_most_one && rows.numel() > 0) {
    // Hits arrive in traversal order; sort each query's rows ascending (query in the high bits).
    at::Tensor owner = at::repeat_interleave(at::arange(l.q, keys.options()), counts, /*dim=*/0, /*output_size=*/rows.numel());
    at::Tensor composite = owner * (int64_t(1) << 32) + rows;
    rows = std::get<0>(composite.sort()) & 0xFFFFFFFFLL;
  }
  return {offsets, rows};
}

// The fixed-capacity form, without a host sync: the composite sort runs over the whole buffer, the entries
// past the matches (or past the buffer) keyed by a sentinel that sorts last. A query cut off by the capacity
// keeps the rows its rays met first, in ascending order.
std::tuple<at::Tensor, at::Tensor, at::Tensor> rx_lookup_csr_capped_cuda(const at::Tensor& structure, const at::Tensor& keys, int64_t config, const at::Tensor& lo,
    const c10::optional<at::Tensor>& hi, int64_t capacity) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const RxConfig cfg = rx_config(config);
  Launch l(structure, keys, cfg, lo, hi);
  auto [offsets, rows, total, counts] = cuda_results::csr_capped(l, l.q, keys.options(), capacity, l.p.num_keys == 0);
  const bool at_most_one = cfg.unique_keys && !hi.has_value();
  if (!at_most_one && capacity > 0 && l.q > 0) {
    at::Tensor pos = at::arange(capacity, keys.options());
    at::Tensor written = pos < total;  // the filled prefix: min(total, capacity) entries
    at::Tensor owner = at::searchsorted(offsets.slice(0, 1), pos, /*out_int32=*/false, /*right=*/true);
    at::Tensor composite = at::where(written, owner * (int64_t(1) << 32) + rows, std::numeric_limits<int64_t>::max());
    rows = at::where(written, std::get<0>(composite.sort()) & 0xFFFFFFFFLL, int64_t(-1));
  }
  return {offsets, rows, total};
}

std::tuple<at::Tensor, at::Tensor> rx_aggregate_cuda(const at::Tensor& structure, const at::Tensor& keys, int64_t config, const at::Tensor& lo,
    const c10::optional<at::Tensor>& hi,
                                                     const at::Tensor& values) {
  const c10::cuda::CUDAGuard guard(keys.device());
  const RxConfig cfg = rx_config(config);
  Launch l(structure, keys, cfg, lo, hi);
  check_values(values, keys.numel(), keys);
  record_uses({&values});
  return cuda_results::aggregate(l, l.q, keys.options(), values, l.p.num_keys == 0);
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex, CUDA, m) {
  m.impl("rx_build", &rx_build_cuda);
  m.impl("rx_refit", &rx_refit_cuda);
  m.impl("rx_lookup", &rx_lookup_cuda);
  m.impl("rx_lookup_rows", &rx_lookup_rows_cuda);
  m.impl("rx_lookup_csr", &rx_lookup_csr_cuda);
  m.impl("rx_lookup_csr_capped", &rx_lookup_csr_capped_cuda);
  m.impl("rx_aggregate", &rx_aggregate_cuda);
}

}  // namespace rtindex
