// The naive representation of the cgRX paper (Algorithm 1): one triangle per bucket representative at its
// key's place, plus row markers at x = -1 and plane markers at x = y = -1, each marker in the slot of the
// first bucket of its row/plane. Buckets sharing a representative (duplicates) get one triangle, the first.
#pragma once

#include "../core/scene.h"
#include "cgrx_core.h"

namespace rtindex::cgrx {

struct SceneShape {
  uint64_t num_buckets;
  bool multi_row;    // representatives span several rows: row markers needed
  bool multi_plane;  // ... several planes: plane markers needed
  RTX_HD uint64_t num_triangles() const { return num_buckets * (1 + multi_row + multi_plane); }
  RTX_HD uint64_t row_marker_slot(uint64_t b) const { return num_buckets + b; }
  RTX_HD uint64_t plane_marker_slot(uint64_t b) const { return num_buckets * (1 + multi_row) + b; }
  // Every slot of bucket b's triangles maps back to b (the paper's primitive-index remapping).
  RTX_HD uint64_t bucket_of_primitive(uint64_t i) const { return i % num_buckets; }
};

RTX_HD SceneShape scene_shape(const uint64_t* reps, uint64_t m, const SceneConfig& c) {
  SceneShape s{m, false, false};
  if (m == 0) return s;
  s.multi_row = key_row(reps[0], c) != key_row(reps[m - 1], c);
  s.multi_plane = key_coords(reps[0], c).z != key_coords(reps[m - 1], c).z;
  return s;
}

// Writes the triangles of bucket b into their slots of `v` (3 vertices per slot).
RTX_HD void bucket_triangles(const uint64_t* reps, const SceneShape& s, uint64_t b, const SceneConfig& c, Vec3* v) {
  const uint64_t rep = reps[b];
  const bool first = b == 0 || reps[b - 1] != rep;
  const KeyCoords kc = key_coords(rep, c);
  if (first) any_axis_triangle(slot_position(kc.x, kc.y, kc.z, c), c, false, v + 3 * b);
  else inactive_triangle(v + 3 * b);
  if (s.multi_row) {
    const bool first_in_row = b == 0 || key_row(reps[b - 1], c) != key_row(rep, c);
    Vec3* t = v + 3 * s.row_marker_slot(b);
    if (first_in_row) any_axis_triangle(slot_position(-1, kc.y, kc.z, c), c, false, t);
    else inactive_triangle(t);
  }
  if (s.multi_plane) {
    const bool first_in_plane = b == 0 || key_coords(reps[b - 1], c).z != kc.z;
    Vec3* t = v + 3 * s.plane_marker_slot(b);
    if (first_in_plane) any_axis_triangle(slot_position(-1, -1, kc.z, c), c, false, t);
    else inactive_triangle(t);
  }
}

}  // namespace rtindex::cgrx
