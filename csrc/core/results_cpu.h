// The three result forms of every index on the CPU, written once over a "visit the matches of query i"
// function: (first row, count), CSR of all rows (ascending per query unless the index orders them), and
// (count, sum of a value column).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"

namespace rtindex::cpu_results {

// Queries per CPU task. A lookup from memory costs 0.1-1 us, so 256 queries pay for a task's start, and a batch
// of a few thousand (an embedding call, or one chunk's queue of the out-of-core index) spreads over all cores;
// at::parallel_for makes no more tasks than threads, so large batches are split as before.
constexpr int64_t kQueryGrain = 256;

// f(begin, end) over the queries' blocks; a batch of one block runs inline (a parallel region of one task still
// costs its start).
template <typename F>
void for_query_blocks(int64_t q, const F& f) {
  if (q <= kQueryGrain) {
    if (q > 0) f(int64_t{0}, q);
    return;
  }
  at::parallel_for(0, q, kQueryGrain, f);
}

// ForEach: void(int64_t query, Visit) where Visit is called with every matching row ID.
// Per query its smallest row (`miss_row` where none) into f and, where c is given, its match count.
template <typename ForEach>
void fold_first(int64_t q, int64_t* f, int64_t* c, int64_t miss_row, ForEach&& for_each) {
  for_query_blocks(q, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t best = -1, n = 0;
      for_each(i, [&](int64_t row) {
        best = (best < 0 || row < best) ? row : best;
        ++n;
      });
      f[i] = n ? best : miss_row;
      if (c) c[i] = n;
    }
  });
}

template <typename ForEach>
std::tuple<at::Tensor, at::Tensor> first_and_count(int64_t q, const at::TensorOptions& opts, ForEach&& for_each) {
  at::Tensor first = at::empty({q}, opts);
  at::Tensor count = at::empty({q}, opts);
  fold_first(q, first.data_ptr<int64_t>(), count.data_ptr<int64_t>(), -1, for_each);
  return {first, count};
}

// The first row of each query alone, `miss_row` for a miss.
template <typename ForEach>
at::Tensor first_rows(int64_t q, const at::TensorOptions& opts, int64_t miss_row, ForEach&& for_each) {
  at::Tensor first = at::empty({q}, opts);
  fold_first(q, first.data_ptr<int64_t>(), nullptr, miss_row, for_each);
  return first;
}

// Per query its number of matches, from CountOf: int64_t(int64_t query).
template <typename CountOf>
at::Tensor match_counts(int64_t q, const at::TensorOptions& opts, CountOf&& count_of) {
  at::Tensor counts = at::empty({q}, opts);
  int64_t* c = counts.data_ptr<int64_t>();
  for_query_blocks(q, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) c[i] = count_of(i);
  });
  return counts;
}

// The count of a query by visiting its matches: for indexes that cannot count a range from positions.
template <typename ForEach>
auto counting_visits(ForEach& for_each) {
  return [&for_each](int64_t i) {
    int64_t n = 0;
    for_each(i, [&](int64_t) { ++n; });
    return n;
  };
}

// Per-query counts and their prefix sums: (offsets [q + 1], counts [q]).
template <typename CountOf>
std::tuple<at::Tensor, at::Tensor> count_pass(int64_t q, const at::TensorOptions& opts, CountOf&& count_of) {
  at::Tensor counts = match_counts(q, opts, count_of);
  at::Tensor offsets = at::zeros({q + 1}, opts);
  if (q > 0) offsets.slice(0, 1).copy_(counts.cumsum(0));
  return {offsets, counts};
}

