"""The answers of a batch's queues put together: scattered back to the caller's order (a range's pieces merged in
chunk order, which is key order), tier and chunk answers combined, the capped forms cut."""

from __future__ import annotations

import torch

from ..results import CappedMatches
from .store import TOP

I64_MAX = 2**63 - 1


def merge(form, tasks, q, P, sq, order, piece_q, D, values):
    """The queues' answers scattered back to the caller's order (pieces of a range merged in chunk order)."""
    if any(not t.result for t in tasks):
        raise RuntimeError("ChunkedIndex: a queue was left unserved (internal scheduler error)")
    if form == "count":  # range counts: each query's pieces summed
        count = torch.zeros(q, dtype=torch.int64, device=D)
        for t in tasks:
            count.index_add_(0, sq[t.start : t.start + t.size], t.result[1].to(D))
        return count
    if form == "lookup" and piece_q is None:  # point lookups: one piece per query, a plain scatter
        first = torch.full((q,), -1, dtype=torch.int64, device=D)
        count = torch.zeros(q, dtype=torch.int64, device=D)
        for idx, f, c in joined(tasks, sq, D):
            first.index_copy_(0, idx, f)
            count.index_copy_(0, idx, c)
        return first, count
    if form == "lookup":
        first = torch.full((q,), I64_MAX, dtype=torch.int64, device=D)
        count = torch.zeros(q, dtype=torch.int64, device=D)
        for t in tasks:
            f, c = (x.to(D) for x in t.result[1:])
            idx = sq[t.start : t.start + t.size]
            first.scatter_reduce_(0, idx, torch.where(f >= 0, f, I64_MAX), "amin")
            count.index_add_(0, idx, c)
        return torch.where(first == I64_MAX, -1, first), count
    if form == "aggregate":
        sum_dtype = torch.float64 if values.dtype.is_floating_point else torch.int64
        count = torch.zeros(q, dtype=torch.int64, device=D)
        total = torch.zeros(q, dtype=sum_dtype, device=D)
        for t in tasks:
            idx = sq[t.start : t.start + t.size]
            a, b = aggregated(t.result, values, D, sum_dtype)
            count.index_add_(0, idx, a)
            total.index_add_(0, idx, b)
        return count, total
    # CSR: piece p's rows go to piece_start[p]; a query's pieces are consecutive (query-major piece order)
    per_piece = torch.zeros(P, dtype=torch.int64, device=D)
    results = []
    for t in tasks:
        off, rows = (x.to(D) for x in t.result[1:])
        pid = order[t.start : t.start + t.size]
        per_piece.index_copy_(0, pid, off[1:] - off[:-1])
        results.append((pid, off, rows))
    piece_start = torch.cumsum(per_piece, 0) - per_piece
    per_query = per_piece if piece_q is None else torch.zeros(q, dtype=torch.int64, device=D).index_add_(
        0, piece_q, per_piece)
    offsets = torch.zeros(q + 1, dtype=torch.int64, device=D)
    torch.cumsum(per_query, 0, out=offsets[1:])
    total = sum(r[2].numel() for r in results)
    out_rows = torch.empty(total, dtype=torch.int64, device=D)
    for pid, off, rows in results:
        if rows.numel():
            per = off[1:] - off[:-1]
            shift = torch.repeat_interleave(piece_start.index_select(0, pid) - off[:-1], per, output_size=rows.numel())
            out_rows.index_copy_(0, shift + torch.arange(rows.numel(), device=D), rows)
    return offsets, out_rows


