"""RXIndex against the numpy reference, on every device under test (CPU always, CUDA where present)."""

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import RXIndex


@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates", "narrow"])
def test_point_lookups(device, gen, kind):
    keys = int64_keys(kind, 3000, gen)
    queries = point_queries(keys, 2000, gen)
    index = RXIndex(keys.to(device))
    ref = Reference(keys, "int64")
    first, count, rows = ref.points(queries)
    check_lookup(index.lookup(queries.to(device)), first, count)
    check_matches(index.lookup_all(queries.to(device)), rows)
    assert index.unique_keys == (torch.unique(keys).numel() == keys.numel())


@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates", "narrow"])
def test_range_lookups(device, gen, kind):
    keys = int64_keys(kind, 3000, gen)
    for max_width in (0, 5, 3 * ROW):  # 3 * ROW crosses row boundaries: several rays per range
        lo, hi = range_queries(keys, 500, gen, max_width)
        index = RXIndex(keys.to(device))
        first, count, rows = Reference(keys, "int64").ranges(lo, hi)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
        check_matches(index.range(lo.to(device), hi.to(device)), rows)


def test_wide_ranges_take_the_scan_path(device, gen):
    keys = int64_keys("uniform", 2000, gen)
    lo = torch.tensor([-(2**63), -(2**62), 0, 5])
    hi = torch.tensor([2**63 - 1, 2**62, 100 * ROW, 5 + 10 * ROW])
    ref = Reference(keys, "int64")
    first, count, rows = ref.ranges(lo, hi)
    for max_rays in (1, 4, 1024):  # the same answer whether rays or the scan find it
        index = RXIndex(keys.to(device), max_range_rays=max_rays)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
        check_matches(index.range(lo.to(device), hi.to(device)), rows)


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float32", "float64"])
def test_key_types(device, gen, key_type):
    keys = keys_of_type(key_type, 2000, gen)
    queries = point_queries(keys, 1000, gen)
    index = RXIndex(keys.to(device), key_type=key_type if key_type == "uint64" else None)
    ref = Reference(keys, key_type)
    first, count, rows = ref.points(queries)
    check_lookup(index.lookup(queries.to(device)), first, count)
    width = 10.0 if keys.dtype.is_floating_point else 2**40
    lo, hi = range_queries(keys, 300, gen, width)
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
    check_matches(index.range(lo.to(device), hi.to(device)), rows)


def test_uint64_order_is_unsigned(device):
    # As uint64, -1 is 2^64 - 1: the largest key, not the smallest.
    keys = torch.tensor([0, 1, -1, -(2**63), 2**63 - 1], dtype=torch.int64)  # -(2**63) is 2^63 as uint64
    index = RXIndex(keys.to(device), key_type="uint64")
    got = index.range(torch.tensor([2**63 - 1], device=device), torch.tensor([-1], device=device))
    assert sorted(got.rows.cpu().tolist()) == [2, 3, 4]
    signed = RXIndex(keys.to(device))
    got = signed.range(torch.tensor([-1], device=device), torch.tensor([1], device=device))
    assert sorted(got.rows.cpu().tolist()) == [0, 1, 2]


def test_float_zero_and_infinities(device):
    keys = torch.tensor([-0.0, 0.0, float("inf"), float("-inf"), 1.5], dtype=torch.float64)
    index = RXIndex(keys.to(device))
    r = index.lookup(torch.tensor([0.0, -0.0, float("inf"), float("nan")], dtype=torch.float64, device=device))
    assert r.count.cpu().tolist() == [2, 2, 1, 0]
    nan = torch.tensor([float("nan")], dtype=torch.float64, device=device)
    assert index.range(nan, nan).rows.numel() == 0
    full = index.range(torch.tensor([float("-inf")], dtype=torch.float64, device=device),
                       torch.tensor([float("inf")], dtype=torch.float64, device=device))
    assert sorted(full.rows.cpu().tolist()) == [0, 1, 2, 3, 4]


