"""Per-query forms (one answer per query: lookup, range_lookup, range_count, aggregate, range_aggregate): the
pieces path, and point lookups partitioned in one pass and pipelined in chunks whose exchanges overlap the local
lookups; how point queries travel is a :class:`PointRouting`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.distributed as dist

from .._grouping import MAX_CUDA_BUCKETS
from .._keys import KEY_TYPES
from ..cgrx import CgRXSearch
from ..results import Aggregate, Lookup
from . import exchange, header, routing, stages
from .values import check_values, route_values, values_header

# Point lookups on CUDA go out in this many chunks by default, so that exchanges overlap local lookups.
DEFAULT_CUDA_PIPELINE = 4

OwnQueries = Literal["auto", "in_place", "routed"]


@dataclass(frozen=True)
class PointRouting:
    """How point lookups travel; the same on every rank (agreed when the index is built).

    Args:
        min_chunk_queries: a pipelined point lookup (``pipeline`` > 1) is split only into chunks of at least
            this many queries of the largest rank's batch: every chunk costs two more collectives, which small
            batches pay without anything to overlap.
        own_queries: where a rank's queries that its own shard holds are answered. ``"in_place"``: the local
            index answers the caller's whole batch as it lies while the other queries travel (a cgRX shard that
            searches; others route), its owners' answers landing over the misses; ``"routed"``: they go
            through the partition like the others; ``"auto"``: in place on CUDA in groups of at most two ranks,
            where it measured faster (the pass costs a miss per other rank's query, which outweighs routing the
            own queries from three ranks on, and on the CPU it measured slower).
    """

    min_chunk_queries: int = 1 << 20
    own_queries: OwnQueries = "auto"

    def __post_init__(self) -> None:
        m = self.min_chunk_queries
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"min_chunk_queries must be a positive int, got {m!r}")
        if self.own_queries not in ("auto", "in_place", "routed"):
            raise ValueError(f"own_queries must be 'auto', 'in_place' or 'routed', got {self.own_queries!r}")

    def header(self) -> list[int]:
        """The settings as call-header integers (the ranks must agree on them)."""
        return [self.min_chunk_queries, ("auto", "in_place", "routed").index(self.own_queries)]


def default_pipeline(device: torch.device) -> int:
    return DEFAULT_CUDA_PIPELINE if device.type == "cuda" else 1


def per_query(ix, op: str, lo: torch.Tensor, hi: torch.Tensor | None, values: torch.Tensor | None = None,
               *, call: str | None = None, check: Callable[[], None] | None = None):
    """``call``: the method's name in the call header where it differs from ``op`` (lookup_rows answers
    through lookup); ``check``: one more local check of the call's arguments."""
    vcode, cached = values_header(ix, values)

    def validate():
        if check is not None:
            check()
        batch = ix._check_queries(lo, hi)
        if op.endswith("aggregate"):
            check_values(ix, values)
        return batch

    (lo, hi), heads = header.agree(ix, call or op, validate, lambda b: [b[0].numel(), cached, ix.pipeline],
                                  values_code=vcode)
    header.disagree(heads, header.HEAD + 2, "pipeline", str)
    st = stages.Stages(op, ix.profile, ix.device, ix.rank, ix._check_s)
    local_values = None
    if values is not None:
        header.disagree(heads, 5, "the value dtype", lambda v: str(header.VALUE_DTYPES[v]) if v >= 0 else "?")
        local_values = route_values(ix, values, st, all(h[header.HEAD + 1] for h in heads))
    chunks = point_chunks(ix, max(h[header.HEAD] for h in heads)) if hi is None else 0
    if chunks:
        out = points(ix, op, lo, local_values, values.dtype if values is not None else None, chunks, st)
        st.stats.update(queries=lo.numel(), pipelined=chunks)
        ix._last_stats = st.stats
        return out
    def route():
        query, owner, plo, phi = routing.pieces(ix, *routing.map_queries(ix, lo, hi))
        return owner, [plo] if hi is None else [plo, phi], query

    got, order, send_splits, recv_splits, (query,) = exchange.send_pieces(ix, op, route, st)
    rlo = got[:, 0].contiguous()
    rhi = None if hi is None else got[:, 1].contiguous()
    ans, err = exchange.guarded(ix, lambda: local_per_query(ix, op, rlo, rhi, local_values),
                             lambda: torch.full((rlo.numel(), 2), exchange.FAILED, dtype=torch.int64, device=ix.device))
    st.mark("local")
    back = exchange.a2a(ix, ans, recv_splits, send_splits, st)
    st.mark("return")
    exchange.raise_failed(ix, op, err, (back == exchange.FAILED).all(dim=1), send_splits)
    out = combine(ix, op, back, order, query, lo.numel(), values.dtype if values is not None else None)
    st.mark("scatter")
    st.stats.update(queries=lo.numel(), pieces=order.numel(), received=rlo.numel())
    ix._last_stats = st.stats
    return out


