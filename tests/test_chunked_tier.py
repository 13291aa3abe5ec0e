"""ChunkedIndex's hot-key tier: its point answers equal CgRXIndex's, its misses reach the chunks sorted; warm,
learning and when learning pauses; row maps and row bases; its reservation; its rebuild after an update."""

from __future__ import annotations

import pytest
import torch
from chunked_support import chunked, equal
from keysets import I64_MIN, int64_keys, keys_of_type, point_queries, range_queries
from reference import check_capped

from torch_rtindex import CgRXIndex, ChunkedIndex
from torch_rtindex.chunked.executor import Executor
from torch_rtindex.chunked.hot_tier import HOT_CANDIDATE_BYTES, HotTier


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
    equal(list(tiered.lookup(q)) + list(tiered.lookup_all(q)), list(plain.lookup(q)) + list(plain.lookup_all(q)))
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
