"""ChunkedIndex against the numpy reference and CgRXIndex over the same keys, with tiny chunks and a tiny cache
budget so that chunks move all the time; its cache policy and scheduler on their own; updates against a multiset;
save / open with lazy, checked chunk files; faults that must leave the index unchanged."""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import time
import weakref
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from keysets import I64_MAX, I64_MIN, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_capped, check_lookup, check_matches

from torch_rtindex import CgRXIndex, ChunkedIndex
from torch_rtindex.chunked.build import Builder
from torch_rtindex.chunked.cache import Arena
from torch_rtindex.chunked.calibration import Calibrator
from torch_rtindex.chunked.config import ChunkedConfig
from torch_rtindex.chunked.cost import CostModel
from torch_rtindex.chunked.executor import Executor
from torch_rtindex.chunked.hot_tier import HOT_CANDIDATE_BYTES, HotTier
from torch_rtindex.chunked.stats import Stats
from torch_rtindex.chunked.store import SEARCH_SLACK, TOP, ChunkStore, align, search_bytes
from torch_rtindex.chunked.updates import InPlace, Updater

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


def test_point_queues_by_id_where_the_partition_operator_declines(gen, monkeypatch):
    """Point batches are grouped by partition_queries; with more chunks than it takes on CUDA, by chunk id
    (group_by): both give the same queues' answers."""
    import torch_rtindex.chunked.executor as executor_module

    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    monkeypatch.setattr(executor_module, "partition_points", lambda *a, **k: None)
    check_all_forms(index, keys, "int64", gen, "cpu", n_q=300, widths=(5,))


@pytest.mark.parametrize("kind", ["uniform", "duplicates", "clustered", "narrow"])
@pytest.mark.parametrize("processors", ["auto", "gpu", "cpu"])
def test_every_form_matches_reference_and_cgrx(device, gen, kind, processors):
    keys = int64_keys(kind, 3000, gen)
    index = chunked(keys.to(device), device, processors=processors,
                    gpu_budget=DUP_BUDGET if kind == "duplicates" else 3 * SMALL)
    assert index.num_chunks > 5
    check_all_forms(index, keys, "int64", gen, device)
    s = index.stats()
    if processors == "cpu":
        assert s["queries_gpu"] == 0 and s["chunk_misses"] == 0
    if processors == "gpu":
        assert s["queries_cpu"] == 0 and s["chunk_misses"] > s["chunks"] and s["evictions"] > 0
    assert s["resident_bytes"] <= index.gpu_budget


@pytest.mark.parametrize("key_type", ["int32", "float32", "float64", "uint64"])
def test_key_types(device, gen, key_type):
    keys = keys_of_type(key_type, 2000, gen)
    index = chunked(keys.to(device), device, key_type=key_type if key_type == "uint64" else None)
    check_all_forms(index, keys, key_type, gen, device, n_q=300)


def test_both_processors_share_a_batch(gen, monkeypatch):
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu")
    q = keys[torch.randint(0, keys.numel(), (3000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    _fixed_rates(index, monkeypatch, cpu=1e6, copy=1e6, gpu=1e6)  # as fast as each other: both get a share
    for _ in range(3):
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    s = index.stats()
    assert s["queries_gpu"] > 0 and s["queries_cpu"] > 0 and s["queries_gpu"] + s["queries_cpu"] == s["pieces"]


def test_a_run_of_equal_keys_stays_in_one_chunk(gen):
    keys = torch.cat([torch.arange(1000), torch.full((900,), 500), torch.arange(2000, 2600)])
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    info = index.chunk_info()
    assert sum(c["n"] for c in info) == keys.numel() and len(info) > 4
    assert max(c["n"] for c in info) >= 901  # the run made one larger chunk
    los = [c["lo"] for c in info]
    assert los[1:] == sorted(los[1:])
    ref = Reference(keys, "int64")
    q = torch.tensor([500, 499, 501, 0, 2599, 1500])
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q), first, count)
    check_matches(index.lookup_all(q), rows)


def test_ranges_across_many_chunks_and_edges(gen):
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu")
    cg = CgRXIndex(keys)
    lo = torch.tensor([I64_MIN, I64_MIN, 0, -1, I64_MAX, 5, I64_MAX])
    hi = torch.tensor([I64_MAX, -1, I64_MAX, 0, I64_MAX, 4, I64_MIN])
    got, want = index.range(lo, hi), cg.range(lo, hi)
    assert torch.equal(got.offsets, want.offsets) and torch.equal(got.rows, want.rows)
    assert int(got.offsets[1]) == keys.numel()
    g, w = index.range_lookup(lo, hi), cg.range_lookup(lo, hi)
    assert torch.equal(g.first_row, w.first_row) and torch.equal(g.count, w.count)
    assert index.stats()["pieces"] > index.num_chunks  # the full range was cut into one piece per chunk


def test_empty_index_empty_batches_and_one_chunk(gen):
    empty = chunked(torch.empty(0, dtype=torch.int64), "cpu")
    assert len(empty) == 0 and empty.num_chunks == 1
    r = empty.lookup(torch.tensor([1, 2]))
    assert r.first_row.tolist() == [-1, -1] and r.count.tolist() == [0, 0]
    assert empty.range(torch.tensor([I64_MIN]), torch.tensor([I64_MAX])).rows.numel() == 0
    keys = int64_keys("duplicates", 1000, gen)
    for updatable in (False, True):  # one chunk: built from the keys as given (no sort), pairs or node chains
        one = ChunkedIndex(keys, device="cpu", chunk_bytes=1 << 30, gpu_budget=0, updatable=updatable)
        assert one.num_chunks == 1
        assert one.chunk_info()[0]["lo"] == int((torch.ops.rtindex.map_keys(keys, 0) ^ TOP).min()) ^ TOP  # smallest
        check_all_forms(one, keys, "int64", gen, "cpu", n_q=200)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    e = torch.empty(0, dtype=torch.int64)
    assert index.lookup(e).first_row.shape == (0,)
    assert index.lookup_all(e).offsets.tolist() == [0]
    assert index.range(e, e).rows.numel() == 0
    assert index.aggregate(e, torch.zeros(keys.numel())).sum.dtype == torch.float64
    assert index.range_capped(e, e, 4).rows.tolist() == [-1] * 4


def test_budgets(gen, monkeypatch):
    keys = int64_keys("uniform", 2000, gen)
    with pytest.raises(ValueError, match="holds no chunk"):
        ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=1000)
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=1 << 30, processors="gpu", hot_keys=0)
    q = keys[:500]
    index.lookup(q)
    index.reset_stats()
    index.processors = "auto"  # every chunk is cached now: the GPU takes every queue (as fast as a GPU would be)
    _fixed_rates(index, monkeypatch, gpu=1e15)
    index.lookup(q)
    s = index.stats()
    touched = chunk_of(index, torch.ops.rtindex.map_keys(q, 0)).unique().numel()
    # everything stayed cached
    assert s["chunk_misses"] == 0 and s["chunk_hits"] == touched > 0 and s["queries_cpu"] == 0
    assert all(c["cached"] for c in index.chunk_info()) and s["resident_chunks"] == index.num_chunks == touched
    host_only = ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=0)
    assert host_only.lookup(q).count.tolist() == index.lookup(q).count.tolist()
    with pytest.raises(ValueError, match="gpu_budget > 0"):
        host_only.processors = "gpu"
        host_only.lookup(q)


def point_forms_equal(index, cg, q, values):
    got, want = index.lookup(q), cg.lookup(q)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    got, want = index.lookup_all(q), cg.lookup_all(q)
    assert torch.equal(got.offsets, want.offsets) and torch.equal(got.rows, want.rows)
    got, want = index.aggregate(q, values), cg.aggregate(q, values)
    assert torch.equal(got.count, want.count) and torch.equal(got.sum, want.sum)
    check_capped(index.lookup_all_capped(q, 37), tuple(cg.lookup_all(q)), 37, exact_prefix=True)


