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
        return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)


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