def test_edges_empty_and_all_miss(device, gen):
    keys = torch.tensor([-(2**63), 2**63 - 1, 0, -1], dtype=torch.int64)
    index = RXIndex(keys.to(device))
    r = index.lookup(keys.to(device))
    assert r.first_row.cpu().tolist() == [0, 1, 2, 3] and r.count.cpu().tolist() == [1, 1, 1, 1]
    # uint64 view of the same bits: 0 and 2^64 - 1 found exactly
    u = RXIndex(keys.to(device), key_type="uint64")
    assert u.lookup(torch.tensor([0, -1], device=device)).first_row.cpu().tolist() == [2, 3]
    # all misses
    misses = torch.tensor([1, 2, 3, 2**62], device=device)
    assert index.lookup(misses).count.sum().item() == 0
    # empty query batch
    empty_q = torch.empty(0, dtype=torch.int64, device=device)
    assert index.lookup(empty_q).first_row.numel() == 0
    m = index.lookup_all(empty_q)
    assert m.offsets.cpu().tolist() == [0] and m.rows.numel() == 0
    # empty index
    empty = RXIndex(torch.empty(0, dtype=torch.int64, device=device))
    r = empty.lookup(torch.tensor([0, 5], device=device))
    assert r.first_row.cpu().tolist() == [-1, -1] and r.count.cpu().tolist() == [0, 0]
    assert empty.range(torch.tensor([0], device=device), torch.tensor([9], device=device)).rows.numel() == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
def test_aggregate(device, gen, dtype):
    keys = int64_keys("duplicates", 2000, gen)
    values = (torch.randn(keys.numel(), generator=gen) * 100).to(dtype)
    queries = point_queries(keys, 500, gen)
    index = RXIndex(keys.to(device))
    ref = Reference(keys, "int64")
    _, count, rows = ref.points(queries)
    agg = index.aggregate(queries.to(device), values.to(device))
    np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
    np.testing.assert_allclose(agg.sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)
    lo, hi = range_queries(keys, 200, gen, 2**60)
    _, count, rows = ref.ranges(lo, hi)
    agg = index.range_aggregate(lo.to(device), hi.to(device), values.to(device))
    np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
    np.testing.assert_allclose(agg.sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)


def test_rebuild_and_refit(device, gen):
    keys = int64_keys("uniform", 1000, gen)
    index = RXIndex(keys.to(device), allow_update=True)
    moved = keys + 1
    index.refit(moved.to(device))
    first, count, _ = Reference(moved, "int64").points(moved[:300])
    check_lookup(index.lookup(moved[:300].to(device)), first, count)
    assert index.lookup(keys[:5].to(device)).count.cpu().tolist() == [
        int((moved == k).sum()) for k in keys[:5]
    ]
    fresh = int64_keys("dense", 500, gen)
    index.rebuild(fresh.to(device))
    first, count, _ = Reference(fresh, "int64").points(fresh)
    check_lookup(index.lookup(fresh.to(device)), first, count)


@pytest.mark.parametrize("seed", range(5))
def test_fuzz(device, seed):
    gen = torch.Generator().manual_seed(seed)
    kind = ["uniform", "dense", "duplicates", "narrow"][seed % 4]
    keys = int64_keys(kind, int(torch.randint(1, 5000, (1,), generator=gen)), gen)
    index = RXIndex(keys.to(device), max_range_rays=int(torch.randint(1, 64, (1,), generator=gen)))
    ref = Reference(keys, "int64")
    q = point_queries(keys, 1000, gen)
    first, count, _ = ref.points(q)
    check_lookup(index.lookup(q.to(device)), first, count)
    lo, hi = range_queries(keys, 300, gen, 40 * ROW)
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
    check_matches(index.range(lo.to(device), hi.to(device)), rows)


def test_keys_at_row_ends_found_by_full_row_ranges(device):
    # A ray along a whole 23-bit row meets the last slot 2^23 - 1/2 slots from its start, where OptiX's hit
    # distance is only accurate to about half a slot; ranges are cut into segments of at most 2^21 slots so
    # that such hits are never lost (see range_segment in csrc/core/scene.h).
    rows = torch.tensor([0, 1, 5, 2**20, 2**40 - 1], dtype=torch.int64)
    ends = rows * ROW + (ROW - 1)
    starts = rows * ROW
    keys = torch.cat([ends, starts, ends - 2**21, ends - 2**22]).contiguous()
    index = RXIndex(keys.to(device))
    lo, hi = starts, ends
    r = index.range(lo.to(device), hi.to(device))
    first, count, rows_expected = Reference(keys, "int64").ranges(lo, hi)
    check_matches(r, rows_expected)
    assert count.tolist() == [4] * 5
    p = index.lookup(ends.to(device))
    assert p.count.cpu().tolist() == [1] * 5
