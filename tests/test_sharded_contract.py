"""ShardedIndex keeps the package's contract (torch_rtindex.index): signatures, result types, the dtype policy,
lookup_rows, memory, capturable, splitters in key space, device moves refused with the alternative named,
pickle / deepcopy / torch.save round trips. Two gloo ranks; answers checked against the concatenated keys."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from dist_harness import run_on_ranks, skip_unless_available

from torch_rtindex import CappedMatches, Index, UpdatableIndex


def _all_keys(world: int) -> list[torch.Tensor]:
    # Negative and positive floats, a duplicate across ranks: the splitters must read as keys.
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(-1000, 1000, (40 + 7 * r,), generator=gen).to(torch.float64) / 4 for r in range(world)]


def _reference(parts, q):
    allk = torch.cat(parts)
    first = [int((allk == v).nonzero()[0]) if bool((allk == v).any()) else -1 for v in q.tolist()]
    return torch.tensor(first, dtype=torch.int64), torch.tensor([int((allk == v).sum()) for v in q.tolist()])


def contract(g) -> None:
    from torch_rtindex.distributed import Fixed, ShardedIndex, ShardedIndexError

    parts = _all_keys(g.world)
    idx = ShardedIndex(parts[g.rank], updatable=True, group=g.group, sample_size=16)
    assert isinstance(idx, Index) and isinstance(idx, UpdatableIndex)
    q = torch.cat([parts[(g.rank + 1) % g.world][:9], torch.tensor([1e9, -1e9])])
    first, count = _reference(parts, q)

    # lookup_rows: first rows, misses as miss_row; a bad miss_row on one rank is raised on every rank.
    assert torch.equal(idx.lookup_rows(q), first)
    assert torch.equal(idx.lookup_rows(q, miss_row=7), torch.where(first < 0, 7, first))
    with pytest.raises(ShardedIndexError, match="miss_row"):
        idx.lookup_rows(q, miss_row="x" if g.rank == 0 else -1)

    # Splitters: keys of the index's dtype; shard r holds the keys k with splitters[r - 1] <= k < splitters[r].
    sp = idx.splitters
    assert sp.dtype == torch.float64 and sp.numel() == g.world - 1
    allk = torch.cat(parts)
    owner = torch.searchsorted(sp, allk, right=True)
    sizes: list = [None] * g.world
    import torch.distributed as dist

    dist.all_gather_object(sizes, idx.local_len, group=g.group)
    assert sizes == torch.bincount(owner, minlength=g.world).tolist(), (sizes, sp)
    assert sum(sizes) == len(idx)

    mem = idx.memory()
    assert mem and all(isinstance(v, int) and v >= 0 for v in mem.values()), mem
    assert any(k.startswith("local_") for k in mem) and mem["local_to_global"] > 0, mem
    assert isinstance(idx.capturable, bool)
    for move in (lambda: idx.to("cpu"), idx.cpu, idx.cuda):
        with pytest.raises(NotImplementedError, match="gathered_state_dict"):
            move()

    # One result type per method: the capped forms CappedMatches, their fixed-capacity forms Fixed.
    capped = idx.lookup_all_capped(q, 16)
    assert isinstance(capped, CappedMatches) and int(capped.total) == int(count.sum())
    fx = idx.lookup_all_capped_fixed(q, 16, 32)
    assert isinstance(fx, Fixed) and isinstance(fx.answer, CappedMatches) and not bool(fx.overflowed)
    assert torch.equal(fx.answer.rows, capped.rows)
    rc = idx.range_capped(q, q + 1, 8)
    rfx = idx.range_capped_fixed(q, q + 1, 8, 32)
    assert isinstance(rc, CappedMatches) and torch.equal(rfx.answer.rows, rc.rows)

    # The dtype policy: float32 queries on a float64 index converted, on one rank only; int queries refused.
    r = idx.lookup(q.to(torch.float32) if g.rank == 1 else q)
    assert torch.equal(r.first_row, first) and torch.equal(r.count, count)
    with pytest.raises(ShardedIndexError, match="dtype"):
        idx.lookup(q.to(torch.int64) if g.rank == 0 else q)

    # One update signature: (insert_keys, insert_rows, delete_keys, delete_rows), positionally too.
    ins = torch.tensor([12345.5 + g.rank])
    res = idx.update(ins, None, torch.tensor([parts[g.rank][0].item()]))
    assert res.inserted == g.world and res.rows.numel() == 1
    assert idx.lookup(ins).count.tolist() == [1]

    # Round trips: pickle and torch.save (this rank's state, rebuilt without a collective), deepcopy (in the
    # same group, independent of the original).
    after = idx.lookup(q)
    for name, clone in (("pickle", lambda: pickle.loads(pickle.dumps(idx))), ("deepcopy", lambda: copy.deepcopy(idx)),
                        ("torch.save", lambda: _saved(idx))):
        other = clone()
        got = other.lookup(q)
        assert torch.equal(got.first_row, after.first_row) and torch.equal(got.count, after.count), name
        assert len(other) == len(idx) and other.local_len == idx.local_len, name
    other = copy.deepcopy(idx)
    other.delete(q)
    assert torch.equal(idx.lookup(q).count, after.count), "deepcopy shares state with the original"
    assert int(other.lookup(q).count.sum()) == 0


def insert_rows(g) -> None:
    """Given global rows: fresh, ascending in rank order, gaps allowed; the next free rows follow the largest.
    Rows not fresh, not ascending, overlapping another rank's or given on some ranks only: refused everywhere."""
    from torch_rtindex.distributed import ShardedIndex, ShardedIndexError

    idx = ShardedIndex(torch.arange(g.rank * 10, g.rank * 10 + 10), updatable=True, group=g.group)
    n = 10 * g.world
    keys = torch.tensor([1000 + g.rank, 2000 + g.rank])
    rows = torch.tensor([100 + 10 * g.rank, 105 + 10 * g.rank])
    res = idx.insert(keys, rows)
    assert res.rows.tolist() == rows.tolist() and res.inserted == 2 * g.world, res
    want = [100 + 10 * r for r in range(g.world)]
    assert idx.lookup(torch.tensor([1000 + r for r in range(g.world)])).first_row.tolist() == want
    # Positional (insert_keys, insert_rows, delete_keys, delete_rows): a same-batch delete of a given row.
    last = 105 + 10 * (g.world - 1)
    res = idx.update(torch.tensor([3000 + g.rank]), torch.tensor([last + 1 + g.rank]),
                     torch.tensor([3000]) if g.rank == g.world - 1 else torch.empty(0, dtype=torch.int64),
                     torch.tensor([last + 1]) if g.rank == g.world - 1 else torch.empty(0, dtype=torch.int64))
    assert (res.inserted, res.deleted, res.absent) == (g.world, 1, 0), res
    fresh = idx.insert(torch.tensor([4000]))  # the next free rows follow the largest given
    assert fresh.rows.tolist() == [last + g.world + 1 + g.rank], fresh.rows
    size = len(idx)
    for what, bad in (("not fresh", torch.tensor([n - 1])), ("not ascending", torch.tensor([10**6, 10**6 - 1])),
                      ("overlapping", torch.tensor([10**7])), ("some ranks only", None)):
        mine = bad if g.rank == 0 or what == "overlapping" else torch.tensor([10**8 + g.rank])
        k = torch.full((mine.numel(),) if mine is not None else (1,), 5000)
        with pytest.raises(ShardedIndexError, match="insert_rows"):
            idx.insert(k, mine)
        assert len(idx) == size, what


