// An index's typed configuration as one int64 operator argument: named fields of fixed bit widths, packed from
// the lowest bit up. One scalar argument, because an `int[]` costs the Python -> dispatcher path a list
// conversion on every lookup call (benchmarks/results/README.md). The field tables below are the only
// statement of each layout: the unpacking here and config_schema() (which torch_rtindex/_config.py checks at
// import, and packs by) both read them.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cctype>
#include <cstddef>
#include <string>
#include <utility>

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

// ---- Enum export: config_schema() states each C++ enum by the names its definition gives (no list of names written
// twice); torch_rtindex/_config.py checks the Python spelling against it at import.

// The compiler's spelling of the template argument V inside its own signature (GCC and Clang alike): "... V =
// ns::E::Name]" where V is an enumerator of E, "... V = (ns::E)7]" where it names none.
template <typename E, E V>
const char* enum_probe() {
  return __PRETTY_FUNCTION__;
}

// The enumerator a probe names, in snake case ("BinarySearch" -> "binary_search", "OptiX" -> "optix", "UInt64" ->
// "uint64"); "" where it names none (or a compiler spells probes otherwise: the import check then says so).
inline std::string enumerator_name(const std::string& probe) {
  const size_t at = probe.rfind("V = ");
  if (at == std::string::npos) return "";
  std::string arg = probe.substr(at + 4, probe.find_first_of("];", at) - at - 4);
  if (arg.empty() || arg[0] == '(') return "";
  arg = arg.substr(arg.rfind("::") + 2);  // npos + 2 == 0: an unqualified name stays whole
  std::string name;
  for (size_t i = 0; i < arg.size(); ++i) {
    const auto c = static_cast<unsigned char>(arg[i]);
    // A word starts at a capital between lower-case letters: an acronym's capitals stay one word.
    if (i > 0 && i + 1 < arg.size() && std::isupper(c) && std::islower(static_cast<unsigned char>(arg[i - 1])) &&
        std::islower(static_cast<unsigned char>(arg[i + 1])))
      name += '_';
    name += static_cast<char>(std::tolower(c));
  }
  return name;
}

template <typename E, int64_t... V>
std::string enum_schema(std::integer_sequence<int64_t, V...>) {
  const char* probes[] = {enum_probe<E, static_cast<E>(V)>()...};
  std::string s;
  for (size_t v = 0; v < sizeof...(V); ++v) {
    const std::string name = enumerator_name(probes[v]);
    if (!name.empty()) s += (s.empty() ? "" : ",") + name + "=" + std::to_string(v);
  }
  return s;
}

// "name=value,..." for every enumerator of E valued 0 .. 15 (the configuration fields are narrower).
template <typename E>
std::string enum_schema() {
  return enum_schema<E>(std::make_integer_sequence<int64_t, 16>{});
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