def skewed(keys, hot, n, gen):
    q = torch.cat([hot[torch.randint(0, hot.numel(), (n,), generator=gen)], point_queries(keys, n // 3, gen)])
    return q[torch.randperm(q.numel(), generator=gen)]


def test_hot_key_tier_answers_every_point_form(gen):
    keys = int64_keys("duplicates", 3000, gen)  # one key 1000 times, others up to 100 times
    index = chunked(keys, "cpu", gpu_budget=1 << 20)  # automatic: a sixteenth of the budget
    assert index.hot_capacity == (1 << 20) // 16 // (HOT_CANDIDATE_BYTES + index.hot_pair_bytes)
    plain = chunked(keys, "cpu", gpu_budget=1 << 20, hot_keys=0)
    cg = CgRXIndex(keys)
    values = torch.arange(keys.numel(), dtype=torch.int64) * 7 - 3
    distinct = torch.unique(keys)
    hot = distinct[torch.randint(0, distinct.numel(), (12,), generator=gen)]
    for step in range(5):
        q = skewed(keys, hot, 600, gen)
        point_forms_equal(index, cg, q, values)
        point_forms_equal(plain, cg, q, values)
    s = index.stats()
    assert s["hot_keys"] > 0 and s["hot_hits"] > 0 and 1 <= s["hot_rebuilds"] <= 3  # not rebuilt every call
    assert s["hot_pairs"] > s["hot_keys"]  # hot keys with many row IDs: all of them in the tier
    assert 0 < index.memory()["hot"] <= index.hot_capacity * (HOT_CANDIDATE_BYTES + index.hot_pair_bytes)
    last = s["last_batch"]
    assert last["queries"] == 0 or last["hot_hits"] <= last["queries"]
    # ranges never touch the tier
    lo, hi = range_queries(keys, 100, gen, 2**50)
    before = index.stats()["hot_hits"]
    want = cg.range(lo, hi)
    got = index.range(lo, hi)
    assert torch.equal(got.rows, want.rows) and index.stats()["hot_hits"] == before
    # updates: the tier is rebuilt over the new chunks, answers stay exact
    k = hot[:2]
    index.insert(torch.cat([k, k]))
    index.delete(hot[2:3])
    plain.insert(torch.cat([k, k]))
    plain.delete(hot[2:3])
    for _ in range(3):
        q = skewed(keys, hot, 300, gen)
        a, b = index.lookup_all(q), plain.lookup_all(q)
        assert torch.equal(a.offsets, b.offsets) and torch.equal(a.rows, b.rows)
        a, b = index.lookup(q), plain.lookup(q)
        assert torch.equal(a.first_row, b.first_row) and torch.equal(a.count, b.count)
    assert index.stats()["hot_hits"] > before


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float32", "float64"])
def test_tier_misses_reach_the_chunks_sorted(gen, monkeypatch, key_type):
    """The tier's misses reach the chunks in the chunks' order (unsigned order of the mapped keys): the answers
    are the reference's in every point form, keys over their type's whole range with duplicates."""
    keys = keys_of_type(key_type, 2500, gen)
    keys = torch.cat([keys, keys[:500]])
    index = chunked(keys, "cpu", gpu_budget=1 << 20, hot_keys=64, key_type=key_type)
    index.hot_learn = False
    held = index.warm(keys[:64])
    tier_keys = index.hot_tier_keys  # the keys as given, in their dtype
    assert tier_keys.dtype == keys.dtype and tier_keys.numel() == held > 0
    assert bool(torch.isin(tier_keys, keys[:64]).all())
    served, serve = [], Executor.serve
    monkeypatch.setattr(Executor, "serve", lambda self, form, lo, *a: (
        served.append((lo, a[3:])) or serve(self, form, lo, *a)))
    cg = CgRXIndex(keys, key_type=key_type)
    values = torch.arange(keys.numel(), dtype=torch.int64) * 5 + 1
    edges = keys[-504:-500]
    if key_type == "int64":  # the chunks' first keys and their predecessors: where one queue's run ends
        first = torch.tensor([c["lo"] for c in index.chunk_info()[1:]], dtype=torch.int64) ^ I64_MIN
        edges = torch.cat([edges, first, first - 1])
        assert first.numel() > 3
    for _ in range(3):
        q = torch.cat([keys[:64].repeat(4), point_queries(keys, 400, gen), edges])
        point_forms_equal(index, cg, q[torch.randperm(q.numel(), generator=gen)], values)
    assert index.stats()["hot_hits"] > 0 and served
    unsigned = [x ^ I64_MIN for x, _ in served]  # the order the chunks are in
    assert all(bool((u[1:] >= u[:-1]).all()) for u in unsigned)
    assert all(flag == (True,) for _, flag in served)  # and the executor is told so (key_order)


def _key_ordered(index, q, device):
    """q as the index's ordered keys sorted into the chunks' order, as the tier's misses come to the chunks."""
    lo = torch.ops.rtindex.map_keys(q.to(device), 0)  # int64 keys
    return torch.sort(lo ^ TOP).values ^ TOP


def _tier_of_one_key(index, keys):
    """Gives ``index`` a hot tier of one key of ``keys`` (its rarest, not an edge the tests ask), learning nothing;
    returns the key. A point batch without it is all misses of the tier, which reach the chunks as one batch sorted
    by key."""
    distinct, counts = torch.unique(keys.cpu(), return_counts=True)
    counts[torch.isin(distinct, torch.tensor([I64_MIN, I64_MAX, 0, -1]))] = keys.numel() + 1
    key = distinct[counts.argmin()].reshape(1)
    index.hot_learn = False
    assert index.warm(key.to(index.device)) == 1
    return int(key)


def _misses_of_the_tier(q, held, device):
    """q without the tier's key ``held``: its point lookups reach the chunks as the tier's misses."""
    return q[q != held].to(device)


def _lookup_key_ordered(index, q, ref):
    """q's point lookups (no query on the tier's key) checked against the reference; every query is a miss of the
    tier, so the chunks serve them as one batch sorted by key (key_order)."""
    got = index.lookup(q)
    want_first, want_count, _ = ref.points(q.cpu())
    np.testing.assert_array_equal(got.first_row.cpu().numpy(), want_first)
    np.testing.assert_array_equal(got.count.cpu().numpy(), want_count)
    s = index.stats()
    assert s["hot_keys"] == 1 and s["last_batch"]["hot_hits"] == 0


def _recorded_groups(monkeypatch, what):
    """Executor.answer_group wrapped: what(tasks, S) of each call appended to the list returned."""
    calls, plain = [], Executor.answer_group

    def recorded(self, views, tasks, batch, S):
        calls.append(what(tasks, S))
        return plain(self, views, tasks, batch, S)

    monkeypatch.setattr(Executor, "answer_group", recorded)
    return calls


def test_sorted_batch_queues_are_runs(device, gen, monkeypatch):
    """A batch sorted by key (key_order) is cut into each chunk's run of it instead of partitioned: every queue
    holds exactly its chunk's keys, in key order, and the answers are the reference's; keys at every chunk's first
    key and below it, below the first chunk and above the last, duplicates, chunks with no query; both processors
    serve."""
    import torch_rtindex.chunked.executor as executor_module

    keys = torch.cat([int64_keys("duplicates", 2500, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, hot_keys=8)
    assert index.num_chunks > 5
    index.read_in_place = True
    _fixed_rates(index, monkeypatch, cpu=1e8, copy=1.0, gpu=1e8, in_place=1e8)  # both serve
    held = _tier_of_one_key(index, keys)
    first = torch.tensor([c["lo"] for c in index.chunk_info()[1:]], dtype=torch.int64) ^ I64_MIN
    seen = []
    merge = executor_module.merge
    monkeypatch.setattr(executor_module, "merge", lambda form, tasks, q, P, sq, *a: seen.append(
        [(t.chunk, sq[t.start : t.start + t.size].cpu()) for t in tasks]) or merge(form, tasks, q, P, sq, *a))
    ref = Reference(keys, "int64")
    for n in (0, 1, 700):
        q = torch.cat([point_queries(keys, n, gen), first[: n // 100], first[: n // 100] - 1,
                       torch.tensor([I64_MIN, I64_MAX] if n else [], dtype=torch.int64)])
        q = _misses_of_the_tier(q, held, device)
        lo = _key_ordered(index, q, device)
        seen.clear()
        _lookup_key_ordered(index, q, ref)
        (queues,) = seen
        assert sum(x.numel() for _, x in queues) == lo.numel()
        chunk_ids = chunk_of(index, lo)
        for chunk, x in queues:
            assert bool((chunk_ids[x] == chunk_number(index, chunk)).all())  # each queue its chunk's keys only
            assert torch.equal(x, torch.arange(int(x[0]), int(x[0]) + x.numel()))  # a run, in key order
    s = index.stats()
    assert s["queries_cpu"] > 0 and s["queries_in_place"] > 0


def test_hot_tier_warm_learning_and_pauses(gen):
    keys = int64_keys("uniform", 3000, gen)
    cg = CgRXIndex(keys)
    index = chunked(keys, "cpu", gpu_budget=1 << 20, hot_keys=50)
    values = torch.randn(keys.numel(), dtype=torch.float64, generator=gen)
    absent = torch.tensor([12345678901, -5])  # not in the index: never in the tier
    given = index.hot_capacity_given  # a given tier learns nothing: the candidates' share holds keys too
    assert 50 < given < 80 + 50
    assert index.warm(torch.cat([absent, keys[: given + 50], keys[:10]])) == given and not index.hot_learn
    q = torch.cat([keys[:60], absent, keys[2000:2100]])
    got, want = index.lookup(q), cg.lookup(q)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    assert index.stats()["last_batch"]["hot_hits"] == 60
    agg, ref = index.aggregate(q, values), cg.aggregate(q, values)
    assert torch.equal(agg.count, ref.count) and torch.allclose(agg.sum, ref.sum, rtol=0, atol=1e-12)
    index.hot_tier = False
    assert index.lookup(q).count.tolist() == want.count.tolist()
    assert index.stats()["last_batch"]["hot_hits"] == 0
    # uniform distinct keys: nothing is worth a tier; learning pauses instead of paying every batch
    index.hot_tier, index.hot_learn = True, True
    index.clear_hot()
    assert index.hot_tier_keys.numel() == 0 and index.stats()["hot_pairs"] == index.stats()["hot_row_map"] == 0
    for i in range(3):
        got = index.lookup(keys[i * 300 : (i + 1) * 300])
        assert got.first_row.tolist() == list(range(i * 300, (i + 1) * 300))
    assert index.stats()["hot_paused"] > 0 and index.stats()["hot_keys"] == 0
    with pytest.raises(ValueError, match="no hot tier"):
        chunked(keys, "cpu", gpu_budget=1 << 20, hot_keys=0).warm(keys[:3])
    with pytest.raises(ValueError, match="hot_keys=60000 takes"):
        chunked(keys, "cpu", gpu_budget=1 << 20, hot_keys=60000)
    with pytest.raises(ValueError, match="hot_sample must be at least 1"):
        chunked(keys, "cpu", gpu_budget=1 << 20, hot_sample=0)
    assert index.hot_sample is None  # by the queries' device
    with pytest.raises(TypeError, match="hot_sample must be an integer"):
        index.hot_sample = 2.5  # refused where it is set
    assert index.hot_sample is None


def test_hot_tier_learns_what_the_next_batch_asks_for(gen):
    """Good-Turing credit: uniform draws whose keys repeat by chance build no tier; Zipf draws fill it, with keys
    seen once as well, and it answers most of a fresh batch."""
    n, m, cap = 100000, 4000, 500  # a tier of 0.5% of uniform keys would answer 0.5%: not worth it
    keys = int64_keys("uniform", n, gen)
    index = chunked(keys, "cpu", gpu_budget=1 << 22, hot_keys=cap)
    for _ in range(3):
        index.lookup(keys[torch.randint(0, n, (m,), generator=gen)])  # about 80 keys drawn twice per batch
    assert index.stats()["hot_keys"] == 0
    # A batch larger than the learning sample: the sample must not draw a query twice (with replacement, about
    # 1000 of its 2000 queries would repeat one and read as keys seen twice).
    index.hot_sample = 2000
    index.clear_hot()  # learning paused after the batches above
    for _ in range(3):
        index.lookup(keys[torch.randint(0, n, (m,), generator=gen)])
    assert index.stats()["hot_keys"] == 0 and index.stats()["hot_rebuilds"] == 0
    index.hot_sample = None
    perm = torch.randperm(n, generator=gen)

    def zipf_batch(s=1.2):
        u = torch.rand(m, dtype=torch.float64, generator=gen)
        rank = (((n + 1) ** (1 - s) - 1) * u + 1) ** (1 / (1 - s))
        return keys[perm[(rank.floor().long() - 1).clamp(0, n - 1)]]

    index.clear_hot()
    for _ in range(3):
        index.lookup(zipf_batch())
    twice = int((torch.unique(zipf_batch(), return_counts=True)[1] >= 2).sum())
    assert index.stats()["hot_keys"] == cap > twice  # filled beyond the keys a batch repeats
    index.hot_learn = False
    fresh = zipf_batch()
    got, want = index.lookup(fresh), CgRXIndex(keys).lookup(fresh)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    assert index.stats()["last_batch"]["hot_hits"] > 0.6 * m


def test_hot_tier_with_a_row_map_and_a_base(gen):
    """A tier whose rows span 2^32 or more keeps a row map of offsets from its smallest row, which need not be
    0: its answers equal those of the chunks alone (lookup, CSR, aggregate)."""
    n = 3000
    keys = torch.randint(0, 300, (n,), generator=gen, dtype=torch.int64)
    state = chunked(keys, "cpu", gpu_budget=1 << 18, hot_keys=0).state_dict()
    far = (state["keys"] ^ -(2**63)) >= 150  # the state's keys are ordered keys: int64 keys flipped
    rows = state["rows"] + 1000 + far.to(torch.int64) * 2**40
    plain = ChunkedIndex.from_state_dict({**state, "rows": rows}, device="cpu", gpu_budget=1 << 18, hot_keys=0)
    tiered = ChunkedIndex.from_state_dict({**state, "rows": rows}, device="cpu", gpu_budget=1 << 18, hot_keys=3000)
    q = torch.tensor([5, 10, 200, 250, 299, 0, 77, 1000])
    assert tiered.warm(q) == 7 and tiered.stats()["hot_row_map"] > 0 and tiered.stats()["hot_row_base"] >= 1000
    _equal(list(tiered.lookup(q)) + list(tiered.lookup_all(q)), list(plain.lookup(q)) + list(plain.lookup_all(q)))
    assert tiered.stats()["last_batch"]["hot_hits"] == 7


def test_hot_tier_aggregates_rows_shared_by_pairs():
    """Updates may give several pairs one row ID: a tier (or chunk) holding row offsets then has more pairs than
    values from its base on; its aggregates still equal the chunks' alone."""
    for hot in (0, 50):
        index = ChunkedIndex(torch.arange(2000), device="cpu", chunk_bytes=1024, gpu_budget=1 << 16, hot_keys=hot)
        index.update(insert_keys=torch.full((10,), 5000), insert_rows=torch.full((10,), 1999))
        last = index.chunk_info()[-1]
        # more pairs than values
        assert last["row_base"] > 0 and last["n"] > 2000 - last["row_base"] and last["row_map"] == 0
        if hot:
            assert index.warm(torch.tensor([5000])) == 1
            assert index.stats()["hot_row_map"] == 0 and index.stats()["hot_row_base"] == 1999
        got = index.aggregate(torch.tensor([5000, 3, 1999, 9999]), torch.arange(2000))
        assert got.count.tolist() == [10, 1, 1, 0] and got.sum.tolist() == [19990, 3, 1999, 0]


def test_hot_tier_stays_within_its_reservation_when_rows_pass_2_32(gen):
    """The reservation prices a tier without a row map while row IDs are below 2^32; an update that hands out a
    row ID past it makes the rebuilt tier hold fewer pairs (a row map each), not more bytes."""
    keys = torch.randint(0, 20000, (40000,), generator=gen, dtype=torch.int64)
    cap = 2000
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=1 << 14, gpu_budget=1 << 20, hot_keys=cap)
    reserved = cap * index.hot_pair_bytes
    hot = keys.unique()[:3000]
    index.warm(hot, learn=True)  # a learning tier: its pairs' share of the reservation
    assert index.stats()["hot_row_map"] == 0 and index.memory()["hot"] <= reserved
    index.update(insert_keys=hot[:1], insert_rows=torch.tensor([2**40]))
    got = index.lookup(hot[:100])  # rebuilds the tier over the new chunks
    assert index.stats()["hot_row_map"] > 0 and index.stats()["hot_pairs"] < cap
    assert index.memory()["hot"] <= reserved
    index.hot_tier = False
    want = index.lookup(hot[:100])
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)


def test_an_update_rebuilds_the_tier_over_its_keys_in_priority_order():
    """warm's order is the tier's priority: a rebuild after an update that leaves room for fewer pairs (row IDs
    past 2^32: a row map each) keeps the most important keys, not the lowest."""
    index = ChunkedIndex(torch.arange(1000), device="cpu", chunk_bytes=2048, gpu_budget=1 << 16, hot_keys=4)
    assert index.warm(torch.tensor([900, 800, 700, 1]), learn=True) == 4
    index.update(insert_keys=torch.tensor([5]), insert_rows=torch.tensor([2**40]))
    got = index.lookup(torch.tensor([900, 800, 700, 1]))  # rebuilds the tier: room for 2 pairs now
    assert got.first_row.tolist() == [900, 800, 700, 1]
    assert index.stats()["last_batch"]["hot_hits"] == 2 and index.hot_tier_keys.tolist() == [900, 800]


def test_a_given_tier_holds_the_learning_candidates_share_too(gen):
    """warm(learn=False) learns nothing, so the candidates' share of the reservation holds pairs too: up to
    hot_capacity_given keys in the same bytes, the first of the given order; once learning resumes the tier
    keeps its first hot_capacity keys beside the candidates, still within the reservation. Answers unchanged."""
    keys = torch.randint(-2**63, 2**63 - 1, (20000,), generator=gen)
    cap = 1000
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=1 << 14, gpu_budget=1 << 20, hot_keys=cap)
    reserved = cap * (HOT_CANDIDATE_BYTES + index.hot_pair_bytes)
    given = index.hot_capacity_given
    assert given == reserved // index.hot_pair_bytes > cap
    prio = keys[torch.randperm(keys.numel(), generator=gen)][: 3 * cap]
    assert index.warm(prio) == given and index.memory()["hot"] <= reserved
    q = torch.cat([prio[:given], prio[given : given + 50]])
    got = index.lookup(q)
    assert index.stats()["last_batch"]["hot_hits"] == given  # the first given keys, none after them
    index.hot_tier = False
    want = index.lookup(q)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    index.hot_tier, index.hot_learn = True, True
    got = index.lookup(q)
    assert index.stats()["hot_keys"] <= cap and index.memory()["hot"] <= reserved
    assert index.stats()["last_batch"]["hot_hits"] == cap  # its first keys (learning has replaced none yet)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    assert index.warm(prio, learn=True) == cap


def test_a_given_tier_rebuilt_by_an_update_keeps_its_first_keys():
    """A given tier (learning nothing, the candidates' share holding pairs) rebuilt after an update that leaves
    room for fewer pairs (row IDs past 2^32: a row map each) keeps its most important keys, within the
    reservation."""
    index = ChunkedIndex(torch.arange(1000), device="cpu", chunk_bytes=2048, gpu_budget=1 << 16, hot_keys=4,
                         layout="packed_row")
    reserved = 4 * (HOT_CANDIDATE_BYTES + index.hot_pair_bytes)
    prio = torch.tensor([900, 800, 700, 600, 500, 400, 1])
    assert index.hot_capacity_given == 7 and index.warm(prio) == 7
    index.update(insert_keys=torch.tensor([5]), insert_rows=torch.tensor([2**40]))
    got = index.lookup(prio)  # rebuilds the tier: room for reserved // (pair + row map) pairs now
    assert got.first_row.tolist() == prio.tolist()
    room = reserved // index.hot_pair_bytes
    assert index.hot_tier_keys.tolist() == prio[:room].tolist()
    assert index.stats()["last_batch"]["hot_hits"] == room and index.memory()["hot"] <= reserved


def test_learning_pauses_when_no_candidate_fits_the_tier(monkeypatch):
    """Hot keys whose rows outnumber the tier's room build no tier: learning then pauses instead of fetching
    their rows again on every batch."""
    keys = torch.cat([torch.full((50,), 7), torch.full((50,), 9), torch.arange(100, 2000)])
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=4096, gpu_budget=1 << 16, hot_keys=4)
    rebuilds = []
    plain = HotTier.rebuild
    monkeypatch.setattr(HotTier, "rebuild", lambda self, prio, D: (rebuilds.append(1), plain(self, prio, D)))
    q = torch.cat([torch.tensor([7, 9]).repeat(500), torch.arange(100, 300)])
    for _ in range(6):
        got = index.lookup(q)
        assert got.count[:2].tolist() == [50, 50] and got.first_row[:2].tolist() == [0, 50]
    assert index.stats()["hot_keys"] == 0 and len(rebuilds) == 1


def test_an_update_that_fails_reading_the_tier_changes_nothing(monkeypatch):
    """The tier's keys (to rebuild it after an update) are read before anything changes: an error there leaves
    the chunks and the tier as they were."""
    keys = torch.arange(1000, dtype=torch.int64) % 100
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=4096, gpu_budget=1 << 18, hot_keys=200)
    index.warm(torch.tensor([7]))
    before = index.lookup_all(torch.tensor([7, 8]))

    def oom(self):
        raise torch.OutOfMemoryError("simulated: the tier's keys")

    monkeypatch.setattr(HotTier, "keys", oom)
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        index.delete(torch.tensor([7]))
    monkeypatch.undo()
    for use_tier in (True, False):
        index.hot_tier = use_tier
        after = index.lookup_all(torch.tensor([7, 8]))
        assert torch.equal(after.offsets, before.offsets) and torch.equal(after.rows, before.rows)
    assert len(index) == 1000
    index.hot_tier = True
    assert index.delete(torch.tensor([7])).deleted == 10  # and it still updates
    assert index.lookup(torch.tensor([7])).count.tolist() == [0]


def test_hot_tier_samples_the_whole_batch(gen):
    """A batch between one and two samples long: the sample spans all of it (a sample of its front would miss
    hot keys that come at its end, as when a batch joins two request streams)."""
    n = 100000
    keys = int64_keys("uniform", n, gen)
    index = chunked(keys, "cpu", gpu_budget=1 << 22, hot_keys=500, hot_sample=2000)
    hot = keys[:10]
    cold = keys[torch.randperm(n, generator=gen)[:2000] + 0]
    batch = torch.cat([cold, hot.repeat(100)])  # 3000 queries: the hot keys only in the last third
    index.lookup(batch)
    assert index.stats()["hot_keys"] > 0
    assert bool(torch.isin(hot, index.hot_tier_keys).all())


def test_per_batch_stats_equal_what_moved(gen):
    """Bytes copied per batch = the bytes of the chunks the batch touched that were not cached when it began
    (GPU-only serving: each touched chunk is copied at most once per batch), and the batches sum to the total."""
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu", gpu_budget=4 * SMALL + 1024, processors="gpu", hot_keys=0)
    total = 0
    for step in range(6):
        q = keys[torch.randint(0, keys.numel(), (50 + 200 * step,), generator=gen)]
        resident = {i for i, c in enumerate(index.chunk_info()) if c["cached"]}
        touched = set(torch.unique(chunk_of(index, torch.ops.rtindex.map_keys(q, 0))).tolist())
        sizes = [c["bytes"] for c in index.chunk_info()]
        index.lookup(q)
        last = index.stats()["last_batch"]
        assert last["bytes_copied"] == sum(sizes[i] for i in touched - resident), step
        assert last["chunk_misses"] == len(touched - resident) and last["chunk_hits"] == len(touched & resident)
        assert last["queries_gpu"] == q.numel() and last["queries_cpu"] == 0 and last["queries"] == q.numel()
        total += last["bytes_copied"]
    assert index.stats()["bytes_copied"] == total


def test_splitter_range_build_equals_one_sort(gen):
    keys = torch.cat([int64_keys("duplicates", 3000, gen), int64_keys("uniform", 2000, gen)])
    whole = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    ranged = chunked(keys, "cpu", gpu_budget=DUP_BUDGET, build_sort_keys=700)
    assert [c["n"] for c in ranged.chunk_info()] != [] and len(ranged) == keys.numel()
    check_all_forms(ranged, keys, "int64", gen, "cpu", n_q=300)
    q = keys[:800]
    a, b = whole.lookup_all(q), ranged.lookup_all(q)
    assert torch.equal(a.rows, b.rows)


def test_out_of_memory_making_the_cache_slab_keeps_the_index_usable(gen, monkeypatch):
    """The cache's slab is allocated on the first copy; out of memory then fails that batch with a clear error and
    gives the slot it had taken back: the next batch allocates the slab and answers."""
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", processors="gpu", hot_keys=0)
    plain = Arena.storage

    def no_memory(self):
        raise torch.OutOfMemoryError("injected: no room for the slab")

    monkeypatch.setattr(Arena, "storage", no_memory)
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        index.lookup(keys[:500])
    # nothing allocated, nothing cached (the cache's own test checks that the slot went back)
    assert index.memory()["cache"] == 0 and index.stats()["resident_chunks"] == 0
    monkeypatch.setattr(Arena, "storage", plain)
    check_lookup(index.lookup(keys[:500]), *Reference(keys, "int64").points(keys[:500])[:2])


def _fixed_rates(index, monkeypatch, **rates):
    """Pins the planner's rates (no calibration, no learning), so that a test knows which way each queue goes."""
    index._cost.rate.update(rates)
    index._cost.fixed_s = dict.fromkeys(index._cost.fixed_s, 0.0)
    index._cost.measured = dict.fromkeys(index._cost.measured, "points")
    monkeypatch.setattr(Executor, "learn_rates", lambda self, batch: None)


@pytest.mark.parametrize("updatable", [False, True])
def test_queues_read_in_place_match_the_reference(gen, monkeypatch, updatable):
    """read_in_place on a CPU index (the GPU's reads of pinned host chunks, as the tests can run them): copies
    priced out, every uncached queue is read in place; the answers are those of the other ways."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET, updatable=updatable, hot_keys=0)
    assert index.read_in_place is None and index.rates().in_place == 0  # automatic: off on a CPU index
    index.read_in_place = True
    _fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    assert index.rates().in_place == 1e9
    check_all_forms(index, keys, "int64", gen, "cpu", n_q=300)
    s = index.stats()
    assert s["queries_in_place"] > 0 and s["chunk_misses"] == 0 and s["queries_in_place"] == s["queries_gpu"]
    index.read_in_place = False
    assert index.rates().in_place == 0
    with pytest.raises(TypeError, match="read_in_place must be None"):
        index.read_in_place = "yes"


def test_in_place_rate_is_calibrated_then_learned(gen):
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu", hot_keys=0)
    assert index.stats()["rates_measured"] == {"cpu": None, "copy": None, "gpu": None, "in_place": None}  # guesses
    index.read_in_place = True
    q = keys[torch.randint(0, keys.numel(), (20000,), generator=gen)]  # queues of over 256: calibrated
    ref = CgRXIndex(keys).lookup(q)
    for _ in range(3):
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["rates_measured"]["in_place"] and index.rates().in_place > 0
    assert index.stats()["in_place_rate"] is not None
    index.processors = "gpu"  # GPU-only serving copies chunks in: the baseline in-place reads are measured against
    assert index.rates().in_place == 0


def test_point_lookups_calibrate_after_a_warm_tier(gen):
    """warm() fetches its keys' rows in one CSR batch, which calibrates the rates if nothing had; the first point
    batch after it calibrates them again on point lookups, and later CSR batches leave them alone."""
    keys = int64_keys("uniform", 20000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=2000)
    index.read_in_place = True
    index.warm(keys[:2000])
    assert index.stats()["rates_measured"]["cpu"] == index.stats()["rates_measured"]["in_place"] == "other"
    q = keys[torch.randint(0, keys.numel(), (40000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    got = index.lookup(q)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["rates_measured"]["cpu"] == index.stats()["rates_measured"]["in_place"] == "points"
    rates = index.rates()
    index.lookup_all(q)
    assert (index.rates().cpu, index.rates().in_place) == (rates.cpu, rates.in_place)


def test_a_rate_that_priced_its_way_out_is_calibrated_again(gen, monkeypatch):
    """A rate so low that no plan uses its way is never measured by the batches: after RATE_STALE point batches
    without a measurement, a point batch with a queue big enough to time lookups rather than a call calibrates it
    again."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys = int64_keys("uniform", 20000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=0)
    index.read_in_place = True
    q = keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    index.lookup(q)
    assert index.stats()["rates_measured"]["in_place"] == "points"
    index._cost.rate["in_place"] = 1.0  # one lookup a second: never worth a plan
    for i in range(RATE_STALE - 1):  # the batch above counts as one: its calibration came before its count
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
        assert index.stats()["last_batch"]["queries_in_place"] == 0 and index.rates().in_place == 1.0, i
    index.lookup(q)  # stale, but its queues (about 800) are too small to replace a point batch's rate
    assert index.rates().in_place == 1.0
    big = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]  # queues of about 24 k
    ways, calibrate_way = [], Calibrator.calibrate_way
    monkeypatch.setattr(Calibrator, "calibrate_way", lambda self, name, *a: (
        ways.append(name), calibrate_way(self, name, *a))[1])
    got, ref = index.lookup(big), CgRXIndex(keys).lookup(big)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert "in_place" in ways and index.rates().in_place > 1.0  # calibrated by this batch, on its point lookups
    last = [c for c in index.stats()["calibrations"] if c["way"] == "in_place"][-1]
    assert last["points"] and last["set"]


