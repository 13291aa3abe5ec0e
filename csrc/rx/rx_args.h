// The RX index's typed configuration, one `int[] config` argument of every RX lookup operator:
// [key_type, unique_keys, max_range_rays, scene x5]. torch_rtindex/_config.py mirrors the field order and checks
// it against config_schema() at import.
#pragma once

#include <ATen/ATen.h>

#include "../core/checks.h"
#include "../core/key_dispatch.h"

namespace rtindex {

struct RxConfig {
  KeyType key_type;  // of the queries
  bool unique_keys;
  int64_t max_range_rays;
  SceneConfig scene;
};
constexpr int64_t kRxConfigLength = 3 + kSceneConfigLength;

inline RxConfig rx_config(at::IntArrayRef c) {
  TORCH_CHECK(static_cast<int64_t>(c.size()) == kRxConfigLength, "an RX config has ", kRxConfigLength,
              " entries [key_type, unique_keys, max_range_rays, scene x5], got ", c.size());
  TORCH_CHECK(c[2] >= 1, "max_range_rays must be at least 1");
  return RxConfig{key_type_from_int(c[0]), c[1] != 0, c[2], scene_from_list(c.slice(3))};
}

}  // namespace rtindex
