// Scene inspection on the CPU: the triangles a key set becomes and the rays a batch of lookups fires,
// computed by the same functions the GPU uses, so that tests can hand them to an independent ray tracer.
#include <torch/library.h>

#include "checks.h"
#include "scene.h"

namespace rtindex {
namespace {

void write_ray(const Ray& r, float* out) {
  const float v[8] = {r.origin.x, r.origin.y, r.origin.z, r.direction.x, r.direction.y, r.direction.z, r.tmin, r.tmax};
  for (int j = 0; j < 8; ++j) out[j] = v[j];
}

at::Tensor scene_triangles_cpu(const at::Tensor& keys, at::IntArrayRef scene) {
  check_ordered_keys(keys, "keys");
  const SceneConfig c = scene_from_list(scene);
  at::Tensor out = at::empty({keys.numel(), 3, 3}, keys.options().dtype(at::kFloat));
  const uint64_t* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  Vec3* v = reinterpret_cast<Vec3*>(out.data_ptr<float>());
  for (int64_t i = 0; i < keys.numel(); ++i) key_triangle(k[i], c, v + 3 * i);
  return out;
}

// [q, 8] float32 rows: origin xyz, direction xyz, tmin, tmax.
at::Tensor scene_point_rays_cpu(const at::Tensor& queries, at::IntArrayRef scene) {
  check_ordered_keys(queries, "queries");
  const SceneConfig c = scene_from_list(scene);
  at::Tensor out = at::empty({queries.numel(), 8}, queries.options().dtype(at::kFloat));
  const uint64_t* q = reinterpret_cast<const uint64_t*>(queries.data_ptr<int64_t>());
  for (int64_t i = 0; i < queries.numel(); ++i) write_ray(point_ray(q[i], c), out.data_ptr<float>() + 8 * i);
  return out;
}

// The rays of a batch of range lookups: (query index of each ray, [r, 8] rays). Ranges wider than
// max_range_rays rows fire no rays (the GPU scans the keys for them) and contribute nothing here.
std::tuple<at::Tensor, at::Tensor> scene_range_rays_cpu(const at::Tensor& lo, const at::Tensor& hi,
                                                        at::IntArrayRef scene, int64_t max_range_rays) {
  check_ordered_keys(lo, "lo");
  check_ordered_keys(hi, "hi");
  TORCH_CHECK(lo.numel() == hi.numel(), "lo and hi must have the same length");
  const SceneConfig c = scene_from_list(scene);
  const uint64_t* l = reinterpret_cast<const uint64_t*>(lo.data_ptr<int64_t>());
  const uint64_t* h = reinterpret_cast<const uint64_t*>(hi.data_ptr<int64_t>());
  std::vector<int64_t> owner;
  std::vector<float> rays;
  for (int64_t i = 0; i < lo.numel(); ++i) {
    const uint64_t n = range_segment_count(l[i], h[i], c);
    if (n > static_cast<uint64_t>(max_range_rays)) continue;
    for (uint64_t s = 0; s < n; ++s) {
      owner.push_back(i);
      rays.resize(rays.size() + 8);
      write_ray(segment_ray(range_segment(l[i], h[i], s, c), c), rays.data() + rays.size() - 8);
    }
  }
  const int64_t r = static_cast<int64_t>(owner.size());
  at::Tensor out_owner = at::empty({r}, lo.options());
  at::Tensor out_rays = at::empty({r, 8}, lo.options().dtype(at::kFloat));
  std::copy(owner.begin(), owner.end(), out_owner.data_ptr<int64_t>());
  std::copy(rays.begin(), rays.end(), out_rays.data_ptr<float>());
  return {out_owner, out_rays};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtindex_internal, CPU, m) {
  m.impl("scene_triangles", &scene_triangles_cpu);
  m.impl("scene_point_rays", &scene_point_rays_cpu);
  m.impl("scene_range_rays", &scene_range_rays_cpu);
}

}  // namespace rtindex
