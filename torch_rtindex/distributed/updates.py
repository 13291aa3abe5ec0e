"""Updates: routed like lookups; the owners translate global rows to local ones (the batch's own inserts
included: inserts first, deletes second) and check limits; the ranks agree before any rank applies; a rank
whose part failed makes every other rank undo its part, so a batch is all-or-nothing across ranks."""

from __future__ import annotations

import torch

from .._keys import KEY_TYPES, MAX_KEYS, check_key_tensor
from ..results import UpdateResult
from . import exchange, header, routing, stages
from .values import plan_values


def update(ix, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
           delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult:
    """:meth:`ShardedIndex.update` (its docstring states the contract): route, plan on the owners, agree,
    apply, agree again; undo this rank's part if another rank could not apply its own."""
    def validate():
        if not ix.updatable:
            raise TypeError("this ShardedIndex was built without updatable=True; its local index takes no updates")
        ik = insert_keys if insert_keys is not None else torch.empty(0, dtype=ix.key_dtype, device=ix.device)
        dk = delete_keys if delete_keys is not None else torch.empty(0, dtype=ix.key_dtype, device=ix.device)
        ik = check_key_tensor(ik, "insert_keys", dtype=ix.key_dtype, device=ix.device, key_type=ix.key_type)
        dk = check_key_tensor(dk, "delete_keys", dtype=ix.key_dtype, device=ix.device, key_type=ix.key_type)
        for t, what in ((ik, "insert_keys"), (dk, "delete_keys")):
            if t.dtype.is_floating_point and t.numel() and bool(torch.isnan(t).any()):
                raise ValueError(f"{what} contain NaN, which has no place in a key order")
        if delete_rows is not None:
            if not isinstance(delete_rows, torch.Tensor) or delete_rows.dim() != 1 or delete_rows.numel() != dk.numel():
                raise ValueError("delete_rows must be a 1-D tensor with one global row ID per delete key")
            if delete_rows.dtype not in (torch.int64, torch.int32) or delete_rows.device != ix.device:
                raise TypeError(f"delete_rows must be int64 on {ix.device}, got {delete_rows.dtype} on {delete_rows.device}")
        return ik, dk, _fresh_rows(ix, insert_rows, ik.numel())

    def sizes(got):
        ik, dk, (ir, lo, hi) = got
        return [ik.numel(), dk.numel(), int(delete_rows is not None), int(ir is not None), lo, hi]

    (ik, dk, (given_rows, _, _)), heads = header.agree(ix, "update", validate, sizes)
    shown = lambda v: "given" if v else "not given"  # noqa: E731
    header.disagree(heads, header.HEAD + 2, "whether delete_rows is given", shown)
    header.disagree(heads, header.HEAD + 3, "whether insert_rows is given", shown)
    st = stages.Stages("update", ix.profile, ix.device, ix.rank)
    n_ins = [h[header.HEAD] for h in heads]
    if given_rows is not None:
        spans = [(r, h[header.HEAD + 4], h[header.HEAD + 5]) for r, h in enumerate(heads) if h[header.HEAD]]
        for (a, _, a_hi), (b, b_lo, _) in zip(spans, spans[1:]):
            if b_lo <= a_hi:
                raise header.ShardedIndexError(
                    f"ShardedIndex.update: insert_rows must ascend in rank order (each shard's global rows stay "
                    f"ascending), but rank {b}'s start at {b_lo}, not after rank {a}'s end at {a_hi}; the index "
                    "is unchanged")
        new_rows = given_rows
        next_row = max([ix._num_rows] + [hi + 1 for _, _, hi in spans])
    else:
        first_row = ix._num_rows + sum(n_ins[: ix.rank])
        new_rows = torch.arange(first_row, first_row + ik.numel(), dtype=torch.int64, device=ix.device)
        next_row = ix._num_rows + sum(n_ins)
    def route_inserts():
        oi = header.ops().map_keys(ik, KEY_TYPES[ix.key_type])
        owner = routing.route(ix, oi)
        return owner, [oi, new_rows], owner

    def route_deletes():
        od = header.ops().map_keys(dk, KEY_TYPES[ix.key_type])
        drows = delete_rows.to(torch.int64) if delete_rows is not None else torch.full_like(od, -1)
        return routing.route(ix, od), [od, drows]

    ins, i_order, i_send, i_recv, (i_owner,) = exchange.send_pieces(ix, "update", route_inserts, st)
    dels, _, _, _, _ = exchange.send_pieces(ix, "update", route_deletes, st)
    rik, rir = ins[:, 0].contiguous(), ins[:, 1].contiguous()
    rdk, rdr = dels[:, 0].contiguous(), dels[:, 1].contiguous()
    L = ix._l2g.numel()

    def plan():
        if L + rik.numel() > MAX_KEYS:
            raise ValueError(f"rank {ix.rank}'s local index would exceed 2^32 - 1 row IDs; rebuild the index")
        local_ins = torch.arange(L, L + rik.numel(), dtype=torch.int64, device=ix.device)
        if delete_rows is None:
            return local_ins, rdk, None, 0
        # Global -> local row IDs over the rows held so far and the batch's own inserts (inserts first,
        # deletes second): the inserts' global rows arrive in source-rank order, each source's ascending, all
        # above the rows so far, so the extended local -> global map stays ascending. Rows this rank does
        # not hold are absent.
        l2g = torch.cat([ix._l2g, rir])
        n = l2g.numel()
        at = torch.searchsorted(l2g, rdr).clamp(max=max(n - 1, 0))
        found = (l2g[at] == rdr) if n else torch.zeros_like(rdr, dtype=torch.bool)
        return local_ins, rdk[found].contiguous(), at[found].contiguous(), int((~found).sum())

    planned, _ = header.agree(ix, "update_apply", plan)
    local_ins, pdk, pdr, absent_rows = planned

    # Apply, then record the new local rows before agreeing. If another rank failed to apply (out of
    # memory), this rank undoes its part (_undo_update), so the update is all-or-nothing across ranks.
    res, err, doomed = None, None, None
    saved = (ix._l2g, ix._src, ix._seq, list(ix._recv_totals), ix._contrib_owner,
             getattr(ix._local, "_next_row", None))
    applied_here = False
    try:  # every local failure up to update_done is this rank's status there (no rank skips it)
        ix._maybe_fault("update_apply")
        doomed = doomed_pairs(ix, pdk, pdr)
        res = ix._local.update(insert_keys=rik, insert_rows=local_ins if rik.numel() else None,
                                 delete_keys=pdk, delete_rows=pdr)
        applied_here = True
        ix._maybe_fault("update_record")
        ix._l2g = torch.cat([ix._l2g, rir])
        srcs = torch.repeat_interleave(torch.arange(ix.world, device=ix.device),
                                       torch.tensor(i_recv, device=ix.device), output_size=sum(i_recv))
        starts = torch.tensor([0] + i_recv, device=ix.device).cumsum(0)[:-1]
        base = torch.tensor(ix._recv_totals, device=ix.device)
        ix._src = torch.cat([ix._src, srcs])
        ix._seq = torch.cat([ix._seq, base[srcs] + torch.arange(srcs.numel(), device=ix.device) - starts[srcs]])
        ix._recv_totals = [a + b for a, b in zip(ix._recv_totals, i_recv)]
        ix._contrib_owner = torch.cat([ix._contrib_owner, i_owner])
        plan_values(ix)
    except Exception as e:  # noqa: BLE001  (reported collectively below)
        err = e
        if applied_here:  # applied, but recording it failed: this rank takes its own part back now
            try:
                undo_update(ix, rik, local_ins, doomed, saved)
            except header.ShardedIndexError as undo_err:
                err = undo_err
    ix._num_rows = next_row  # row IDs handed out are used up either way
    ix._values_cache = None

    def applied():
        if isinstance(err, header.ShardedIndexError):  # this rank could not undo its part (message says so)
            raise err
        if err is not None:
            raise RuntimeError(
                f"applying the update failed here ({type(err).__name__}: {err}); every rank undid its part, "
                "the index is unchanged"
            ) from err
        return res

    try:
        res, heads2 = header.agree(ix, "update_done", applied, lambda r: [r.deleted, r.absent + absent_rows])
    except header.ShardedIndexError:
        if err is None:  # this rank applied its part and another rank could not: take it back
            undo_update(ix, rik, local_ins, doomed, saved)
        raise
    deleted = sum(h[header.HEAD] for h in heads2)
    absent = sum(h[header.HEAD + 1] for h in heads2)
    ix._num_keys += sum(n_ins) - deleted
    st.mark("local")
    ix._last_stats = st.stats
    return UpdateResult(inserted=sum(n_ins), deleted=deleted, absent=absent, rows=new_rows)


def doomed_pairs(ix, keys: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The local (ordered key, local row) pairs a deletion of ``keys`` (with ``rows``: of those exact pairs)
    will remove, read before the update so that it can be undone."""
    if keys.numel() == 0:
        return keys, keys.new_empty(0, dtype=torch.int64)
    uk = torch.unique(keys)
    m = ix._local.lookup_all(uk)
    okeys = torch.repeat_interleave(uk, m.offsets.diff(), output_size=m.rows.numel())
    orows = m.rows
    if rows is not None:  # local row IDs are unique: a pair is doomed if its row is asked for with its key
        if orows.numel() == 0:
            return okeys, orows
        order = torch.argsort(orows)
        srows, skeys = orows[order], okeys[order]
        r = rows.to(torch.int64)
        pos = torch.searchsorted(srows, r).clamp(max=srows.numel() - 1)
        sel = torch.unique(pos[(srows[pos] == r) & (skeys[pos] == keys)])
        return skeys[sel], srows[sel]
    return okeys, orows


def undo_update(ix, ins_keys: torch.Tensor, ins_rows: torch.Tensor, doomed, saved) -> None:
    """Takes back this rank's applied part of an update another rank failed to apply: the inserted pairs
    deleted, the deleted ones inserted again, the bookkeeping as it was."""
    try:
        dk, dr = doomed
        ix._local.update(insert_keys=dk if dk.numel() else None, insert_rows=dr if dk.numel() else None,
                           delete_keys=ins_keys if ins_keys.numel() else None,
                           delete_rows=ins_rows if ins_keys.numel() else None)
    except Exception as e:  # noqa: BLE001
        raise header.ShardedIndexError(
            f"ShardedIndex.update: rank {ix.rank} could not undo its part of an update another rank failed "
            f"to apply ({type(e).__name__}: {e}); its shard no longer matches the others: reload the index from "
            "a saved state", {ix.rank: str(e)}
        ) from e
    ix._l2g, ix._src, ix._seq, ix._recv_totals, ix._contrib_owner, next_row = saved
    if next_row is not None:
        ix._local._next_row = next_row  # the undone insertions' row IDs are free again
    plan_values(ix)


def _fresh_rows(ix, rows: torch.Tensor | None, n: int) -> tuple[torch.Tensor | None, int, int]:
    """Given insert rows checked (int64, then its smallest and largest, -1 when empty): global row IDs not handed
    out yet, strictly ascending, so that every shard's local -> global map stays ascending; the header then
    checks that they ascend across ranks in rank order. One host synchronization."""
    if rows is None:
        return None, -1, -1
    if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.numel() != n:
        raise ValueError("insert_rows must be a 1-D tensor with one global row ID per insert key")
    if rows.dtype not in (torch.int64, torch.int32) or rows.device != ix.device:
        raise TypeError(f"insert_rows must be int64 on {ix.device}, got {rows.dtype} on {rows.device}")
    rows = rows.to(torch.int64)
    if n == 0:
        return rows, -1, -1
    lo, hi, ascending = torch.stack([rows.min(), rows.max(), (rows[1:] > rows[:-1]).all().to(torch.int64)]).tolist()
    if lo < ix._num_rows or not ascending:
        raise ValueError(
            f"insert_rows must be fresh global row IDs (from {ix._num_rows} on: no row ID so far), strictly "
            f"ascending, and ascend across ranks in rank order, got {rows.numel()} rows from {lo} to {hi}"
            f"{'' if ascending else ', not ascending'}; or pass None for the next free ones")
    return rows, lo, hi
