"""The CSR forms (lookup_all, range: every match, sizes learned on the host) and the capped forms (the first
``capacity`` matches of the caller's batch and the true total), over the dynamic exchange."""

from __future__ import annotations

import torch

from ..results import CappedMatches, Matches
from . import exchange, fixed, header, routing, stages


def csr(ix, op: str, lo: torch.Tensor, hi: torch.Tensor | None) -> Matches:
    (lo, hi), heads = header.agree(ix, op, lambda: ix._check_queries(lo, hi), lambda b: [b[0].numel()])
    st = stages.Stages(op, ix.profile, ix.device, ix.rank, ix._check_s)
    got, order, send_splits, recv_splits, (query,) = exchange.send_pieces(ix, op, routing.range_route(ix, lo, hi), st)

    def local():
        ix._maybe_fault("local")
        m = ix._local.range(got[:, 0].contiguous(), got[:, 1].contiguous())
        return m.offsets[1:] - m.offsets[:-1], routing.to_global(ix, m.rows)

    (counts, rows), err = exchange.guarded(ix, local, lambda: (
        torch.full((got.shape[0],), exchange.FAILED, dtype=torch.int64, device=ix.device),
        torch.empty(0, dtype=torch.int64, device=ix.device)))
    st.mark("local")
    back_counts = exchange.a2a(ix, counts, recv_splits, send_splits, st)
    # Rows per source / destination: sums of the piece counts over each block (one host sync). A failed
    # owner's counts are exchange.FAILED and it sends no rows: counted as 0 on both sides.
    src_totals = exchange.block_sums(counts.clamp(min=0), recv_splits).tolist()
    dst_totals = exchange.block_sums(back_counts.clamp(min=0), send_splits).tolist()
    back_rows = exchange.a2a(ix, rows, src_totals, dst_totals, st)
    exchange.raise_failed(ix, op, err, back_counts == exchange.FAILED, send_splits)
    st.mark("return")
    n, P = lo.numel(), order.numel()
    gen_counts = torch.empty_like(back_counts).index_copy_(0, order, back_counts)
    # Start of each piece's rows in back_rows (send order), moved to generation order.
    src_start = torch.empty_like(back_counts).index_copy_(0, order, torch.cumsum(back_counts, 0) - back_counts)
    dst_start = torch.cumsum(gen_counts, 0) - gen_counts
    total = int(back_rows.numel())
    gather = torch.arange(total, device=ix.device) + torch.repeat_interleave(src_start - dst_start, gen_counts, output_size=total)
    out_rows = back_rows[gather]
    qcount = torch.zeros(n, dtype=torch.int64, device=ix.device).index_add_(0, query, gen_counts) if P else \
        torch.zeros(n, dtype=torch.int64, device=ix.device)
    offsets = torch.zeros(n + 1, dtype=torch.int64, device=ix.device)
    offsets[1:] = torch.cumsum(qcount, 0)
    st.mark("scatter")
    st.stats.update(queries=n, pieces=P, received=int(got.shape[0]), matches=total)
    ix._last_stats = st.stats
    return Matches(offsets, out_rows)


