// The three result forms on CUDA, written once over an index's launcher: anything with a `ResultParams
// results` member reachable as `launcher.p.results` and a `run(ResultMode)` that answers every query.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>

#include <tuple>

#include "checks.h"
#include "results_device.h"

namespace rtindex::cuda_results {

// One answer per query, from PyTorch's caching allocator as at::empty's CUDA kernel takes it, without the
// dispatcher's round trip to that kernel: at small batches the point forms' allocations cost as much as the launch.
inline at::Tensor per_query(int64_t q, const at::TensorOptions& opts) { return at::detail::empty_cuda({q}, opts); }

// `empty_index`: nothing to launch; every query is a miss.
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor> first_and_count(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  if (empty_index) return {at::full({q}, -1, opts), at::zeros({q}, opts)};
  at::Tensor first = per_query(q, opts);
  at::Tensor count = per_query(q, opts);
  l.p.results.first_row = first.data_ptr<int64_t>();
  l.p.results.count = count.data_ptr<int64_t>();
  l.p.results.miss_row = -1;
  l.run(ResultMode::First);
  return {first, count};
}

// The first row of each query alone, `miss_row` for a miss: one result tensor, one launch.
template <typename Launcher>
at::Tensor first_rows(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index, int64_t miss_row) {
  if (empty_index) return at::full({q}, miss_row, opts);
  at::Tensor first = per_query(q, opts);
  l.p.results.first_row = first.data_ptr<int64_t>();
  l.p.results.miss_row = miss_row;
  l.run(ResultMode::Rows);
  return first;
}

// Per-query match counts (range_count, pass 1 of a CSR lookup); all zero when there is nothing to launch.
template <typename Launcher>
at::Tensor match_counts(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  at::Tensor counts = at::zeros({q}, opts);
  if (empty_index || q == 0) return counts;
  l.p.results.count = counts.data_ptr<int64_t>();
  l.run(ResultMode::Count);
  return counts;
}

// Pass 1 of a CSR lookup: per-query counts and, prefix-summed on the device, the offsets. Returns (offsets,
// counts); both all zero when there is nothing to launch.
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor> count_pass(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  at::Tensor counts = match_counts(l, q, opts, empty_index);
  at::Tensor offsets = at::zeros({q + 1}, opts);
  if (!empty_index && q > 0) offsets.slice(0, 1).copy_(counts.cumsum(0));
  return {offsets, counts};
}

// Pass 2: every query writes its matches at its offset, none at or past rows.numel().
template <typename Launcher>
void fill_pass(Launcher& l, const at::Tensor& offsets, at::Tensor& rows) {
  l.p.results.offsets = offsets.data_ptr<int64_t>();
  l.p.results.rows = rows.data_ptr<int64_t>();
  l.p.results.capacity = rows.numel();
  l.run(ResultMode::Fill);
}

// Two passes over the same matches: count, then fill at the prefix-summed offsets. Learning the output size
// is the one host sync of a CSR lookup. Returns (offsets, rows, per-query counts).
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  at::Tensor offsets, counts;
  std::tie(offsets, counts) = count_pass(l, q, opts, empty_index);
  if (empty_index || q == 0) return {offsets, at::empty({0}, opts), counts};
  const int64_t total = offsets[q].item<int64_t>();
  at::Tensor rows = at::empty({total}, opts);
  if (total > 0) fill_pass(l, offsets, rows);
  return {offsets, rows, counts};
}

// The fixed-capacity CSR: the same two passes into a caller-sized buffer, with no host sync (so it can be
// captured in a CUDA graph wherever the launcher can). rows has `capacity` entries: entry j < min(total,
// capacity) is filled exactly as a full CSR's entry j, the rest stay -1. offsets are the full CSR's (they may
// point past the buffer). Returns (offsets, rows, total as a 0-d tensor, per-query counts).
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> csr_capped(Launcher& l, int64_t q, const at::TensorOptions& opts,
                                                                      int64_t capacity, bool empty_index) {
  check_capacity(capacity);
  at::Tensor offsets, counts;
  std::tie(offsets, counts) = count_pass(l, q, opts, empty_index);
  at::Tensor rows = at::full({capacity}, -1, opts);
  at::Tensor total = offsets.select(0, q).clone();
  if (!empty_index && q > 0 && capacity > 0) fill_pass(l, offsets, rows);
  return {offsets, rows, total, counts};
}

template <typename Launcher>
std::tuple<at::Tensor, at::Tensor> aggregate(Launcher& l, int64_t q, const at::TensorOptions& opts, const at::Tensor& values,
                                             bool empty_index) {
  at::Tensor count = at::zeros({q}, opts);
  at::Tensor sum = at::zeros({q}, opts.dtype(sum_dtype(values.scalar_type())));
  if (empty_index) return {count, sum};
  l.p.results.count = count.data_ptr<int64_t>();
  l.p.results.sums = sum.data_ptr();
  l.p.results.values = values.data_ptr();
  l.p.results.value_kind = static_cast<uint32_t>(value_kind_of(values.scalar_type()));
  l.run(ResultMode::Aggregate);
  return {count, sum};
}

}  // namespace rtindex::cuda_results
