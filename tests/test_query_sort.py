"""Sorting the queries before a lookup (``index.sort_queries``): the sort operator against numpy, and every
one-row-per-query lookup against the independent reference with the sort forced on, off and automatic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from keysets import I64_MAX, I64_MIN, ROW, int64_keys, point_queries, range_queries
from reference import Reference, check_lookup

import torch_rtindex
from torch_rtindex import CgRXIndex, RXIndex, UpdatableCgRXIndex
from torch_rtindex._base import QUERY_SORT_BITS, query_sort_bits

ops = torch.ops.rtindex


def numpy_order(keys: torch.Tensor, begin: int, end: int) -> np.ndarray:
    """A stable sort of the ordered keys by bits [begin, end), computed with numpy."""
    k = keys.cpu().numpy().view(np.uint64)
    field = (k >> np.uint64(begin)) & np.uint64((1 << (end - begin)) - 1 if end - begin < 64 else 2**64 - 1)
    return np.argsort(field, kind="stable")


@pytest.mark.parametrize("bits", [(0, 64), (40, 64), (0, 8), (17, 41), (63, 64)])
@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates"])
def test_sort_queries_matches_a_stable_numpy_sort(device, gen, bits, kind):
    keys = int64_keys(kind, 3000, gen)
    got_keys, got_order = ops.sort_queries(keys.to(device), *bits)
    want = numpy_order(keys, *bits)
    np.testing.assert_array_equal(got_order.cpu().numpy(), want)
    np.testing.assert_array_equal(got_keys.cpu().numpy(), keys.numpy()[want])


def test_sort_queries_empty_and_bad_bits(device):
    k, o = ops.sort_queries(torch.empty(0, dtype=torch.int64, device=device), 0, 64)
    assert k.numel() == 0 and o.numel() == 0 and o.dtype == torch.int64
    for bits in [(5, 5), (-1, 10), (0, 65), (10, 3)]:
        with pytest.raises(RuntimeError, match="sort bits"):
            ops.sort_queries(torch.zeros(4, dtype=torch.int64, device=device), *bits)


def test_sort_queries_opcheck(device, gen):
    keys = int64_keys("uniform", 500, gen).to(device)
    result = torch.library.opcheck(ops.sort_queries.default, (keys, 20, 44))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_query_sort_bits():
    assert query_sort_bits(5, 5) == (0, 0)
    assert query_sort_bits(0, 1) == (0, 1)
    assert query_sort_bits(0, 2**30) == (31 - QUERY_SORT_BITS, 31)
    assert query_sort_bits(I64_MIN, I64_MAX) == (64 - QUERY_SORT_BITS, 64)  # signed order: the top bit differs
    assert query_sort_bits(-1, 0) == (64 - QUERY_SORT_BITS, 64)


def indexes(keys: torch.Tensor):
    yield RXIndex(keys)
    for backend in ("radix", "optix", "binary_search"):
        yield CgRXIndex(keys, backend=backend, bucket_size=4)
    yield UpdatableCgRXIndex(keys, node_size=8)


@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates", "narrow"])
def test_sorted_lookups_equal_the_reference(device, gen, kind):
    keys = int64_keys(kind, 2000, gen)
    ref = Reference(keys, "int64")
    q = torch.cat([point_queries(keys, 3000, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    lo, hi = range_queries(keys, 1000, gen, 2 * ROW)
    values = torch.randint(-1000, 1000, (keys.numel(),), generator=gen)
    first, count, rows = ref.points(q)
    rfirst, rcount, rrows = ref.ranges(lo, hi)
    dq, dlo, dhi, dv = (t.to(device) for t in (q, lo, hi, values))
    for index in indexes(keys.to(device)):
        for mode in (True, False, None):
            index.sort_queries = mode
            check_lookup(index.lookup(dq), first, count)
            for miss_row in (-1, 99):
                want = np.where(first < 0, miss_row, first)
                np.testing.assert_array_equal(index.lookup_rows(dq, miss_row).cpu().numpy(), want)
            check_lookup(index.range_lookup(dlo, dhi), rfirst, rcount)
            agg = index.aggregate(dq, dv)
            np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
            np.testing.assert_array_equal(agg.sum.cpu().numpy(), Reference.sums(rows, values))
            ragg = index.range_aggregate(dlo, dhi, dv)
            np.testing.assert_array_equal(ragg.sum.cpu().numpy(), Reference.sums(rrows, values))


def test_sorted_lookups_edge_batches(device, gen):
    keys = int64_keys("uniform", 500, gen).to(device)
    for index in indexes(keys):
        index.sort_queries = True
        r = index.lookup(keys[:0])
        assert r.first_row.numel() == 0
        miss = torch.full((7,), 12345, dtype=torch.int64, device=device)
        miss = miss[~torch.isin(miss, keys)]
        assert int(index.lookup(miss).count.sum()) == 0
        # One distinct key: nothing to order by, the lookup runs unsorted.
        one = type(index)(torch.full((9,), -5, dtype=torch.int64, device=device))
        one.sort_queries = True
        assert one.lookup(torch.tensor([-5, 4], device=device)).count.tolist() == [9, 0]


def test_automatic_policy():
    keys = torch.arange(1000, dtype=torch.int64)
    rx = RXIndex(keys)
    assert rx.sort_queries is None
    assert not rx._wants_query_sort(1 << 20)  # CPU: never automatically
    rx.sort_queries = True
    assert rx._wants_query_sort(10)
    if torch.cuda.is_available():
        gpu = RXIndex(keys.cuda())
        assert gpu._wants_query_sort(torch_rtindex._base.QUERY_SORT_MIN_BATCH)
        assert not gpu._wants_query_sort(100)
        assert not CgRXIndex(keys.cuda(), backend="radix")._wants_query_sort(1 << 24)
        assert CgRXIndex(keys.cuda(), backend="optix")._wants_query_sort(1 << 24)


def test_direct_lookup_only_where_nothing_else_is_needed(monkeypatch):
    """lookup() goes straight to the operator only while no query sort and no capture refusal can apply; a
    change of sort_queries switches it off and on again, and the sorted path still answers."""
    keys = torch.tensor([5, 1, 5, 3, -7], dtype=torch.int64)
    ix = CgRXIndex(keys)
    assert ix._direct_lookup is not None
    calls = []
    monkeypatch.setattr(ix, "_call", lambda *a, **k: calls.append(a) or type(ix)._call(ix, *a, **k))
    q = torch.tensor([5, 2, -7])
    want = ix.lookup(q)
    assert not calls  # the direct path
    ix.sort_queries = True
    assert ix._direct_lookup is None
    got = ix.lookup(q)
    assert calls and torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    assert want.first_row.tolist() == [0, -1, 4] and want.count.tolist() == [2, 0, 1]
    ix.sort_queries = None
    assert ix._direct_lookup is not None
    with pytest.raises(TypeError):
        ix.lookup(q.to(torch.float64))  # a batch the direct path does not take still gets _call's checks
    if torch.cuda.is_available():
        assert CgRXIndex(keys.cuda(), backend="optix")._direct_lookup is None  # capture refusal, query sort


def test_sorted_lookup_compiles(device, gen):
    keys = int64_keys("duplicates", 1000, gen).to(device)
    index = CgRXIndex(keys)
    index.sort_queries = True
    q = point_queries(keys.cpu(), 500, gen).to(device)

    def fn(x):
        r = index.lookup(x)
        return r.first_row, r.count

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for n in (500, 317):
        a, b = compiled(q[:n]), fn(q[:n])
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_lookup_rows_checks_its_arguments(device, gen):
    keys = int64_keys("uniform", 300, gen).to(device)
    for index in (*indexes(keys), CgRXIndex(keys[:0])):
        for bad in (True, 1.5, "3", None):
            with pytest.raises(TypeError, match="miss_row must be an int"):
                index.lookup_rows(keys, bad)
        with pytest.raises(TypeError):
            index.lookup_rows(keys.double(), 0)  # a key dtype that does not convert exactly: the lookups' checks
        got = index.lookup_rows(keys[:5].flip(0), -7)
        np.testing.assert_array_equal(got.cpu().numpy(), index.lookup(keys[:5].flip(0)).first_row.cpu().numpy()
                                      if len(index) else np.full(5, -7))
