// The geometry shared by every index: how an ordered 64-bit key becomes a point in 3D, the triangle that
// stands for a key, and the rays a lookup fires. CPU reference, CUDA kernels and OptiX programs all call
// these functions, and the Embree scene test checks them against an independent ray tracer.
//
// Exactness (the reason for every constant below). A key is split into integer parts x, y, z of at most 23
// bits each; every integer below 2^24 is a float32, and so is every half-integer below 2^23. A part p on an
// axis with scale 2^s sits at coordinate p * 2^s, and triangle corners and ray ends sit half a slot away,
// at (p +- 1/2) * 2^s: all exactly representable for every p < 2^23, i.e. for every 64-bit key. Vertices,
// ray origins and ray extents are therefore exact, and every hit lies at least a quarter slot inside its
// triangle, so float32 rounding inside a ray/triangle test cannot move a hit across a key boundary.
#pragma once

#include <cstdint>

#include "keys.h"

namespace rtindex {

struct Vec3 {
  float x, y, z;
};

struct Ray {
  Vec3 origin;
  Vec3 direction;
  float tmin, tmax;
};

// How keys are laid out in the scene. bits_* split the 64 key bits (x takes the lowest); scale_*_log2 are the
// per-axis scale factors (0 for RX; cgRX's "scaled mapping" stretches y and z so the BVH builder groups
// along x). Passed through the operator schemas as an int[5] in this order.
// A plain aggregate (no default member initializers) so that it can sit in OptiX's __constant__ params.
struct SceneConfig {
  int32_t bits_x, bits_y, bits_z;
  int32_t scale_y_log2, scale_z_log2;
};

constexpr int kSceneConfigLength = 5;
constexpr int kMaxAxisBits = 23;  // half-integers are exact in float32 only below 2^23

// Returns nullptr when the configuration is valid, otherwise what is wrong with it.
inline const char* scene_config_error(const SceneConfig& c) {
  if (c.bits_x < 1 || c.bits_y < 0 || c.bits_z < 0 || c.bits_x > kMaxAxisBits || c.bits_y > kMaxAxisBits ||
      c.bits_z > kMaxAxisBits)
    return "each axis takes at most 23 key bits (x at least 1), so that every coordinate is exact in float32";
  if (c.bits_x + c.bits_y + c.bits_z != 64) return "the three axis bit counts must add up to 64";
  if (c.scale_y_log2 < 0 || c.scale_z_log2 < 0 || c.scale_y_log2 > 60 || c.scale_z_log2 > 60)
    return "axis scales are powers of two 2^0 .. 2^60";
  return nullptr;
}

struct KeyCoords {
  uint32_t x, y, z;
};

RTX_HD uint64_t axis_mask(int bits) { return bits >= 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1); }

RTX_HD KeyCoords key_coords(uint64_t key, const SceneConfig& c) {
  KeyCoords k;
  k.x = static_cast<uint32_t>(key & axis_mask(c.bits_x));
  k.y = static_cast<uint32_t>((key >> c.bits_x) & axis_mask(c.bits_y));
  k.z = static_cast<uint32_t>(c.bits_x + c.bits_y >= 64 ? 0 : (key >> (c.bits_x + c.bits_y)));
  return k;
}

// A "row" is every key that shares y and z: the keys a ray along x can reach.
RTX_HD uint64_t key_row(uint64_t key, const SceneConfig& c) { return key >> c.bits_x; }

RTX_HD float pow2f(int e) {
  // ldexpf is not constexpr-friendly on every compiler; powers of two are built from their bits instead.
  return bit_cast_value<float>(static_cast<uint32_t>(127 + e) << 23);
}

RTX_HD Vec3 key_position(KeyCoords k, const SceneConfig& c) {
  return Vec3{static_cast<float>(k.x), static_cast<float>(k.y) * pow2f(c.scale_y_log2),
              static_cast<float>(k.z) * pow2f(c.scale_z_log2)};
}

// Half a slot on each axis.
RTX_HD Vec3 half_slot(const SceneConfig& c) {
  return Vec3{0.5f, pow2f(c.scale_y_log2 - 1), pow2f(c.scale_z_log2 - 1)};
}

