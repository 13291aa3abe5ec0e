"""ShardedIndex: one index over the keys of every rank of a process group, range-partitioned by key.

Keys are routed by their ordered key (the package's order-preserving uint64 map, csrc/core/keys.h): splitters
cut the ordered-key space into one contiguous range per rank, rank order = key order. Each rank holds a local
index (any class of the package) over the ordered keys of its range, with ``key_type="uint64"``; its 32-bit
local row IDs translate to global int64 row IDs through ``local -> global``, which is ascending, so "smallest
local row" is "smallest global row" and (key, local row) order is (key, global row) order.

This class is the facade; the units it composes, each a module of this package:
header (the call header and its agreement), exchange (counts then tensors; the fixed-capacity exchange),
routing (splitters, owners, pieces), values (value columns of aggregates), points (per-query forms and the
pipelined point path), forms (CSR and capped), fixed (fixed-capacity forms), updates, state (build, states,
pickling), stages (timing).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.distributed as dist

from .._keys import KEY_TYPES, as_key_dtype, check_queries
from ..results import Aggregate, CappedMatches, Lookup, Matches, UpdateResult
from . import fixed, forms, header, points, updates
from . import state as _state
from .fixed import Fixed
from .header import ShardedIndexError
from .points import DEFAULT_CUDA_PIPELINE, PointRouting

__all__ = ["ShardedIndex", "ShardedIndexError", "Fixed", "PointRouting", "DEFAULT_CUDA_PIPELINE"]


class ShardedIndex:
    """One index over the keys of all ranks of a process group; every method is collective (every rank of
    the group calls it, in the same order, each with its own inputs, which may be empty).

    Args:
        keys: this rank's keys: a 1-D contiguous tensor of any key dtype the other indexes take (int64, int32,
            float32, float64, uint64), on this rank's device (CUDA with NCCL, CPU with gloo). Global row ID of a
            key = its position in the concatenation of all ranks' keys in rank order (int64).
        key_type: as for :class:`~torch_rtindex.CgRXIndex`; must be the same on every rank.
        group: the process group (default: the WORLD group); NCCL and gloo work alike.
        index_factory: builds each rank's local index: ``index_factory(ordered_keys, key_type="uint64")``, where
            ``ordered_keys`` are the rank's keys as ordered keys (int64 storage of the uint64 order-preserving
            map) in ascending global row order. Default: :class:`~torch_rtindex.CgRXIndex`, or
            :class:`~torch_rtindex.UpdatableCgRXIndex` with ``updatable=True``; pass e.g.
            ``functools.partial(CgRXIndex, backend="radix")`` to configure it, or
            ``functools.partial(ChunkedIndex, gpu_budget=...)`` for shards larger than a GPU (out of core).
        updatable: whether :meth:`update` / :meth:`insert` / :meth:`delete` are wanted (default local index
            :class:`~torch_rtindex.UpdatableCgRXIndex`).
        sample_size: keys per rank sampled to choose the splitters.
        pipeline: split the point lookups of :meth:`lookup` and :meth:`aggregate` into up to this many chunks
            (each keeps at least ``point_routing.min_chunk_queries`` of the largest rank's batch: small batches
            stay whole) whose exchanges run asynchronously, overlapping the local lookups of earlier chunks (1: no
            pipelining; the same on every rank). Default: ``DEFAULT_CUDA_PIPELINE`` (4) on CUDA, 1 on the CPU (gloo's
            collectives block the caller, so there is nothing to overlap). The attribute may be changed between
            calls, on every rank alike. With NCCL the overlap needs the group's streams at high priority
            (``ProcessGroupNCCL.Options().is_high_priority_stream``): at normal priority NCCL's kernels wait
            for a lookup kernel's blocks to drain.
        profile: record per-stage times (synchronizing the device between stages) for :meth:`stats`.
        point_routing: how point lookups travel (:class:`PointRouting`: the pipeline's smallest chunk, where a
            rank's own queries are answered); the same on every rank. Default: ``PointRouting()``.

    Shards hold nearly equal numbers of keys whatever their distribution, except that all keys equal to one
    another live on one rank (a key holding a large part of all keys makes its shard that large).

    Lookups answer global row IDs (int64) with the result types of the other indexes. Ranges spanning several
    shards are answered piecewise and their rows concatenated in rank order: with cgRX local indexes that is
    (key, row ID) order, as for :class:`~torch_rtindex.CgRXIndex`.

    Aggregates take the value column at the call, sharded like the keys: each rank passes the values of the
    rows it contributed (its build keys, then the keys it inserted, in that order; see :meth:`num_contributed`).

    Fixed-capacity forms (:meth:`lookup_fixed`, :meth:`range_lookup_fixed`, :meth:`aggregate_fixed`,
    :meth:`range_aggregate_fixed`, :meth:`lookup_all_capped_fixed`, :meth:`range_capped_fixed`):
    fixed shapes and no host synchronization, for CUDA graphs and ``torch.compile(fullgraph=True)``; they return
    :class:`Fixed` with an overflow flag. The other forms learn their exchange sizes on the host.

    Errors: every call first shares a small header (status of this rank's input checks, operation, call number,
    sizes) with one ``all_gather``; bad input on any rank, or ranks calling different methods, raises
    :class:`ShardedIndexError` on every rank before any data moves, and the index is unchanged. A local lookup
    that fails after the exchange (out of memory) raises on that rank and on every rank it owed answers (with
    the fixed-capacity forms: on every rank, unless checks are off). Whatever fails on one rank, every rank
    posts the same collectives. With NCCL, call ``torch.cuda.set_device`` on every rank first (headers go on
    the current GPU, and the error path gathers messages with ``all_gather_object``); inputs must be on a
    device the group's backend serves (NCCL: CUDA).

    Updates (``updatable=True``): :meth:`update`, :meth:`insert`, :meth:`delete`. State: :meth:`state_dict` /
    :meth:`from_state_dict` per rank, :meth:`gathered_state_dict` / :meth:`from_gathered_state` as one state.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        group: dist.ProcessGroup | None = None,
        index_factory: Callable[..., Any] | None = None,
        updatable: bool = False,
        sample_size: int = 4096,
        pipeline: int | None = None,
        profile: bool = False,
        point_routing: PointRouting | None = None,
    ) -> None:
        self._setup(group, index_factory, updatable, profile, point_routing)
        failure = None  # a bad argument on one rank is raised on every rank by the build's header
        try:
            if pipeline is None:
                pipeline = points.default_pipeline(keys.device if isinstance(keys, torch.Tensor) else torch.device("cpu"))
            if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 1:
                raise ValueError(f"pipeline must be a positive int, got {pipeline!r}")
            if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1:
                raise ValueError(f"sample_size must be a positive int, got {sample_size!r}")
            if point_routing is not None and not isinstance(point_routing, PointRouting):
                raise TypeError(f"point_routing must be a PointRouting, got {type(point_routing).__name__}")
        except (TypeError, ValueError) as e:
            failure, pipeline, sample_size = e, 1, 1
        self.pipeline = pipeline
        self.sample_size = sample_size
        _state.build(self, keys, key_type, failure=failure)

    def _setup(self, group, index_factory, updatable, profile, point_routing=None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedIndex needs an initialized process group: call torch.distributed.init_process_group "
                "(backend 'nccl' for GPUs, 'gloo' for CPU) on every rank first"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.updatable = bool(updatable)
        self.index_factory = index_factory or _state.default_factory(self.updatable)
        self.profile = bool(profile)
        self.point_routing = point_routing if isinstance(point_routing, PointRouting) else PointRouting()
        self._calls = 0
        self.pipeline = 1
        self._check_s = 0.0
        self._last_stats: dict[str, Any] = {}
        self._values_cache: tuple | None = None
        # Every header goes on the device the group's object collectives use, chosen from the group alone,
        # never from a rank's inputs: a rank whose inputs are bad (a state without tensors, keys on the CPU
        # under NCCL) still posts its header on a device the backend serves, and raises with the others.
        self._head_device = header.group_device(self.group)
        self._fault: Callable[[str], None] | None = None  # test hook: called with a stage name, may raise

    def _maybe_fault(self, stage: str) -> None:
        """Fault injection for tests (``self._fault``): stages "partition" (routing any call's pieces), "local"
        (every local lookup), "update_apply", "update_record" (bookkeeping after applying), "export"
        (gathered_state_dict)."""
        if self._fault is not None:
            self._fault(stage)

    def _as_key_dtype(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The dtype policy alone, for the fixed forms without checks (compiling, capturing): no host sync."""
        conv = lambda t, name: as_key_dtype(t, name, dtype=self.key_dtype, key_type=self.key_type)  # noqa: E731
        return conv(lo, "queries" if hi is None else "lo"), None if hi is None else conv(hi, "hi")

    def _check_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch checked and converted to the key dtype (lossless conversions only, _keys.check_queries)."""
        return check_queries(lo, hi, dtype=self.key_dtype, device=self.device, key_type=self.key_type)

    @staticmethod
    def _check_capacity(capacity: Any, name: str) -> int:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"{name} must be an int, got {type(capacity).__name__}")
        if capacity < 0:
            raise ValueError(f"{name} must be non-negative, got {capacity}")
        return capacity

    def num_contributed(self) -> int:
        """How many rows this rank contributed: its build keys, then the keys it inserted. A value column for
        :meth:`aggregate` holds one value per contributed row, in that order."""
        return self._contrib_owner.numel()

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups (collective): per query the smallest matching global row ID (-1 on a miss) and the
        number of matches. ``queries``: this rank's 1-D batch (any size, empty too) of the index's key dtype."""
        return points.per_query(self, "lookup", queries, None)

    def lookup_rows(self, queries: torch.Tensor, miss_row: int = -1) -> torch.Tensor:
        """Point lookups answered by the smallest matching global row ID alone, ``miss_row`` (an int) where a
        query has no match: ``lookup(queries).first_row`` with the misses replaced (collective; what
        :class:`~torch_rtindex.IdToRow` maps IDs with)."""
        def check():
            if isinstance(miss_row, bool) or not isinstance(miss_row, int):
                raise TypeError(f"miss_row must be an int, got {type(miss_row).__name__}")
            if not -(2**63) <= miss_row <= header.I64_MAX:
                raise ValueError(f"miss_row must fit in int64 (the answers' dtype), got {miss_row}")

        first = points.per_query(self, "lookup", queries, None, call="lookup_rows", check=check).first_row
        return first if miss_row == -1 else torch.where(first < 0, miss_row, first)

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive, in the key type's order) as (smallest global row ID or
        -1, match count), collective."""
        return points.per_query(self, "range_lookup", lo, hi)

    def range_count(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Per range the number of matching pairs over every shard (int64): ``range_lookup(lo, hi).count``, each
        shard's piece counted by its local index's ``range_count``; collective."""
        return points.per_query(self, "range_count", lo, hi).count

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Point lookups as (match count, sum of the value column over the matches), collective. ``values``:
        this rank's part of the column, one value per row it contributed (see the class doc); passing the
        same unmodified tensor again on every rank skips routing it to the owners again."""
        return points.per_query(self, "aggregate", queries, None, values)

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Range lookups as (match count, sum of the value column over the matches), collective."""
        return points.per_query(self, "range_aggregate", lo, hi, values)

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Point lookups returning every matching global row ID as CSR, ascending per query (collective)."""
        return forms.csr(self, "lookup_all", queries, None)

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive), every matching global row ID as CSR, in the local
        index's order within each shard and shards in rank order: (key, row ID) order with cgRX local indexes
        (collective)."""
        return forms.csr(self, "range", lo, hi)

    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`lookup_all` into a fixed-size answer (:class:`~torch_rtindex.CappedMatches`: the full
        offsets, the first ``capacity`` rows, the true total), collective. The queries are exchanged with exact
        sizes (host synchronizations); :meth:`lookup_all_capped_fixed` has none."""
        return forms.capped(self, "lookup_all_capped", queries, None, capacity, None, None)

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`range` into a fixed-size answer (see :meth:`lookup_all_capped`), collective."""
        return forms.capped(self, "range_capped", lo, hi, capacity, None, None)

    def lookup_all_capped_fixed(self, queries: torch.Tensor, capacity: int, query_capacity: int, *,
                                check: bool | None = None) -> Fixed:
        """:meth:`lookup_all_capped` through the fixed-capacity exchange (see :meth:`lookup_fixed`): no host
        synchronization; the answer is :class:`Fixed` ``(CappedMatches, overflowed)``."""
        return forms.capped(self, "lookup_all_capped_fixed", queries, None, capacity, query_capacity, check)

    def range_capped_fixed(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int, query_capacity: int, *,
                           check: bool | None = None) -> Fixed:
        """:meth:`range_capped` through the fixed-capacity exchange (see :meth:`lookup_fixed`); a range counts
        one slot at every shard it overlaps."""
        return forms.capped(self, "range_capped_fixed", lo, hi, capacity, query_capacity, check)

    def lookup_fixed(self, queries: torch.Tensor, query_capacity: int, *, check: bool | None = None) -> Fixed:
        """:meth:`lookup` through the fixed-capacity exchange: every rank sends each rank a block of exactly
        ``query_capacity`` query slots (the same int on every rank) holding the block's count and an overflow
        flag, so there is no host synchronization and every shape is fixed (CUDA graphs, ``torch.compile``
        with ``fullgraph=True``). Queries beyond the capacity of their owner's block are dropped (answered
        ``-1, -1``) and :attr:`Fixed.overflowed` is set on every rank.

        ``check``: run the collective input check first (one small all_gather and a host sync). Default: in
        eager mode yes, while compiling or capturing a CUDA graph no; then the inputs' dtypes and shapes must
        match on every rank (they are fixed in a graph anyway).
        """
        return fixed.fixed(self, "lookup_fixed", queries, None, None, query_capacity, check)

    def range_lookup_fixed(self, lo: torch.Tensor, hi: torch.Tensor, query_capacity: int, *,
                           check: bool | None = None) -> Fixed:
        """:meth:`range_lookup` through the fixed-capacity exchange (see :meth:`lookup_fixed`); a range counts
        one slot at every shard it overlaps."""
        return fixed.fixed(self, "range_lookup_fixed", lo, hi, None, query_capacity, check)

    def aggregate_fixed(self, queries: torch.Tensor, values: torch.Tensor, query_capacity: int, *,
                        check: bool | None = None) -> Fixed:
        """:meth:`aggregate` through the fixed-capacity exchange (see :meth:`lookup_fixed`)."""
        return fixed.fixed(self, "aggregate_fixed", queries, None, values, query_capacity, check)

    def range_aggregate_fixed(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor, query_capacity: int,
                              *, check: bool | None = None) -> Fixed:
        """:meth:`range_aggregate` through the fixed-capacity exchange (see :meth:`lookup_fixed`)."""
        return fixed.fixed(self, "range_aggregate_fixed", lo, hi, values, query_capacity, check)

    def update(self, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
               delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult:
        """One batch of insertions and deletions, collective and all-or-nothing across ranks: each rank's keys
        are routed to their owners, every owner checks its part, the ranks agree, and only then does any rank
        change its local index. Inserts first, deletes second, as :meth:`UpdatableCgRXIndex.update`: a pair the
        batch inserts (on any rank) and deletes (on any rank, by key or by its global row) is absent afterwards
        and counted deleted.

        Insertions get fresh global row IDs, numbered after every row ID so far, rank by rank (returned as
        ``rows`` to the rank that inserted them), or ``insert_rows`` (then on every rank): global row IDs not
        handed out yet, strictly ascending on each rank and across ranks in rank order, so that every shard's
        local -> global map stays ascending (gaps are fine; the next free row follows the largest). Deletions
        remove every pair of a key, or with ``delete_rows`` (global row IDs; then on every rank) one pair each.
        ``inserted``, ``deleted`` and ``absent`` are totals over all ranks. Needs ``updatable=True``. Keys
        follow the dtype policy of :mod:`torch_rtindex.index` (lossless conversions only).
        """
        return updates.update(self, insert_keys, insert_rows, delete_keys, delete_rows)

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Inserts this rank's keys (collective; see :meth:`update` for the row IDs ``rows`` may give)."""
        return self.update(insert_keys=keys, insert_rows=rows)

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Deletes every pair of each key, or with ``rows`` the pairs (key, global row ID) (collective)."""
        return self.update(delete_keys=keys, delete_rows=rows)

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of the index (not collective): its local index's state, the splitters, the
        local -> global row map and the bookkeeping of contributed rows. Load it on the same rank of a group of
        the same size with :meth:`from_state_dict` (collective). For one state of the whole index, see
        :meth:`gathered_state_dict`."""
        return _state.state_dict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], *, group: dist.ProcessGroup | None = None,
                        device: torch.device | str | None = None, profile: bool = False,
                        local_options: dict[str, Any] | None = None,
                        point_routing: PointRouting | None = None) -> "ShardedIndex":
        """Collective: every rank loads the state its rank saved (:meth:`state_dict`), in a group of the same
        size. ``device``: where to build (default: where the state's tensors are). ``local_options``: keyword
        arguments for the local index class's ``from_state_dict``, for settings a state does not hold (e.g.
        ``{"gpu_budget": ...}`` for :class:`~torch_rtindex.ChunkedIndex` shards)."""
        return _state.from_state_dict(cls, state, group=group, device=device, profile=profile,
                                      local_options=local_options, point_routing=point_routing)

    def gathered_state_dict(self) -> dict[str, Any]:
        """Collective: one state of the whole index on every rank (CPU tensors): every live (key, global row)
        pair, keys as ordered keys, sorted by row. Load it into a group of any size with
        :meth:`from_gathered_state`; it is what one rank would need to rebuild the index alone."""
        return _state.gathered_state_dict(self)

    @classmethod
    def from_gathered_state(cls, state: dict[str, Any], *, device: torch.device | str = "cpu",
                            group: dist.ProcessGroup | None = None, index_factory: Callable[..., Any] | None = None,
                            updatable: bool = False, sample_size: int = 4096, profile: bool = False,
                            point_routing: PointRouting | None = None) -> "ShardedIndex":
        """Collective: a sharded index over a :meth:`gathered_state_dict` state, in a group of any size; every
        rank passes the same state and takes an equal slice of its pairs (global row IDs are kept). Rank r's
        contributed rows (for value columns) are then its slice's."""
        return _state.from_gathered_state(cls, state, device=device, group=group, index_factory=index_factory,
                                          updatable=updatable, sample_size=sample_size, profile=profile,
                                          point_routing=point_routing)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (torch.save(index)) and copy.deepcopy carry this rank's state_dict, never the process group
        # or device structures.
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        _state.restore(self, state, None, None, False, None)

    def __deepcopy__(self, memo: dict[int, Any]) -> "ShardedIndex":
        # In this index's group (an unpickled copy takes the default group), with its settings.
        other = type(self).__new__(type(self))
        _state.restore(other, copy.deepcopy(self.state_dict(), memo), self.group, self.device, self.profile,
                       self.point_routing)
        other.pipeline, other.sample_size = self.pipeline, self.sample_size
        other._calls = self._calls  # the ranks copy together or not at all: the copies' calls stay matched
        return other

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Collective: replaces this index by the one this rank's ``state`` (:meth:`state_dict`) describes, on
        this index's device and group. All-or-nothing: if any rank's state is rejected, every rank raises and
        keeps its index."""
        fresh = type(self).from_state_dict(state, group=self.group, device=self.device, profile=self.profile,
                                           point_routing=self.point_routing)
        pipeline = self.pipeline
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)
        self.pipeline = pipeline

    @property
    def local_index(self):
        """This rank's local index (over ordered keys, ``key_type="uint64"``, 32-bit local row IDs)."""
        return self._local

    @property
    def splitters(self) -> torch.Tensor:
        """The world - 1 shard borders as keys (the index's key dtype): rank r holds the keys ``k`` with
        ``splitters[r - 1] <= k < splitters[r]`` in the key type's order (rank 0 from the smallest key, the
        last rank up to the largest)."""
        return header.ops().unmap_keys(self._splitters_ordered, KEY_TYPES[self.key_type], self.key_dtype)

    def local_to_global(self) -> torch.Tensor:
        """Global row ID of each local row ID (ascending)."""
        return self._l2g

    def __len__(self) -> int:
        """Keys in the whole index (every rank's shard)."""
        return self._num_keys

    @property
    def local_len(self) -> int:
        """Keys in this rank's shard (not collective)."""
        return len(self._local)

    @property
    def capturable(self) -> bool:
        """Whether the fixed-capacity forms (``*_fixed`` with ``check=False``) can be captured in a CUDA graph:
        where the local index's lookups can (NCCL's ``all_to_all_single`` can); on the CPU trivially, as for the
        other classes. The other forms learn their exchange sizes on the host and cannot be captured."""
        c = getattr(self._local, "capturable", False)
        return bool(c() if callable(c) else c)

    def memory(self) -> dict[str, int]:
        """This rank's bytes (not collective): its local index's parts (``local_`` + the local index's names),
        the local -> global row map and the bookkeeping of contributed rows and value columns."""
        nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))  # noqa: E731
        cache = self._values_cache[2] if self._values_cache is not None else None
        return {
            **{f"local_{k}": v for k, v in self._local.memory().items()},
            "local_to_global": nbytes(self._l2g),
            "bookkeeping": nbytes(self._splitters, self._splitters_ordered, self._src, self._seq, self._contrib_owner,
                                  *self._value_plan[::2]),
            "value_cache": nbytes(cache),
        }

    def to(self, device: torch.device | str | int) -> "ShardedIndex":
        """Not available: each rank's shard lives on the device its process group serves. To move the index,
        save :meth:`gathered_state_dict` and load it with :meth:`from_gathered_state` (``device=``) in the
        group that serves the new device (or :meth:`state_dict` / :meth:`from_state_dict` per rank)."""
        raise NotImplementedError(
            "ShardedIndex cannot move between devices in place (its shards live where the process group's backend "
            "serves); use gathered_state_dict() and ShardedIndex.from_gathered_state(state, device=..., group=...), "
            "or state_dict() and ShardedIndex.from_state_dict(state, device=...) per rank")

    def cpu(self) -> "ShardedIndex":
        """Not available (see :meth:`to`)."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None) -> "ShardedIndex":
        """Not available (see :meth:`to`)."""
        return self.to("cuda" if device is None else device)

    def stats(self) -> dict[str, Any]:
        """The last collective call on this rank: its per-stage seconds (``partition_s``, ``exchange_s``,
        ``local_s``, ``return_s``, ``scatter_s``; measured only with ``profile=True``, which synchronizes the
        device at each stage boundary) and the bytes it sent (all, and to other ranks) and received."""
        return dict(self._last_stats)

    def __repr__(self) -> str:
        return (f"ShardedIndex(rank={self.rank}/{self.world}, keys={self._num_keys}, local_keys={self.local_len}, "
                f"key_type={self.key_type}, device={self.device}, local={type(self._local).__name__})")
