// The cgRX scene: the triangles that stand for the bucket representatives, in either of the cgRX paper's two
// representations, and the ray search that finds, for a key k with reps[0] < k <= reps[m - 1], the bucket of
// the first representative >= k (keys outside that interval are answered without tracing: trivial_bucket).
// The builds (CPU and CUDA) write the triangles with bucket_triangles; the OptiX program and the CPU operator
// cgrx_scene_rays (which the Embree test drives) run the very same search, ray_search_step, so that the test
// checks the code the GPU runs.
//
// Notation: m buckets, reps[b] the representative (last key) of bucket b; a key's slot is (x, y, z) (scene.h),
// a "row" is a (y, z) pair and a "plane" a z; x_max, y_max, z_max are the last slots (2^bits - 1). A row or
// plane is "populated" when a representative lies in it. Ray names below refer to cgrx_{x,y,z}_ray.
//
// ---- Naive representation (paper §3.2, Algorithm 1) --------------------------------------------------------
// Slots [0, m): one triangle per distinct representative at its own slot, in the slot of the FIRST bucket
// that has it (duplicates); [m, 2m) (multi-row sets only): a row marker at x = -1 of every populated row,
// in the slot of the row's first bucket; [2m, 3m) (multi-plane sets only): a plane marker at x = y = -1 of
// every populated plane, in the slot of the plane's first bucket. Every slot maps to bucket slot % m.
// Search (at most three rays, each hit is the answer since a marker carries its row's/plane's first bucket):
//   1. x-ray through k's row from k.x:                  hit -> slot % m.
//   2. y-ray at x = -1 in k's plane from row k.y + 1:   hit -> slot % m (the next populated row's first bucket).
//   3. z-ray at x = y = -1 from plane k.z + 1:          hit -> slot % m (the next populated plane's first).
//
// ---- Optimized representation (paper §3.3, Algorithm 3) ----------------------------------------------------
// Build, for bucket b (rep = reps[b]; "next key" = the first key of bucket b + 1, i.e. the key after rep):
//   movable    = the set spans several rows and the next key lies in a later row than rep (the last bucket,
//                which has no next key, counts as movable: no traced key lies beyond it). Only the last
//                bucket of a row can be movable. A movable representative may move to r' = (x_max, its row)
//                (rep <= r' < next key: no key lies between).
//   slot b     : a triangle at (movable ? x_max : rep.x, rep's row) unless rep duplicates reps[b - 1] and does
//                not move (the first bucket of a duplicate run holds the triangle at rep's own place; the
//                run's last bucket, when movable, gets a second one at x_max). Maps to bucket b.
//   slot m + b : (multi-row sets) a row-end triangle at (x_max, rep's row) when b is the last bucket of its
//                row, is not movable and rep.x != x_max (at x_max rep itself ends the row). Maps to b + 1.
//   slot 2m + b: (multi-plane sets) a plane-end triangle at (x_max, y_max, rep.z) when b is the last bucket
//                of its plane and rep.y != y_max (otherwise the end of row y_max is the plane's end).
//                Maps to b + 1.
//   one trailing inactive slot (index (1 + multi_row + multi_plane) * m) tells the lookups that the GAS holds
//                this representation: they read it from the GAS header's triangle count.
// So every populated row has a triangle at x_max (I1) and every populated plane one at (x_max, y_max) (I2),
// and the remapping i -> i (i < m), i - m + 1, i - 2m + 1 is the paper's.
// Flipping: a triangle that is the ONLY triangle of its row has reversed winding (any_axis_triangle's `flip`),
// which every axis ray sees as a back face. These are (a) a row's first representative placed at x_max (the
// paper's case: moved and alone in its row; also a run of duplicates that already sits at x_max), and (b)
// every plane-end triangle (its row y_max holds no representative). Such a triangle is the answer for every
// key before its row whose y-ray reaches it.
// Search (at most five rays; "hit s" means the closest hit is slot s, beta(s) its mapped bucket):
//   1. SameRow: x-ray through k's row from k.x to x_max.
//        hit s  -> beta(s), except when s < m and reps[s] < k: a representative moved to x_max was hit from
//                  beyond its own key, so the first representative >= k is the next one: s + 1.
//        miss   -> k's row is not populated (I1): 2.
//   2. NextRow (multi-row sets, k.y < y_max): y-ray at x = x_max in k's plane from row k.y + 1 to y_max.
//        It meets the end triangle of the next populated row y' of the plane, or the plane-end triangle.
//        back face -> beta(s): the triangle is alone in its row (flipped), so it IS that row's first
//                  representative (or, a plane end, the next plane's first bucket). One ray saved.
//        front face-> the row has several triangles and the answer is its first bucket. With b = s mod m (a
//                  bucket of row y'), read reps[b] (row y', needed for the next ray's origin) and reps[b-1]:
//                  when b == 0 or reps[b - 1] lies in an earlier row, b is the row's first bucket -> b;
//                  otherwise 4.
//        miss   -> k's plane holds nothing after k (I2): 3.
//   3. NextPlane (multi-plane sets, k.z < z_max): z-ray at (x_max, y_max) from plane k.z + 1 to z_max.
//        hit s  -> the end triangle of the next populated plane z'; b = s mod m is a bucket of plane z'.
//                  Read reps[b] (z') and reps[b - 1]: when b == 0 or reps[b - 1] lies in an earlier plane,
//                  b is the plane's first bucket -> b. Otherwise a y-ray at x = x_max through plane z' from
//                  row 0, handled exactly like 2 (back face -> beta(s); front face -> b or 4).
//        miss   -> none (cannot happen for k <= reps[m - 1]).
//   4. RowStart: x-ray through row y' from x = 0: hit s -> beta(s) (the row's first triangle; no representative
//                  of row y' lies below k's row, so no fix-up).
// The reps[b - 1] checks are this implementation's addition to the paper's sequence: they cost one load next
// to the reps[b] load that the follow-up ray's origin needs anyway, and spare the follow-up ray whenever the
// row or plane holds a single bucket (for sparse key sets, most planes).
#pragma once

