"""UpdatableCgRXIndex: cgRX with batch inserts and deletes through node lists (section 4 of the cgRX paper).

Every bucket is a chain of fixed-size nodes (default 32 pairs), bulk-loaded half full. The representatives
and the structure that finds them (radix table, OptiX scene) are fixed at build time and never rebuilt by an
update; :meth:`rebuild` compacts everything and re-derives them.

State: :meth:`UpdatableCgRXIndex.state_dict` holds the index's current (key, row ID) pairs, as exported from
the node chains after every update so far, with the keys as ordered keys (the order-preserving uint64 map of
csrc/core/keys.h, in an int64 tensor) and the original key dtype and key type, so that a loaded index takes
the same query dtypes.
"""

from __future__ import annotations

from typing import Any

import torch

from ._keys import MAX_KEYS, flip_sign
from ._base import format_bytes
from ._config import cgrx_config
from .cgrx import CGRX_SCENE, CgRXSearch, _ops
from .index import Backend, KeyType
from ._base import _optix_ops, query_sort_bits
from .results import UpdateResult
from .scene import SceneConfig


#: Largest accepted ``growth``: spare node space is a fraction of what is in use, and a larger factor only
#: reserves memory that nothing will use.
MAX_GROWTH = 16.0
#: Default of ``max_node_reads``: lookups read about that many chain nodes per match before a rebuild, against
#: 1.0 for a freshly built index.
DEFAULT_MAX_NODE_READS = 1.25


def _check_row_ids(rows: torch.Tensor, what: str) -> None:
    """Row IDs are integers in 0 .. 2^32 - 2 (stored as 32 bits; 2^32 - 1 is no row). One host sync."""
    if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
        raise TypeError(f"{what} must be an integer tensor of row IDs, got {rows.dtype}; convert with .long()")
    wide = rows.to(torch.int64)  # narrower integer dtypes cannot hold the bound
    if rows.numel() and bool(((wide < 0) | (wide > MAX_KEYS - 1)).any()):
        raise ValueError(f"{what} must be row IDs in 0 .. 2^32 - 2")


def _check_growth(growth: Any) -> float:
    if isinstance(growth, bool) or not isinstance(growth, (int, float)) and not hasattr(growth, "__float__"):
        raise TypeError(f"growth must be a number in 1.0 .. {MAX_GROWTH}, got {type(growth).__name__}")
    g = float(growth)
    if not 1.0 <= g <= MAX_GROWTH:  # also rejects NaN
        raise ValueError(f"growth must be in 1.0 .. {MAX_GROWTH} (spare node space as a factor), got {growth!r}")
    return g


def _check_max_node_reads(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"max_node_reads must be a number >= 1.0 or None, got {type(value).__name__}")
    v = float(value)
    if not v >= 1.0 or v == float("inf"):
        raise ValueError(f"max_node_reads must be a finite number >= 1.0 or None (never rebuild), got {value!r}")
    return v


def sort_pairs(ordered: torch.Tensor, rows: torch.Tensor | None, rows_sorted: bool = False):
    """A batch side sorted by (key, row ID), keys in unsigned order; rows stay None when not given.
    ``rows_sorted``: the rows already ascend (fresh row IDs), so one stable sort by key is enough."""
    if rows is not None and not rows_sorted:
        by_row = torch.sort(rows, stable=True).indices
        ordered, rows = ordered[by_row], rows[by_row]
    # Unsigned key order through a signed sort (flip the top bit), stable: equal keys keep their row order.
    flipped, by_key = torch.sort(flip_sign(ordered), stable=True)
    return flip_sign(flipped).contiguous(), (rows[by_key] if rows is not None else None)


def bucket_offsets(reps: torch.Tensor, table: torch.Tensor, ordered: torch.Tensor) -> torch.Tensor:
    """Where each bucket's slice of a batch sorted by key starts (sorted by key is sorted by bucket)."""
    if ordered.numel() == 0:
        return torch.zeros(reps.numel() + 1, dtype=torch.int64, device=reps.device)
    buckets = _ops().cgrx_find_buckets(reps, table, ordered)
    return torch.searchsorted(buckets, torch.arange(reps.numel() + 1, device=reps.device))


def ranks_within(groups: torch.Tensor) -> torch.Tensor:
    """For each element, how many earlier elements share its group id."""
    order = torch.argsort(groups, stable=True)
    sorted_groups = groups[order]
    ranks = torch.empty_like(groups)
    ranks[order] = torch.arange(groups.numel(), device=groups.device) - torch.searchsorted(sorted_groups, sorted_groups)
    return ranks