def test_a_calibration_gone_wrong_is_mended_after_rate_stale_batches(gen):
    """A fresh index's calibration once priced an H100 host's CPU at a tenth of its rate (4.8 against 42-50 M/s in
    other runs): the CPU then got only take-overs of a few queries, which never move a rate. RATE_STALE point
    batches later a calibration measures it again, and the CPU serves its share."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys = int64_keys("uniform", 200000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 19, gpu_budget=1 << 21, hot_keys=0)
    q = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]  # queues of about 24 k: big enough to time
    ref = CgRXIndex(keys).lookup(q)
    # The cache's stand-in (CPU lookups too) starts from a guess a loaded host's calibrated CPU can fall below,
    # which would hand the stand-in the whole first batch: a pessimistic guess keeps the CPU in the plan.
    index._cost.rate["gpu"] = 1e5
    index.lookup(q)
    assert index.stats()["rates_measured"]["cpu"] == "points" and index.stats()["last_batch"]["queries_cpu"] > 0
    index._cost.rate["cpu"] /= 1e4  # as if the calibration had been timed on a busy host
    for i in range(RATE_STALE + 1):  # the last one calibrates
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["last_batch"]["queries_cpu"] > 1000 and index._cost.stale_after["cpu"] == RATE_STALE


def test_calibrations_time_queries_their_warm_up_did_not_read(gen, monkeypatch):
    """Every way's calibration (here the CPU's and in place; the cache's shares the code) warms up on some of a
    queue's queries and times two slices of others: a timed slice the warm-up had read would come from the caches (on
    the H100 the CPU's rate was calibrated at 64-76 M/s that way, against 41-52 M/s in the batches after). The CPU's
    warm-up is wide enough to start its threads, whose start a timed slice would pay."""
    keys = int64_keys("uniform", 200000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 19, gpu_budget=1 << 21, hot_keys=0)
    index.read_in_place = True
    seen, way = {}, []
    calibrate_way, timed = Calibrator.calibrate_way, Calibrator.timed
    monkeypatch.setattr(Calibrator, "calibrate_way", lambda self, name, *a: (
        way.append(name), calibrate_way(self, name, *a))[1])
    monkeypatch.setattr(Calibrator, "timed", lambda self, view, batch, S, t, slices: (
        seen.setdefault(way[-1], []).extend((t.size, a, n) for a, n in slices),
        timed(self, view, batch, S, t, slices))[1])
    q = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    got = index.lookup(q)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert {"cpu", "in_place"} <= set(seen), seen
    for name, slices in seen.items():
        assert len(slices) == 3, (name, slices)  # the warm-up, then two timed sizes
        (size, a0, n0), (_, a1, n1), (_, a2, n2) = slices
        assert 0 == a0 < n0 <= a1 and a1 + n1 <= a2 and a2 + n2 <= size and n1 > n2 > 0, (name, slices)
    # the CPU's warm-up starts every thread of a parallel region (256 queries per task), or takes a quarter queue
    size, _, n0 = seen["cpu"][0]
    assert n0 >= min(size // 4, 256 * torch.get_num_threads())
    # stats() shows what each calibration timed and what it set
    shown = {c["way"]: c for c in index.stats()["calibrations"]}
    for name, slices in seen.items():
        c = shown[name]
        assert c["points"] and c["set"] and [n for n, _ in c["slices"]] == [n for _, _, n in slices]
        assert all(sec > 0 for _, sec in c["slices"]) and c["rate"] > 0 and c["fixed_s"] >= 0  # (the batch refits them)


def _timed_at(rate):
    """A stand-in for Calibrator.timed: every slice timed by a fixed law (10 us plus its lookups at ``rate``)."""
    return lambda self, view, batch, S, t, slices: [(n, 1e-5 + n / rate) for _, n in slices]


def _hot_chunk_and_calibrations(gen, monkeypatch):
    """(keys, a CPU index of small chunks, 50 keys of one chunk, the names of the rates each calibration sets)."""
    keys = torch.unique(torch.randint(-2**62, 2**62, (200000,), generator=gen))
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=0)
    hot = keys[1000:1050]
    assert chunk_of(index, hot ^ TOP).unique().numel() == 1
    calibrations, learn = [], CostModel.learn
    monkeypatch.setattr(CostModel, "learn", lambda self, name, samples, points, reset=False: (
        calibrations.append(name) if reset else None, learn(self, name, samples, points, reset))[1])
    return keys, index, hot, calibrations


def test_a_stale_rate_is_calibrated_after_its_wait_not_every_batch(gen, monkeypatch):
    """A calibration is a measurement: it makes the rate fresh even where its slices (at most 2^15, eight ninths of
    the queue) stay under RATE_QUEUE, else a stale rate with a largest queue of 16.9-18.7 k lookups was calibrated
    again, its fit thrown away, on every batch. Calibrations here time a fixed law (a shared 2-core host's timings
    vary 70x); the batches are real."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys, index, hot, calibrations = _hot_chunk_and_calibrations(gen, monkeypatch)
    index.read_in_place = True
    monkeypatch.setattr(Calibrator, "timed", _timed_at(2e7))

    def batch():
        return torch.cat([hot[torch.randint(0, hot.numel(), (17000,), generator=gen)],
                          keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]])

    index.lookup(batch())
    index.processors = "gpu"  # the hot chunk cached (on a GPU: its queue served from the cache, not in place)
    index.lookup(hot)
    index.processors = "auto"
    index._cost.age["in_place"], index._cost.rate["in_place"] = RATE_STALE, 1.0  # stale and priced out of every plan
    calibrations.clear()
    ref = CgRXIndex(keys)
    for _ in range(12):
        q = batch()
        got, want = index.lookup(q), ref.lookup(q)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    # Stale at the first batch; after it, again at most every RATE_STALE batches while the way stays out of the plans.
    assert 1 <= calibrations.count("in_place") <= 1 + (12 - 1) // RATE_STALE


