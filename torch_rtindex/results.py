"""Result types shared by every index."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Lookup(NamedTuple):
    """One answer per query: the smallest matching row ID (-1 on a miss) and the number of matches."""

    first_row: torch.Tensor
    count: torch.Tensor


class Matches(NamedTuple):
    """Every match, as CSR: the row IDs of query i are ``rows[offsets[i]:offsets[i + 1]]``."""

    offsets: torch.Tensor
    rows: torch.Tensor

    def query_ids(self) -> torch.Tensor:
        """The query each entry of ``rows`` belongs to (same length as ``rows``)."""
        counts = self.offsets[1:] - self.offsets[:-1]
        # output_size: the length is known (rows), so no host sync to learn it.
        return torch.repeat_interleave(
            torch.arange(counts.numel(), device=counts.device), counts, output_size=self.rows.numel()
        )


class CappedMatches(NamedTuple):
    """Every match that fits a caller-given capacity, as fixed-size CSR (``lookup_all_capped``, ``range_capped``).

    - ``offsets`` [q + 1]: the full answer's offsets (``offsets[-1] == total``, which may exceed the capacity);
    - ``rows`` [capacity]: entry ``j < min(total, capacity)`` is the full answer's entry ``j``; the rest are -1.
      Query ``i``'s rows are ``rows[offsets[i]:offsets[i + 1]]`` whenever ``offsets[i + 1] <= capacity``;
    - ``total`` (0-d int64): the true number of matches. ``total > capacity`` (:meth:`overflowed`) means the
      answer was cut: the query straddling the capacity holds only some of its rows (RXIndex on CUDA: the ones
      its rays met first, ascending; otherwise its first rows), later queries none. Retry with a capacity of
      at least ``total``.

    Nothing here synchronizes with the host except :meth:`to_matches`.
    """

    offsets: torch.Tensor
    rows: torch.Tensor
    total: torch.Tensor

    def overflowed(self) -> torch.Tensor:
        """0-d bool: whether some matches did not fit."""
        return self.total > self.rows.shape[0]

    def valid(self) -> torch.Tensor:
        """[capacity] bool: which entries of ``rows`` hold a match."""
        return torch.arange(self.rows.shape[0], device=self.rows.device) < self.total

    def query_ids(self) -> torch.Tensor:
        """[capacity]: the query each entry of ``rows`` belongs to, -1 past the stored matches (fixed size)."""
        pos = torch.arange(self.rows.shape[0], device=self.rows.device)
        # Over the whole offsets (offsets[0] == 0 <= pos, hence the - 1), not the view offsets[1:]: Inductor's CUDA
        # searchsorted ignored that view's storage offset (torch 2.11, H100: every owner one too high).
        owner = torch.searchsorted(self.offsets, pos, right=True) - 1
        return torch.where(pos < self.total, owner, -1)

    def to_matches(self) -> Matches:
        """The stored matches as :class:`Matches` (offsets clamped to the capacity); one host synchronization.
        Equal to the uncapped answer when nothing overflowed."""
        capacity = self.rows.shape[0]
        offsets = self.offsets.clamp(max=capacity)
        return Matches(offsets, self.rows[: int(offsets[-1])])


class CappedPairs(NamedTuple):
    """A join's ``(probe_position, build_row)`` pairs in fixed-size tensors (``join_capped``, ``range_join_capped``).

    ``probe`` and ``build`` have ``capacity`` entries: the first ``min(total, capacity)`` hold pairs, ordered as
    the uncapped join orders them, the rest are -1 in both; ``total`` (0-d int64) is the true number of pairs.
    Without overflow (``total <= capacity``) the pairs are exactly the uncapped join's; with it, the probes
    that fit are complete, the probe straddling the capacity has only some of its pairs, later ones none.
    """

    probe: torch.Tensor
    build: torch.Tensor
    total: torch.Tensor


class UpdateResult(NamedTuple):
    """What an update batch did: pairs inserted, pairs deleted, deletions that named nothing present, and the
    row IDs of the inserted keys."""

    inserted: int
    deleted: int
    absent: int
    rows: torch.Tensor


class Aggregate(NamedTuple):
    """Per query: the number of matches and the sum of a value column over the matching rows."""

    count: torch.Tensor
    sum: torch.Tensor
