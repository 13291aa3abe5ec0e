"""Feature-store joins: probe keys against an index built over the build side's key column.

The build side is the indexed table (row ID = position of its key); the probe side is a batch of keys (or of
``[lo, hi]`` ranges). Any index works — :class:`RXIndex`, :class:`CgRXIndex`, :class:`UpdatableCgRXIndex`, or
anything with their ``lookup_all`` / ``range`` methods (and ``lookup_all_capped`` / ``range_capped`` for the
capped joins). A join returns one ``(probe_position, build_row)`` pair per match, duplicates on either side
included, as two aligned int64 tensors sorted by probe position and then by build row::

    index = RXIndex(features_key_column)                           # or CgRXIndex(...)
    probe_pos, build_row = join(index, request_keys)               # inner equi-join
    features = feature_table[build_row]                            # gather the matched build rows
    probe_pos, build_row = join(index, request_keys, how="left")   # misses kept once, with build_row -1
    pairs = join_capped(index, request_keys, capacity=4096)        # fixed size: CUDA graphs, no host sync

Every function here is built from tensor operations on the CSR answer of the index (no host loop). The number
of pairs of :func:`join` / :func:`range_join` depends on the data, so under ``torch.compile`` they need
``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` (see the README); :func:`join_capped` and
:func:`range_join_capped` return fixed-size tensors and need nothing.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ._config import check_option
from .index import JoinHow
from .results import CappedMatches, CappedPairs, Matches


class JoinIndex(Protocol):
    """What the joins need from an index (duck-typed; RXIndex and the cgRX indexes have it)."""

    def lookup_all(self, queries: torch.Tensor) -> Matches: ...

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches: ...


class CappedJoinIndex(Protocol):
    """What the capped joins need from an index."""

    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches: ...

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches: ...


def _check_how(index: object, how: str, method: str) -> None:
    if not callable(getattr(index, method, None)):
        raise TypeError(
            f"a join's first argument is the build side's index (e.g. CgRXIndex(build_keys)), which needs a "
            f"{method}() method; got {type(index).__name__}"
        )
    check_option(how, "how", JoinHow)


def _by_owner_then_row(owner: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows reordered by (owner, row): a stable sort by row, then a stable sort by owner. Two sorts rather than
    one over a packed (owner << 32) + row key, since row IDs of the chunked and sharded indexes exceed 32 bits."""
    by_row = torch.sort(rows, stable=True).indices
    by_owner = torch.sort(owner[by_row], stable=True).indices
    return rows[by_row[by_owner]]


def _range_rows_sorted(index: object) -> bool:
    # A point lookup's matches share one key, so every index returns them in row order; range answers of an
    # index that orders them by key (cgRX) are re-sorted by row.
    return bool(getattr(index, "range_rows_ascending", False))


def _sorted_by_row(matches: Matches) -> Matches:
    """The same CSR with each query's rows in ascending order."""
    return Matches(matches.offsets, _by_owner_then_row(matches.query_ids(), matches.rows))


def _capped_sorted_by_row(m: CappedMatches) -> CappedMatches:
    owner = m.query_ids()  # -1 past the stored matches: moved past every owner so they keep sorting last
    owner = torch.where(owner >= 0, owner, torch.iinfo(torch.int64).max)
    return CappedMatches(m.offsets, _by_owner_then_row(owner, m.rows), m.total)