def test_a_stale_cache_rate_is_calibrated_again(gen, monkeypatch):
    """The cache's rate, like the others, can price its way out of every plan (a wrong big-queue sample): then no
    batch measures it again. After RATE_STALE point batches a point batch with a big queue of a cached chunk
    calibrates it (once), and the cache serves again."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys, index, hot, calibrations = _hot_chunk_and_calibrations(gen, monkeypatch)

    def batch():  # a big queue for the hot (cached) chunk
        return torch.cat([hot[torch.randint(0, hot.numel(), (40000,), generator=gen)],
                          keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]])

    index.processors = "gpu"  # the hot chunk cached, the cache's rate measured on its queue
    index.lookup(hot[torch.randint(0, hot.numel(), (40000,), generator=gen)])
    index.processors = "auto"
    index.lookup(batch())
    assert index.stats()["rates_measured"]["gpu"] == "points"
    index._cost.rate["gpu"] = 1.0  # one lookup a second: the plan gives the cache nothing
    ref = CgRXIndex(keys)
    calibrations.clear()
    # The calibration times a fixed law: the cache at 1e9 lookups/s (on this CPU index its reads are the CPU's own).
    monkeypatch.setattr(Calibrator, "timed", _timed_at(1e9))
    for i in range(RATE_STALE + 2):
        q = batch()
        priced_out = index.rates().gpu == 1.0
        got, want = index.lookup(q), ref.lookup(q)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
        served = index.stats()["last_batch"]["queries_gpu"]
        if priced_out and index.rates().gpu == 1.0:
            assert served == 0, i
        elif priced_out:  # this batch calibrated the cache's rate, then planned with it
            assert i <= RATE_STALE and served > 0
    assert calibrations.count("gpu") == 1


def test_queues_read_in_place_next_to_cached_ones(device, gen, monkeypatch):
    """One batch with queues served from the cache and queues read in place (on CUDA: the pinned host chunks
    through their mapped views), next to the CPU's."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=0)
    index.lookup(keys[:1500].to(device))  # fills the cache
    assert index.stats()["resident_chunks"] > 0
    index.processors, index.read_in_place = "auto", True
    _fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    index.reset_stats()
    check_all_forms(index, keys, "int64", gen, device, n_q=300)
    s = index.stats()
    assert s["queries_in_place"] > 0 and s["chunk_hits"] > 0 and s["chunk_misses"] == 0


@pytest.mark.parametrize("processors", ["auto", "cpu"])
def test_point_queues_answered_in_groups(device, gen, monkeypatch, processors):
    """Point queues of chunks holding row offsets go in groups, one operator call each: every queue the GPU reads
    in place (on a CPU index, its stand-in) of a batch in key order (the tier's misses), and the CPU worker's small
    queues; the answers are the reference's (duplicates, misses, the 64-bit edges)."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: (S.type, len(tasks)))
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([-(2**63), 2**63 - 1, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors=processors,
                    hot_keys=64 if processors == "auto" else 0,
                    cpu_group_queries=64,  # several CPU groups per batch
                    in_place_window=1 << 15)
    if processors == "auto":
        index.read_in_place = True
        index.hot_learn = False
        index.warm(keys[:8].to(device))  # the misses of a tier go to the chunks in key order
        _fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
        calls.clear()
    ref = Reference(keys, "int64")
    for _ in range(3):
        q = torch.cat([point_queries(keys, 600, gen), torch.tensor([-(2**63), 2**63 - 1, 0, -1, 1, -2])])
        first, count, _ = ref.points(q)
        check_lookup(index.lookup(q.to(device)), first, count)
    if processors == "auto":  # every queue read in place: one group per batch, on the GPU's device
        assert [c[0] for c in calls] == [index.device.type] * 3 and all(n > 5 for _, n in calls)
        s = index.stats()
        assert s["hot_hits"] > 0 and s["queries_in_place"] == s["queries"] - s["hot_hits"]
        # a batch not sorted by key (the tier off): a launch per queue, whatever the window
        index.hot_tier = False
        calls.clear()
        check_lookup(index.lookup(q.to(device)), first, count)
        assert calls == [] and index.stats()["queries_in_place"] == s["queries_in_place"] + q.numel()
    else:
        assert calls and all(c[0] == "cpu" for c in calls) and max(n for _, n in calls) > 1


def test_cached_queues_join_the_in_place_launch(device, gen, monkeypatch):
    """In a batch sorted by key (the tier's misses), the cached chunks' queues go in the in-place queues' one launch,
    each read from its cache slot. The answers are the reference's (the 64-bit edges, duplicates); the stats count
    the cached chunks as hits and only the other queues' queries as read in place."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: sorted(t.resident for t in tasks))
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys[:1500].to(device))  # fills the cache
    index.processors, index.read_in_place = "auto", True
    _fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)  # the GPU serves; no copies
    held = _tier_of_one_key(index, keys)
    samples = []
    monkeypatch.setattr(Executor, "learn_rates", lambda self, batch: samples.append(batch.in_place_lookups))
    cached = {i for i, c in enumerate(index.chunk_info()) if c["cached"]}
    assert 0 < len(cached) < index.num_chunks
    ref = Reference(keys, "int64")
    for n in (1, 700):
        q = torch.cat([point_queries(keys, n, gen), torch.tensor([I64_MIN, I64_MAX] * (n > 1), dtype=torch.int64)])
        q = _misses_of_the_tier(q, held, device)
        lo = _key_ordered(index, q, device)
        ids = chunk_of(index, lo)
        in_cached = sum(int((ids == c).sum()) for c in cached)
        hit_chunks = sum(int((ids == c).any()) for c in cached)
        calls.clear()
        samples.clear()
        index.reset_stats()
        _lookup_key_ordered(index, q, ref)
        s = index.stats()
        assert s["queries_gpu"] == lo.numel() and s["queries_in_place"] == lo.numel() - in_cached
        # the in-place rate's samples: the one launch's in-place queries, and their share of its time by the planned
        # rates (equal here: by count)
        if n > 1:
            ((_, _, m, share),) = samples[0]
            assert m == lo.numel() - in_cached and share == pytest.approx(m / lo.numel())
        assert s["chunk_hits"] == hit_chunks and s["chunk_misses"] == 0
        queues = hit_chunks + len(set(ids.tolist()) - cached)
        if n > 1:
            assert hit_chunks > 0 and queues > hit_chunks + 1
            assert calls == [[False] * (queues - hit_chunks) + [True] * hit_chunks]  # one launch for every queue
        else:
            assert calls == []  # one queue: a launch of its own


def test_cached_queues_join_no_launch_without_in_place_reads(device, gen, monkeypatch):
    """With the GPU reading nothing in place (read_in_place off), a batch sorted by key keeps a launch per cached
    queue: cached queues join only a launch that reads some queue in place."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: len(tasks))
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys.to(device), device, gpu_budget=1 << 20, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys.to(device))  # every chunk cached
    assert all(c["cached"] for c in index.chunk_info())
    index.processors, index.read_in_place = "auto", False
    _fixed_rates(index, monkeypatch, cpu=1e3, copy=1e12, gpu=1e9, in_place=1e9)
    q = _misses_of_the_tier(point_queries(keys, 500, gen), _tier_of_one_key(index, keys), device)
    lo = _key_ordered(index, q, device)
    index.reset_stats()
    _lookup_key_ordered(index, q, Reference(keys, "int64"))
    s = index.stats()
    assert calls == [] and s["chunk_hits"] > 1 and s["queries_in_place"] == 0 and s["queries_gpu"] == lo.numel()


def test_cached_queue_evicted_by_an_in_place_view_is_read_in_place(device, gen, monkeypatch):
    """Making a chunk's in-place view can carve its search part out of the cache's shared slab and evict the cached
    chunks there (on CUDA), the one launch's own among them: such a queue is read in place instead of from its old
    slot. Forced here on both devices: every cached chunk evicted and its slot overwritten as a view is made; the
    answers stay the reference's and no evicted chunk counts as a hit."""
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys[:1500].to(device))  # fills the cache
    index.processors, index.read_in_place = "auto", True
    _fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    held = _tier_of_one_key(index, keys)
    plain, evicted = ChunkStore.in_place_view, []

    def evicting(store, chunk):  # the store's cache is the index's
        if device == "cuda":
            torch.cuda.synchronize()  # the earlier lookups are done with the slots overwritten here
        for c, e in list(store.cache.entries.items()):
            e.arena.storage()[e.off : e.off + align(c.nbytes)].fill_(0xFF)
            store.cache.evict(c)
            evicted.append(c)
        return plain(store, chunk)

    monkeypatch.setattr(ChunkStore, "in_place_view", evicting)
    q = _misses_of_the_tier(torch.cat([point_queries(keys, 700, gen), torch.tensor([I64_MIN, I64_MAX])]),
                            held, device)
    lo = _key_ordered(index, q, device)
    index.reset_stats()
    _lookup_key_ordered(index, q, Reference(keys, "int64"))
    s = index.stats()
    assert evicted and s["chunk_hits"] == 0 and s["queries_in_place"] == lo.numel()


def test_lookup_queues_operator(device, gen):
    """rtindex_internal.cgrx_lookup_queues over separate cgRX indexes: each queue's answers equal its own index's
    lookup with the base added; empty queues; clear errors for mismatched lists and queues out of bounds."""
    ops = torch.ops.rtindex_internal
    parts = [int64_keys("duplicates", 500, gen), int64_keys("uniform", 300, gen), torch.tensor([5, 5, 7])]
    indexes = [CgRXIndex(k.to(device)) for k in parts]
    queries = torch.cat([k[torch.randint(0, k.numel(), (50,), generator=gen)] for k in parts] + [torch.tensor([9, -9])])
    queries = queries.to(device)
    ordered = torch.ops.rtindex.map_keys(queries, 0)
    starts, sizes, bases = [0, 50, 100, 100, 150], [50, 50, 0, 50, 2], [0, 2**40, 7, 3, 0]
    use = [0, 1, 2, 2, 2]
    lead = [indexes[j]._lead for j in use]
    cfg = indexes[0]._cfg_ordered
    first, count = ops.cgrx_lookup_queues([x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], cfg,
                                          ordered, starts, sizes, bases)
    at = 0
    for j, a, n, b in zip(use, starts, sizes, bases):
        want = indexes[j].lookup(queries[a : a + n])
        got_first, got_count = first[at : at + n], count[at : at + n]
        assert torch.equal(got_count, want.count)
        assert torch.equal(got_first, torch.where(want.count > 0, want.first_row + b, -1))
        at += n
    assert at == first.numel() == 152
    torch.library.opcheck(ops.cgrx_lookup_queues.default, ([x[0] for x in lead], [x[1] for x in lead],
                                                           [x[2] for x in lead], cfg, ordered, starts, sizes, bases, 64))
    for window in (1, 64, 0):  # any window, the same answers
        again = ops.cgrx_lookup_queues([x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], cfg, ordered,
                                       starts, sizes, bases, window)
        assert torch.equal(again[0], first) and torch.equal(again[1], count)
    empty = ops.cgrx_lookup_queues([], [], [], cfg, ordered, [], [], [])
    assert empty[0].numel() == 0 and empty[1].numel() == 0
    x = lead[0]
    with pytest.raises(RuntimeError, match="one pairs, reps, table, start, size and base per queue"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0, 1], [1], [0])
    with pytest.raises(RuntimeError, match="is not within the 152 queries"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [150], [3], [0])
    with pytest.raises(RuntimeError, match="bases must be >= 0"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0], [3], [-1])
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0], [3], [0], -5)


# ------------------------------------------------------------------------------------------------- updates
class Multiset:
    def __init__(self, keys, rows):
        self.pairs = Counter(zip(keys, rows))

    def apply(self, ins_k, ins_r, del_k, del_r):
        for k, r in zip(ins_k, ins_r):
            self.pairs[(k, r)] += 1
        removed = found = 0
        present = {k for k, _ in self.pairs}
        for i, k in enumerate(del_k):
            if del_r is None:
                hits = [p for p in self.pairs if p[0] == k]
                removed += sum(self.pairs.pop(p) for p in hits)
                found += k in present
            elif self.pairs[(k, del_r[i])] > 0:
                self.pairs[(k, del_r[i])] -= 1
                removed += 1
                found += 1
        self.pairs = +self.pairs
        return removed, len(del_k) - found


def pairs_of(index):
    """The index's (key, row ID) pairs as a multiset, from its state (ordered keys)."""
    state = index.state_dict()
    return Counter((_signed(k), r) for k, r in zip(state["keys"].tolist(), state["rows"].tolist()))


def _signed(ordered: int) -> int:
    return ordered ^ -(2**63)  # int64 keys: the ordered key with the top bit flipped back


def check_against(index, ref, rng, device):
    assert pairs_of(index) == ref.pairs
    assert len(index) == sum(ref.pairs.values())
    keys = sorted({k for k, _ in ref.pairs})
    probe = rng.sample(keys, min(30, len(keys))) + [rng.randint(I64_MIN, I64_MAX) for _ in range(5)]
    got = index.lookup(torch.tensor(probe, device=device))
    for k, f, c in zip(probe, got.first_row.tolist(), got.count.tolist()):
        rows = sorted(r for (kk, r), n in ref.pairs.items() if kk == k for _ in range(n))
        assert (f, c) == ((rows[0] if rows else -1), len(rows))
    full = index.range(torch.tensor([I64_MIN], device=device), torch.tensor([I64_MAX], device=device))
    assert full.rows.cpu().tolist() == [r for _, r in sorted(ref.pairs.elements())]
    los = [c["lo"] for c in index.chunk_info()][1:]
    assert los == sorted(los, key=lambda x: x ^ -(2**63))


