// The RX index's typed configuration, one `int config` argument of every RX lookup operator (core/config.h).
// torch_rtindex/_config.py packs it by the table below, which it checks against config_schema() at import.
#pragma once

#include <ATen/ATen.h>

#include "../core/checks.h"
#include "../core/config.h"
#include "../core/key_dispatch.h"

namespace rtindex {

struct RxConfig {
  KeyType key_type;  // of the queries
  bool unique_keys;
  int64_t max_range_rays;
  SceneConfig scene;
};
enum RxField : size_t { kRxKeyType, kRxUniqueKeys, kRxScene, kRxMaxRangeRays = kRxScene + kSceneFieldCount };
constexpr ConfigField kRxConfigFields[] = {{"key_type", 3},   {"unique_keys", 1}, kSceneFields[0], kSceneFields[1],
                                           kSceneFields[2],   kSceneFields[3],    {"max_range_rays", 31}};
static_assert(sizeof(kRxConfigFields) / sizeof(ConfigField) == kRxMaxRangeRays + 1, "field table and enum differ");
static_assert(config_bits(kRxConfigFields) <= 63, "an RX config must fit a non-negative int64");

inline RxConfig rx_config(int64_t packed) {
  const auto f = unpack_config(packed, kRxConfigFields, "an RX config");
  TORCH_CHECK(f[kRxMaxRangeRays] >= 1, "max_range_rays must be at least 1");
  return RxConfig{key_type_from_int(f[kRxKeyType]), f[kRxUniqueKeys] != 0, f[kRxMaxRangeRays],
                  scene_from_fields(&f[kRxScene])};
}

}  // namespace rtindex
