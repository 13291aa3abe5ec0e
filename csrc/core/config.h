// An index's typed configuration as one int64 operator argument: named fields of fixed bit widths, packed from
// the lowest bit up. One scalar argument, because an `int[]` costs the Python -> dispatcher path a list
// conversion on every lookup call (benchmarks/results/README.md). The field tables below are the only
// statement of each layout: the unpacking here and config_schema() (which torch_rtindex/_config.py checks at
// import, and packs by) both read them.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstddef>
#include <string>

#include "scene.h"

namespace rtindex {

struct ConfigField {
  const char* name;
  int bits;
};

// The scene's fields in every index's configuration; bits_z is implied (the axes' bits add up to 64).
constexpr ConfigField kSceneFields[] = {{"scene_bits_x", 5}, {"scene_bits_y", 5}, {"scene_scale_y_log2", 6},
                                        {"scene_scale_z_log2", 6}};
constexpr size_t kSceneFieldCount = sizeof(kSceneFields) / sizeof(kSceneFields[0]);

// A configuration's total width: at most 63 bits, so that the packed value is a non-negative int64.
template <size_t N>
constexpr int config_bits(const ConfigField (&fields)[N]) {
  int bits = 0;
  for (size_t i = 0; i < N; ++i) bits += fields[i].bits;
  return bits;
}

// A configuration's fields unpacked, in table order.
template <size_t N>
std::array<int64_t, N> unpack_config(int64_t packed, const ConfigField (&fields)[N], const char* what) {
  TORCH_CHECK(packed >= 0, what, " must be a non-negative packed configuration, got ", packed);
  uint64_t v = static_cast<uint64_t>(packed);
  std::array<int64_t, N> out{};
  for (size_t i = 0; i < N; ++i) {
    out[i] = static_cast<int64_t>(v & ((uint64_t(1) << fields[i].bits) - 1));
    v >>= fields[i].bits;
  }
  TORCH_CHECK(v == 0, what, " has bits set past its last field (", packed,
              "): pack it with torch_rtindex._config, whose layout is config_schema()'s");
  return out;
}

template <size_t N>
std::string config_fields_schema(const ConfigField (&fields)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += (i ? "," : "") + std::string(fields[i].name) + ":" + std::to_string(fields[i].bits);
  return s;
}

// The scene fields starting at f[0] (kSceneFields order), checked.
inline SceneConfig scene_from_fields(const int64_t* f) {
  SceneConfig c{};
  c.bits_x = static_cast<int32_t>(f[0]);
  c.bits_y = static_cast<int32_t>(f[1]);
  c.bits_z = 64 - c.bits_x - c.bits_y;
  c.scale_y_log2 = static_cast<int32_t>(f[2]);
  c.scale_z_log2 = static_cast<int32_t>(f[3]);
  const char* err = scene_config_error(c);
  TORCH_CHECK(err == nullptr, "invalid scene configuration: ", err ? err : "");
  return c;
}

}  // namespace rtindex