def cancel_pairs(ik, ir, dk, dr):
    """The paper's cancellation: a (key, row ID) pair both inserted and deleted by one batch does neither.
    Returns which insertions and deletions remain (multiset matching: k copies cancel k copies)."""
    if ik.numel() == 0 or dk.numel() == 0:
        return torch.ones_like(ik, dtype=torch.bool), torch.ones_like(dk, dtype=torch.bool)
    pairs = torch.stack([torch.cat([ik, dk]), torch.cat([ir, dr])], dim=1)
    groups = torch.unique(pairs, dim=0, return_inverse=True)[1]
    gi, gd = groups[: ik.numel()], groups[ik.numel() :]
    matched = torch.minimum(torch.bincount(gi, minlength=groups.numel()), torch.bincount(gd, minlength=groups.numel()))
    return ranks_within(gi) >= matched[gi], ranks_within(gd) >= matched[gd]


def cancel_batch(ik, ir, dk, dr):
    """A batch after the paper's cancellation: (ik, ir, dk, dr, cancelled insertions) with the insertions and
    deletions that cancel removed (pairs both inserted and deleted; by key, the insertions of a deleted key). A
    batch of insertions only or deletions only comes back as it is: nothing cancels, nothing to compute."""
    if not (ik.numel() and dk.numel()):
        return ik, ir, dk, dr, 0
    if dr is not None:
        keep_ins, keep_del = cancel_pairs(ik, ir, dk, dr)
        return ik[keep_ins], ir[keep_ins], dk[keep_del], dr[keep_del], ik.numel() - keep_ins.sum()
    keep_ins = ~torch.isin(ik, dk)
    return ik[keep_ins], ir[keep_ins], dk, None, ik.numel() - keep_ins.sum()


def plan_insertions(nodes: torch.Tensor, node_size: int, used: int, dk, dr, doff, ik, ir, ioff):
    """Plans a batch with insertions (cgrx_nodes_plan): each bucket's first reserved node, and as tensors the
    nodes to reserve, the pairs the deletions remove and the deletion entries that find something. Changes
    nothing: the caller reserves the nodes (growing the region, or not) before cgrx_nodes_apply."""
    plan = _ops().cgrx_nodes_plan(nodes, node_size, dk, dr, doff, ik, ir, ioff)
    # Insertions can split nodes: a bound on each bucket's new nodes (cgrx_nodes.h split_bound). Only
    # insertions split, so a bucket without any reserves nothing (the bound counts its full nodes even then).
    reserve = torch.where(ioff[1:] > ioff[:-1], plan[:, 5], 0)
    first_new = torch.cumsum(reserve, 0) - reserve + used
    return first_new, reserve.sum(), (plan[:, 0] - plan[:, 2]).sum(), plan[:, 4].sum()


