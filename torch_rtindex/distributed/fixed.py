"""The fixed-capacity forms (``*_fixed``): every rank sends every rank exactly ``query_capacity`` query slots
behind a header (count, overflow flag, status), with equal split sizes; slots found by a stable sort and a
search (points: by partition_padded, which writes the blocks and their headers in one pass), never a host read:
fixed shapes and no host synchronization, for CUDA graphs and ``torch.compile(fullgraph=True)``. The overflow
flags every rank receives from every rank give a global flag without another collective."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._config import PADDED_COUNT, PADDED_HEADER, PADDED_OVERFLOW
from .._grouping import MAX_CUDA_BUCKETS
from .._keys import KEY_TYPES
from . import exchange, forms, header, points, routing, stages
from .values import check_values, route_values, values_header


class Fixed(NamedTuple):
    """The answer of a fixed-capacity call (``*_fixed``, or a capped form with ``query_capacity``) and whether
    queries were dropped because more of them went to one rank than ``query_capacity`` allowed.

    ``overflowed`` is a 0-d bool tensor, the same on every rank (any rank's overflow): retry every rank's call
    with a larger ``query_capacity``. Dropped queries answer ``first_row = -1, count = -1`` (sum 0); in capped
    answers they count as having no matches.
    """

    answer: Any
    overflowed: torch.Tensor


def checks_wanted(ix, check: bool | None, live: bool | None = None) -> bool:
    if check is not None:
        return bool(check)
    return eager(ix) if live is None else live


def eager(ix) -> bool:
    """Neither compiling nor capturing a CUDA graph: Python exceptions can be caught and reported."""
    # is_compiling first: Dynamo cannot trace the capture query (it returns a bool, a graph break).
    if torch.compiler.is_compiling():
        return False
    return not (ix.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def fixed_local(ix, fn, shape: tuple[int, int], live: bool, marked: bool):
    """The local stage of a fixed-capacity call: (payload, error). ``marked``: the payload is the answers
    (reshaped to ``shape``, one row per source rank), and an owner that failed answers exchange.FAILED in every
    slot, which its first slot's mark tells; else a status column goes in front of them (column 0). ``live``
    (eager mode): a failure (out of memory, ...) answers exchange.FAILED (with status 1) so that this rank still
    posts the return exchange; compiled or captured, the local stage runs as is."""
    if live:
        ans, err = exchange.guarded(ix, fn, lambda: torch.full(shape, exchange.FAILED, dtype=torch.int64, device=ix.device))
    else:
        ans, err = fn(), None
    if marked:
        return ans.view(shape), err
    status = torch.full((shape[0], 1), int(err is not None), dtype=torch.int64, device=ix.device)
    return torch.cat([status, ans.reshape(shape)], dim=1), err


def fixed_exchange(ix, lo, hi, k: int, qcap: int, st: stages.Stages, live: bool):
    """Padded exchange of the pieces of ``lo`` / ``hi`` (``k`` columns: 1 for points, 2 for ranges). Returns
    (received data [world * qcap, k], valid slots, global overflow (0-d bool), the received rows with their
    headers (each rank's routing status), this rank's routing error, and the pieces: (query, owner, valid) of
    each piece, its position in the send buffer, dropped pieces). No host synchronization. In eager mode
    (``live``) a failure while routing (out of memory) sends empty blocks and status 1 instead of raising, so
    that every rank posts both exchanges; the caller raises after the return (:func:`~.exchange.raise_routing`)."""
    dev, W = ix.device, ix.world
    err, pieces = None, None
    try:
        ix._maybe_fault("partition")
        qlo, qhi = routing.map_queries(ix, lo, hi)
        query, owner, plo, phi, valid = routing.fixed_pieces(ix, qlo, qhi)
        cols = [plo] if k == 1 else [plo, phi]
        P = owner.numel()
        key = owner if valid is None else torch.where(valid, owner, W)
        order = torch.argsort(key, stable=True)
        skey = key[order]
        starts = torch.searchsorted(skey, torch.arange(W + 1, device=dev))
        slot = torch.empty_like(order).index_copy_(0, order, torch.arange(P, device=dev) - starts[skey])
        counts = starts[1:] - starts[:-1]
        live_piece = torch.ones(P, dtype=torch.bool, device=dev) if valid is None else valid
        fits = slot < qcap
        dropped = live_piece & ~fits
        overflow = dropped.any()
        trash = W * qcap
        pos = torch.where(live_piece & fits, owner * qcap + slot, trash)
        data = torch.zeros(trash + 1, k, dtype=torch.int64, device=dev)
        data.index_copy_(0, pos, torch.stack(cols, dim=1))
        data = data[:trash].reshape(W, qcap * k)
        pieces = (query, owner, valid, pos.clamp(max=trash - 1) if trash else pos, dropped)
    except Exception as e:  # noqa: BLE001  (eager: this rank's status, raised after the return exchange)
        if not live:
            raise
        err = e
        counts = torch.zeros(W, dtype=torch.int64, device=dev)
        overflow = torch.zeros((), dtype=torch.bool, device=dev)
        data = torch.zeros((W, qcap * k), dtype=torch.int64, device=dev)
    got = exchange.padded_exchange(ix, exchange.padded_block(ix, counts, overflow, err, data), st)
    gover = got[:, PADDED_OVERFLOW].any()
    rcount = got[:, PADDED_COUNT]
    rvalid = (torch.arange(qcap, device=dev)[None] < rcount.clamp(max=qcap)[:, None]).reshape(-1)
    return got[:, PADDED_HEADER:].reshape(W * qcap, k), rvalid, gover, got, err, pieces


def fixed_answers(ix, op: str, fn, shape: tuple[int, int], checked: bool, route_err: BaseException | None,
                   received: torch.Tensor, st: stages.Stages, live: bool, flag_col: int | None = None) -> torch.Tensor:
    """The fixed-capacity local stage and return exchange: ``fn()`` answers the received blocks (reshaped to
    ``shape``, one row per source rank), the rows go back, and failures are raised once every rank has posted
    both exchanges: a failed local lookup (with checks every rank raises if any owner failed, one host
    synchronization; without, only the failed rank: the others' answers from a failed owner are undefined, a
    call without checks reads no flag), then a failed routing (:func:`~.exchange.raise_routing`).
    ``flag_col``: the column of a returned row that a failed owner marks exchange.FAILED (answers no real
    lookup gives that value there); None: a status column travels in front of the answers instead. Returns
    the answers this rank got back, [world, shape[1]]."""
    payload, err = fixed_local(ix, fn, shape, live, flag_col is not None)
    st.mark("local")
    got = exchange.a2a(ix, payload, None, None, st)
    st.mark("return")
    if checked:
        flags = got[:, 0] != 0 if flag_col is None else got[:, flag_col] == exchange.FAILED
        exchange.raise_failed(ix, op, err, flags, [1] * ix.world)
    elif err is not None:
        exchange.raise_failed(ix, op, err, got[:0, 0], [])
    exchange.raise_routing(ix, op, route_err, received, checked)
    return got if flag_col is not None else got[:, 1:]


def fixed(ix, op, lo, hi, values, query_capacity, check):
    live = eager(ix)  # once per call: each query of the compile and capture state costs host time
    checked = checks_wanted(ix, check, live)
    if checked:
        vcode, cached = values_header(ix, values)

        def validate():
            batch = ix._check_queries(lo, hi)
            ix._check_capacity(query_capacity, "query_capacity")
            if values is not None:
                check_values(ix, values)
            return batch

        (lo, hi), heads = header.agree(ix, op, validate, lambda b: [b[0].numel(), query_capacity, cached],
                                      values_code=vcode)
        header.disagree(heads, header.HEAD + 1, "query_capacity", str)
        if values is not None:
            header.disagree(heads, 5, "the value dtype", lambda v: str(header.VALUE_DTYPES[v]) if v >= 0 else "?")
            cached = all(h[header.HEAD + 2] for h in heads)
    else:
        # No check: the value column is routed again (whether every rank has it cached is not known here).
        cached = False
        ix._check_s = 0.0
        lo, hi = ix._as_key_dtype(lo, hi)
    st = stages.Stages(op, ix.profile, ix.device, ix.rank, ix._check_s)
    local_values = route_values(ix, values, st, cached) if values is not None else None
    qcap = query_capacity
    if hi is None and (ix.device.type != "cuda" or ix.world <= MAX_CUDA_BUCKETS):
        return fixed_points(ix, op, lo, local_values, values.dtype if values is not None else None, qcap,
                            checked, st, live)
    rdata, rvalid, gover, received, perr, pieces = fixed_exchange(ix, lo, hi, 1 if hi is None else 2, qcap, st, live)
    rlo = rdata[:, 0].contiguous()
    rhi = None if hi is None else rdata[:, 1].contiguous()
    base = op.removesuffix("_fixed")
    back = fixed_answers(ix, op, lambda: points.local_per_query(ix, base, rlo, rhi, local_values),
                         (ix.world, qcap * 2), checked, perr, received, st, live).reshape(ix.world * qcap, 2)
    query, owner, valid, pos, dropped = pieces
    mine = back[pos] if back.shape[0] else torch.zeros(pos.numel(), 2, dtype=torch.int64, device=ix.device)
    if valid is not None:  # a range's pieces at shards it does not overlap contribute nothing
        mine = torch.where(valid[:, None], mine, torch.tensor([-1, 0], device=ix.device) if "lookup" in op
                           else torch.zeros(2, dtype=torch.int64, device=ix.device))
    out = points.combine(ix, op, mine, None, query, lo.numel(), values.dtype if values is not None else None, dropped)
    st.mark("scatter")
    ix._last_stats = st.stats
    return Fixed(out, gover)


def fixed_points(ix, op, lo, local_values, value_dtype, qcap: int, checked: bool, st: stages.Stages,
                 live: bool) -> Fixed:
    """Point queries through the fixed-capacity exchange: put into per-owner blocks of ``qcap`` slots behind
    the exchange's header in one pass (partition_padded; which queries of an overfull owner fill its block is
    not specified: the CUDA kernel is not stable), the received rows answered as they lie, headers included
    (three answers per source rank never read, instead of a copy without them), so that a query's slot is
    also its answer's row, and the answers read back by slot in one pass (gather_answers, which also ORs the
    received overflow flags). A failed owner's answers are all exchange.FAILED, its first (a header's) too: the
    flag. Fixed shapes, no host synchronization."""
    dev, W = ix.device, ix.world
    internal = header.internal()
    part_err = None
    try:
        ix._maybe_fault("partition")
        block, slots = internal.partition_padded(lo, KEY_TYPES[ix.key_type], ix._splitters_ordered, qcap)
    except Exception as e:  # noqa: BLE001  (eager: sent as this rank's status, raised after the exchanges)
        if not live:
            raise
        part_err = e
        block = exchange.padded_block(ix, torch.zeros(W, dtype=torch.int64, device=dev),
                                      torch.zeros((), dtype=torch.bool, device=dev), e,
                                      torch.zeros((W, qcap), dtype=torch.int64, device=dev))
        slots = torch.full((lo.numel(),), -1, dtype=torch.int64, device=dev)
    got = exchange.padded_exchange(ix, block, st)
    rlo = got.view(-1)  # the headers and the slots past a block's count: answered, never read
    base = op.removesuffix("_fixed")
    width = PADDED_HEADER + qcap
    count_col = 0 if "aggregate" in op else 1  # a real count is never FAILED (a sum's bits can be)
    back = fixed_answers(ix, op, lambda: points.local_per_query(ix, base, rlo, None, local_values), (W, width * 2),
                         checked, part_err, got, st, live, flag_col=count_col).view(W * width, 2)
    # Dropped queries: first row -1 and count -1 (aggregates: count -1, sum 0). The global overflow flag is
    # read from the received headers in the same launch.
    first, second, gover = internal.gather_answers(back, slots, -1, 0 if "aggregate" in op else -1, got)
    st.mark("scatter")
    ix._last_stats = st.stats
    return Fixed(points.point_answer(op, first, second, value_dtype), gover)


def capped_fixed(ix, op, lo, hi, capacity, qcap, checked: bool) -> Fixed:
    live = eager(ix)
    st = stages.Stages(op, ix.profile, ix.device, ix.rank, ix._check_s)
    rdata, rvalid, gover, received, perr, pieces = fixed_exchange(ix, lo, hi, 2, qcap, st, live)
    # Slots past a block's count become empty ranges (ordered lo 1 > hi 0), so they add no rows.
    rlo = torch.where(rvalid, rdata[:, 0], 1)
    rhi = torch.where(rvalid, rdata[:, 1], 0)
    def local():
        ix._maybe_fault("local")
        parts = []
        for s in range(ix.world):
            c = ix._local.range_capped(rlo[s * qcap:(s + 1) * qcap].contiguous(), rhi[s * qcap:(s + 1) * qcap].contiguous(), capacity)
            parts.append(torch.cat([c.offsets[1:] - c.offsets[:-1], routing.to_global(ix, c.rows)]))
        return torch.stack(parts)

    back = fixed_answers(ix, op, local, (ix.world, qcap + capacity), checked, perr, received, st, live)
    query, owner, valid, pos, dropped = pieces
    counts_from = back[:, :qcap].reshape(-1)
    rows_from = back[:, qcap:].reshape(-1)
    gen_counts = counts_from[pos] if counts_from.numel() else torch.zeros_like(owner)
    gone = dropped if valid is None else (dropped | ~valid)
    gen_counts = torch.where(gone, 0, gen_counts)
    out = forms.assemble_capped(ix, gen_counts, owner, query, lo.numel(), rows_from, capacity)
    st.mark("scatter")
    ix._last_stats = st.stats
    return Fixed(out, gover)
