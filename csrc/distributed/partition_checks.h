// Argument checks of the sharded-index routing operators and their outputs' shapes, shared by the CPU and CUDA
// kernels.
#pragma once

#include <ATen/ATen.h>

#include <limits>
#include <tuple>

#include "../core/checks.h"

namespace rtindex {

// The CUDA kernel keeps the splitters and one counter per bucket in shared memory.
constexpr int64_t kMaxPartitionBuckets = 2048;
// partition_padded's header columns before each owner's keys (the owner's query count, the sender's overflow
// flag, the sender's routing status) and their number. Exported by config_schema() (ops.cpp); the PADDED_*
// constants of torch_rtindex/_config.py are checked against them at import.
constexpr int64_t kPaddedCount = 0;
constexpr int64_t kPaddedOverflow = 1;
constexpr int64_t kPaddedStatus = 2;
constexpr int64_t kPaddedHeader = 3;

inline void check_partition_args(const at::Tensor& queries, int64_t key_type, const at::Tensor& splitters,
                                 int64_t chunks, int64_t skip = -1) {
  TORCH_CHECK(queries.dim() == 1, "queries must be a 1-D tensor, got ", queries.dim(), " dimensions");
  const KeyType t = key_type_from_int(key_type);
  TORCH_CHECK(dtype_holds(queries.scalar_type(), t), "queries have dtype ", queries.scalar_type(),
              " but the index holds ", key_type_name(t), " keys");
  check_ordered_keys(splitters, "splitters");
  check_same_device(queries, splitters, "queries", "splitters");
  TORCH_CHECK(chunks >= 1, "chunks must be positive, got ", chunks);
  TORCH_CHECK(skip >= -1 && skip <= splitters.numel(), "skip must be -1 (none) or an owner in 0 .. ",
              splitters.numel(), ", got ", skip);
  // chunk_of computes i * chunks in 64 bits.
  TORCH_CHECK(queries.numel() <= std::numeric_limits<int64_t>::max() / chunks, "too many queries (", queries.numel(), ") for ", chunks,
              " chunks");
}

inline void check_padded_args(const at::Tensor& queries, int64_t key_type, const at::Tensor& splitters,
                              int64_t capacity) {
  check_partition_args(queries, key_type, splitters, 1);
  TORCH_CHECK(capacity >= 0, "capacity must be non-negative, got ", capacity);
  TORCH_CHECK(capacity <= std::numeric_limits<int64_t>::max() / (splitters.numel() + 1) - kPaddedHeader,
              "capacity ", capacity, " times ", splitters.numel() + 1, " owners does not fit in 64 bits");
}

inline void check_gather_args(const at::Tensor& answers, const at::Tensor& slots, const at::Tensor& received) {
  TORCH_CHECK(answers.dim() == 2 && answers.size(1) == 2 && answers.scalar_type() == at::kLong,
              "answers must be an int64 tensor [m, 2], got ", answers.scalar_type(), " ", answers.sizes());
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong, "slots must be a 1-D int64 tensor");
  TORCH_CHECK(received.dim() == 2 && received.size(1) >= kPaddedHeader && received.scalar_type() == at::kLong,
              "received must be the int64 padded blocks [owners, ", kPaddedHeader, " + capacity], got ",
              received.scalar_type(), " ", received.sizes());
  check_same_device(answers, slots, "answers", "slots");
  check_same_device(answers, received, "answers", "received");
}

// The two answer columns (first row or count, count or sum bits) a call returns, n each.
inline std::tuple<at::Tensor, at::Tensor> answer_columns(int64_t n, const at::TensorOptions& options) {
  return {at::empty({n}, options), at::empty({n}, options)};
}

// scatter_answers_into: m answer rows into two int64 output columns of one length n >= m.
inline void check_answers_into(const at::Tensor& answers, const at::Tensor& positions, const at::Tensor& first,
                               const at::Tensor& second) {
  TORCH_CHECK(answers.dim() == 2 && answers.size(1) == 2 && answers.scalar_type() == at::kLong,
              "answers must be an int64 tensor [m, 2], got ", answers.scalar_type(), " ", answers.sizes());
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong && positions.numel() == answers.size(0),
              "positions must be an int64 tensor with one entry per answer");
  for (const at::Tensor* t : {&first, &second}) {
    TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kLong && t->is_contiguous(),
                "first and second must be contiguous 1-D int64 tensors");
    check_same_device(answers, *t, "answers", "an output column");
  }
  TORCH_CHECK(first.numel() == second.numel(), "first and second must have one length, got ", first.numel(), " and ",
              second.numel());
  check_same_device(answers, positions, "answers", "positions");
}

inline void check_global_rows_args(const at::Tensor& local, const at::Tensor& local_to_global) {
  TORCH_CHECK(local.dim() == 1 && local.scalar_type() == at::kLong, "local must be a 1-D int64 tensor");
  TORCH_CHECK(local_to_global.dim() == 1 && (local_to_global.scalar_type() == at::kLong ||
                                             local_to_global.scalar_type() == at::kInt),
              "local_to_global must be a 1-D int32 (unsigned offsets) or int64 tensor");
  check_same_device(local, local_to_global, "local", "local_to_global");
}

inline void check_pack_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& local_to_global) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1 && a.numel() == b.numel(), "a and b must be 1-D of one length");
  TORCH_CHECK(a.scalar_type() == at::kLong, "a must be int64, got ", a.scalar_type());
  TORCH_CHECK(b.scalar_type() == at::kLong || b.scalar_type() == at::kInt, "b must be int64 or int32, got ",
              b.scalar_type());
  TORCH_CHECK(local_to_global.dim() == 1 && local_to_global.scalar_type() == at::kLong,
              "local_to_global must be a 1-D int64 tensor");
  check_same_device(a, b, "a", "b");
  check_same_device(a, local_to_global, "a", "local_to_global");
}

}  // namespace rtindex
