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

# The options of the public signatures, spelled once. The names of a C++ enum are listed in its numbering
# (torch_rtindex/_config.py derives the operators' codes from that order and checks them against the extension
# at import).

#: How an index reads its keys; also the C++ ``KeyType`` numbering.
KeyType = Literal["int64", "int32", "uint64", "float32", "float64"]
#: How a read-only cgRX index stores its sorted pairs (the C++ ``Layout`` numbering; the updatable index's node
#: chains come last, torch_rtindex/_config.py).
PairsLayout = Literal["packed_row", "aligned_row", "column"]
#: ``layout=`` of :class:`~torch_rtindex.CgRXIndex`: a pairs layout, or "auto" (chosen by the backend).
Layout = Literal["auto", PairsLayout]
#: The representative search of the cgRX indexes (the C++ ``Backend`` numbering).
SearchBackend = Literal["radix", "optix", "binary_search"]
#: ``backend=`` of the cgRX indexes: a search backend, or "auto" (chosen by the device).
Backend = Literal["auto", SearchBackend]
#: How a cgRX lookup searches within a bucket (the C++ ``BucketSearch`` numbering).
BucketSearch = Literal["binary", "linear"]
#: The OptiX scene of cgRX's "optix" backend (the C++ ``Representation`` numbering).
Representation = Literal["naive", "optimized"]
#: What :class:`~torch_rtindex.IdToRow` maps an ID that is not in the table to.
MissPolicy = Literal["default", "minus_one", "error"]
#: The index :class:`~torch_rtindex.IdToRow` builds over its IDs.
IndexKind = Literal["cgrx", "rx", "chunked", "sharded"]
#: A join's type: every pair of a match ("inner"), and also each probe without one ("left").
JoinHow = Literal["inner", "left"]


@runtime_checkable
class Index(Protocol):
    """A read-only index over keys with a row ID each (by default the key's position in the build batch)."""

    key_type: KeyType
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