// Writes query i's matches at rows[offsets[i] ..], none at or past rows.numel(); sort_rows: each query's
// rows ascending (RX) or in visit order (cgRX: key order). A query cut off by the end of `rows` keeps the
// first entries of its full answer (CappedMatches), so with sort_rows it sorts all its matches first.
template <typename ForEach>
void fill_pass(int64_t q, const at::Tensor& offsets, at::Tensor& rows, bool sort_rows, ForEach&& for_each) {
  const int64_t* off = offsets.data_ptr<int64_t>();
  int64_t* r = rows.data_ptr<int64_t>();
  const int64_t limit = rows.numel();
  for_query_blocks(q, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (off[i] >= limit) continue;  // nothing of this query fits
      if (sort_rows && off[i + 1] > limit) {  // the one query the capacity cuts
        std::vector<int64_t> all;
        for_each(i, [&](int64_t row) { all.push_back(row); });
        std::sort(all.begin(), all.end());
        std::copy(all.begin(), all.begin() + (limit - off[i]), r + off[i]);
        continue;
      }
      int64_t at = off[i];
      for_each(i, [&](int64_t row) {
        if (at < limit) r[at] = row;
        ++at;
      });
      if (sort_rows) std::sort(r + off[i], r + std::min(at, limit));
    }
  });
}

// CSR of every query's matches: counted by CountOf (which must count exactly the matches for_each visits: from
// positions where the index has them), then filled by visiting.
template <typename ForEach, typename CountOf>
std::tuple<at::Tensor, at::Tensor> csr(int64_t q, const at::TensorOptions& opts, bool sort_rows, ForEach&& for_each,
                                       CountOf&& count_of) {
  at::Tensor offsets, counts;
  std::tie(offsets, counts) = count_pass(q, opts, count_of);
  at::Tensor rows = at::empty({offsets[q].item<int64_t>()}, opts);
  fill_pass(q, offsets, rows, sort_rows, for_each);
  return {offsets, rows};
}

template <typename ForEach>
std::tuple<at::Tensor, at::Tensor> csr(int64_t q, const at::TensorOptions& opts, bool sort_rows, ForEach&& for_each) {
  return csr(q, opts, sort_rows, for_each, counting_visits(for_each));
}

// The fixed-capacity CSR (as cuda_results::csr_capped): rows has `capacity` entries, -1 past the matches;
// returns (offsets, rows, total as a 0-d tensor).
template <typename ForEach, typename CountOf>
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_capped(int64_t q, const at::TensorOptions& opts, bool sort_rows,
                                                          int64_t capacity, ForEach&& for_each, CountOf&& count_of) {
  check_capacity(capacity);
  at::Tensor offsets, counts;
  std::tie(offsets, counts) = count_pass(q, opts, count_of);
  at::Tensor rows = at::full({capacity}, -1, opts);
  fill_pass(q, offsets, rows, sort_rows, for_each);
  return {offsets, rows, offsets.select(0, q).clone()};
}

template <typename ForEach>
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_capped(int64_t q, const at::TensorOptions& opts, bool sort_rows,
                                                          int64_t capacity, ForEach&& for_each) {
  return csr_capped(q, opts, sort_rows, capacity, for_each, counting_visits(for_each));
}

template <typename scalar_t, typename acc_t, typename ForEach>
void aggregate_into(int64_t q, const at::Tensor& values, at::Tensor& count, at::Tensor& sum, ForEach&& for_each) {
  const scalar_t* v = values.data_ptr<scalar_t>();
  int64_t* c = count.data_ptr<int64_t>();
  acc_t* s = sum.data_ptr<acc_t>();
  for_query_blocks(q, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      acc_t total = 0;
      int64_t n = 0;
      for_each(i, [&](int64_t row) {
        total += static_cast<acc_t>(v[row]);
        ++n;
      });
      c[i] = n;
      s[i] = total;
    }
  });
}

template <typename ForEach>
std::tuple<at::Tensor, at::Tensor> aggregate(int64_t q, const at::TensorOptions& opts, const at::Tensor& values,
                                             ForEach&& for_each) {
  at::Tensor count = at::empty({q}, opts);
  at::Tensor sum = at::empty({q}, opts.dtype(sum_dtype(values.scalar_type())));
  switch (values.scalar_type()) {
    case at::kLong: aggregate_into<int64_t, int64_t>(q, values, count, sum, for_each); break;
    case at::kInt: aggregate_into<int32_t, int64_t>(q, values, count, sum, for_each); break;
    case at::kFloat: aggregate_into<float, double>(q, values, count, sum, for_each); break;
    default: aggregate_into<double, double>(q, values, count, sum, for_each); break;
  }
  return {count, sum};
}

}  // namespace rtindex::cpu_results