#include "../core/scene.h"
#include "cgrx_core.h"

namespace rtindex::cgrx {

enum class Representation : uint32_t { Naive = 0, Optimized = 1 };

struct SceneShape {
  uint64_t num_buckets;
  bool multi_row;    // representatives span several rows: row marker / row-end slots
  bool multi_plane;  // ... several planes: plane marker / plane-end slots
  uint32_t representation;  // Representation

  RTX_HD bool optimized() const { return representation == static_cast<uint32_t>(Representation::Optimized); }
  // Slots of the representative, row and plane regions (the same for both representations).
  RTX_HD uint64_t region_slots() const { return num_buckets * (1 + multi_row + multi_plane); }
  // The vertex buffer's length; the optimized representation adds its trailing inactive tag slot.
  RTX_HD uint64_t num_triangles() const { return region_slots() + (optimized() && num_buckets > 0 ? 1 : 0); }
  RTX_HD uint64_t row_marker_slot(uint64_t b) const { return num_buckets + b; }
  RTX_HD uint64_t plane_marker_slot(uint64_t b) const { return num_buckets * (1 + multi_row) + b; }
  // The paper's primitive-index remapping (naive: every slot of bucket b's triangles maps back to b).
  RTX_HD uint64_t bucket_of_primitive(uint64_t i) const {
    if (!optimized()) return i % num_buckets;
    return i < num_buckets ? i : i % num_buckets + 1;
  }
};

RTX_HD SceneShape scene_shape(const uint64_t* reps, uint64_t m, const SceneConfig& c,
                              Representation r = Representation::Naive) {
  SceneShape s{m, false, false, static_cast<uint32_t>(r)};
  if (m == 0) return s;
  s.multi_row = key_row(reps[0], c) != key_row(reps[m - 1], c);
  s.multi_plane = key_coords(reps[0], c).z != key_coords(reps[m - 1], c).z;
  return s;
}

// The representation a GAS holds, from its triangle count (lookups get the scene as a GAS and nothing else):
// `shape` is the scene's shape as computed from the representatives (any representation).
RTX_HD Representation representation_of_scene(uint64_t gas_triangles, SceneShape shape) {
  shape.representation = static_cast<uint32_t>(Representation::Optimized);
  return shape.num_buckets > 0 && gas_triangles == shape.num_triangles() ? Representation::Optimized
                                                                          : Representation::Naive;
}

RTX_HD uint32_t plane_of(uint64_t key, const SceneConfig& c) { return key_coords(key, c).z; }

// Writes the triangles of bucket b into their slots of `v` (3 vertices per slot). `pairs` (the sorted keys)
// is needed by the optimized representation only (the key after each representative); `reps` has m entries.
RTX_HD void bucket_triangles(const uint64_t* reps, const Pairs& pairs, const SceneShape& s, uint64_t b,
                             const SceneConfig& c, Vec3* v) {
  const uint64_t m = s.num_buckets;
  const uint64_t rep = reps[b];
  const KeyCoords kc = key_coords(rep, c);
  const bool duplicate = b > 0 && reps[b - 1] == rep;
  if (!s.optimized()) {
    if (!duplicate) any_axis_triangle(slot_position(kc.x, kc.y, kc.z, c), c, false, v + 3 * b);
    else inactive_triangle(v + 3 * b);
    if (s.multi_row) {
      const bool first_in_row = b == 0 || key_row(reps[b - 1], c) != key_row(rep, c);
      Vec3* t = v + 3 * s.row_marker_slot(b);
      if (first_in_row) any_axis_triangle(slot_position(-1, kc.y, kc.z, c), c, false, t);
      else inactive_triangle(t);
    }
    if (s.multi_plane) {
      const bool first_in_plane = b == 0 || plane_of(reps[b - 1], c) != kc.z;
      Vec3* t = v + 3 * s.plane_marker_slot(b);
      if (first_in_plane) any_axis_triangle(slot_position(-1, -1, kc.z, c), c, false, t);
      else inactive_triangle(t);
    }
    return;
  }
  const int64_t x_max = static_cast<int64_t>(axis_mask(c.bits_x));
  const int64_t y_max = static_cast<int64_t>(axis_mask(c.bits_y));
  const bool has_next = b + 1 < m;
  const bool first_in_row = b == 0 || key_row(reps[b - 1], c) != key_row(rep, c);
  const bool last_in_row = !has_next || key_row(reps[b + 1], c) != key_row(rep, c);
  const bool last_in_plane = !has_next || plane_of(reps[b + 1], c) != kc.z;
  // Algorithm 3, line 10: the next key (first key of bucket b + 1) lies in a later row.
  const bool movable =
      s.multi_row && (!has_next || key_row(pairs.key((b + 1) * uint64_t(pairs.bucket_size)), c) != key_row(rep, c));
  const bool at_end = kc.x == static_cast<uint32_t>(x_max);
  const bool needs_rep = !duplicate || (movable && !at_end);  // line 13
  const int64_t x = movable ? x_max : kc.x;                   // line 17
  // Alone in its row: placed at x_max and the row's first representative (no earlier triangle in the row, no
  // later representative, no row-end triangle since it sits at x_max itself). Line 18, generalised.
  const bool flip = s.multi_row && needs_rep && x == x_max && first_in_row;
  if (needs_rep) any_axis_triangle(slot_position(x, kc.y, kc.z, c), c, flip, v + 3 * b);
  else inactive_triangle(v + 3 * b);
  if (s.multi_row) {  // line 14 (and not when rep already ends its row at x_max)
    Vec3* t = v + 3 * s.row_marker_slot(b);
    if (last_in_row && !movable && !at_end) any_axis_triangle(slot_position(x_max, kc.y, kc.z, c), c, false, t);
    else inactive_triangle(t);
  }
  if (s.multi_plane) {  // line 15; a plane end is alone in its row y_max: flipped
    Vec3* t = v + 3 * s.plane_marker_slot(b);
    if (last_in_plane && kc.y != static_cast<uint32_t>(y_max))
      any_axis_triangle(slot_position(x_max, y_max, kc.z, c), c, true, t);
    else inactive_triangle(t);
  }
  if (b == 0) inactive_triangle(v + 3 * s.region_slots());  // the representation's tag slot
}

// ---- The ray search (see the top of this file) ------------------------------------------------------------
constexpr uint32_t kRayMiss = 0xFFFFFFFFu;

// What the last ray found: the primitive index (slot) of its closest hit or kRayMiss, and whether that hit
// was a back face (OptiX: optixIsTriangleBackFaceHit; Embree: Ng along the ray direction).
struct RayHit {
  uint32_t prim;
  uint32_t back_face;
};

enum class RayStage : uint32_t {
  Start = 0,      // nothing fired yet
  SameRow = 1,    // the x-ray through the key's row is out
  NextRow = 2,    // the y-ray from the next row of the key's plane
  NextPlane = 3,  // the z-ray from the next plane
  PlaneRows = 4,  // the y-ray through the found plane from row 0 (optimized only)
  RowStart = 5,   // the x-ray through the found row from x = 0 (optimized only)
  Done = 6,       // `bucket` holds the answer (kNoBucket: none)
};

struct RaySearch {
  uint64_t key;
  uint64_t bucket;
  uint32_t stage;  // RayStage
};

// What the search reads: the representatives (m of them), the scene's shape and its key mapping.
struct SceneView {
  const uint64_t* reps;
  SceneShape shape;
  SceneConfig config;
};

RTX_HD RaySearch ray_search_start(uint64_t key) {
  return RaySearch{key, kNoBucket, static_cast<uint32_t>(RayStage::Start)};
}

namespace detail {

RTX_HD bool finish(RaySearch& s, uint64_t bucket) {
  s.bucket = bucket;
  s.stage = static_cast<uint32_t>(RayStage::Done);
  return false;
}

RTX_HD bool fire(RaySearch& s, RayStage stage, const Ray& r, Ray& out) {
  s.stage = static_cast<uint32_t>(stage);
  out = r;
  return true;
}

// Step 3 (both representations), or "none" where there is no next plane.
RTX_HD bool next_plane(const SceneView& v, RaySearch& s, Ray& out) {
  const KeyCoords kc = key_coords(s.key, v.config);
  if (!v.shape.multi_plane || kc.z >= axis_mask(v.config.bits_z)) return finish(s, kNoBucket);
  const int64_t x = v.shape.optimized() ? static_cast<int64_t>(axis_mask(v.config.bits_x)) : -1;
  const int64_t y = v.shape.optimized() ? static_cast<int64_t>(axis_mask(v.config.bits_y)) : -1;
  return fire(s, RayStage::NextPlane, cgrx_z_ray(x, y, int64_t(kc.z) + 1, v.config), out);
}

// Step 2 (both representations), or step 3 where there is no next row in the key's plane.
RTX_HD bool next_row(const SceneView& v, RaySearch& s, Ray& out) {
  const KeyCoords kc = key_coords(s.key, v.config);
  if (!v.shape.multi_row || kc.y >= axis_mask(v.config.bits_y)) return next_plane(v, s, out);
  const int64_t x = v.shape.optimized() ? static_cast<int64_t>(axis_mask(v.config.bits_x)) : -1;
  return fire(s, RayStage::NextRow, cgrx_y_ray(x, int64_t(kc.y) + 1, kc.z, v.config), out);
}

// Optimized, a y-ray (step 2, or the one through a found plane) met the end triangle of row y'.
RTX_HD bool row_end_hit(const SceneView& v, RaySearch& s, RayHit h, Ray& out) {
  if (h.back_face) return finish(s, v.shape.bucket_of_primitive(h.prim));  // alone in its row: flipped
  const uint64_t b = h.prim % v.shape.num_buckets;  // a bucket of row y' (plane ends are never front faces)
  const uint64_t row = key_row(v.reps[b], v.config);
  if (b == 0 || key_row(v.reps[b - 1], v.config) != row) return finish(s, b);  // b is the row's first bucket
  const KeyCoords rc = key_coords(v.reps[b], v.config);
  return fire(s, RayStage::RowStart, cgrx_x_ray(0, rc.y, rc.z, v.config), out);
}

}  // namespace detail

// Advances the search of s.key by the result `h` of the ray fired last (ignored at the start). Returns true
// with the next ray to trace in `out`, or false when the search is over: s.bucket is then the bucket of the
// first representative >= s.key, or kNoBucket. Requires reps[0] < key <= reps[m - 1] for an answer (smaller
// and larger keys are decided before tracing); fires at most three (naive) or five (optimized) rays.
RTX_HD bool ray_search_step(const SceneView& v, RaySearch& s, RayHit h, Ray& out) {
  using namespace detail;
  const SceneShape& shape = v.shape;
  const bool hit = h.prim != kRayMiss;
  switch (static_cast<RayStage>(s.stage)) {
    case RayStage::Start: {
      const KeyCoords kc = key_coords(s.key, v.config);
      return fire(s, RayStage::SameRow, cgrx_x_ray(kc.x, kc.y, kc.z, v.config), out);
    }
    case RayStage::SameRow: {
      if (!hit) return next_row(v, s, out);
      uint64_t b = shape.bucket_of_primitive(h.prim);
      // Optimized: a representative moved to x_max answers keys above its own key with the next bucket.
      if (shape.optimized() && h.prim < shape.num_buckets && v.reps[b] < s.key) b += 1;
      return finish(s, b);
    }
    case RayStage::NextRow:
      if (!hit) return next_plane(v, s, out);
      if (!shape.optimized()) return finish(s, shape.bucket_of_primitive(h.prim));
      return row_end_hit(v, s, h, out);
    case RayStage::NextPlane: {
      if (!hit) return finish(s, kNoBucket);
      if (!shape.optimized()) return finish(s, shape.bucket_of_primitive(h.prim));
      const uint64_t b = h.prim % shape.num_buckets;  // a bucket of the plane found
      const uint32_t z = plane_of(v.reps[b], v.config);
      if (b == 0 || plane_of(v.reps[b - 1], v.config) != z) return finish(s, b);  // the plane's first bucket
      return fire(s, RayStage::PlaneRows, cgrx_y_ray(static_cast<int64_t>(axis_mask(v.config.bits_x)), 0, z, v.config),
                  out);
    }
    case RayStage::PlaneRows:
      if (!hit) return finish(s, kNoBucket);
      return row_end_hit(v, s, h, out);
    case RayStage::RowStart:
      return finish(s, hit ? shape.bucket_of_primitive(h.prim) : kNoBucket);
    default:
      return false;
  }
}

}  // namespace rtindex::cgrx