def _pairs(matches: Matches, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(probe position, build row) per match of a CSR answer; with how="left" a probe without matches appears
    once, with build row -1."""
    if how == "inner":
        return matches.query_ids(), matches.rows
    offsets, rows = matches.offsets, matches.rows
    counts = offsets[1:] - offsets[:-1]
    kept = counts.clamp(min=1)  # a probe without matches still takes one slot
    kept_offsets = torch.cumsum(kept, 0) - kept  # where each probe's slots start in the output
    probe = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), kept)
    # Match j of probe q goes to kept_offsets[q] + (j - offsets[q]); every other slot keeps -1.
    owner = matches.query_ids()
    slot = kept_offsets[owner] + torch.arange(rows.numel(), device=rows.device) - offsets[:-1][owner]
    build = torch.full((probe.numel(),), -1, dtype=rows.dtype, device=rows.device).index_put((slot,), rows)
    return probe, build


def _capped_pairs(m: CappedMatches, how: str) -> CappedPairs:
    """_pairs over a capped CSR, into the same capacity, without a host sync. Output slot j of a left join
    belongs to the probe p with kept_start[p] <= j < kept_end[p]; its match (if p has any) sits in the CSR at
    offsets[p] + (j - kept_start[p]) <= j, so a CSR capped at the same capacity holds every match needed."""
    if how == "inner":
        return CappedPairs(m.query_ids(), m.rows, m.total)
    capacity = m.rows.shape[0]
    counts = m.offsets[1:] - m.offsets[:-1]
    kept = counts.clamp(min=1)
    kept_end = torch.cumsum(kept, 0)
    total = kept.sum()
    pos = torch.arange(capacity, device=m.rows.device)
    if counts.shape[0] == 0:
        none = torch.full_like(pos, -1)
        return CappedPairs(none, none.clone(), total)
    probe = torch.searchsorted(kept_end, pos, right=True)
    valid = pos < total
    p = probe.clamp(max=counts.shape[0] - 1)
    src = m.offsets[p] + pos - (kept_end[p] - kept[p])
    build = torch.where(valid & (counts[p] > 0), m.rows[src.clamp(min=0, max=capacity - 1)], -1)
    return CappedPairs(torch.where(valid, probe, -1), build, total)


def join(index: JoinIndex, probe_keys: torch.Tensor, how: JoinHow = "inner") -> tuple[torch.Tensor, torch.Tensor]:
    """Equi-join of ``probe_keys`` against the index's keys.

    Args:
        index: the build side (RXIndex, CgRXIndex, UpdatableCgRXIndex).
        probe_keys: 1-D tensor of keys on the index's device, in its key dtype or one that converts to it
            exactly (int32 probes on an int64 index).
        how: ``"inner"`` (one pair per match) or ``"left"`` (also one pair ``(i, -1)`` per probe key ``i``
            without any match).

    Returns:
        ``(probe_positions, build_rows)``: int64 tensors of equal length, one entry per pair, ordered by
        probe position and then by build row (ascending).
    """
    _check_how(index, how, "lookup_all")
    return _pairs(index.lookup_all(probe_keys), how)


def range_join(
    index: JoinIndex, lo: torch.Tensor, hi: torch.Tensor, how: JoinHow = "inner"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Band join: probe row ``i`` matches every build row whose key lies in ``[lo[i], hi[i]]`` (inclusive,
    in the key type's order; empty when ``lo[i] > hi[i]``).

    Args:
        index: the build side.
        lo, hi: 1-D tensors of range bounds, one pair per probe row, with the index's dtype and device.
        how: ``"inner"`` or ``"left"``, as in :func:`join`.

    Returns:
        ``(probe_positions, build_rows)`` as in :func:`join` (a cgRX index's key-ordered range answer is
        re-sorted by build row).
    """
    _check_how(index, how, "range")
    matches = index.range(lo, hi)
    return _pairs(matches if _range_rows_sorted(index) else _sorted_by_row(matches), how)


def join_capped(index: CappedJoinIndex, probe_keys: torch.Tensor, capacity: int, how: JoinHow = "inner") -> CappedPairs:
    """:func:`join` into ``capacity`` pairs, with the true pair count: fixed-size outputs and no host
    synchronization, so it can be captured in a CUDA graph (with an index whose lookups can, e.g.
    ``CgRXIndex(..., backend="radix")``) and compiled without ``capture_dynamic_output_shape_ops``.

    Returns:
        :class:`~torch_rtindex.CappedPairs` ``(probe, build, total)``; entries past ``min(total, capacity)``
        are -1, and ``total > capacity`` means the pairs were cut (retry with a larger capacity).
    """
    _check_how(index, how, "lookup_all_capped")
    return _capped_pairs(index.lookup_all_capped(probe_keys, capacity), how)


def range_join_capped(
    index: CappedJoinIndex, lo: torch.Tensor, hi: torch.Tensor, capacity: int, how: JoinHow = "inner"
) -> CappedPairs:
    """:func:`range_join` into ``capacity`` pairs, with the true pair count (see :func:`join_capped`)."""
    _check_how(index, how, "range_capped")
    m = index.range_capped(lo, hi, capacity)
    return _capped_pairs(m if _range_rows_sorted(index) else _capped_sorted_by_row(m), how)