def _saved(idx):
    buf = io.BytesIO()
    torch.save(idx, buf)
    buf.seek(0)
    return torch.load(buf)  # weights_only=True: ShardedIndex is allowlisted by torch_rtindex.distributed


def int32_updates(g) -> None:
    """int32 keys to update an int64 index (lossless) on one rank: converted, answered as int64 keys."""
    from torch_rtindex.distributed import ShardedIndex

    idx = ShardedIndex(torch.arange(g.rank * 10, g.rank * 10 + 10), updatable=True, group=g.group)
    ins = torch.tensor([100 + g.rank])
    res = idx.update(insert_keys=ins.to(torch.int32) if g.rank == 0 else ins, delete_keys=torch.tensor([g.rank * 10],
                     dtype=torch.int32))
    assert (res.inserted, res.deleted, res.absent) == (g.world, g.world, 0), res
    assert idx.lookup(torch.tensor([100, 101, 0, 10])).count.tolist() == [1, 1, 0, 0]


@skip_unless_available(2)
def test_contract():
    run_on_ranks(2, "test_sharded_contract:contract")


@skip_unless_available(3)
def test_contract_three_ranks():
    run_on_ranks(3, "test_sharded_contract:contract")


@skip_unless_available(2)
def test_insert_rows():
    run_on_ranks(2, "test_sharded_contract:insert_rows")


@skip_unless_available(3)
def test_insert_rows_three_ranks():
    run_on_ranks(3, "test_sharded_contract:insert_rows")


@skip_unless_available(2)
def test_lossless_key_dtypes_in_updates():
    run_on_ranks(2, "test_sharded_contract:int32_updates")