def ship(tasks: list, D: torch.device, io: torch.cuda.Stream, merging: torch.cuda.Stream) -> None:
    """Sends the CPU's point answers of ``tasks`` (``result`` = (tag, a, b) on the CPU) to the GPU ``D`` as soon as
    they are made, so that no copy and no pinning is left for the merge. Each column crosses through a pinned block
    of torch's caching host allocator, on ``io``; blocks come in size classes and are reused once their copy is done,
    so a warm index pins nothing new while its CPU's share grows (one buffer for a batch's whole share was pinned
    afresh whenever the share outgrew it, tens of milliseconds in the merge). The results are then on D, read on
    ``merging``, which must wait for ``io`` before it reads them."""
    n = sum(t.size for t in tasks)
    cols = []
    for k in (1, 2):
        host = torch.empty(n, dtype=tasks[0].result[k].dtype, pin_memory=True)
        torch.cat([t.result[k] for t in tasks], out=host)
        with torch.cuda.stream(io):
            col = host.to(D, non_blocking=True)  # the host block is held until this copy is done
        col.record_stream(merging)  # read there: not handed out again before that
        cols.append(col)
    at = 0
    for t in tasks:
        t.result = (t.result[0], cols[0][at : at + t.size], cols[1][at : at + t.size])
        at += t.size


def joined(tasks: list, sq: torch.Tensor, D: torch.device):
    """The point answers of ``tasks`` (``result`` = (tag, a, b)) joined per serving device: yields (positions in
    ``sq``'s order, a, b) on D, one scatter per device rather than one per queue (a batch has a queue per chunk).
    The CPU's answers to a GPU batch are there already (:func:`ship`)."""
    by_device: dict[torch.device, list] = {}
    for t in tasks:
        by_device.setdefault(t.result[1].device, []).append(t)
    for dev, ts in by_device.items():
        # Every queue on one device: their positions are all of sq, in order (queues follow sq).
        idx = sq if len(ts) == len(tasks) else torch.cat([sq[t.start : t.start + t.size] for t in ts])
        parts = []
        for k in (1, 2):
            x = torch.cat([t.result[k] for t in ts]) if len(ts) > 1 else ts[0].result[k]
            parts.append(x.to(D))  # already on D but for a CPU batch's GPU answers: waited for, read next
        yield idx, parts[0], parts[1]


def key_sorted(ordered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordered keys (int64 holding uint64) in the chunks' order, ascending unsigned, and the permutation that sorts
    them."""
    flipped, order = torch.sort(ordered ^ TOP)
    return flipped ^ TOP, order


def aggregated(result: tuple, values: torch.Tensor, D: torch.device, sum_dtype: torch.dtype) -> tuple:
    """A queue's aggregate answer (:meth:`Executor.answer`) as (count, sum) on D: the kernel's, or summed
    here from the CSR rows where the kernel could not take the values (another device, or values that do not
    cover one per pair)."""
    a, b = (x.to(D) for x in result[1:])
    if result[0] != "csr":
        return a.to(torch.int64), b.to(sum_dtype)
    per = a[1:] - a[:-1]
    owner = torch.repeat_interleave(torch.arange(per.numel(), device=D), per, output_size=b.numel())
    total = torch.zeros(per.numel(), dtype=sum_dtype, device=D)
    return per, total.index_add_(0, owner, values.index_select(0, b).to(sum_dtype))


def capped(full: tuple[torch.Tensor, torch.Tensor], capacity: int) -> CappedMatches:
    offsets, rows = full
    out = torch.full((capacity,), -1, dtype=torch.int64, device=rows.device)
    m = min(capacity, rows.numel())
    out[:m] = rows[:m]
    return CappedMatches(offsets, out, torch.tensor(rows.numel(), dtype=torch.int64, device=rows.device))


def combine_csr(q: int, parts: list, D: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One CSR answer for q queries from parts (query ids, offsets, rows) over disjoint sets of queries."""
    per = torch.zeros(q, dtype=torch.int64, device=D)
    for idx, off, _ in parts:
        per.index_copy_(0, idx, (off[1:] - off[:-1]).to(D))
    offsets = torch.zeros(q + 1, dtype=torch.int64, device=D)
    torch.cumsum(per, 0, out=offsets[1:])
    out = torch.empty(sum(r.numel() for _, _, r in parts), dtype=torch.int64, device=D)
    for idx, off, rows in parts:
        if rows.numel():
            off, rows = off.to(D), rows.to(D)
            cnt = off[1:] - off[:-1]
            shift = torch.repeat_interleave(offsets.index_select(0, idx) - off[:-1], cnt, output_size=rows.numel())
            out.index_copy_(0, shift + torch.arange(rows.numel(), device=D), rows)
    return offsets, out
