"""The contract every index keeps: :class:`Index` (lookups, state) and :class:`UpdatableIndex` (updates).

Each class of the package implements these protocols with the same signatures and result types, so code written
against ``Index`` (``IdToRow``, the joins, the benchmarks) takes any of them. Where a form cannot exist for a
class, the class raises :class:`NotImplementedError` naming the alternative; the README's table of methods x
classes lists those cases.

Queries, keys and IDs follow one dtype policy: a tensor in the index's key dtype passes as it is, one whose every
value converts exactly (int32 queries on an int64 index, float32 on float64) is converted, and anything else
(narrowing, integer <-> float, signed <-> unsigned) is a ``TypeError`` that names both dtypes.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import torch

from .results import Aggregate, CappedMatches, Lookup, Matches, UpdateResult

KeyType = Literal["int64", "int32", "uint64", "float32", "float64"]
MissPolicy = Literal["default", "minus_one", "error"]


@runtime_checkable
class Index(Protocol):
    """A read-only index over keys with a row ID each (by default the key's position in the build batch)."""

    key_type: str
    key_dtype: torch.dtype
    device: torch.device

    def __len__(self) -> int: ...

    def lookup(self, queries: torch.Tensor) -> Lookup: ...

    def lookup_rows(self, queries: torch.Tensor, miss_row: int = -1) -> torch.Tensor: ...

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup: ...

    def range_count(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor: ...

    def lookup_all(self, queries: torch.Tensor) -> Matches: ...

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches: ...

    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches: ...

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches: ...

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate: ...

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate: ...

    @property
    def capturable(self) -> bool: ...

    def memory(self) -> dict[str, int]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def to(self, device: torch.device | str | int) -> Any: ...

    def cpu(self) -> Any: ...


@runtime_checkable
class UpdatableIndex(Index, Protocol):
    """An index that takes inserts and deletes. ``update`` applies one batch all-or-nothing: inserts first, then
    deletes (a pair inserted and deleted in one batch is absent afterwards); a delete names a key (every pair of
    it) or a key and a row (that pair)."""

    def update(self, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
               delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult: ...

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult: ...

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult: ...