def test_random_update_sequences(device):
    rng = random.Random(7)
    pool = [rng.randint(I64_MIN, I64_MAX) for _ in range(200)] + list(range(-30, 30)) + [I64_MIN, I64_MAX, 0, -1]
    keys = [rng.choice(pool) for _ in range(600)]
    index = chunked(torch.tensor(keys, device=device), device, chunk_bytes=2048, gpu_budget=4096 * 3)
    ref = Multiset(keys, range(len(keys)))
    next_row = len(keys)
    chunks_seen = set()
    for step in range(60):
        ins, ins_rows, rows_now, dk, dr = _batch(rng, pool, ref, next_row, far_rows=True, max_pairs=200,
                                                 sizes=(0, 1, 5, 60, 300))
        n_ins = len(ins)
        exp = ref.apply(ins, rows_now, dk, dr)
        res = index.update(
            insert_keys=torch.tensor(ins, dtype=torch.int64, device=device),
            insert_rows=None if ins_rows is None else torch.tensor(ins_rows, dtype=torch.int64, device=device),
            delete_keys=torch.tensor(dk, dtype=torch.int64, device=device),
            delete_rows=None if dr is None else torch.tensor(dr, dtype=torch.int64, device=device),
        )
        assert (res.inserted, res.deleted, res.absent) == (n_ins, *exp), f"batch {step}"
        assert res.rows.cpu().tolist() == rows_now
        if ins_rows is None:
            next_row += n_ins
        else:
            next_row = max([next_row] + [r + 1 for r in ins_rows])
        chunks_seen.add(index.num_chunks)
        check_against(index, ref, rng, device)
    assert max(chunks_seen) > min(chunks_seen)  # chunks were split along the way


def test_updates_split_grown_chunks_and_drop_empty_ones():
    keys = torch.arange(0, 3000, 3)
    index = chunked(keys, "cpu", gpu_budget=1 << 20)
    n0 = index.num_chunks
    res = index.insert(torch.arange(1, 600, 3).repeat(3))  # 600 keys into the first chunks' ranges
    assert res.inserted == 600 and index.num_chunks > n0
    los = [c["lo"] for c in index.chunk_info()]
    assert los[1:] == sorted(los[1:]) and len(set(los[1:])) == len(los) - 1
    ref = Reference(torch.cat([keys, torch.arange(1, 600, 3).repeat(3)]), "int64")
    q = torch.arange(-5, 3005)
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q), first, count)
    check_matches(index.lookup_all(q), rows)
    n1 = index.num_chunks
    res = index.delete(torch.arange(1500, 3000))  # by key: every pair of the upper half
    assert res.deleted == 500 and res.absent == 1000 and index.num_chunks < n1
    assert index.range(torch.tensor([1500]), torch.tensor([10**9])).rows.numel() == 0
    index.insert(torch.tensor([2999, 10**12]))  # the last remaining chunk's range reaches up to the maximum
    assert index.lookup(torch.tensor([2999, 10**12])).count.tolist() == [1, 1]
    index.delete(torch.arange(-1, 10**4))
    index.delete(torch.tensor([10**12]))
    assert len(index) == 0 and index.num_chunks == 1 and index.lookup(torch.tensor([3])).count.item() == 0
    index.insert(torch.tensor([3, 3]))
    assert index.lookup_all(torch.tensor([3])).rows.tolist() == [1602, 1603]


def test_aggregate_values_after_updates():
    index = chunked(torch.tensor([5, 7, 5]), "cpu")
    index.insert(torch.tensor([5]), rows=torch.tensor([10]))
    with pytest.raises(ValueError, match="at least 11"):
        index.aggregate(torch.tensor([5]), torch.ones(4))
    agg = index.aggregate(torch.tensor([5, 7]), torch.arange(11, dtype=torch.float32))
    assert agg.count.tolist() == [3, 1] and agg.sum.tolist() == [12.0, 1.0]


def test_aggregates_summed_from_rows_when_values_sit_on_another_device(gen, monkeypatch):
    """A queue answered on one device with the values on the other (the CPU worker, values on CUDA) is summed
    from its rows on the values' device; forced here on the CPU by telling _answer it serves elsewhere."""
    keys = int64_keys("duplicates", 1500, gen)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    q = point_queries(keys, 400, gen)
    lo, hi = range_queries(keys, 200, gen, 2**40)
    values = torch.randn(keys.numel(), dtype=torch.float64, generator=gen)
    want, want_r = index.aggregate(q, values), index.range_aggregate(lo, hi, values)
    original = Executor.answer
    monkeypatch.setattr(Executor, "answer", lambda self, view, batch, a, b, S: original(
        self, view, batch, a, b, torch.device("meta") if batch.form == "aggregate" else S))
    got, got_r = index.aggregate(q, values), index.range_aggregate(lo, hi, values)
    assert torch.equal(got.count, want.count) and torch.equal(got_r.count, want_r.count)
    torch.testing.assert_close(got.sum, want.sum)
    torch.testing.assert_close(got_r.sum, want_r.sum)


def _fail(monkeypatch, cls, name, nth=1, after=False, error=torch.OutOfMemoryError):
    """cls.name made to raise ``error`` on its nth call (``after``: once that call has run): a fault injected into a
    unit, through its own method. Returns the list of calls made."""
    plain, calls = getattr(cls, name), []

    def failing(*args, **kw):
        calls.append(name)
        if len(calls) == nth and not after:
            raise error(f"injected at {name}")
        out = plain(*args, **kw)
        if len(calls) == nth:
            raise error(f"injected after {name}")
        return out

    monkeypatch.setattr(cls, name, failing)
    return calls


def test_failed_updates_change_nothing(gen, monkeypatch):
    keys = int64_keys("uniform", 2000, gen)
    index = chunked(keys, "cpu")
    q = keys[:300]
    before = index.lookup_all(q)
    info = index.chunk_info()

    def same():
        after = index.lookup_all(q)
        assert torch.equal(before.rows, after.rows) and torch.equal(before.offsets, after.offsets)
        assert len(index) == keys.numel() and [c["n"] for c in index.chunk_info()] == [c["n"] for c in info]

    with pytest.raises(ValueError, match="rows must be row IDs in 0 .. 2"):
        index.insert(keys[:5], rows=torch.tensor([1, 2, -3, 4, 5]))
    with pytest.raises(ValueError, match="one row ID per key"):
        index.delete(keys[:5], rows=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="dtype"):
        index.insert(torch.tensor([1.5]))
    same()
    with monkeypatch.context() as m:
        calls = _fail(m, Builder, "build_chunk", nth=3)  # out of pinned memory building the third new chunk
        with pytest.raises(torch.OutOfMemoryError, match="injected"):
            index.update(insert_keys=keys[::100] + 1, delete_keys=keys[:50])  # touches many chunks
        assert len(calls) == 3
    same()
    with monkeypatch.context() as m:  # a chunk built, then an error: nothing was swapped in yet
        _fail(m, Builder, "build_chunk", nth=1, after=True, error=RuntimeError)
        with pytest.raises(RuntimeError, match="injected after"):
            index.delete(keys[:10])
    same()
    assert index.delete(keys[:10]).deleted >= 10


def test_a_failing_lookup_batch_leaves_the_index_usable(gen, monkeypatch):
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", critical_mass=50)
    index.hot_tier = False  # it could answer a whole batch, and then no chunk task would run to fail
    q = keys[torch.randint(0, keys.numel(), (2000,), generator=gen)]
    want = index.lookup(q)
    # One processor per stage: with both, either may steal the other's queues, and the faulty stage might not run.
    for processors in ("cpu", "gpu"):
        index.processors = processors
        with monkeypatch.context() as m:
            _fail(m, Executor, "answer", nth=2)
            _fail(m, Executor, "answer_group", nth=1)
            with pytest.raises(torch.OutOfMemoryError):
                index.lookup(q)
        got = index.lookup(q)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
        assert index.stats()["resident_bytes"] <= index.gpu_budget


# ------------------------------------------------------------------------------------------ save and open
def test_save_open_lazy_round_trip(tmp_path, gen):
    keys = keys_of_type("float64", 2000, gen)
    index = chunked(keys, "cpu")
    index.save(tmp_path / "idx")
    opened = ChunkedIndex.open(tmp_path / "idx", device="cpu", gpu_budget=3 * SMALL)
    assert not any(c["loaded"] for c in opened.chunk_info()) and len(opened) == len(index)
    q = keys[:5]  # touches a few chunks only
    assert torch.equal(opened.lookup_all(q).rows, index.lookup_all(q).rows)
    loaded = sum(c["loaded"] for c in opened.chunk_info())
    assert 0 < loaded < opened.num_chunks and opened.stats()["disk_loads"] == loaded
    check_all_forms(opened, keys, "float64", gen, "cpu", n_q=300)