// The triangle that stands for one key. In slot units around the key's position P it spans
//   A = P + (-1/2, -1/2, +1/2),  B = P + (+1/2, -1/2, -1/2),  C = P + (0, +1/2, 0),
// a triangle in the plane (X - x) + (Z - z) = 0 that is tilted against every axis ray it must answer:
// a ray along +z through (x, y) meets it at P (point lookups), and a ray along +x through (y, z) meets it
// at P (range lookups). In the plane's own parameters (a along (1,0,-1), b along y) P is (0, 0), at
// least 0.22 slot from every edge; any other key's triangle is met at |a| >= 1 or |b| >= 1, outside.
RTX_HD void key_triangle(uint64_t key, const SceneConfig& c, Vec3 out[3]) {
  const Vec3 p = key_position(key_coords(key, c), c);
  const Vec3 h = half_slot(c);
  out[0] = Vec3{p.x - h.x, p.y - h.y, p.z + h.z};
  out[1] = Vec3{p.x + h.x, p.y - h.y, p.z - h.z};
  out[2] = Vec3{p.x, p.y + h.y, p.z};
}

// Point lookup: a short ray along +z through (x, y), from half a slot below the key's plane to half a
// slot above it (the paper's "perpendicular" ray: it can meet no other slot's triangle).
RTX_HD Ray point_ray(uint64_t key, const SceneConfig& c) {
  const Vec3 p = key_position(key_coords(key, c), c);
  const Vec3 h = half_slot(c);
  return Ray{Vec3{p.x, p.y, p.z - h.z}, Vec3{0.f, 0.f, 1.f}, 0.f, 2.f * h.z};
}

// A range lookup [lo, hi] covers one or more rows; it is cut into segments, each within one row and at most
// 2^21 slots long, and each segment is one ray. Why the length limit: OptiX computes a hit's distance along
// the ray to about one float32 ulp, and at 2^22 slots and beyond that is half a slot or more, the distance
// between a hit and the ray's end (seen on an H100: rays along a whole 23-bit row missed about 40% of the
// triangles in the row's last slot). Within 2^21 slots the error stays at a quarter slot or less, inside the
// half-slot margin every hit has. A full row therefore takes four rays.
constexpr int kMaxSegmentLog2 = 21;

struct RowSegment {
  uint64_t row;
  uint32_t x_first, x_last;
};

RTX_HD int segment_log2(const SceneConfig& c) { return c.bits_x < kMaxSegmentLog2 ? c.bits_x : kMaxSegmentLog2; }

// Number of segments (= rays) of [lo, hi]: the aligned blocks of 2^segment_log2 keys it touches (a block never
// crosses a row, because rows are aligned blocks of 2^bits_x keys). 0 for an empty range (lo > hi).
RTX_HD uint64_t range_segment_count(uint64_t lo, uint64_t hi, const SceneConfig& c) {
  if (lo > hi) return 0;
  const int b = segment_log2(c);
  return (hi >> b) - (lo >> b) + 1;
}

RTX_HD RowSegment range_segment(uint64_t lo, uint64_t hi, uint64_t i, const SceneConfig& c) {
  const int b = segment_log2(c);
  const uint64_t block = (lo >> b) + i;
  const uint64_t first = block == (lo >> b) ? lo : block << b;
  const uint64_t last = block == (hi >> b) ? hi : (block << b) | axis_mask(b);
  RowSegment s;
  s.row = key_row(first, c);
  s.x_first = static_cast<uint32_t>(first & axis_mask(c.bits_x));
  s.x_last = static_cast<uint32_t>(last & axis_mask(c.bits_x));
  return s;
}

// The keys a segment covers, as an ordered-key interval (used by the CPU path, which has no rays).
RTX_HD uint64_t segment_first_key(const RowSegment& s, const SceneConfig& c) {
  return (s.row << c.bits_x) | s.x_first;
}
RTX_HD uint64_t segment_last_key(const RowSegment& s, const SceneConfig& c) {
  return (s.row << c.bits_x) | s.x_last;
}

// Range lookup within one row: a ray along +x at the row's (y, z), from half a slot before x_first to half
// a slot after x_last ("parallel from offset"). Hits lie at t = x - x_first + 1/2.
RTX_HD Ray segment_ray(const RowSegment& s, const SceneConfig& c) {
  const Vec3 p = key_position(key_coords(segment_first_key(s, c), c), c);
  return Ray{Vec3{p.x - 0.5f, p.y, p.z}, Vec3{1.f, 0.f, 0.f}, 0.f,
             static_cast<float>(s.x_last - s.x_first) + 1.0f};
}

}  // namespace rtindex

