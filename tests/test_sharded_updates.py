"""ShardedIndex updates across processes (gloo on the CPU): a batch's own inserts are visible to its deletes,
as in UpdatableCgRXIndex.update (insert first, delete second), for every local index kind, whichever rank
inserts the pair and whichever deletes it."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from torch_rtindex import ChunkedIndex, UpdatableCgRXIndex

LOCAL_KINDS = ("default", "updatable_binary_search", "chunked")


def _factory(kind: str):
    if kind == "default":
        return None
    if kind == "updatable_binary_search":
        return functools.partial(UpdatableCgRXIndex, backend="binary_search", node_size=4)
    return functools.partial(ChunkedIndex, chunk_bytes=4096, gpu_budget=40000, updatable=True)


def same_batch_delete(g, kind: str, inserter: int, deleter: int, by_rows: bool) -> None:
    """Rank 0 holds keys [10, 20], rank 1 [30]; ``inserter`` inserts 40 (global row 3) and ``deleter`` deletes it
    in the same batch, by key or by (key, row). The pair is gone afterwards and counted deleted, not absent."""
    from torch_rtindex.distributed import ShardedIndex

    keys = torch.tensor([10, 20] if g.rank == 0 else [30], dtype=torch.int64)
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


def _on_ranks(rank: int, world: int, cases: list[tuple]) -> None:
    import torch.distributed as dist

    g = SimpleNamespace(rank=rank, world=world, group=dist.group.WORLD, device=torch.device("cpu"))
    failures = []
    for case in cases:
        try:
            same_batch_delete(g, *case)
        except AssertionError as e:
            failures.append(str(e))
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_same_batch_delete(kind):
    from torch_rtindex.distributed import spawn

    cases = [(kind, i, d, rows) for i in (0, 1) for d in (0, 1) for rows in (True, False)]
    spawn(_on_ranks, 2, cases, timeout_s=120, join_timeout_s=400)
