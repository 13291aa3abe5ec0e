"""ChunkedIndex updates against a multiset of (key, row ID) pairs: random sequences, grown chunks split and empty
ones dropped, aggregates after updates, faults that must leave the index unchanged; updatable (node) chunks
updated in place, against the index that rebuilds its chunks, and saved, opened and round-tripped after updates."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch
from chunked_support import DUP_BUDGET, SMALL, check_all_forms, chunk_of, chunked, equal
from keysets import I64_MAX, I64_MIN, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import ChunkedIndex
from torch_rtindex.chunked.build import Builder
from torch_rtindex.chunked.executor import Executor
from torch_rtindex.chunked.updates import InPlace, Updater


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
    equal(_all_answers(index, probe), want)
    assert index.stats()["chunks_updated_in_place"] == index.stats()["chunks_rebuilt"] == 0
    for ix in (index, twin):  # and usable: the same batch applies
        ix.update(**batch)
    assert index.stats()["chunks_updated_in_place"] > 5 and index.stats()["chunks_rebuilt"] >= 1
    equal(_all_answers(index, probe)[:-1], _all_answers(twin, probe)[:-1])  # chunks differ


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
    equal(_all_answers(opened, probe), _all_answers(index, probe))
    # the opened index takes updates in place too, and saves them (changed chunks rewritten, others linked)
    batch2 = dict(insert_keys=keys[5:8] * 3, delete_keys=keys[100:103])
    for ix in (opened, twin):
        ix.update(**batch2)
    assert opened.stats()["chunks_updated_in_place"] >= 1
    opened.save(d)
    again = ChunkedIndex.open(d, device="cpu", gpu_budget=1 << 17)
    equal(_all_answers(again, probe)[:-1], _all_answers(twin, probe)[:-1])
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
    equal(_all_answers(again, probe)[:-1], _all_answers(index, probe)[:-1])
    more = dict(insert_keys=keys[5:8] * 3, delete_keys=keys[100:103])  # it takes further updates alike
    index.update(**more)
    again.update(**more)
    equal(_all_answers(again, probe)[:-1], _all_answers(index, probe)[:-1])
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
    equal(_all_answers(mixed, probe)[:-1], _all_answers(twin, probe)[:-1])
    mixed.save(tmp_path / "mixed")
    back = ChunkedIndex.open(tmp_path / "mixed", device="cpu", gpu_budget=4 * SMALL, updatable=False)
    assert [c["kind"] for c in back.chunk_info()] == kinds and not back.updatable
    for ix in (back, twin):
        ix.update(insert_keys=keys[:3] + 2, delete_keys=keys[:3] + 1)  # node chunks touched become pairs again
    assert [c["kind"] for c in back.chunk_info()].count("nodes") < kinds.count("nodes")
    equal(_all_answers(back, probe)[:-1], _all_answers(twin, probe)[:-1])
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
        equal(list(tiered.lookup(q)) + list(tiered.lookup_all(q)), list(index.lookup(q)) + list(index.lookup_all(q)))
        hp = tier_keys[torch.randint(0, held, (300,), generator=gen)]
        equal(list(tiered.lookup(hp)) + list(tiered.lookup_all(hp)), list(index.lookup(hp)) + list(index.lookup_all(hp)))
        assert tiered.stats()["last_batch"]["hot_hits"] == 300
    # Saved with offsets in some chunk: manifest version 3, which older readers refuse (they would answer offsets).
    index.save(tmp_path / "ix")
    manifest = json.loads((tmp_path / "ix" / (tmp_path / "ix" / "CURRENT").read_text().strip()).read_text())
    assert manifest["version"] == 3
    again = ChunkedIndex.open(tmp_path / "ix", device="cpu", gpu_budget=1 << 17)
    equal(list(again.lookup(q)) + list(again.lookup_all(q)), list(index.lookup(q)) + list(index.lookup_all(q)))