def test_corrupt_and_truncated_chunk_files(tmp_path, gen):
    keys = int64_keys("uniform", 2000, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    manifest = json.loads((d / (d / "CURRENT").read_text().strip()).read_text())
    f0 = d / manifest["chunks"][0]["file"]
    f1 = d / manifest["chunks"][1]["file"]
    data = bytearray(f0.read_bytes())
    data[len(data) // 2] ^= 0x40
    f0.write_bytes(bytes(data))
    f1.write_bytes(f1.read_bytes()[:-100])
    opened = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
    in_chunk = [torch.tensor([c["lo"] ^ -(2**63)]) for c in opened.chunk_info()]  # a key of each chunk's range
    with pytest.raises(ValueError, match=f"{f0.name}.*corrupt.*CRC"):
        opened.lookup(torch.tensor([I64_MIN]))  # chunk 0 holds the smallest keys
    with pytest.raises(ValueError, match=f"{f1.name}.*truncated"):
        opened.range(in_chunk[1], in_chunk[1])
    for q in in_chunk[2:]:  # the other chunks still answer
        assert opened.lookup(q).count.item() >= 1
    with pytest.raises(ValueError, match=f"{f0.name}.*corrupt"):  # and the bad ones keep saying so
        opened.lookup(torch.tensor([I64_MIN]))


def test_saves_are_generations_readers_keep_theirs(tmp_path, gen):
    keys = int64_keys("uniform", 1500, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    reader = ChunkedIndex.open(d, device="cpu", gpu_budget=0)  # old state, nothing loaded yet
    index.insert(torch.tensor([42, 42]))
    index.save(d)  # unchanged chunks are hard links, the touched one is new
    newer = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
    q = torch.tensor([42])
    assert reader.lookup(q).count.item() == int((keys == 42).sum())  # the old generation, lazily, intact
    assert newer.lookup(q).count.item() == int((keys == 42).sum()) + 2
    assert len(newer) == len(keys) + 2 and newer.lookup_all(keys[:100]).rows.tolist() == index.lookup_all(keys[:100]).rows.tolist()
    gens = sorted(p.name for p in d.iterdir() if p.is_dir())
    assert gens == ["gen-000001", "gen-000002"]
    index.save(d)
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["gen-000002", "gen-000003"]
    with pytest.raises(ValueError, match="no readable ChunkedIndex"):
        ChunkedIndex.open(tmp_path / "nothing")


# ------------------------------------------------------------------------------------------------- errors
def test_clear_errors(gen):
    keys = int64_keys("uniform", 500, gen)
    with pytest.raises(ValueError, match="NaN"):
        ChunkedIndex(torch.tensor([1.0, float("nan")]), device="cpu")
    with pytest.raises(ValueError, match="backend"):
        ChunkedIndex(keys, device="cpu", backend="optix")
    with pytest.raises(ValueError, match="chunk_bytes"):
        ChunkedIndex(keys, device="cpu", chunk_bytes=10)
    with pytest.raises(ValueError, match="gpu_budget"):
        ChunkedIndex(keys, device="cpu", gpu_budget=-1)
    index = chunked(keys, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        index.lookup(torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="same length"):
        index.range(keys[:3], keys[:2])
    with pytest.raises(ValueError, match="one value per key"):
        index.aggregate(keys[:3], torch.ones(3))
    with pytest.raises(TypeError, match="capacity"):
        index.range_capped(keys[:3], keys[:3], 2.5)
    with pytest.raises(ValueError, match="processors"):
        index.processors = "both"
    with pytest.raises(ValueError, match="zero_copy.*CUDA"):
        index.processors = "zero_copy"  # the GPU reading pinned host memory: a CUDA index only
    assert index.lookup(keys[:3]).count.tolist() == [1, 1, 1]
    assert "ChunkedIndex(keys=505" in repr(index) and index.memory()["chunks"] > 0


def test_benchmark_smoke_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chunked_bench.py"), "--device", "cpu", "--log-keys", "14",
         "--log-lookups", "10,12", "--zipf", "0.99", "--chunk-mib", "0.0625", "--repeats", "1", "--hot-given",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, "RTINDEX_COMMIT": "testcommit"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "chunked_k14_testcommit.json").read_text())
    assert result["commit"] == "testcommit" and result["runs"]
    modes = {r["mode"] for r in result["runs"]}
    assert {"chunked", "cpu_only", "in_core", "hot_given"} <= modes
    assert all(r["checked"] for r in result["runs"] if not r.get("skipped"))
    given = [r for r in result["runs"] if r["mode"] == "hot_given"]
    # the tier holds what it was given
    assert all(r["hot_keys"] == result["build"]["hot_capacity_given"] > 0 for r in given)


def test_readme_section_runs():
    from test_readme_examples import python_blocks

    blocks = python_blocks("Indexes larger than GPU memory")
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md (Indexes larger than GPU memory)", "exec"), {})


READER = r"""
import sys, time, torch
from torch_rtindex import ChunkedIndex
d, states = sys.argv[1], {}
for pair in sys.argv[2].split(","):
    n, c = pair.split(":")
    states[int(n)] = int(c)
import os
open(d + ".ready", "w").close()
seen, deadline = set(), time.time() + 60
while time.time() < deadline:
    done = os.path.exists(d + ".done")  # one more full read after the writer finished
    try:
        index = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
        count = index.lookup(torch.tensor([42])).count.item()
        rows = index.range(torch.tensor([-2**63]), torch.tensor([2**63 - 1])).rows.numel()
    except FileNotFoundError:
        continue  # the generation this reader opened was removed meanwhile (saved over twice): open again
    except ValueError as e:
        if "no readable" in str(e):
            continue
        raise
    assert len(index) in states and states[len(index)] == count and rows == len(index), (len(index), count, rows)
    seen.add(len(index))
    if done:
        break
print("states seen", sorted(seen))
assert seen
"""


def test_a_reader_process_sees_old_or_new_state_never_a_mix(tmp_path, gen):
    keys = int64_keys("uniform", 1500, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    n0, c0 = len(index), int((keys == 42).sum())
    proc = subprocess.Popen([sys.executable, "-c", READER, str(d), f"{n0}:{c0},{n0 + 2}:{c0 + 2}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    ready = Path(str(d) + ".ready")
    for _ in range(600):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    for i in range(30):  # alternate two states while the reader opens and reads
        if i % 2 == 0:
            added = index.insert(torch.tensor([42, 42])).rows
        else:
            assert index.delete(torch.tensor([42, 42]), rows=added).deleted == 2
        index.save(d)
        if proc.poll() is not None:
            break
    Path(str(d) + ".done").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    print(out)


def test_joins_take_a_chunked_index(gen):
    """The joins are written against lookup_all / range / their capped forms: a ChunkedIndex plugs in."""
    from torch_rtindex import join, join_capped, range_join

    keys = int64_keys("duplicates", 1500, gen)
    index, cg = chunked(keys, "cpu", gpu_budget=DUP_BUDGET), CgRXIndex(keys)
    probe = point_queries(keys, 300, gen)
    for how in ("inner", "left"):
        assert all(torch.equal(a, b) for a, b in zip(join(index, probe, how), join(cg, probe, how)))
    lo, hi = range_queries(keys, 100, gen, 2**40)
    assert all(torch.equal(a, b) for a, b in zip(range_join(index, lo, hi), range_join(cg, lo, hi)))
    assert all(torch.equal(a, b) for a, b in zip(join_capped(index, probe, 50), join_capped(cg, probe, 50)))


def test_row_ids_past_2_31_and_2_32():
    """A chunk's row map holds unsigned 32-bit offsets when its rows span < 2^32, int64 beyond."""
    index = chunked(torch.tensor([5, 6, 7]), "cpu", gpu_budget=0)
    index.insert(torch.tensor([5, 6]), rows=torch.tensor([3_000_000_000, 2**31]))
    assert index.chunk_info()[0]["row_map"] == 0  # rows spanning < 2^32: offsets from the chunk's base
    assert index.lookup_all(torch.tensor([5, 6])).rows.tolist() == [0, 3_000_000_000, 1, 2**31]
    index.insert(torch.tensor([7]), rows=torch.tensor([2**40]))
    assert index.chunk_info()[0]["row_map"] == 6  # past it: an int64 row map
    assert index.range(torch.tensor([5]), torch.tensor([7])).rows.tolist() == [0, 3_000_000_000, 1, 2**31, 2, 2**40]
    values = torch.zeros(2**20, dtype=torch.int64)
    with pytest.raises(ValueError, match="at least"):
        index.aggregate(torch.tensor([5]), values)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("processors", ["auto", "gpu", "cpu"])
def test_cuda_index_with_cpu_queries_and_cpu_index_with_cuda_queries(gen, processors):
    keys = int64_keys("uniform", 3000, gen)
    cg = CgRXIndex(keys)
    q = point_queries(keys, 500, gen)
    lo, hi = range_queries(keys, 200, gen, 2**40)
    values = torch.arange(keys.numel(), dtype=torch.float64)
    for index_device, query_device in (("cuda", "cpu"), ("cpu", "cuda")):
        index = chunked(keys, index_device, processors=processors)
        for _ in range(2):
            got = index.lookup(q.to(query_device))
            assert got.first_row.device.type == query_device
            assert torch.equal(got.first_row.cpu(), cg.lookup(q).first_row)
            m = index.range(lo.to(query_device), hi.to(query_device))
            assert torch.equal(m.rows.cpu(), cg.range(lo, hi).rows)
            agg = index.range_aggregate(lo.to(query_device), hi.to(query_device), values.to(query_device))
            torch.testing.assert_close(agg.sum.cpu(), cg.range_aggregate(lo, hi, values).sum)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("updatable", [False, True])
def test_zero_copy_serving_matches_cgrx(gen, updatable):
    """processors='zero_copy': the kernels read the pinned host chunks directly; the same answers, nothing cached."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cuda", gpu_budget=DUP_BUDGET, updatable=updatable, processors="zero_copy", hot_keys=0)
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=300)
    s = index.stats()
    assert s["queries_cpu"] == 0 and s["chunk_misses"] == 0 and s["queries_gpu"] > 0
    if updatable:  # an in-place update is seen through the mapped view at once
        new_key = int(keys.max()) + 1 if int(keys.max()) < 2**63 - 1 else int(keys.min()) - 1
        index.insert(torch.tensor([new_key], device="cuda"), torch.tensor([keys.numel()], device="cuda"))
        got = index.lookup(torch.tensor([new_key], device="cuda"))
        assert got.first_row.tolist() == [keys.numel()] and got.count.tolist() == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("updatable", [False, True])
def test_in_place_reads_keep_the_search_part_on_the_gpu(gen, updatable):
    """Where gpu_budget holds every chunk's search part and still two chunks, in-place reads keep each chunk's
    representatives and radix table in GPU memory (made on its first read) and read only the rest over PCIe;
    the answers are unchanged, also after updates that rewrite chunks; a budget without that room keeps none."""
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cuda", gpu_budget=64 * SMALL, updatable=updatable, processors="zero_copy", hot_keys=0)
    assert index.stats()["search_budget"] > 0 and index.memory()["search"] == 0
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=300)
    assert 0 < index.memory()["search"] <= index.stats()["search_budget"]
    assert index._cache.arena.buf is None  # reading in place only: the chunks' slab is never allocated
    assert index.memory()["search"] + index._cache.budget + index.memory()["hot"] <= index.gpu_budget
    for c in index._store.chunks:  # a view made by an in-place read: its search part is not in the pinned blob
        if c.mapped_view is not None and c.mapped_view.resident:
            lo, hi = c.host.data_ptr(), c.host.data_ptr() + c.host.numel()
            assert not lo <= c.mapped_view.index._reps.data_ptr() < hi
            assert not lo <= c.mapped_view.index._table.data_ptr() < hi
            assert lo <= c.mapped_view.index._pairs.data_ptr() < hi
    ref_keys, ref_rows = keys.tolist(), list(range(keys.numel()))
    ins = keys[:50] + 1  # lands in existing chunks (node chunks: applied in place)
    index.insert(ins.cuda(), torch.arange(keys.numel(), keys.numel() + 50, device="cuda"))
    index.delete(keys[100:150].cuda())
    ref_keys, ref_rows = ref_keys + ins.tolist(), ref_rows + list(range(keys.numel(), keys.numel() + 50))
    kept = [(k, r) for k, r in zip(ref_keys, ref_rows) if not (100 <= r < 150)]
    probe = [k for k, _ in kept[::7]] + keys[100:150:5].tolist()
    cg = CgRXIndex(torch.tensor([k for k, _ in kept]))
    got, want = index.lookup(torch.tensor(probe, device="cuda")), cg.lookup(torch.tensor(probe))
    rows = torch.tensor([r for _, r in kept])
    assert torch.equal(got.count.cpu(), want.count)
    hit = want.count > 0
    assert torch.equal(got.first_row.cpu()[hit], rows[want.first_row[hit]])
    largest = max(align(c["bytes"]) for c in index.chunk_info())
    tight = chunked(keys, "cuda", gpu_budget=2 * largest + 64, processors="zero_copy", hot_keys=0)
    assert tight.stats()["search_budget"] == 0  # less the search parts, the budget holds fewer than two chunks
    assert chunked(keys, "cuda", gpu_budget=64 * SMALL, processors="gpu", hot_keys=0).stats()["search_budget"] == 0
    check_lookup(tight.lookup(keys[:500].cuda()), *Reference(keys, "int64").points(keys[:500])[:2])
    assert tight.memory()["search"] == 0


def _arena_accounted(index, views=()):
    """Every byte of the cache's slabs is free, a cached chunk's slot or a live view's search part: the index's
    views and those of ``views`` (weak references to views of replaced chunks) still alive, which must keep
    their slots (the memory checker, for one, keeps some frames and so their views alive)."""
    gc.collect()
    cache = index._cache
    for arena in cache.arenas:
        arena.reclaim()
    live = {id(c.mapped_view): c.mapped_view for c in index._store.chunks if c.mapped_view is not None}
    live.update((id(v), v) for v in (r() for r in views) if v is not None)
    free = sum(size for arena in cache.arenas for _, size in arena.free)
    search = sum(v.resident for v in live.values())
    return free + cache.used() + search == sum(arena.budget for arena in cache.arenas)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_search_parts_take_the_shared_slab_back_from_chunks(gen):
    """The search parts' reservation is the cache's second slab: chunks fill it while no search part is made;
    each chunk's first in-place read carves its search part there, evicting the chunks in the way (never one in
    the first slab); answers stay right through copies and in-place reads, and an update's changed chunks give
    their slots back."""
    keys = int64_keys("uniform", 4000, gen)
    probe = chunked(keys, "cpu", hot_keys=0)
    largest = max(align(c["bytes"]) for c in probe.chunk_info())
    search = int(sum(search_bytes(c.specs) for c in probe._store.chunks) * SEARCH_SLACK)
    index = chunked(keys, "cuda", gpu_budget=3 * largest + search, hot_keys=0)
    cache = index._cache
    assert index.stats()["search_budget"] == search and cache.shared.budget == search and cache.budget == 3 * largest
    index.processors = "gpu"  # every queue copied in (the reservation stays), none taken over by the CPU
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # chunks fill both slabs
    assert any(e.arena is cache.shared for e in cache.entries.values())
    # ids: chunks kept alive would keep their views
    in_first = {id(c) for c, e in cache.entries.items() if e.arena is cache.arena}
    assert all(index._store.in_place_view(c).resident == search_bytes(c.specs) for c in index._store.chunks)
    assert index.memory()["search"] == sum(search_bytes(c.specs) for c in index._store.chunks)
    assert in_first <= {id(c) for c in cache.entries}  # the first slab's chunks stayed
    base = cache.shared.buf.data_ptr()
    parts = [p for c in index._store.chunks for p in (c.mapped_view.index._reps.data_ptr(),
                                                 c.mapped_view.index._table.data_ptr())]
    assert all(base <= p < base + cache.shared.budget for p in parts)
    assert not any(base + e.off <= p < base + e.off + align(c.nbytes)
                   for c, e in cache.entries.items() if e.arena is cache.shared for p in parts)
    assert _arena_accounted(index)
    assert index.memory()["cache"] + index.memory()["search"] + index.memory()["hot"] <= index.gpu_budget
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # copies beside the search parts
    index.processors = "zero_copy"
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # in-place reads through them
    before = index.memory()["search"]
    views = [weakref.ref(c.mapped_view) for c in index._store.chunks]
    index.insert((keys[:40] + 1).cuda(), torch.arange(4000, 4040, device="cuda"))  # its chunks' views go
    assert index.memory()["search"] < before and _arena_accounted(index, views)
    ref = Reference(torch.cat([keys, keys[:40] + 1]), "int64")
    q = point_queries(keys, 500, gen)
    check_lookup(index.lookup(q.cuda()), *ref.points(q)[:2])
    assert index.memory()["search"] > 0 and _arena_accounted(index, views)


def test_chunk_views_are_cold_and_a_plain_index_is_not(gen):
    """A chunk's queue visits it once per batch, so its views ask the CPU kernels to prefetch whatever the chunk's
    size (the config's cold bit); an index of its own, and the hot tier, do not. The answers are the same."""
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", hot_keys=0)
    config = ChunkedConfig(chunk_bytes=SMALL, gpu_budget=0, device="cpu", layout="packed_row").resolved()
    store = ChunkStore(config, "int64", torch.int64, False, Stats())  # the chunk store on its own, as the index's
    store.set(Builder(config, "int64", pin=False).build(keys))
    view = store.host_view(store.chunks[0])
    plain = CgRXIndex(keys)
    assert view.index._cold and not plain._cold
    assert index.lookup(keys[:5]).count.tolist() == [1] * 5
    from torch_rtindex._config import CGRX_CONFIG_FIELDS, cgrx_config
    at = sum(bits for name, bits in CGRX_CONFIG_FIELDS[: [f for f, _ in CGRX_CONFIG_FIELDS].index("cold")])
    base = cgrx_config("uint64", "packed_row", 16, "binary", "radix", [23, 23, 18, 0, 0])
    assert cgrx_config("uint64", "packed_row", 16, "binary", "radix", [23, 23, 18, 0, 0], cold=True) == base | 1 << at


@pytest.mark.parametrize("dist", ["uniform", "duplicates"])
def test_cold_lookups_answer_as_warm_ones(gen, dist):
    """The cold bit changes only how the CPU kernels prefetch: every form answers as the same structure without
    it, over tables below and above the prefetch's size threshold, ranges and misses included."""
    for n in (3000, 1 << 21):
        keys = int64_keys(dist, n, gen)
        warm = CgRXIndex(keys, layout="packed_row")
        cold = CgRXIndex._from_structure(warm._pairs, warm._reps, warm._table, len(warm), key_type="int64",
                                         key_dtype=torch.int64, key_span=None, layout="packed_row", cold=True)
        q = torch.cat([point_queries(keys, 3000, gen), torch.tensor([I64_MIN, I64_MAX])])
        for a, b in ((warm.lookup(q), cold.lookup(q)), (warm.lookup_all(q), cold.lookup_all(q))):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        lo, hi = range_queries(keys, 1000, gen, 2**40)
        assert all(torch.equal(x, y) for x, y in zip(warm.range(lo, hi), cold.range(lo, hi)))
        assert torch.equal(warm.range_count(lo, hi), cold.range_count(lo, hi))


def test_a_cpu_index_keeps_no_search_part():
    index = chunked(torch.arange(2000), "cpu", gpu_budget=64 * SMALL, hot_keys=0)
    assert index.stats()["search_budget"] == 0 and index.memory()["search"] == 0


def test_a_chunk_grown_past_the_cache_is_served_by_the_cpu():
    index = chunked(torch.arange(2000), "cpu", gpu_budget=4 * SMALL, hot_keys=0)
    index.insert(torch.full((1500,), 7))  # one run of equal keys: one chunk, now larger than the cache
    assert index.stats()["oversized_chunks"] == 1
    for processors in ("gpu", "auto"):
        index.processors = processors
        assert index.lookup(torch.tensor([7, 8, 1999])).count.tolist() == [1501, 1, 1]
        assert index.lookup_all(torch.tensor([7])).rows.numel() == 1501


# ------------------------------------------------------------------------------- updatable (node) chunks
def same_answers(a, b, probe, device, values=True):
    """Every lookup form of ``a`` equals ``b``'s (an index over the same pairs: the multiset reference's twin,
    or the same index before a failed update), for point queries ``probe`` and ranges between them."""
    q = torch.tensor(probe, dtype=torch.int64, device=device)
    pairs = torch.tensor(probe[len(probe) % 2 :], dtype=torch.int64).view(-1, 2)
    lo = torch.cat([pairs.min(1).values, torch.tensor([I64_MIN])]).to(device)
    hi = torch.cat([pairs.max(1).values, torch.tensor([I64_MAX])]).to(device)
    for x, y in ((a.lookup(q), b.lookup(q)), (a.range_lookup(lo, hi), b.range_lookup(lo, hi))):
        assert torch.equal(x.first_row, y.first_row) and torch.equal(x.count, y.count)
    assert torch.equal(a.range_count(lo, hi), b.range_count(lo, hi))
    for x, y in ((a.lookup_all(q), b.lookup_all(q)), (a.range(lo, hi), b.range(lo, hi))):
        assert torch.equal(x.offsets, y.offsets) and torch.equal(x.rows, y.rows)
    for x, y in ((a.lookup_all_capped(q, 9), b.lookup_all_capped(q, 9)),
                 (a.range_capped(lo, hi, 20), b.range_capped(lo, hi, 20))):
        assert all(torch.equal(s, t) for s, t in zip(x, y))
    if values:  # one value per row ID handed out so far
        values = (torch.arange(max(a.next_row, b.next_row), dtype=torch.int64) * 7 - 3).to(device)
        for x, y in ((a.aggregate(q, values), b.aggregate(q, values)),
                     (a.range_aggregate(lo, hi, values), b.range_aggregate(lo, hi, values))):
            assert torch.equal(x.count, y.count) and torch.equal(x.sum, y.sum)


def _batch(rng, pool, ref, next_row, *, far_rows=False, max_pairs=60, sizes=(0, 1, 5, 40, 150, 300)):
    """A random update batch: insertions (fresh or given row IDs: near the next free one, or with ``far_rows``
    anywhere below 2^40, beyond 2^32 too), deletions by key or of up to ``max_pairs`` present pairs."""
    present = list(ref.pairs)
    n_ins = rng.choice(sizes)
    ins = [rng.choice(pool) for _ in range(n_ins)]
    ins_rows = None
    if rng.random() < (0.2 if far_rows else 0.3):
        ins_rows = [rng.randint(0, 2**40 if far_rows else next_row + 50) for _ in range(n_ins)]
    rows_now = ins_rows or list(range(next_row, next_row + n_ins))
    if rng.random() < 0.2:
        dk = [rng.choice(present)[0] if present else 0 for _ in range(rng.randint(0, 5))] + [rng.choice(pool)]
        dr = None
    else:
        chosen = [rng.choice(present) for _ in range(rng.randint(0, max_pairs))] if present else []
        chosen += [(rng.choice(pool), rng.randint(0, 10**6)) for _ in range(3)]
        chosen += [(ins[j], rows_now[j]) for j in range(n_ins) if rng.random() < 0.3]
        dk, dr = [c[0] for c in chosen], [c[1] for c in chosen]
    return ins, ins_rows, rows_now, dk, dr


def _update(index, ins, ins_rows, dk, dr, device):
    t = lambda x: None if x is None else torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    return index.update(insert_keys=t(ins), insert_rows=t(ins_rows), delete_keys=t(dk), delete_rows=t(dr))


def test_updatable_random_sequences_match_the_multiset_and_the_rebuilding_index(device):
    rng = random.Random(11)
    pool = [rng.randint(I64_MIN, I64_MAX) for _ in range(150)] + list(range(-20, 20)) + [I64_MIN, I64_MAX, 0, -1]
    keys = [rng.choice(pool) for _ in range(600)]
    kw = dict(chunk_bytes=2048, gpu_budget=3 * 4096, node_size=8)
    index = chunked(torch.tensor(keys, device=device), device, updatable=True, **kw)
    twin = chunked(torch.tensor(keys, device=device), device, **kw)  # today's rebuilding index
    assert {c["kind"] for c in index.chunk_info()} == {"nodes"} and index.num_chunks > 5
    ref = Multiset(keys, range(len(keys)))
    next_row = len(keys)
    chunks_seen = set()
    for step in range(24):
        ins, ins_rows, rows_now, dk, dr = _batch(rng, pool, ref, next_row)
        exp = ref.apply(ins, rows_now, dk, dr)
        res = _update(index, ins, ins_rows, dk, dr, device)
        res_twin = _update(twin, ins, ins_rows, dk, dr, device)
        assert (res.inserted, res.deleted, res.absent) == (len(ins), *exp) == (res_twin.inserted, res_twin.deleted,
                                                                              res_twin.absent), f"batch {step}"
        assert res.rows.cpu().tolist() == rows_now
        next_row = max([next_row + (len(ins) if ins_rows is None else 0)] + [r + 1 for r in ins_rows or []])
        chunks_seen.add(index.num_chunks)
        index.processors = twin.processors = ("auto", "gpu", "cpu")[step % 3]  # cached copies must follow updates
        check_against(index, ref, rng, device)
        probe = rng.sample(pool, 40) + [rng.randint(I64_MIN, I64_MAX) for _ in range(4)]
        same_answers(index, twin, probe, device)
    s = index.stats()
    assert s["chunks_updated_in_place"] > 0 and s["chunks_rebuilt"] > 0  # tiny chunks: their slack runs out often
    assert max(chunks_seen) > min(chunks_seen)  # chunks were split and dropped along the way
    assert s["resident_bytes"] <= index.gpu_budget


def test_updatable_rows_beyond_a_chunks_32_bit_window_rebuild_it():
    """Rows spanning 2^32 or more in one chunk take a row map; such a chunk is rebuilt by every update."""
    index = chunked(torch.tensor([5, 6, 7]), "cpu", gpu_budget=0, updatable=True)
    twin = chunked(torch.tensor([5, 6, 7]), "cpu", gpu_budget=0)
    for ix in (index, twin):
        ix.insert(torch.tensor([5, 6]), rows=torch.tensor([3_000_000_000, 2**31]))
    assert index.stats()["chunks_updated_in_place"] == 1 and index.chunk_info()[0]["row_map"] == 0  # no row map
    for ix in (index, twin):
        ix.insert(torch.tensor([7, 6]), rows=torch.tensor([2**40, 1]))
    assert index.stats()["chunks_rebuilt"] == 1 and index.chunk_info()[0]["row_map"] == 7  # an int64 row map
    assert index.range(torch.tensor([5]), torch.tensor([7])).rows.tolist() == [0, 3_000_000_000, 1, 1, 2**31, 2, 2**40]
    for ix in (index, twin):
        ix.update(insert_keys=torch.tensor([6]), insert_rows=torch.tensor([4]), delete_keys=torch.tensor([7]),
                  delete_rows=torch.tensor([2**40]))
    assert index.stats()["chunks_rebuilt"] == 2 and index.chunk_info()[0]["row_map"] == 0  # back in the window
    same_answers(index, twin, [5, 6, 7, 4, 8, 5], "cpu", values=False)


def test_updatable_duplicates_across_chunk_boundaries(gen):
    base = torch.arange(0, 4000, 4).repeat_interleave(3)  # runs of 3 equal keys: boundaries fall between runs
    keys = base[torch.randperm(base.numel(), generator=gen)]
    index = chunked(keys, "cpu", updatable=True, gpu_budget=1 << 16)
    twin = chunked(keys, "cpu", gpu_budget=1 << 16)
    firsts = [c["lo"] ^ -(2**63) for c in index.chunk_info()[1:]]
    assert len(firsts) > 5
    edges = firsts + [f - 4 for f in firsts]  # each chunk's first key and the previous chunk's last one
    for ix in (index, twin):
        ix.insert(torch.tensor(edges * 3))  # more copies on both sides of every boundary
        ix.insert(torch.tensor([f - 2 for f in firsts]))  # keys between two chunks: the lower one takes them
    assert index.stats()["chunks_rebuilt"] == 0
    probe = edges + [f - 2 for f in firsts] + [f - 1 for f in firsts]
    same_answers(index, twin, probe, "cpu")
    for ix in (index, twin):
        r = ix.update(delete_keys=torch.tensor(firsts[:3]), insert_keys=torch.tensor(firsts[:2]))
        ix.delete(torch.tensor(edges[3:9]), rows=torch.arange(6) * 997 % 3000)
    same_answers(index, twin, probe, "cpu")
    assert r.deleted == 6 * 3 + 2 and len(index) == len(twin)


def test_updatable_slack_overflow_falls_back_and_growth_splits():
    keys = torch.arange(0, 30000, 10)
    index = chunked(keys, "cpu", updatable=True, gpu_budget=1 << 20, node_size=4, growth=1.0)
    twin = chunked(keys, "cpu", gpu_budget=1 << 20)
    n0, T = index.num_chunks, Builder(index.config, index.key_type, pin=False).chunk_keys(len(index))
    c = index.num_chunks // 2
    lo = index.chunk_info()[c]["lo"] ^ -(2**63)
    # growth 1.0 leaves a node or so of slack: a batch that splits nodes needs more, and the chunk is rebuilt
    for ix in (index, twin):
        ix.insert(torch.tensor([lo + 1, lo + 2, lo + 3, lo + 11, lo + 12, lo + 13]))
    s = index.stats()
    assert (s["chunks_rebuilt"], s["chunks_updated_in_place"], index.num_chunks) == (1, 0, n0)
    same_answers(index, twin, list(range(lo - 5, lo + 40)), "cpu")
    # rebuilt with fresh slack: a single insertion in place again
    for ix in (index, twin):
        ix.insert(torch.tensor([lo + 5]))
    assert index.stats()["chunks_updated_in_place"] == 1
    # more than twice the chunk's size: rebuilt and split
    for ix in (index, twin):
        ix.insert(lo + torch.arange(4 * T) % 9)
    assert index.num_chunks > n0 and index.stats()["chunks_rebuilt"] == 2
    same_answers(index, twin, list(range(lo - 5, lo + 40)), "cpu")


def test_updatable_deleting_everything_in_a_chunk_drops_it():
    keys = torch.arange(0, 3000, 3)
    index = chunked(keys, "cpu", updatable=True)
    twin = chunked(keys, "cpu")
    info = index.chunk_info()
    n0 = index.num_chunks
    lo, hi = info[3]["lo"] ^ -(2**63), info[4]["lo"] ^ -(2**63)
    for ix in (index, twin):
        ix.delete(torch.arange(lo, hi))  # by key: every pair of chunk 3, in place (deletions reserve nothing)
    assert index.num_chunks == n0 - 1 and index.stats()["chunks_updated_in_place"] == 1
    assert index.range(torch.tensor([lo]), torch.tensor([hi - 1])).rows.numel() == 0
    for ix in (index, twin):
        ix.insert(torch.tensor([lo, lo + 1]))  # its range belongs to the chunk before it now
    same_answers(index, twin, list(range(lo - 6, hi + 6)), "cpu")
    for ix in (index, twin):
        ix.delete(torch.arange(-1, 10**4))
    assert len(index) == 0 and index.num_chunks == 1 and index.lookup(torch.tensor([3])).count.item() == 0
    for ix in (index, twin):
        ix.insert(torch.tensor([3, 3, 9]))
    assert index.lookup_all(torch.tensor([3])).rows.tolist() == [1002, 1003]
    same_answers(index, twin, [3, 9, 4, 0], "cpu")


def test_update_touching_few_chunks_changes_only_those_in_place(gen):
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", updatable=True, gpu_budget=1 << 20)
    index.processors = "gpu"
    index.lookup(keys)  # every chunk loaded and cached
    # the chunks' host blobs, which no public view shows: an update in place changes its chunk's blob itself
    before = [(c, c.host.data_ptr(), c.host.clone()) for c in index._store.chunks]
    k = torch.tensor([index.chunk_info()[2]["lo"] ^ -(2**63)])
    res = index.update(insert_keys=k, delete_keys=keys[:0])
    assert res.inserted == 1
    s = index.stats()
    assert (s["chunks_updated_in_place"], s["chunks_rebuilt"]) == (1, 0)
    after, info = index._store.chunks, index.chunk_info()
    assert len(after) == len(before)
    for i, ((c, ptr, blob), now) in enumerate(zip(before, after)):
        assert now is c and c.host.data_ptr() == ptr, i  # the same chunks and blobs
        assert torch.equal(c.host, blob) == (i != 2) and info[i]["cached"] == (i != 2), i  # chunk 2 alone changed
    assert index.lookup_all(k).rows.tolist()[-1] == keys.numel()


def _all_answers(index, probe):
    q = torch.tensor(probe)
    lo, hi = q.sort().values[::2].contiguous(), q.sort().values[1::2].contiguous()
    values = torch.arange(index.next_row, dtype=torch.float64)  # one value per row ID
    out = [*index.lookup(q), *index.lookup_all(q), *index.range(lo, hi), *index.range_lookup(lo, hi),
           *index.aggregate(q, values), *index.range_aggregate(lo, hi, values), *index.lookup_all_capped(q, 5),
           *index.range_capped(lo, hi, 7)]
    return out + [len(index), [c["n"] for c in index.chunk_info()]]


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


@pytest.mark.parametrize("stage,nth,after", [("plan_in_place", 1, False), ("plan_in_place", 4, False),
                                             ("build_chunk", 1, False), ("apply", 1, False), ("apply", 3, False),
                                             ("apply", -1, True)])
def test_updatable_failed_update_at_each_stage_changes_nothing(gen, monkeypatch, stage, nth, after):
    """An error in any stage of an update (planning a chunk in place, building a rebuilt one, applying one in
    place, or after the last apply: -1) leaves every answer as it was, and the same batch applies after."""
    keys = int64_keys("uniform", 2000, gen)
    index = chunked(keys, "cpu", updatable=True, node_size=4)
    twin = chunked(keys, "cpu", node_size=4)
    c = index.num_chunks // 2
    overflow = torch.full((40,), index.chunk_info()[c]["lo"] ^ -(2**63))  # this chunk falls back (build_chunk)
    batch = dict(insert_keys=torch.cat([keys[::150] + 1, overflow]), delete_keys=keys[:60],
                 delete_rows=torch.arange(60))
    probe = keys[::37].tolist() + (keys[::150] + 1).tolist() + overflow[:1].tolist()
    index.lookup(keys[::7].contiguous())  # some chunks cached
    want = _all_answers(index, probe)
    unit = {"plan_in_place": Updater, "build_chunk": Builder, "apply": InPlace}[stage]
    if nth < 0:  # the last chunk updated in place
        counted = []
        with monkeypatch.context() as m:
            m.setattr(InPlace, "apply", lambda self, plain=InPlace.apply: (counted.append(1), plain(self))[1])
            twin_counts = chunked(keys, "cpu", updatable=True, node_size=4)
            twin_counts.update(**batch)
        nth = len(counted)
    with monkeypatch.context() as m:
        _fail(m, unit, stage, nth=nth, after=after)
        with pytest.raises(torch.OutOfMemoryError, match=f"injected (at|after) {stage}"):
            index.update(**batch)
    _equal(_all_answers(index, probe), want)
    assert index.stats()["chunks_updated_in_place"] == index.stats()["chunks_rebuilt"] == 0
    for ix in (index, twin):  # and usable: the same batch applies
        ix.update(**batch)
    assert index.stats()["chunks_updated_in_place"] > 5 and index.stats()["chunks_rebuilt"] >= 1
    _equal(_all_answers(index, probe)[:-1], _all_answers(twin, probe)[:-1])  # chunks differ


def test_updatable_save_open_after_updates(tmp_path, gen):
    keys = int64_keys("duplicates", 2000, gen)
    index = chunked(keys, "cpu", updatable=True, gpu_budget=1 << 17)
    twin = chunked(keys, "cpu", gpu_budget=1 << 17)
    batch = dict(insert_keys=keys[::40] + 1, delete_keys=keys[:30], delete_rows=torch.arange(30))
    for ix in (index, twin):
        ix.update(**batch)
    probe = keys[::23].tolist() + (keys[::40] + 1).tolist()
    d = tmp_path / "idx"
    index.save(d)
    manifest = json.loads((d / (d / "CURRENT").read_text().strip()).read_text())
    assert manifest["version"] == 2 and manifest["updatable"] and {e["kind"] for e in manifest["chunks"]} == {"nodes"}
    opened = ChunkedIndex.open(d, device="cpu", gpu_budget=1 << 17)
    assert opened.updatable and opened.node_size == index.node_size and opened.growth == index.growth
    _equal(_all_answers(opened, probe), _all_answers(index, probe))
    # the opened index takes updates in place too, and saves them (changed chunks rewritten, others linked)
    batch2 = dict(insert_keys=keys[5:8] * 3, delete_keys=keys[100:103])
    for ix in (opened, twin):
        ix.update(**batch2)
    assert opened.stats()["chunks_updated_in_place"] >= 1
    opened.save(d)
    again = ChunkedIndex.open(d, device="cpu", gpu_budget=1 << 17)
    _equal(_all_answers(again, probe)[:-1], _all_answers(twin, probe)[:-1])
    # a node chunk file that is corrupt, truncated, or of the other kind says so, naming the file
    manifest = json.loads((d / (d / "CURRENT").read_text().strip()).read_text())
    f0, f1 = (d / manifest["chunks"][i]["file"] for i in (0, 1))
    f1.write_bytes(f1.read_bytes()[:-100])
    data = bytearray(f0.read_bytes())
    data[:8] = b"RTXCHNK1"  # a pairs chunk's magic
    f0.write_bytes(bytes(data))
    broken = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
    with pytest.raises(ValueError, match=f"{f0.name}.*corrupt.*not a nodes chunk"):
        broken.lookup(torch.tensor([I64_MIN]))
    in_chunk1 = torch.tensor([broken.chunk_info()[1]["lo"] ^ -(2**63)])
    with pytest.raises(ValueError, match=f"{f1.name}.*truncated"):
        broken.lookup(in_chunk1)


@pytest.mark.parametrize("updatable", [False, True])
def test_state_dict_round_trip_after_updates(gen, updatable):
    """state_dict / from_state_dict in memory (what a ShardedIndex state holds): every answer equal, after
    updates that made row IDs other than positions, through torch.save with weights_only."""
    import io

    keys = int64_keys("duplicates", 2000, gen)
    index = chunked(keys, "cpu", updatable=updatable, gpu_budget=1 << 17)
    index.update(insert_keys=keys[::40] + 1, delete_keys=keys[:30], delete_rows=torch.arange(30))
    probe = keys[::23].tolist() + (keys[::40] + 1).tolist()
    buf = io.BytesIO()
    torch.save(index.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    again = ChunkedIndex.from_state_dict(state, device="cpu", gpu_budget=1 << 17)
    assert again.updatable == updatable and again.next_row == index.next_row and len(again) == len(index)
    _equal(_all_answers(again, probe)[:-1], _all_answers(index, probe)[:-1])
    more = dict(insert_keys=keys[5:8] * 3, delete_keys=keys[100:103])  # it takes further updates alike
    index.update(**more)
    again.update(**more)
    _equal(_all_answers(again, probe)[:-1], _all_answers(index, probe)[:-1])
    empty = ChunkedIndex.from_state_dict(chunked(keys[:0], "cpu").state_dict(), device="cpu")
    assert len(empty) == 0 and empty.lookup(keys[:3]).count.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="not a ChunkedIndex state"):
        ChunkedIndex.from_state_dict({**state, "version": 9}, device="cpu")
    with pytest.raises(ValueError, match="non-negative row IDs"):
        ChunkedIndex.from_state_dict({**state, "rows": -1 - state["rows"]}, device="cpu")
    with pytest.raises(ValueError, match="1-D int64 tensors of one length"):
        ChunkedIndex.from_state_dict({**state, "rows": state["rows"][1:]}, device="cpu")


def test_updatable_argument_checks(gen):
    keys = int64_keys("uniform", 500, gen)
    with pytest.raises(TypeError, match="updatable must be True or False"):
        chunked(keys, "cpu", updatable=1)
    with pytest.raises(ValueError, match="node_size must be an even integer"):
        chunked(keys, "cpu", updatable=True, node_size=7)
    with pytest.raises(ValueError, match="growth must be in"):
        chunked(keys, "cpu", updatable=True, growth=0.5)
    assert {c["kind"] for c in chunked(keys, "cpu").chunk_info()} == {"pairs"}


@pytest.mark.parametrize("key_type,kind", [("int64", "duplicates"), ("int64", "clustered"), ("int32", None),
                                           ("float64", None), ("uint64", None)])
def test_updatable_every_form_and_key_type(device, gen, key_type, kind):
    keys = int64_keys(kind, 2000, gen) if kind else keys_of_type(key_type, 2000, gen)
    kt = key_type if key_type == "uint64" else None
    index = chunked(keys.to(device), device, key_type=kt, updatable=True, growth=2.0,
                    gpu_budget=DUP_BUDGET * 2 if kind == "duplicates" else 4 * SMALL)
    assert index.num_chunks > 5 and {c["kind"] for c in index.chunk_info()} == {"nodes"}
    check_all_forms(index, keys, key_type, gen, device, n_q=300)
    # an update in place and its undo by the inverse batch: the same answers again
    ins = keys[::97].contiguous()
    res = index.update(insert_keys=ins.to(device))
    assert index.stats()["chunks_updated_in_place"] > 0
    index.delete(ins.to(device), rows=res.rows)
    if kind != "duplicates":  # there a chunk of one run of 1000 keys plus others grows past twice its size
        assert index.stats()["chunks_rebuilt"] == 0
    check_all_forms(index, keys, key_type, gen, device, n_q=300, values_n=index.next_row)


def test_updatable_oversized_chunks_rebuild_only_when_a_rebuild_can_split_them():
    index = chunked(torch.arange(2000), "cpu", updatable=True, gpu_budget=1 << 20, growth=4.0)
    twin = chunked(torch.arange(2000), "cpu", gpu_budget=1 << 20)
    T = Builder(index.config, index.key_type, pin=False).chunk_keys(len(index))
    for ix in (index, twin):
        ix.insert(torch.full((3 * T,), 0))  # the first chunk grows past 2T: rebuilt, its run of 0s cut out
    assert index.stats()["chunks_rebuilt"] == 1
    info, zero = index.chunk_info(), torch.tensor([0])
    (at,) = [i for i, c in enumerate(info) if c["n"] > 2 * T]
    # a chunk of 0s alone: the chunk of key 0 holds as many keys as there are 0s
    assert chunk_of(index, torch.ops.rtindex.map_keys(zero, 0)).item() == at
    assert info[at]["n"] == 3 * T + 1 == int(index.range_count(zero, zero))
    for ix in (index, twin):
        ix.insert(torch.full((5,), 0))  # a run of one key: no rebuild could cut it, so in place
        ix.delete(torch.full((3,), 0), rows=torch.tensor([2000, 2001, 0]))  # shrinking: in place
    assert index.stats()["chunks_rebuilt"] == 1 and index.stats()["chunks_updated_in_place"] == 2
    same_answers(index, twin, [0, 1, -1, 7, 1999, 2000], "cpu")


def test_open_switches_the_kind_of_chunk_updates_make(tmp_path, gen):
    keys = int64_keys("uniform", 2000, gen)
    twin = chunked(keys, "cpu")
    twin.save(tmp_path / "pairs")
    mixed = ChunkedIndex.open(tmp_path / "pairs", device="cpu", gpu_budget=4 * SMALL, updatable=True)
    batch = dict(insert_keys=keys[:3] + 1, delete_keys=keys[10:12])
    for ix in (mixed, twin):
        ix.update(**batch)
    kinds = [c["kind"] for c in mixed.chunk_info()]
    assert "nodes" in kinds and "pairs" in kinds  # the touched chunks became node chunks, the others stay
    probe = keys[:21].tolist() + (keys[:3] + 1).tolist()
    _equal(_all_answers(mixed, probe)[:-1], _all_answers(twin, probe)[:-1])
    mixed.save(tmp_path / "mixed")
    back = ChunkedIndex.open(tmp_path / "mixed", device="cpu", gpu_budget=4 * SMALL, updatable=False)
    assert [c["kind"] for c in back.chunk_info()] == kinds and not back.updatable
    for ix in (back, twin):
        ix.update(insert_keys=keys[:3] + 2, delete_keys=keys[:3] + 1)  # node chunks touched become pairs again
    assert [c["kind"] for c in back.chunk_info()].count("nodes") < kinds.count("nodes")
    _equal(_all_answers(back, probe)[:-1], _all_answers(twin, probe)[:-1])
    with pytest.raises(TypeError, match="updatable must be None"):
        ChunkedIndex.open(tmp_path / "mixed", updatable="yes")


def test_row_offsets_in_pairs_and_row_maps_answer_alike(gen, tmp_path):
    """Read-only chunks whose rows span < 2^32 hold row offsets in their pairs (no row map); wider spans keep the
    map. One index with both kinds, from a state whose rows are positions for the lower keys and spread past 2^40
    for the upper ones: point, CSR and range answers against a dict of each key's rows."""
    keys = int64_keys("duplicates", 3000, gen)
    state = chunked(keys, "cpu", gpu_budget=1 << 17).state_dict()
    ordered, sr = state["keys"], state["rows"]  # the state's keys are ordered keys: int64 keys flipped
    rows = torch.where(ordered > ordered.median(), sr * 2**22 + 2**40, sr)
    sk = ordered ^ -(2**63)
    index = ChunkedIndex.from_state_dict({**state, "rows": rows}, device="cpu", gpu_budget=1 << 17)
    maps = [c["row_map"] for c in index.chunk_info()]
    assert any(m == 0 for m in maps) and any(m > 0 for m in maps), maps  # both kinds of chunk
    by_key: dict[int, list[int]] = {}
    for k, r in zip(sk.tolist(), rows.tolist()):
        by_key.setdefault(k, []).append(r)
    for v in by_key.values():
        v.sort()
    q = torch.cat([sk[torch.randint(0, sk.numel(), (400,), generator=gen)], keys.max() + 1 + torch.arange(5)])
    first, count = index.lookup(q)
    assert first.tolist() == [by_key.get(k, [-1])[0] for k in q.tolist()]
    assert count.tolist() == [len(by_key.get(k, [])) for k in q.tolist()]
    offsets, got = index.lookup_all(q)
    want = [r for k in q.tolist() for r in by_key.get(k, [])]
    assert got.tolist() == want and offsets[-1].item() == len(want)
    lo = q[:100].sort().values
    hi = torch.minimum(lo + 2**61, torch.full_like(lo, 2**63 - 1))
    ordered = sorted(by_key)
    in_range = [[r for k in ordered if a <= k <= b for r in by_key[k]] for a, b in zip(lo.tolist(), hi.tolist())]
    assert index.range(lo, hi)[1].tolist() == [r for rows_ in in_range for r in rows_]
    rfirst, rcount = index.range_lookup(lo, hi)
    assert rfirst.tolist() == [min(x) if x else -1 for x in in_range] and rcount.tolist() == [len(x) for x in in_range]
    # The hot tier likewise: row offsets in its pairs where its rows span < 2^32, else a row map; the same answers.
    upper = state["keys"] > state["keys"].median()  # the keys whose rows spread past 2^40
    low, high = sk[~upper].unique(), sk[upper].unique()
    for prio, direct in ((low[:60], True), (torch.cat([low[:30], high[:30]]), False)):
        tiered = ChunkedIndex.from_state_dict({**state, "rows": rows}, device="cpu", gpu_budget=1 << 18, hot_keys=3000)
        held = tiered.warm(prio)  # the keys, in order, as far as their rows fit the tier
        s = tiered.stats()
        assert 20 < held <= prio.numel() and s["hot_row_map"] == (0 if direct else s["hot_pairs"]) and s["hot_pairs"]
        tier_keys = tiered.hot_tier_keys
        assert tier_keys.numel() == held and bool(torch.isin(tier_keys, prio).all())
        _equal(list(tiered.lookup(q)) + list(tiered.lookup_all(q)), list(index.lookup(q)) + list(index.lookup_all(q)))
        hp = tier_keys[torch.randint(0, held, (300,), generator=gen)]
        _equal(list(tiered.lookup(hp)) + list(tiered.lookup_all(hp)), list(index.lookup(hp)) + list(index.lookup_all(hp)))
        assert tiered.stats()["last_batch"]["hot_hits"] == 300
    # Saved with offsets in some chunk: manifest version 3, which older readers refuse (they would answer offsets).
    index.save(tmp_path / "ix")
    manifest = json.loads((tmp_path / "ix" / (tmp_path / "ix" / "CURRENT").read_text().strip()).read_text())
    assert manifest["version"] == 3
    again = ChunkedIndex.open(tmp_path / "ix", device="cpu", gpu_budget=1 << 17)
    _equal(list(again.lookup(q)) + list(again.lookup_all(q)), list(index.lookup(q)) + list(index.lookup_all(q)))