def capped(ix, op: str, lo, hi, capacity, query_capacity, check):
    padded = query_capacity is not None

    def validate():
        batch = ix._check_queries(lo, hi)
        ix._check_capacity(capacity, "capacity")
        if padded:
            ix._check_capacity(query_capacity, "query_capacity")
        return batch

    if padded and not fixed.checks_wanted(ix, check):
        ix._check_s = 0.0
        lo, hi = ix._as_key_dtype(lo, hi)
        return fixed.capped_fixed(ix, op, lo, hi, capacity, query_capacity, checked=False)
    (lo, hi), heads = header.agree(ix, op, validate, lambda b: [b[0].numel(), capacity, query_capacity if padded else -1])
    header.disagree(heads, header.HEAD + 1, "capacity", str)
    header.disagree(heads, header.HEAD + 2, "query_capacity", str)
    if padded:
        return fixed.capped_fixed(ix, op, lo, hi, capacity, query_capacity, checked=True)
    st = stages.Stages(op, ix.profile, ix.device, ix.rank, ix._check_s)
    got, order, send_splits, recv_splits, (query, owner) = exchange.send_pieces(ix, 
        op, routing.range_route(ix, lo, hi, with_owner=True), st)
    rlo, rhi = got[:, 0].contiguous(), got[:, 1].contiguous()
    # Per source block: its pieces' full counts and the first `capacity` rows of its answer (never more of
    # a block's rows can land in the caller's first `capacity`).
    def local():
        ix._maybe_fault("local")
        parts, start = [], 0
        for s in range(ix.world):
            b = recv_splits[s]
            c = ix._local.range_capped(rlo[start:start + b], rhi[start:start + b], capacity)
            parts.append(torch.cat([c.offsets[1:] - c.offsets[:-1], routing.to_global(ix, c.rows)]))
            start += b
        return torch.cat(parts)

    payload, err = exchange.guarded(ix, local, lambda: torch.full((sum(recv_splits) + ix.world * capacity,), exchange.FAILED,
                                                           dtype=torch.int64, device=ix.device))
    st.mark("local")
    back = exchange.a2a(ix, payload, [b + capacity for b in recv_splits], [b + capacity for b in send_splits], st)
    st.mark("return")
    ends = torch.tensor([b + capacity for b in send_splits], device=ix.device).cumsum(0)
    firsts = (ends - ends.new_tensor([b + capacity for b in send_splits]))
    marks = (back[firsts.clamp(max=max(back.numel() - 1, 0))] == exchange.FAILED) & (ends > firsts) if back.numel() else \
        torch.zeros(ix.world, dtype=torch.bool, device=ix.device)
    exchange.raise_failed(ix, op, err, marks, [1] * ix.world)
    counts_send, rows_from = [], []
    start = 0
    for d in range(ix.world):
        counts_send.append(back[start:start + send_splits[d]])
        rows_from.append(back[start + send_splits[d]:start + send_splits[d] + capacity])
        start += send_splits[d] + capacity
    counts_send = torch.cat(counts_send)
    rows_from = torch.cat(rows_from)
    gen_counts = torch.empty_like(counts_send).index_copy_(0, order, counts_send)
    out = assemble_capped(ix, gen_counts, owner, query, lo.numel(), rows_from, capacity)
    st.mark("scatter")
    ix._last_stats = st.stats
    return out


def assemble_capped(ix, gen_counts, owner, query, n, rows_from, capacity) -> CappedMatches:
    """A capped answer from the pieces' full counts (generation order), their owners and queries, and each
    owner's first ``capacity`` rows of its block (rows_from [world * capacity]). No host sync."""
    dev = ix.device
    P = gen_counts.numel()
    qcount = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, query, gen_counts)
    offsets = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(qcount, 0)
    total = offsets[-1]
    if P == 0 or capacity == 0:
        return CappedMatches(offsets, torch.full((capacity,), -1, dtype=torch.int64, device=dev), total)
    piece_end = torch.cumsum(gen_counts, 0)
    piece_start = piece_end - gen_counts
    # Offset of each piece inside its owner's block answer: exclusive cumsum of counts over the pieces sent
    # to the same owner, in generation order (the block order).
    key = owner * (P + 1) + torch.arange(P, device=dev)
    by_owner = torch.argsort(key)
    c_sorted = gen_counts[by_owner]
    excl = torch.cumsum(c_sorted, 0) - c_sorted
    o_sorted = owner[by_owner]
    block_first = torch.searchsorted(o_sorted, torch.arange(ix.world, device=dev))
    base = excl - excl[block_first.clamp(max=P - 1)][o_sorted] if P else excl
    # excl at the block's first piece is the sum of earlier blocks; subtract it
    blk_off = torch.empty_like(base).index_copy_(0, by_owner, base)
    pos = torch.arange(capacity, device=dev)
    p = torch.searchsorted(piece_end, pos, right=True).clamp(max=P - 1)
    j = pos - piece_start[p]
    src = owner[p] * capacity + blk_off[p] + j
    valid = (pos < total) & (blk_off[p] + j < capacity)
    rows = torch.where(valid, rows_from[src.clamp(0, rows_from.numel() - 1)], -1)
    return CappedMatches(offsets, rows, total)
