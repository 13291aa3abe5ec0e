"""Updates: a batch of insertions and deletions routed to the chunks it touches, with
:meth:`UpdatableCgRXIndex.update`'s semantics. By default each touched chunk is rebuilt from its pairs plus the
batch's insertions minus its deletions (cost: the touched chunks' sizes, not the batch's). With ``updatable=True``
each chunk holds node chains (row IDs stored as offsets from the chunk's smallest, so global row order is chain
order), and a chunk's share is planned and then applied in place (:class:`InPlace`): a batch costs its own size
plus one pass over the touched chunks' node headers, with no sort, build or copy of a chunk. A chunk is rebuilt
instead when its share needs more nodes than its slack (``growth``), when it grows past twice the chunk size
(unless it holds one key's run, which no cut can split), or when its rows span 2^32 or more. Either way a chunk
that outgrew twice the chunk size is split and an emptied one dropped. All-or-nothing: every touched chunk is
planned (and rebuilt ones built) before anything changes; the in-place applies save the chains they touch first
and restore them on any error; chunks are swapped and cached copies of changed chunks evicted only after every
chunk succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._base import _ops
from .._keys import MAX_KEYS, check_key_tensor
from ..cgrx_updatable import bucket_offsets, cancel_batch, plan_insertions, ranks_within, sort_pairs
from ..results import UpdateResult
from .build import Builder
from .config import ChunkedConfig
from .hot_tier import HotTier
from .stats import Stats
from .store import TOP, Chunk, ChunkStore, align

# Row IDs are int64 below 2^48: one past that could index no values tensor (aggregate), and fresh row IDs follow
# the largest one given.
MAX_ROW_ID = 2**48 - 1


class Updater:
    """Applies update batches to the chunks of ``store`` (chunks made by ``builder``), keeping the hot tier's keys
    for its rebuild over the new chunks."""

    def __init__(self, config: ChunkedConfig, key_dtype: torch.dtype, store: ChunkStore, builder: Builder,
                 hot: HotTier, stats: Stats) -> None:
        self.config, self.key_dtype, self.store, self.builder, self.hot, self.stats = (
            config, key_dtype, store, builder, hot, stats)

    def side(self, keys, rows, what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One side of a batch checked: its keys as ordered keys and its rows (int64), on the CPU."""
        if keys is None:
            keys = torch.empty(0, dtype=self.key_dtype)
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"{what} keys must be a torch.Tensor, got {type(keys).__name__}")
        check_key_tensor(keys, f"{what} keys", dtype=self.key_dtype, device=keys.device)
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError(f"{what} keys contain NaN, which has no place in a key order; drop or replace those rows")
        ordered = self.builder.map(keys).cpu()
        if rows is not None:
            if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.numel() != keys.numel():
                raise ValueError(f"{what} rows must be a 1-D tensor with one row ID per key")
            if rows.dtype.is_floating_point or rows.dtype == torch.bool:
                raise TypeError(f"{what} rows must be an integer tensor, got {rows.dtype}")
            rows = rows.to("cpu", torch.int64)
            if rows.numel() and bool(((rows < 0) | (rows > MAX_ROW_ID)).any()):
                bad = int(rows[(rows < 0) | (rows > MAX_ROW_ID)][0])
                raise ValueError(f"{what} rows must be row IDs in 0 .. 2^48 - 1, got {bad}: a row ID indexes the "
                                 "values of aggregate() and the next fresh row ID follows the largest; number the "
                                 "rows densely from 0")
        return ordered, rows

    def update(self, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
               delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult:
        """One batch of insertions and deletions of (key, row ID) pairs: the index becomes (index + insertions)
        - deletions, as multisets, with :meth:`UpdatableCgRXIndex.update`'s semantics and counts (a deletion with
        a row ID removes one such pair, without row IDs every pair of its key; insertions without row IDs get the
        next free row IDs, returned as ``rows``; row IDs are int64 >= 0).

        The batch is routed to the chunks it touches. Read-only chunks are rebuilt; node chunks
        (``updatable=True``) take their share in place, unless it needs more nodes than the chunk's slack, would
        make it larger than twice ``chunk_bytes``, or holds row IDs 2^32 or more away from the chunk's smallest:
        then that chunk is rebuilt (and split if it outgrew its size). All-or-nothing across chunks: on any error
        (bad input, out of memory) the index is unchanged. :meth:`stats` counts ``chunks_updated_in_place`` and
        ``chunks_rebuilt``.
        """
        ik, ir = self.side(insert_keys, insert_rows, "insert")
        dk, dr = self.side(delete_keys, delete_rows, "delete")
        n_ins = ik.numel()
        fresh = ir is None
        if fresh:
            ir = torch.arange(self.store.next_row, self.store.next_row + n_ins, dtype=torch.int64)
        ci, cd = self.store.chunk_of(ik), self.store.chunk_of(dk)
        touched = torch.unique(torch.cat([ci, cd])).tolist()
        T = self.builder.chunk_keys(max(self.store.next_row, int(ir.max()) + 1 if ir.numel() else 0))
        W = self.builder.work_device()  # chunks are rebuilt where the build sorts (the GPU where there is one)
        removed = absent = 0
        replace: dict[int, list[Chunk]] = {}
        in_place: list[InPlace] = []
        # ---- plan every touched chunk (nothing changes yet): an in-place plan, or the chunk rebuilt
        for c in touched:
            chunk = self.store.chunks[c]
            mi, md = ci == c, cd == c
            side = (ik[mi], ir[mi], dk[md], None if dr is None else dr[md])
            planned = self.plan_in_place(chunk, *side, T) if self.config.updatable else None
            if planned is not None:
                in_place.append(planned)
                continue
            allk, allr, c_removed, c_absent = self.merged(chunk, *side)
            removed, absent = removed + c_removed, absent + c_absent
            replace[c] = self.rebuilt(chunk, allk.to(W), allr.to(W), T)
        if W.type == "cuda":
            torch.cuda.current_stream(W).synchronize()  # the new blobs were copied out asynchronously
        # ---- apply in place, undoably. Undo log rather than copy-on-write: only the chains of the buckets a
        # batch touches change (new nodes come from slack no chain reaches), so saving those nodes costs about
        # the batch, where copying the touched chunks would cost their whole size, like a rebuild's copy.
        # The tier's keys, to rebuild it over the new chunks, read now: an error leaves everything as it was.
        hot_keys = self.hot.keys() if self.hot.tier is not None else None
        undo: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        try:
            for p in in_place:
                undo.append(p.snapshot())
                c_removed, c_absent = p.apply()
                removed, absent = removed + c_removed, absent + c_absent
        except BaseException:
            for grid, ids, saved in reversed(undo):
                grid.index_copy_(0, ids, saved)
            raise
        # ---- commit: nothing above changed what the index answers, and nothing below can fail
        for p in in_place:
            p.commit()
        new_chunks: list[Chunk] = []
        for c, chunk in enumerate(self.store.chunks):
            new_chunks.extend(replace.get(c, [chunk]))
        if len(new_chunks) > 1:
            nonempty = [ch for ch in new_chunks if ch.n]
            new_chunks = nonempty or new_chunks[:1]
        if self.store.cache is not None:
            for old in [self.store.chunks[c] for c in replace] + [p.chunk for p in in_place]:
                if old in self.store.cache:  # a changed chunk's cached copy would answer stale: copied in again on use
                    self.store.cache.evict(old)
        self.store.set(new_chunks)
        self.stats.count("chunks_updated_in_place", len(in_place))
        self.stats.count("chunks_rebuilt", len(replace))
        self.store.n += n_ins - removed
        if fresh:
            self.store.next_row += n_ins
        elif ir.numel():
            self.store.next_row = max(self.store.next_row, int(ir.max()) + 1)
        if n_ins or removed:
            self.store.rows_are_positions = False
        if hot_keys is not None:  # the tier's answers may be stale now: rebuilt over the new chunks at the next batch
            self.hot.after_update(hot_keys)
        self._check_budget()
        rows_out = ir if insert_keys is None else ir.to(insert_keys.device)  # where the caller's keys are
        return UpdateResult(inserted=n_ins, deleted=removed, absent=absent, rows=rows_out)

    def plan_in_place(self, chunk: Chunk, ik, ir, dk, dr, T: int) -> "InPlace | None":
        """A node chunk's share of a batch planned for an in-place apply (as :meth:`UpdatableCgRXIndex.update`
        plans it: cancellation, then cgrx_nodes_plan), changing nothing; None when the chunk must be rebuilt
        instead: rows outside its 32-bit window of offsets, more new nodes than its slack, or more than 2T keys."""
        if chunk.kind != "nodes":
            return None
        view = self.store.host_view(chunk)
        if not view.direct:  # rows spanning 2^32 or more sit behind a row map in global row order
            return None
        idx, base = view.index, chunk.base
        io = ir - base
        if io.numel() and bool(((io < 0) | (io > MAX_KEYS - 1)).any()):
            return None
        found_by_key = None
        if dr is None and dk.numel() and ik.numel():
            # By key next to insertions: absent = in neither the chunk nor the insertions (which cancel below).
            found_by_key = idx._present(dk) | torch.isin(dk, ik)
        ik, ir, dk, dr, cancelled = cancel_batch(ik, ir, dk, dr)
        cancelled, io = int(cancelled), ir - base
        far, do = 0, None
        if dr is not None:  # a row outside the window is in no pair of the chunk: absent
            do = dr - base
            near = (do >= 0) & (do <= MAX_KEYS - 1)
            far = int((~near).sum())
            dk, do = dk[near], do[near]
        ik, io = sort_pairs(ik, io)
        dk, do = sort_pairs(dk, do)
        ioff = bucket_offsets(idx._reps, idx._table, ik)
        doff = bucket_offsets(idx._reps, idx._table, dk)
        ir32 = io.to(torch.int32).contiguous()
        dr32 = None if do is None else do.to(torch.int32).contiguous()
        N, nodes = self.config.node_size, idx._pairs
        extra, removed, found = 0, None, None
        if ik.numel():
            first_new, *planned = plan_insertions(nodes, N, chunk.used, dk, dr32, doff, ik, ir32, ioff)
            extra, removed, found = torch.stack(planned).tolist()
            if chunk.used + extra > nodes.numel() // (3 * N + 2):
                return None  # its slack is spent: rebuilt, with fresh slack
            n_after = chunk.n + ik.numel() - removed
            # Growing past twice the chunk size: rebuilt and split. A chunk that already was that large and
            # does not grow stays (a rebuild would not make it smaller), as does a run of one key (no cut
            # falls inside it).
            one_key = chunk.kmin == chunk.kmax == int(ik[0]) == int(ik[-1])
            if n_after > 2 * T and n_after > chunk.n and not one_key:
                return None
        else:  # deletions alone reserve nothing (the apply counts what they removed)
            first_new = torch.zeros(idx.num_buckets, dtype=torch.int64)
        kmin, kmax = chunk.kmin, chunk.kmax
        if ik.numel():  # sorted: the first and last insertions are the smallest and largest
            lo, hi = int(ik[0]), int(ik[-1])
            kmin = lo if kmin is None or (lo ^ TOP) < (kmin ^ TOP) else kmin
            kmax = hi if kmax is None or (hi ^ TOP) > (kmax ^ TOP) else kmax
        return InPlace(chunk, nodes, N, dk, dr32, doff, ik, ir32, ioff, first_new, chunk.used + extra, (kmin, kmax),
                        cancelled, removed, found, None if found_by_key is None else int((~found_by_key).sum()), far)

    def merged(self, chunk: Chunk, ik, ir, dk, dr) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """The chunk's pairs plus its insertions minus its deletions (what a rebuild builds), and the pairs
        removed and the deletions absent."""
        keys, rows = self.store.decode(chunk)
        allk, allr = torch.cat([keys, ik]), torch.cat([rows, ir])
        if dr is None:
            gone = torch.isin(allk, dk)
            absent, removed = int((~torch.isin(dk, allk)).sum()), int(gone.sum())
        else:
            gone, removed, absent = remove_pairs(allk, allr, dk, dr)
        keep = ~gone
        return allk[keep], allr[keep], removed, absent

    def rebuilt(self, chunk: Chunk, keys: torch.Tensor, rows: torch.Tensor, T: int) -> list[Chunk]:
        """The chunk (range start kept) over new pairs, split into chunks of about T keys (between distinct
        keys) when it holds more than 2T."""
        if keys.numel() <= 2 * T:
            return [self.builder.build_chunk(keys, rows, chunk.lo)]
        flipped = keys ^ TOP
        by_row = torch.sort(rows, stable=True).indices
        sf, perm = torch.sort(flipped.index_select(0, by_row), stable=True)
        pos = rows.index_select(0, by_row).index_select(0, perm)
        out: list[Chunk] = []
        self.builder.cut(sf, pos, T, True, out)
        out[0].lo = chunk.lo
        return out

    def _check_budget(self) -> None:
        if self.store.cache is not None and max(align(c.nbytes) for c in self.store.chunks) > self.store.cache.budget:
            # A run of equal keys outgrew the budget: its queues are answered by the CPU (never an error here, the
            # update is done); say so once.
            self.stats.set(oversized_chunks=sum(align(c.nbytes) > self.store.cache.budget for c in self.store.chunks))


@dataclass
class InPlace:
    """One node chunk's share of an update batch, planned (:meth:`Updater.plan_in_place`): sorted by
    (key, row offset), sliced by bucket, nodes reserved from the chunk's slack."""

    chunk: Chunk
    nodes: torch.Tensor  # the node region inside the chunk's host blob
    node_size: int
    dk: torch.Tensor
    dr: torch.Tensor | None
    doff: torch.Tensor
    ik: torch.Tensor
    ir: torch.Tensor
    ioff: torch.Tensor
    first_new: torch.Tensor
    used: int  # nodes in use after the batch
    span: tuple[int | None, int | None]  # (kmin, kmax) after the insertions; deletions leave it wider (harmless)
    cancelled: int  # insertions cancelled by deletions of the batch, counted as deleted
    removed: int | None  # pairs the deletions remove, from the plan (None: deletions alone, counted by the apply)
    found: int | None
    absent_by_key: int | None  # deletions by key next to insertions: known before the apply
    far: int  # deletions whose row lies outside the chunk's window: absent
    n_after: int = 0

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The nodes the apply can change (every node of the touched buckets' chains; reserved nodes come from
        slack that no chain reaches) and a copy of them: (node grid, node ids, saved nodes)."""
        N = self.node_size
        grid = self.nodes.view(-1, 3 * N + 2)
        cur = torch.nonzero((self.ioff[1:] > self.ioff[:-1]) | (self.doff[1:] > self.doff[:-1])).reshape(-1)
        ids = [cur]
        while cur.numel():  # one step along every chain at once (kNoNode reads as -1)
            nxt = grid[:, 3 * N + 1].index_select(0, cur).to(torch.int64)
            cur = nxt[nxt >= 0]
            ids.append(cur)
        ids_t = torch.cat(ids)
        return grid, ids_t, grid.index_select(0, ids_t)

    def apply(self) -> tuple[int, int]:
        """Applies the batch in place; returns (pairs deleted, deletions absent)."""
        applied = _ops().cgrx_nodes_apply(self.nodes, self.node_size, self.dk, self.dr, self.doff, self.ik, self.ir,
                                          self.ioff, self.first_new)
        removed, found = (self.removed, self.found) if self.removed is not None else applied.sum(0).tolist()
        absent = self.absent_by_key if self.absent_by_key is not None else self.dk.numel() - found + self.far
        self.n_after = self.chunk.n + self.ik.numel() - removed
        return removed + self.cancelled, absent

    def commit(self) -> None:
        c = self.chunk
        c.n, c.used = self.n_after, self.used
        c.kmin, c.kmax = self.span if self.n_after else (None, None)
        c.host_view = c.mapped_view = None  # made again on use: their index's sizes and key span are the old ones
        c.file = None  # the blob no longer matches its saved file: the next save writes it


def remove_pairs(keys, rows, del_k, del_r) -> tuple[torch.Tensor, int, int]:
    """Multiset deletion of (key, row) pairs: which of (keys, rows) go, how many, and how many deletions found
    nothing (each deletion removes one copy)."""
    gone = torch.zeros(keys.numel(), dtype=torch.bool)
    if del_k.numel() == 0:
        return gone, 0, 0
    cand = torch.nonzero(torch.isin(keys, del_k)).reshape(-1)
    pk, pr = keys[cand], rows[cand]
    pairs = torch.stack([torch.cat([pk, del_k]), torch.cat([pr, del_r])], dim=1)
    groups = torch.unique(pairs, dim=0, return_inverse=True)[1]
    gp, gd = groups[: cand.numel()], groups[cand.numel() :]
    G = int(groups.max()) + 1
    present, wanted = torch.bincount(gp, minlength=G), torch.bincount(gd, minlength=G)
    matched = torch.minimum(present, wanted)
    gone[cand[ranks_within(gp) < matched[gp]]] = True
    return gone, int(matched.sum()), int((wanted - matched).sum())
