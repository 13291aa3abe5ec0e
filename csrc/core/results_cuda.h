// The three result forms on CUDA, written once over an index's launcher: anything with a `ResultParams
// results` member reachable as `launcher.p.results` and a `run(ResultMode)` that answers every query.
#pragma once

#include <ATen/ATen.h>

#include "checks.h"
#include "results_device.h"

namespace rtindex::cuda_results {

// `empty_index`: nothing to launch; every query is a miss.
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor> first_and_count(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  if (empty_index) return {at::full({q}, -1, opts), at::zeros({q}, opts)};
  at::Tensor first = at::empty({q}, opts);
  at::Tensor count = at::empty({q}, opts);
  l.p.results.first_row = first.data_ptr<int64_t>();
  l.p.results.count = count.data_ptr<int64_t>();
  l.run(ResultMode::First);
  return {first, count};
}

// Two passes over the same matches: count, then fill at the prefix-summed offsets. Learning the output size
// is the one host sync of a CSR lookup. Returns (offsets, rows, per-query counts).
template <typename Launcher>
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr(Launcher& l, int64_t q, const at::TensorOptions& opts, bool empty_index) {
  at::Tensor counts = at::zeros({q}, opts);
  at::Tensor offsets = at::zeros({q + 1}, opts);
  if (empty_index || q == 0) return {offsets, at::empty({0}, opts), counts};
  l.p.results.count = counts.data_ptr<int64_t>();
  l.run(ResultMode::Count);
  offsets.slice(0, 1).copy_(counts.cumsum(0));
  const int64_t total = offsets[q].item<int64_t>();
  at::Tensor rows = at::empty({total}, opts);
  if (total == 0) return {offsets, rows, counts};
  l.p.results.offsets = offsets.data_ptr<int64_t>();
  l.p.results.rows = rows.data_ptr<int64_t>();
  l.run(ResultMode::Fill);
  return {offsets, rows, counts};
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