def local_per_query(ix, op: str, rlo: torch.Tensor, rhi: torch.Tensor | None,
                     values: torch.Tensor | None) -> torch.Tensor:
    """Local answers packed as int64 [R, 2]: (first global row, count) or (count, sum bits), written in one
    pass that also makes the local row IDs global and widens an int32 count (pack_answers)."""
    return header.internal().pack_answers(*local_columns(ix, op, rlo, rhi, values))


def local_columns(ix, op: str, rlo: torch.Tensor, rhi: torch.Tensor | None, values: torch.Tensor | None,
                   key_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The local index's answers as two columns, (first row, count) or (count, sum bits), and the map the
    first column still goes through (empty: none). ``key_type``: ``rlo`` holds point queries of that type
    (the caller's, for :func:`own_answers`; the kernels map them) rather than ordered keys."""
    ix._maybe_fault("local")
    loc, none = ix._local, ix._l2g[:0]
    if op == "range_count":  # the local index counts from positions where it can; no first row to map
        count = loc.range_count(rlo, rhi)
        return torch.full_like(count, -1, dtype=torch.int64), count, none
    if op.startswith("lookup") or op.startswith("range_lookup"):
        r = loc._spare_lookup(rlo, rhi, key_type) if ix._spare_rows else None  # global rows from the shard
        if r is not None:
            return r.first_row, r.count, none
        if key_type is not None:
            r = Lookup(*loc._point_call_as("lookup", rlo, key_type))
        else:
            r = loc.lookup(rlo) if rhi is None else loc.range_lookup(rlo, rhi)
        return r.first_row, r.count, ix._l2g
    if key_type is not None:
        a = Aggregate(*loc._point_call_as("aggregate", rlo, key_type, values))
    else:
        a = loc.aggregate(rlo, values) if rhi is None else loc.range_aggregate(rlo, rhi, values)
    s = a.sum.view(torch.int64) if a.sum.dtype == torch.float64 else a.sum.to(torch.int64)
    return a.count.to(torch.int64), s, none


def point_chunks(ix, largest: int) -> int:
    """Chunks of a point lookup through partition_queries (0: through the pieces path instead): at most the
    pipeline setting, at least ``min_chunk_queries`` of the ``largest`` rank's batch per chunk. The same on every
    rank: the pipeline setting and every rank's batch size are agreed in the call header, the routing settings
    at the build."""
    if ix.device.type == "cuda" and ix.world > MAX_CUDA_BUCKETS:
        return 0
    most = ix.pipeline if ix.device.type != "cuda" else min(ix.pipeline, MAX_CUDA_BUCKETS // ix.world)
    return max(1, min(most, largest // ix.point_routing.min_chunk_queries))


def own_in_place(ix) -> bool:
    """Whether this rank answers its own point queries where they lie (:func:`own_answers`): a cgRX shard
    that searches (not one tracing rays, whose large batches want the query sort that pass skips), whose
    search of another rank's key ends at its first or last bucket (the same few cache lines for every such
    key); with ``own_queries="auto"`` on CUDA in a group of at most two ranks (the others' keys are (W - 1) / W
    of the pass)."""
    how = ix.point_routing.own_queries
    if how == "routed" or not isinstance(ix._local, CgRXSearch) or ix._local._traces_rays():
        return False
    return how == "in_place" or (ix.device.type == "cuda" and ix.world <= 2)


def own_answers(ix, op: str, lo: torch.Tensor, values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The local index's answers to the caller's whole batch, in its order and dtype (the kernels map the
    keys), as the two int64 columns of :func:`local_per_query`'s rows. Right for this rank's own queries;
    the others' keys lie outside its keys (misses), and their owners' answers overwrite them."""
    first, second, l2g = local_columns(ix, op, lo, None, values, ix.key_type)
    return (header.internal().global_rows(first, l2g, 0) if l2g.numel() else first), second.to(torch.int64)


def points(ix, op: str, lo: torch.Tensor, values: torch.Tensor | None, value_dtype, chunks: int,
            st: stages.Stages):
    """Point lookups: the queries mapped, routed and grouped by (chunk, owner) in one pass
    (partition_queries); the counts of every chunk exchanged at once (the only host synchronization before
    the answers are in); then per chunk the queries out, the local lookup and the answers back. With
    several chunks the exchanges are asynchronous, so on CUDA (NCCL runs them on its own stream) they
    overlap the local lookups of other chunks. Where :func:`own_in_place`, this rank's own queries stay
    out of the routing: the local index answers the caller's batch as it lies, while the first chunk's
    queries are in flight, and the owners' answers land over the others; otherwise the answers land in one
    buffer in send order. Either way one pass puts them in the caller's order (scatter_answers_into).

    Every rank posts the same collectives whatever fails where: a failed routing is this rank's status in
    the counts exchange (every rank raises before queries move); a failed local lookup answers exchange.FAILED and
    is a flag in the all_reduce after the returns (its rank and every rank it owed answers raise)."""
    internal = header.internal()
    n, C, W, r = lo.numel(), chunks, ix.world, ix.rank
    # Where this rank's own queries are answered: in place (:func:`own_in_place`: the partition leaves them
    # out); else, on the first and the last rank, as pieces: the partition puts the own piece of each chunk
    # at an end of the chunk's send buffer, looked up there instead of being copied to itself by the
    # exchange. A middle rank's piece lies between other ranks' pieces and goes through the exchange.
    in_place = own_in_place(ix)
    pieces = not in_place and r in (0, W - 1)
    part_err = None
    try:
        ix._maybe_fault("partition")
        keys, positions, counts = internal.partition_queries(lo, KEY_TYPES[ix.key_type], ix._splitters_ordered, C,
                                                             r if in_place else -1)
    except Exception as e:  # noqa: BLE001  (reported through the counts exchange)
        part_err = e
        counts = torch.zeros((C, W), dtype=torch.int64, device=ix.device)
    st.mark("partition")
    sent, got_counts = exchange.exchange_counts(ix, op, counts.t(), part_err)  # row d: every chunk's count to rank d
    sc, rc = [list(col) for col in zip(*sent)], [list(col) for col in zip(*got_counts)]  # each [chunk][rank]
    starts = [0]
    for c in range(C):
        starts.append(starts[-1] + sum(sc[c]))

    def remote(c: int, row: list[int]) -> tuple[int, int, list[int]]:
        """The exchanged part of chunk c's buffer (start, end) and its splits, given one row of counts."""
        lo, hi = starts[c], starts[c + 1]
        if not pieces:
            return lo, hi, row
        lo, hi = (lo + row[r], hi) if r == 0 else (lo, lo + sum(row[:r]))
        return lo, hi, [0 if j == r else x for j, x in enumerate(row)]

    def failed_answers(*shape: int) -> torch.Tensor:
        return torch.full(shape, exchange.FAILED, dtype=torch.int64, device=ix.device)

    overlap = C > 1
    # The queries travel while the own ones are looked up, also in one chunk (unless profiling, which times
    # the exchange as a stage of its own).
    flight = overlap or not st.on
    outgoing = []
    for c in range(C):
        lo_c, hi_c, send = remote(c, sc[c])
        _, _, recv = remote(c, rc[c])
        part = keys[lo_c:hi_c]
        got = keys.new_empty(sum(recv))
        work = dist.all_to_all_single(got, part, recv, send, group=ix.group, async_op=flight)
        st.moved(part, got, send)
        outgoing.append((got, work, lo_c, hi_c, send, recv))
    if not overlap:
        st.mark("exchange")
    # The own answers first: they need no exchange, so they run while the first chunk's queries are in flight.
    back = torch.empty((starts[-1], 2), dtype=torch.int64, device=ix.device)
    err = None
    if in_place:
        (first, second), err = exchange.guarded(ix, lambda: own_answers(ix, op, lo, values),
                                             lambda: (failed_answers(n), failed_answers(n)))
    else:
        first, second = (torch.empty(n, dtype=torch.int64, device=ix.device) for _ in range(2))
    if pieces:
        for c in range(C):
            a = starts[c] + sum(sc[c][:r])
            mine = keys[a:a + sc[c][r]]
            if mine.numel():
                ans, e = exchange.guarded(ix, lambda: local_per_query(ix, op, mine, None, values),
                                       lambda: failed_answers(mine.numel(), 2))
                err = err or e
                back[a:a + mine.numel()].copy_(ans)
    returns = []
    for c in range(C):
        got, work, lo_c, hi_c, send, recv = outgoing[c]
        if work is not None:
            work.wait()
        ans, e = exchange.guarded(ix, lambda: local_per_query(ix, op, got, None, values),
                               lambda: failed_answers(got.numel(), 2))
        err = err or e
        if not overlap:
            st.mark("local")
        dest = back[lo_c:hi_c]
        work = dist.all_to_all_single(dest, ans, send, recv, group=ix.group, async_op=overlap)
        st.moved(ans, dest, recv)
        returns.append((work, ans))  # ans stays referenced until its send is done
    # Whether any rank's local lookup failed: one integer, instead of a pass over every answer.
    failed = torch.zeros(1, dtype=torch.int64, device=ix.device)
    if err is not None:
        failed.fill_(1)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=ix.group)
    for work, _ in returns:
        if work is not None:
            work.wait()
    st.mark("local" if overlap else "return")
    internal.scatter_answers_into(back, positions[:starts[-1]], first, second)
    if err is not None or bool(failed):
        count_col = 0 if "aggregate" in op else 1
        exchange.raise_failed(ix, op, err, back[:, count_col] == exchange.FAILED, [x for row in sc for x in row])
    st.mark("scatter")
    return point_answer(op, first, second, value_dtype)


def combine(ix, op: str, back: torch.Tensor, order: torch.Tensor, query: torch.Tensor, n: int,
             value_dtype: torch.dtype | None, dropped: torch.Tensor | None = None):
    """Answers of pieces (in send order) to answers of queries in the caller's order."""
    if order is not None:  # column by column, so that the answers come out contiguous
        cols = [torch.empty(back.shape[0], dtype=torch.int64, device=back.device).index_copy_(0, order, back[:, j])
                for j in range(2)]
    else:
        cols = [back[:, 0], back[:, 1]]
    is_agg = "aggregate" in op
    if is_agg:
        sum_dtype = torch.float64 if value_dtype is not None and value_dtype.is_floating_point else torch.int64
        count = cols[0]
        s = cols[1].view(torch.float64) if sum_dtype == torch.float64 else cols[1]
    else:
        first, count = cols
    if dropped is not None:
        count = torch.where(dropped, 0, count)
        if is_agg:
            s = torch.where(dropped, 0, s)
        else:
            first = torch.where(dropped, -1, first)
    if query.numel() == n and op in ("lookup", "aggregate", "lookup_fixed", "aggregate_fixed"):
        qcount = count  # one piece per query, in query order
        res = (first if not is_agg else s)
    else:
        qcount = torch.zeros(n, dtype=torch.int64, device=ix.device).index_add_(0, query, count)
        if is_agg:
            res = torch.zeros(n, dtype=s.dtype, device=ix.device).index_add_(0, query, s)
        else:
            big = torch.where(first < 0, header.I64_MAX, first)
            m = torch.full((n,), header.I64_MAX, dtype=torch.int64, device=ix.device).scatter_reduce_(0, query, big, "amin")
            res = torch.where(m == header.I64_MAX, -1, m)
    if dropped is not None:
        qdrop = torch.zeros(n, dtype=torch.int64, device=ix.device).index_add_(0, query, dropped.to(torch.int64)) > 0
        qcount = torch.where(qdrop, -1, qcount)
    return Aggregate(qcount, res) if is_agg else Lookup(res, qcount)


def point_answer(op: str, first: torch.Tensor, second: torch.Tensor, value_dtype: torch.dtype | None):
    """The two answer columns of a point call as its result: (first row, count), or for aggregates (count, sum
    bits; a floating value column's sums are float64 bits)."""
    if "aggregate" not in op:
        return Lookup(first, second)
    if value_dtype is not None and value_dtype.is_floating_point:
        second = second.view(torch.float64)
    return Aggregate(first, second)
