"""ShardedIndex updates across processes (gloo on the CPU): a batch's own inserts are visible to its deletes,
as in UpdatableCgRXIndex.update (insert first, delete second), for every local index kind, whichever rank
inserts the pair and whichever deletes it."""

from __future__ import annotations

import functools

import pytest
import torch
from dist_harness import run_on_ranks, skip_unless_available

from torch_rtindex import ChunkedIndex, UpdatableCgRXIndex

LOCAL_KINDS = ("default", "updatable_binary_search", "chunked")


def _factory(kind: str):
    if kind == "default":
        return None
    if kind == "updatable_binary_search":
        return functools.partial(UpdatableCgRXIndex, backend="binary_search", node_size=4)
    return functools.partial(ChunkedIndex, chunk_bytes=4096, gpu_budget=40000, updatable=True)


def same_batch_delete(g, kind: str, inserter: int, deleter: int, by_rows: bool) -> None:
    """Rank 0 holds keys [10, 20], rank 1 [30] (others none); ``inserter`` inserts 40 (global row 3) and
    ``deleter`` deletes it in the same batch, by key or by (key, row). The pair is gone afterwards and counted
    deleted, not absent."""
    from torch_rtindex.distributed import ShardedIndex

    keys = torch.tensor({0: [10, 20], 1: [30]}.get(g.rank, []), dtype=torch.int64)
    idx = ShardedIndex(keys, updatable=True, index_factory=_factory(kind), group=g.group)
    empty = torch.empty(0, dtype=torch.int64)
    ins = torch.tensor([40]) if g.rank == inserter else empty
    dk = torch.tensor([40]) if g.rank == deleter else empty
    dr = (torch.tensor([3]) if g.rank == deleter else empty) if by_rows else None
    res = idx.update(insert_keys=ins, delete_keys=dk, delete_rows=dr)
    what = f"{kind}, inserted on rank {inserter}, deleted on rank {deleter}, by {'row' if by_rows else 'key'}"
    assert (res.inserted, res.deleted, res.absent) == (1, 1, 0), f"{what}: {res}"
    assert res.rows.tolist() == ([3] if g.rank == inserter else []), f"{what}: rows {res.rows}"
    q = torch.tensor([10, 20, 30, 40])
    r = idx.lookup(q)
    assert r.count.tolist() == [1, 1, 1, 0], f"{what}: counts {r.count.tolist()}"
    assert r.first_row.tolist() == [0, 1, 2, -1], f"{what}: first rows {r.first_row.tolist()}"
    assert len(idx) == 3, f"{what}: len {len(idx)}"
    # A same-batch delete of a fresh row under another key names nothing: absent. A pre-existing pair deleted
    # by row next to a fresh insert of its key: only that pair goes.
    res = idx.update(insert_keys=torch.tensor([50]) if g.rank == inserter else empty,
                     delete_keys=torch.tensor([60, 10]) if g.rank == deleter else empty,
                     delete_rows=torch.tensor([4, 0]) if g.rank == deleter else empty)
    assert (res.inserted, res.deleted, res.absent) == (1, 1, 1), f"{what}, second batch: {res}"
    r = idx.lookup(torch.tensor([10, 50, 60]))
    assert r.count.tolist() == [0, 1, 0], f"{what}, second batch: counts {r.count.tolist()}"
    assert r.first_row.tolist() == [-1, 4, -1], f"{what}, second batch: first rows {r.first_row.tolist()}"


@pytest.mark.parametrize("by_rows", [True, False], ids=["by_row", "by_key"])
@pytest.mark.parametrize("inserter,deleter", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("kind", LOCAL_KINDS)
@skip_unless_available(2)
def test_same_batch_delete(kind, inserter, deleter, by_rows):
    run_on_ranks(2, "test_sharded_updates:same_batch_delete", kind, inserter, deleter, by_rows)


@pytest.mark.parametrize("kind", LOCAL_KINDS)
@skip_unless_available(3)
def test_same_batch_delete_three_ranks(kind):
    """The last rank inserts, the first deletes by row (the pair's owner is whichever shard holds key 40)."""
    run_on_ranks(3, "test_sharded_updates:same_batch_delete", kind, 2, 0, True)
