"""Helpers the ChunkedIndex tests (test_chunked*.py) share: the tiny chunk and cache sizes they build with, each
ordered key's chunk, every lookup form checked against the reference and CgRXIndex, the planner's rates pinned, and
lists of answers compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from keysets import point_queries, range_queries
from reference import Reference, check_capped, check_lookup, check_matches

from torch_rtindex import CgRXIndex, ChunkedIndex
from torch_rtindex.chunked.executor import Executor
from torch_rtindex.chunked.store import TOP

ROOT = Path(__file__).resolve().parent.parent
SMALL = 4096  # chunk_bytes: ~240 keys per chunk
DUP_BUDGET = 40000  # the "duplicates" key set has one key 1000 times: one chunk of ~17 KB


def chunk_of(index, ordered):
    """Each ordered key's chunk, found from the chunks' first keys (chunk_info): the reference for queues."""
    lows = torch.tensor([c["lo"] for c in index.chunk_info()[1:]], dtype=torch.int64)
    return torch.searchsorted(lows ^ TOP, ordered.cpu() ^ TOP, right=True)


def chunk_number(index, chunk):
    """A chunk's position among the index's chunks (chunk_info), found by the first key of its range."""
    return [c["lo"] for c in index.chunk_info()].index(chunk.lo)


def chunked(keys, device, **kw):
    kw.setdefault("chunk_bytes", SMALL)
    kw.setdefault("gpu_budget", 3 * SMALL)
    kw.setdefault("layout", "packed_row")  # the sizes above are for 12-byte pairs
    return ChunkedIndex(keys, device=device, **kw)


def check_all_forms(index, keys, key_type, gen, device, n_q=600, widths=(5, 2**40), values_n=None):
    """Every lookup form of ``index`` against the reference and against CgRXIndex over the same keys
    (``values_n``: values per row ID handed out, where updates handed out more than ``keys`` has)."""
    ref = Reference(keys, key_type)
    cg = CgRXIndex(keys, key_type=key_type if key_type == "uint64" else None)
    q = point_queries(keys, n_q, gen)
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q.to(device)), first, count)
    check_matches(index.lookup_all(q.to(device)), rows)
    assert torch.equal(index.lookup_all(q.to(device)).rows.cpu(), cg.lookup_all(q).rows)
    values = torch.arange(values_n or keys.numel(), dtype=torch.int64) * 7 - 3
    agg = index.aggregate(q.to(device), values.to(device))
    np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
    np.testing.assert_array_equal(agg.sum.cpu().numpy(), ref.sums(rows, values))
    for w in widths if not keys.dtype.is_floating_point else (3.0, 1e7):
        lo, hi = range_queries(keys, n_q // 3, gen, w)
        first, count, rows = ref.ranges(lo, hi)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
        np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), count)
        got = index.range(lo.to(device), hi.to(device))
        want = cg.range(lo, hi)  # cgRX order: (key, row ID)
        assert torch.equal(got.offsets.cpu(), want.offsets) and torch.equal(got.rows.cpu(), want.rows)
        fv = values.double() / 3
        ragg = index.range_aggregate(lo.to(device), hi.to(device), fv.to(device))
        np.testing.assert_array_equal(ragg.count.cpu().numpy(), count)
        np.testing.assert_allclose(ragg.sum.cpu().numpy(), ref.sums(rows, fv), rtol=1e-12)
        full = (want.offsets, want.rows)
        for cap in (0, max(1, want.rows.numel() // 2), want.rows.numel() + 3):
            check_capped(index.range_capped(lo.to(device), hi.to(device), cap), full, cap, exact_prefix=True)
    cap = 7
    check_capped(index.lookup_all_capped(q.to(device), cap), tuple(cg.lookup_all(q)), cap, exact_prefix=True)


def fixed_rates(index, monkeypatch, **rates):
    """Pins the planner's rates (no calibration, no learning), so that a test knows which way each queue goes."""
    index._cost.rate.update(rates)
    index._cost.fixed_s = dict.fromkeys(index._cost.fixed_s, 0.0)
    index._cost.measured = dict.fromkeys(index._cost.measured, "points")
    monkeypatch.setattr(Executor, "learn_rates", lambda self, batch: None)


def equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