class UpdatableCgRXIndex(CgRXSearch):
    """A cgRX index that takes batch updates. Same lookups as :class:`CgRXIndex`; row IDs are those given at
    build (positions) and at insertion (given, or the next free row IDs).

    Args:
        keys, key_type, backend, scene: as for :class:`CgRXIndex`.
        node_size: pairs per node (default 32, even); buckets are bulk-loaded with node_size / 2 pairs.
        growth: spare node capacity reserved beyond what a build or update needs (a factor in 1 .. 16).
        max_node_reads: the rebuild policy. Updates that land in few buckets (an append workload: ever larger
            keys all go to the last bucket) stretch those buckets' chains, and a lookup walks its chain. After
            each update the index measures the mean number of nodes a lookup of a stored pair reads (1.0 when
            freshly built; :meth:`stats`) and calls :meth:`rebuild` when it exceeds this value. ``None``: never
            (then watch :meth:`stats` yourself).

    An update mutates the node region in place on the current CUDA stream: order it after lookups running on
    other streams (``wait_stream``) as for any in-place tensor operation.
    """

    _STATE_FORMAT = "torch_rtindex.UpdatableCgRXIndex"
    _STATE_KEYS = ("keys", "rows", "keys_ordered", "key_dtype", "key_type", "node_size", "growth", "backend", "scene",
                   "next_row")
    _STATE_TENSORS = ("keys", "rows")
    _SETTINGS = CgRXSearch._SETTINGS | {"node_size"}

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: KeyType | None = None,
        node_size: int = 32,
        backend: Backend = "auto",
        scene: SceneConfig | None = None,
        growth: float = 1.25,
        max_node_reads: float | None = DEFAULT_MAX_NODE_READS,
    ) -> None:
        if isinstance(node_size, bool) or not isinstance(node_size, int) or node_size < 2 or node_size > 4096 or node_size % 2:
            raise ValueError(f"node_size must be an even integer in 2 .. 4096, got {node_size!r}")
        self.node_size = node_size
        self.growth = growth
        self.max_node_reads = max_node_reads
        self.auto_rebuilds = 0
        self._node_reads = 1.0
        self._init_search(keys, key_type, backend, scene)
        # What the node storage holds: buckets bulk-loaded with half a node, node chains instead of a pairs
        # layout, and the naive scene (the optimized one reads the key after each representative in sorted
        # pairs, which node chains do not keep in place).
        self.bucket_size = node_size // 2
        self.layout = "nodes"
        self.representation = "naive"
        self._build(keys)

    @property
    def growth(self) -> float:
        """Spare node capacity reserved beyond what a build or update needs (a factor in 1 .. MAX_GROWTH)."""
        return self._growth

    @growth.setter
    def growth(self, value: float) -> None:
        self._growth = _check_growth(value)

    @property
    def max_node_reads(self) -> float | None:
        """The rebuild policy's bound (see the class doc); None: never rebuild. May be changed between updates."""
        return self._max_node_reads

    @max_node_reads.setter
    def max_node_reads(self, value: float | None) -> None:
        self._max_node_reads = _check_max_node_reads(value)

    # ------------------------------------------------------------------------------------------------ build
    def _build(self, keys: torch.Tensor, rows: torch.Tensor | None = None, *, mapped: bool = False) -> None:
        ops = _ops()
        ordered = keys if mapped else self._map_keys(keys)
        given_rows = rows
        if rows is None:
            rows = torch.arange(ordered.numel(), device=self.device, dtype=torch.int64)
        nodes, reps, table, used = ops.cgrx_nodes_load(ordered, rows.to(torch.int32), self.node_size, self.growth)
        self._pairs, self._reps, self._table, self._used = nodes, reps, table, int(used)
        self._n = ordered.numel()
        # Given row IDs (a state, a rebuild) may skip some: the next free one is past the largest.
        self._next_row = ordered.numel() if given_rows is None or not given_rows.numel() else int(given_rows.max()) + 1
        self.num_buckets = reps.numel()
        self._node_reads = 1.0  # a bulk load puts every bucket in one node
        if self.backend == "optix" and self.device.type == "cuda":
            self._scene = _optix_ops(self.device).cgrx_build_scene(self._reps, self.num_buckets, self.scene.as_list())
        else:
            self._scene = self._no_scene()
        self._note_key_span(ordered)
        self._prepare_lookups()

    def rebuild(self, keys: torch.Tensor | None = None) -> None:
        """Compacts the index (no arguments: same pairs, fresh buckets and representatives) or replaces its keys.

        All-or-nothing: on error the index is unchanged.
        """
        if keys is not None:
            self._all_or_nothing(self._build, keys)
            return
        k, r = self._export()
        next_row = self._next_row
        self._all_or_nothing(self._build, k, r, mapped=True)
        self._next_row = next_row

    def _export(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current (ordered key, row ID) pairs, row IDs as int64."""
        k, r = _ops().cgrx_nodes_export(self._pairs, self.node_size, self.num_buckets)
        return k, r.to(torch.int64) & 0xFFFFFFFF

    def _config(self, key_type: str) -> int:
        # The node region is the storage, its node size the unit the kernels walk; the bucket search is binary.
        return cgrx_config(key_type, "nodes", self.node_size, "binary", self.backend, self.scene.as_list())

    def _num_values(self) -> tuple[int, bool]:
        return self._next_row, False  # indexed by row ID: every row ID handed out so far

    @classmethod
    def _from_structure(cls, nodes: torch.Tensor, reps: torch.Tensor, table: torch.Tensor, n: int, used: int, *,
                        node_size: int, key_type: str, key_dtype: torch.dtype, key_span: tuple[int, int] | None,
                        num_values: int, backend: str = "radix") -> "UpdatableCgRXIndex":
        """An index over a node region, representatives and table that ``cgrx_nodes_load`` made (any device),
        without reloading them: how :class:`~torch_rtindex.ChunkedIndex` serves an updatable chunk from its host
        blob or its cache slot (as :meth:`CgRXIndex._from_structure` for sorted pairs). Only the backends that
        need no OptiX scene; ``key_span`` is (smallest, largest) ordered key, for the query sort."""
        if backend not in ("radix", "binary_search"):
            raise ValueError(
                f"an index over prebuilt structure needs backend 'radix' or 'binary_search', got {backend!r}")
        self = cls.__new__(cls)
        self.key_type, self.key_dtype, self.device = key_type, key_dtype, nodes.device
        self.requested_backend = self.backend = backend
        self.scene = CGRX_SCENE
        self.node_size, self.bucket_size, self.layout, self.representation = node_size, node_size // 2, "nodes", "naive"
        self.growth, self.max_node_reads, self.auto_rebuilds, self._node_reads = 1.0, None, 0, 1.0
        self._pairs, self._reps, self._table, self._used = nodes, reps, table, int(used)
        self._n, self._next_row = int(n), int(num_values)
        self.num_buckets = reps.numel()
        self._scene = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._query_bits = (0, 0) if key_span is None else query_sort_bits(*key_span)
        self._prepare_lookups()
        return self

    # ---------------------------------------------------------------------------------- state and devices
    def state_dict(self) -> dict[str, Any]:
        """The current pairs and the configuration (never the node region or the search structures, rebuilt on load).

        ``"keys"`` are the pairs' keys as ordered keys (int64 storage of the uint64 order-preserving map,
        ``"keys_ordered": True``) and ``"rows"`` their row IDs (int64); ``"key_dtype"`` / ``"key_type"`` restore
        the query dtypes, ``"next_row"`` the next free row ID. A state built by hand may instead hold keys of the
        key dtype with ``"keys_ordered": False``. Exporting the pairs synchronizes with the host on CUDA.
        """
        return super().state_dict()

    def _state_entries(self) -> dict[str, Any]:
        keys, rows = self._export()
        return {
            "keys": keys,
            "rows": rows,
            "keys_ordered": True,
            "key_dtype": str(self.key_dtype).removeprefix("torch."),
            "key_type": self.key_type,
            "node_size": self.node_size,
            "growth": self.growth,
            "backend": self.requested_backend,
            "scene": self.scene.as_list(),
            "next_row": self._next_row,
        }

    @classmethod
    def _from_valid_state(cls, state: dict[str, Any]) -> "UpdatableCgRXIndex":
        key_dtype = getattr(torch, str(state["key_dtype"]), None)
        if not isinstance(key_dtype, torch.dtype):
            raise ValueError(f"the state's key_dtype {state['key_dtype']!r} is not a torch dtype")
        keys, rows = state["keys"], state["rows"]
        if rows.dim() != 1 or rows.numel() != keys.numel() or rows.dtype not in (torch.int32, torch.int64):
            raise ValueError("the state's rows must be a 1-D integer tensor with one row ID per key")
        if rows.device != keys.device:
            raise ValueError(f"the state's rows are on {rows.device} but its keys on {keys.device}")
        _check_row_ids(rows, "the state's rows")
        if state["keys_ordered"] and (keys.dtype != torch.int64 or keys.dim() != 1):
            raise TypeError("ordered keys (keys_ordered=True) must be a 1-D int64 tensor")
        index = cls(
            torch.empty(0, dtype=key_dtype, device=keys.device),
            key_type=state["key_type"],
            node_size=state["node_size"],
            backend=state["backend"],
            scene=SceneConfig(*state["scene"]),
            growth=state["growth"],
        )
        index._build(keys.contiguous(), rows.to(torch.int64), mapped=bool(state["keys_ordered"]))
        next_row = state["next_row"]
        if isinstance(next_row, bool) or not isinstance(next_row, int) or not 0 <= next_row <= MAX_KEYS:
            raise ValueError(f"the state's next_row must be a row ID in 0 .. 2^32 - 1, got {next_row!r}")
        index._next_row = max(next_row, index._next_row)
        return index

    # ---------------------------------------------------------------------------------------------- updates
    def _sorted_side(self, keys: torch.Tensor | None, rows: torch.Tensor | None, what: str, fresh_rows: bool = False):
        """Maps, validates and sorts one side of a batch by (key, row ID); rows stay None when not given.
        ``fresh_rows``: the rows are the next free row IDs, valid and ascending, so they need no check (a host
        sync) and one stable sort by key is enough."""
        if keys is None:
            keys = torch.empty(0, dtype=self.key_dtype, device=self.device)
        ordered = self._map_keys(keys, f"{what} keys")
        if rows is not None:
            if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.numel() != keys.numel():
                raise ValueError(f"{what} rows must be a 1-D tensor with one row ID per key")
            if rows.device != self.device:
                raise ValueError(f"{what} rows are on {rows.device} but the index is on {self.device}")
            if not fresh_rows:
                _check_row_ids(rows, f"{what} rows")
            rows = rows.to(torch.int64)
        return sort_pairs(ordered, rows, rows_sorted=fresh_rows)

    def _bucket_offsets(self, ordered: torch.Tensor) -> torch.Tensor:
        """Where each bucket's slice of a sorted batch starts (batches sorted by key are sorted by bucket)."""
        return bucket_offsets(self._reps, self._table, ordered)

    def _present(self, ordered: torch.Tensor) -> torch.Tensor:
        """Whether each ordered key is in the index now (one radix-table lookup; any backend gives the same)."""
        config = cgrx_config("uint64", "nodes", self.node_size, "binary", "radix", self.scene.as_list())
        count = _ops().cgrx_lookup(*self._lead, config, ordered, None)[1]
        return count > 0

    def update(
        self,
        insert_keys: torch.Tensor | None = None,
        insert_rows: torch.Tensor | None = None,
        delete_keys: torch.Tensor | None = None,
        delete_rows: torch.Tensor | None = None,
    ) -> UpdateResult:
        """One batch of insertions and deletions of (key, row ID) pairs, with the result of inserting first and
        deleting second: the index becomes (index + insertions) - deletions, as multisets.

        A deletion with a row ID removes one such pair; without row IDs it removes every pair with the key.
        As in the paper, pairs both inserted and deleted by the batch cancel out before anything is applied;
        the rest is applied deletions first, then insertions, one thread per bucket. Deleting something absent
        is a no-op, counted in ``absent`` (for deletions by key: keys in neither the index nor the insertions).
        Insertions without row IDs get the next free row IDs (returned as ``rows``). ``deleted`` counts the
        pairs removed, cancelled insertions included. All-or-nothing: if the batch cannot be applied (bad input,
        out of memory) the index is exactly as it was and the error says why.
        """
        ops = _ops()
        for name, t in (("insert_keys", insert_keys), ("insert_rows", insert_rows), ("delete_keys", delete_keys),
                        ("delete_rows", delete_rows)):
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        n_ins = 0 if insert_keys is None else int(insert_keys.numel())
        fresh_rows = insert_rows is None
        if fresh_rows:
            if self._next_row + n_ins > MAX_KEYS:
                raise ValueError("row IDs would exceed 2^32 - 1; pass insert_rows or rebuild")
            insert_rows = torch.arange(self._next_row, self._next_row + n_ins, device=self.device)
        ik, ir = self._sorted_side(insert_keys, insert_rows, "insert", fresh_rows=fresh_rows)
        dk, dr = self._sorted_side(delete_keys, delete_rows, "delete")
        if self._n + n_ins > MAX_KEYS:
            raise ValueError("an index holds at most 2^32 - 1 keys")
        found_by_key = None
        if dr is None and dk.numel() and ik.numel():
            # Deletion by key next to insertions: an entry is absent if its key is in neither the index nor the
            # insertions (cancellation removes the latter before the plan sees them). Without insertions the
            # plan counts the entries whose key it found.
            found_by_key = self._present(dk) | torch.isin(dk, ik)
        ik, ir, dk, dr, cancelled = cancel_batch(ik, ir, dk, dr)
        ik, ir, dk = ik.contiguous(), ir.to(torch.int32).contiguous(), dk.contiguous()
        dr = dr.to(torch.int32).contiguous() if dr is not None else None
        ioff, doff = self._bucket_offsets(ik), self._bucket_offsets(dk)
        N = self.node_size
        words = 3 * N + 2
        nodes = self._pairs
        if ik.numel():
            # Insertions can split nodes: plan first, so that the nodes are reserved for the whole batch before
            # anything changes.
            first_new, extra, removed, found = plan_insertions(nodes, N, self._used, dk, dr, doff, ik, ir, ioff)
        else:
            # Deletions alone reserve nothing: no plan, the apply itself counts what it removed and found.
            first_new = torch.zeros(self.num_buckets, dtype=torch.int64, device=self.device)
            removed, found = ops.cgrx_nodes_apply(nodes, N, dk, dr, doff, ik, ir, ioff, first_new).sum(0)
            extra = torch.zeros_like(removed)
        absent = (~found_by_key).sum() if found_by_key is not None else dk.numel() - found
        extra, removed, absent = torch.stack([extra, removed + cancelled, absent]).tolist()  # the one host sync
        need = self._used + extra
        if ik.numel():
            if need > nodes.numel() // words:  # grow before touching anything: a failed allocation changes nothing
                grown = torch.empty(int(need * self.growth + 1) * words, dtype=torch.int32, device=self.device)
                grown[: self._used * words] = nodes[: self._used * words]
                nodes = grown
            ops.cgrx_nodes_apply(nodes, N, dk, dr, doff, ik, ir, ioff, first_new)
        if nodes is not self._pairs:  # the region grew: the lookups' arguments follow it
            self._pairs = nodes
            self._prepare_lookups()
        self._used = need
        self._n += n_ins - removed
        if fresh_rows:
            self._next_row += n_ins
        elif insert_rows.numel():
            self._next_row = max(self._next_row, int(insert_rows.max()) + 1)
        if ik.numel() and self.max_node_reads is not None:
            self._apply_rebuild_policy()
        return UpdateResult(inserted=n_ins, deleted=removed, absent=absent, rows=insert_rows)

    def _chain_totals(self) -> tuple[int, int, int, int]:
        """(nodes in chains, pairs, node reads summed over the pairs, longest chain); one host sync (an index
        always has a bucket: an empty build makes one)."""
        per_bucket = _ops().cgrx_nodes_stats(self._pairs, self.node_size, self.num_buckets)
        nodes, pairs, reads, longest = torch.cat([per_bucket.sum(0), per_bucket[:, 0].amax().view(1)]).tolist()
        return nodes, pairs, reads, longest

    def _apply_rebuild_policy(self) -> None:
        """Only insertions lengthen chains (deletions leave nodes in place), so only they are checked."""
        _, pairs, reads, _ = self._chain_totals()
        self._node_reads = reads / pairs if pairs else 1.0
        if self._node_reads > self.max_node_reads:
            self.rebuild()  # all-or-nothing: if it fails, the updated (uncompacted) index stays as it is
            self.auto_rebuilds += 1

    def stats(self) -> dict[str, Any]:
        """How far updates have stretched the node chains (one host synchronization on CUDA).

        - ``mean_node_reads``: nodes a lookup of a stored pair reads, averaged over the pairs (1.0 after a
          build; lookups slow down about in proportion); the rebuild policy compares it with ``max_node_reads``;
        - ``longest_chain`` / ``mean_chain``: nodes per bucket; ``buckets``, ``nodes``, ``pairs``;
        - ``auto_rebuilds``: rebuilds the policy has run so far.
        """
        nodes, pairs, reads, longest = self._chain_totals()
        return {
            "buckets": self.num_buckets,
            "nodes": nodes,
            "pairs": pairs,
            "longest_chain": longest,
            "mean_chain": nodes / self.num_buckets if self.num_buckets else 0.0,
            "mean_node_reads": reads / pairs if pairs else 1.0,
            "max_node_reads": self.max_node_reads,
            "auto_rebuilds": self.auto_rebuilds,
        }

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Inserts keys (row IDs given, or the next free ones)."""
        return self.update(insert_keys=keys, insert_rows=rows)

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Deletes (key, row ID) pairs, or every pair of each key when rows is None."""
        return self.update(delete_keys=keys, delete_rows=rows)

    # ----------------------------------------------------------------------------------------- reporting
    def _storage_memory(self) -> dict[str, int]:
        """Nodes in use, and node space reserved but unused (grows on updates; rebuild() compacts)."""
        words = 3 * self.node_size + 2
        capacity = self._pairs.numel() // words
        return {"nodes": self._used * words * 4, "free_node_space": (capacity - self._used) * words * 4}

    def __repr__(self) -> str:
        mem = sum(self.memory().values())
        return (
            f"UpdatableCgRXIndex(keys={self._n}, key_type={self.key_type}, device={self.device}, "
            f"node_size={self.node_size}, buckets={self.num_buckets}, nodes={self._used}, "
            f"backend={self.backend}, memory={format_bytes(mem)})"
        )

