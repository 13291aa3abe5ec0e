// Argument unpacking of the update operators, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include "../core/checks.h"
#include "cgrx_nodes.h"
#include "cgrx_update.h"

namespace rtindex::cgrx::update {

struct Batch {
  const uint64_t* del_keys;
  const uint32_t* del_rows;
  const int64_t* del_offsets;
  const uint64_t* ins_keys;
  const uint32_t* ins_rows;
  const int64_t* ins_offsets;

  RTX_HD BucketBatch bucket(uint64_t b) const {
    BucketBatch bb;
    bb.del_keys = del_keys + del_offsets[b];
    bb.del_rows = del_rows ? del_rows + del_offsets[b] : nullptr;
    bb.del_count = static_cast<uint64_t>(del_offsets[b + 1] - del_offsets[b]);
    bb.ins_keys = ins_keys + ins_offsets[b];
    bb.ins_rows = ins_rows + ins_offsets[b];
    bb.ins_count = static_cast<uint64_t>(ins_offsets[b + 1] - ins_offsets[b]);
    return bb;
  }
};

inline Nodes nodes_view(const at::Tensor& nodes, int64_t node_size, int64_t m) {
  check_node_size(node_size);
  TORCH_CHECK(nodes.dim() == 1 && nodes.scalar_type() == at::kInt && nodes.is_contiguous() &&
                  nodes.numel() % node_words(static_cast<uint32_t>(node_size)) == 0 &&
                  nodes.numel() / node_words(static_cast<uint32_t>(node_size)) >= m,
              "nodes must be the int32 node region of an updatable cgRX index");
  return Nodes{reinterpret_cast<uint32_t*>(nodes.data_ptr<int32_t>()), static_cast<uint32_t>(node_size),
               static_cast<uint64_t>(m)};
}

// The first reserved node of every bucket (the caller's prefix sum over the plan's reservations).
inline void check_first_new(const at::Tensor& first_new, int64_t m, const at::Tensor& nodes) {
  TORCH_CHECK(first_new.dim() == 1 && first_new.scalar_type() == at::kLong && first_new.numel() == m &&
                  first_new.is_contiguous(),
              "first_new must be int64 with one entry per bucket");
  check_same_device(first_new, nodes, "first_new", "the index");
}

inline Batch batch_view(const at::Tensor& nodes, const at::Tensor& del_keys, const c10::optional<at::Tensor>& del_rows,
                        const at::Tensor& del_offsets, const at::Tensor& ins_keys, const at::Tensor& ins_rows,
                        const at::Tensor& ins_offsets) {
  check_ordered_keys(del_keys, "delete keys");
  check_ordered_keys(ins_keys, "insert keys");
  TORCH_CHECK(ins_rows.scalar_type() == at::kInt && ins_rows.numel() == ins_keys.numel() && ins_rows.is_contiguous(),
              "insert rows must be int32, one per insert key");
  if (del_rows.has_value())
    TORCH_CHECK(del_rows->scalar_type() == at::kInt && del_rows->numel() == del_keys.numel() && del_rows->is_contiguous(),
                "delete rows must be int32, one per delete key");
  TORCH_CHECK(del_offsets.scalar_type() == at::kLong && ins_offsets.scalar_type() == at::kLong &&
                  del_offsets.numel() == ins_offsets.numel() && del_offsets.numel() >= 2,
              "batch offsets must be int64 with one entry per bucket plus one");
  for (const at::Tensor* t : {&del_keys, &ins_keys, &ins_rows, &del_offsets, &ins_offsets})
    check_same_device(*t, nodes, "an update argument", "the index");
  Batch b;
  b.del_keys = reinterpret_cast<const uint64_t*>(del_keys.data_ptr<int64_t>());
  b.del_rows = del_rows.has_value() ? reinterpret_cast<const uint32_t*>(del_rows->data_ptr<int32_t>()) : nullptr;
  b.del_offsets = del_offsets.data_ptr<int64_t>();
  b.ins_keys = reinterpret_cast<const uint64_t*>(ins_keys.data_ptr<int64_t>());
  b.ins_rows = reinterpret_cast<const uint32_t*>(ins_rows.data_ptr<int32_t>());
  b.ins_offsets = ins_offsets.data_ptr<int64_t>();
  return b;
}

}  // namespace rtindex::cgrx::update