namespace rtindex {

// ---- cgRX: triangles that rays along any axis can meet ---------------------------------------------------
// A representative is found by closest-hit rays along x (its row), y (the rows' end or start markers) and z
// (the planes' markers), so its triangle must face all three axes. In slot units around P:
//   A = P + (1/2, -1/2, 0),  B = P + (0, 1/2, -1/2),  C = P + (-1/2, 0, 1/2)
// lies in the plane a + b + c = 0 with P as its centroid; its shadow along each axis stays inside the open
// half-slot box around P (no other slot's ray can meet it) and holds P at least 0.2 slot from every edge.
// Slot coordinates may be -1 (the naive markers' column/row) or the axis's last slot (2^bits - 1, the
// optimized markers'): both exact in float32, and so are their corners at +-1/2 slot.
RTX_HD Vec3 slot_position(int64_t x, int64_t y, int64_t z, const SceneConfig& c) {
  return Vec3{static_cast<float>(x), static_cast<float>(y) * pow2f(c.scale_y_log2),
              static_cast<float>(z) * pow2f(c.scale_z_log2)};
}

// Winding. OptiX and Embree both take N = (v1 - v0) x (v2 - v0) (counter-clockwise in a right-handed frame)
// as the triangle's front normal: a ray meets the front face when its direction points against N (OptiX
// reports OPTIX_HIT_KIND_TRIANGLE_FRONT_FACE, Embree's Ng is this N), the back face when it points along N.
// For the corners above, (B - A) x (C - A) = (3 hy hz, 3 hx hz, 3 hx hy) points along +x, +y and +z at once,
// so the vertex order A, C, B (N against every axis) makes every ray along +x, +y or +z meet the FRONT face,
// and `flip` (order A, B, C) makes every such ray meet the BACK face: the optimized representation's
// "flipped" triangles (cgrx_scene.h) are recognised by any axis ray as back-face hits.
RTX_HD void any_axis_triangle(Vec3 p, const SceneConfig& c, bool flip, Vec3 out[3]) {
  const Vec3 h = half_slot(c);
  const Vec3 a{p.x + h.x, p.y - h.y, p.z};
  const Vec3 b{p.x, p.y + h.y, p.z - h.z};
  const Vec3 d{p.x - h.x, p.y, p.z + h.z};
  out[0] = a;
  out[1] = flip ? b : d;
  out[2] = flip ? d : b;
}

// A slot of the vertex buffer that holds no triangle: OptiX (and Embree) treat NaN triangles as inactive.
RTX_HD void inactive_triangle(Vec3 out[3]) {
  const float nan = bit_cast_value<float>(0x7FC00000u);
  for (int i = 0; i < 3; ++i) out[i] = Vec3{nan, nan, nan};
}

// The axis rays of a cgRX search. Each starts half a slot before its first slot, so it meets exactly the
// triangles centred on its line from that slot on (origins are (integer - 1/2) * 2^s, exact in float32 like the
// triangles' corners). It does not stop half a slot after the axis's last slot but runs on to twice the axis's
// length (an exact power of two): no triangle lies on its line beyond the last slot, and a hit in the last slot
// must not depend on the computed hit distance staying below an extent only half a slot further. OptiX rounds
// that distance to about one float32 ulp, which near 2^23 slots is half a slot: with the tight extent, a ray
// along a 23-bit x axis missed about 40% of the triangles in the last slot x = 2^23 - 1 (seen on an H100).
// Along +x in row (y, z), from slot x_from.
RTX_HD Ray cgrx_x_ray(int64_t x_from, int64_t y, int64_t z, const SceneConfig& c) {
  const Vec3 p = slot_position(x_from, y, z, c);
  return Ray{Vec3{p.x - 0.5f, p.y, p.z}, Vec3{1.f, 0.f, 0.f}, 0.f, pow2f(c.bits_x + 1)};
}

// Along +y in column x of plane z, from row y_from.
RTX_HD Ray cgrx_y_ray(int64_t x, int64_t y_from, int64_t z, const SceneConfig& c) {
  const Vec3 p = slot_position(x, y_from, z, c);
  return Ray{Vec3{p.x, p.y - half_slot(c).y, p.z}, Vec3{0.f, 1.f, 0.f}, 0.f, pow2f(c.bits_y + 1 + c.scale_y_log2)};
}

// Along +z through (x, y), from plane z_from.
RTX_HD Ray cgrx_z_ray(int64_t x, int64_t y, int64_t z_from, const SceneConfig& c) {
  const Vec3 p = slot_position(x, y, z_from, c);
  return Ray{Vec3{p.x, p.y, p.z - half_slot(c).z}, Vec3{0.f, 0.f, 1.f}, 0.f, pow2f(c.bits_z + 1 + c.scale_z_log2)};
}

}  // namespace rtindex
