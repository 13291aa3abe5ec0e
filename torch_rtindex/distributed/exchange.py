"""The exchanges: counts first, then tensors (as TorchRec's splits-then-tensors all-to-all), and the
fixed-capacity exchange of equal blocks behind a small header of counts, overflow flags and statuses.

Every rank posts the same collectives in the same order whatever fails where: a local failure is carried by
the next collective every rank posts anyway (the counts exchange, the fixed-capacity exchange's header, the
answers' return with :data:`FAILED` marks or a status column) and raised after it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .._config import PADDED_COUNT, PADDED_HEADER, PADDED_OVERFLOW, PADDED_STATUS
from . import stages
from . import header, routing

FAILED = -2  # an answer slot of an owner whose local lookup failed (no real answer is ever -2)


def a2a(ix, send: torch.Tensor, send_splits: list[int] | None, recv_splits: list[int] | None,
         st: stages.Stages) -> torch.Tensor:
    send = send.contiguous()
    if recv_splits is None:
        out = torch.empty_like(send)
    else:
        out = send.new_empty((sum(recv_splits), *send.shape[1:]))
    dist.all_to_all_single(out, send, recv_splits, send_splits, group=ix.group)
    st.moved(send, out, send_splits)
    return out


def exchange_counts(ix, op: str, counts: torch.Tensor, err: BaseException | None) -> tuple[list, list]:
    """The counts exchange every dynamic call starts with, and its failure report: ``counts`` [world, k] (row
    d: what this rank sends rank d) goes out with this rank's status appended (1: its routing failed with
    ``err``). Returns (sent, received) as [world][k] lists (one host synchronization); if any rank's routing
    failed, every rank raises here, before a query moves, so no rank waits in a collective another skips."""
    head = torch.cat([counts, torch.full_like(counts[:, :1], int(err is not None))], dim=1)
    recv = torch.empty_like(head)
    dist.all_to_all_single(recv, head, group=ix.group)
    sent, got = torch.stack([head, recv]).tolist()
    failed = [r for r in range(ix.world) if got[r][-1]]
    if failed:
        here = "" if err is None else f"; here: {type(err).__name__}: {err}"
        raise header.ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank(s) {failed}{here}; "
                                "nothing was exchanged, the index is unchanged",
                                {ix.rank: str(err)} if err is not None else {}) from err
    return [row[:-1] for row in sent], [row[:-1] for row in got]


def send_pieces(ix, op: str, route: Callable[[], tuple], st: stages.Stages):
    """Dynamic exchange of pieces to their owners. ``route()`` gives (owner of each piece, its columns,
    *extra). The routing (``route``, the grouping, the payload) is guarded: a failure on any rank (out of
    memory) is reported through the counts exchange (:func:`exchange_counts`). Returns (received
    [R, len(cols)], send order, send splits, receive splits, extra)."""
    err, extra = None, ()
    try:
        ix._maybe_fault("partition")
        owner, cols, *extra = route()
        order, send_counts = routing.partition(ix, owner)
        payload = cols[0][order].unsqueeze(1) if len(cols) == 1 else torch.stack([c[order] for c in cols], dim=1)
    except Exception as e:  # noqa: BLE001  (every rank raises in the counts exchange)
        err = e
        send_counts = torch.zeros(ix.world, dtype=torch.int64, device=ix.device)
    st.mark("partition")
    sent, got_counts = exchange_counts(ix, op, send_counts[:, None], err)
    send_splits, recv_splits = [c for c, in sent], [c for c, in got_counts]
    got = a2a(ix, payload, send_splits, recv_splits, st)
    st.mark("exchange")
    return got, order, send_splits, recv_splits, tuple(extra)


def guarded(ix, fn, fallback):
    """Runs a local lookup; if it fails (out of memory, ...) returns (fallback(), error) instead of raising,
    so that this rank still takes part in the return exchange and nobody waits for it forever."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001  (raised after the exchange, see _raise_failed)
        return fallback(), e


def raise_failed(ix, op: str, err: BaseException | None, flags: torch.Tensor, splits: list[int]) -> None:
    """After a return exchange: raise if this rank's local lookup failed, or if answers came back marked
    failed (``flags``: per received answer, ``splits[j]`` of them from rank j % world: rank order, or
    chunk-major, rank-minor). One host synchronization."""
    if err is not None:
        raise header.ShardedIndexError(f"ShardedIndex.{op}: the local lookup failed on rank {ix.rank}: "
                                f"{type(err).__name__}: {err}", {ix.rank: str(err)}) from err
    if flags.numel() and bool(flags.any()):
        ends = torch.tensor(splits, device=flags.device).cumsum(0)
        segments = torch.searchsorted(ends, flags.nonzero()[:, 0], right=True)
        owners = sorted(set((segments % ix.world).tolist()))
        raise header.ShardedIndexError(
            f"ShardedIndex.{op}: the local lookup failed on rank(s) {owners}, which own some of rank "
            f"{ix.rank}'s queries (see the error raised there); the index is unchanged"
        )


def padded_block(ix, counts, overflow, err, data) -> torch.Tensor:
    """The fixed-capacity exchange's send buffer [world, PADDED_HEADER + slots] from its parts: row d is rank
    d's block (``data`` [world, slots]) behind a header of the block's count, this rank's overflow flag and its
    routing status (1: ``err``); the layout partition_padded writes in place."""
    W = ix.world
    head = torch.empty((W, PADDED_HEADER), dtype=torch.int64, device=ix.device)
    head[:, PADDED_COUNT] = counts
    head[:, PADDED_OVERFLOW] = overflow.to(torch.int64)
    head[:, PADDED_STATUS] = int(err is not None)
    return torch.cat([head, data], dim=1)


def padded_exchange(ix, block: torch.Tensor, st: stages.Stages):
    """The fixed-capacity query exchange: every rank sends every rank its row of ``block`` (see
    :func:`padded_block`) as it is. Returns the received rows [world, PADDED_HEADER + slots], headers included:
    each rank's overflow flag (any rank's is the call's) and routing status."""
    st.mark("partition")
    got = a2a(ix, block, None, None, st)
    st.mark("exchange")
    return got


def raise_routing(ix, op: str, err: BaseException | None, received: torch.Tensor, checked: bool) -> None:
    """After a fixed-capacity return exchange: the rank whose routing failed raises; with checks every rank
    does (``received``: the rows of the query exchange, each rank's status in its header; one host
    synchronization)."""
    if err is not None:
        raise header.ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank {ix.rank}: "
                                f"{type(err).__name__}: {err}", {ix.rank: str(err)}) from err
    if checked and bool(received[:, PADDED_STATUS].any()):
        failed = (received[:, PADDED_STATUS] != 0).nonzero()[:, 0].tolist()
        raise header.ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank(s) {failed} (see the error "
                                "raised there); the index is unchanged")


def block_sums(values: torch.Tensor, splits: list[int]) -> torch.Tensor:
    """Sums of consecutive blocks of ``values`` of the given sizes."""
    if values.numel() == 0:
        return torch.zeros(len(splits), dtype=torch.int64, device=values.device)
    c = torch.cumsum(values, 0)
    ends = torch.tensor(splits, device=values.device).cumsum(0)
    tot = torch.where(ends > 0, c[(ends - 1).clamp(min=0)], 0)
    return torch.diff(tot, prepend=torch.zeros(1, dtype=tot.dtype, device=tot.device))
