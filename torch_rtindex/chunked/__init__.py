"""ChunkedIndex: an index larger than GPU memory, after Budge et al., "Out-of-core data management for path tracing
on hybrid resources" (EG 2009; notes in ../shared/docs/PAPERS-NOTES.md).

The keys are cut into key-range **chunks** (:mod:`.build`); each chunk is a cgRX structure over its keys in global
row order, or with ``updatable=True`` the node chains of :class:`~torch_rtindex.UpdatableCgRXIndex`. Every chunk
lives in host memory (pinned when the index serves a GPU) as one contiguous blob (:mod:`.store`); a **cache** on the
fast device holds whole chunks, none twice, within a byte budget (:mod:`.cache`). A batch is partitioned into one
queue per chunk and served by the GPU and the CPU at once (:mod:`.executor`), each queue assigned by a greedy
makespan balance (:mod:`.planner`) over measured rates (:mod:`.cost`, :mod:`.calibration`). A GPU-resident **hot
tier** answers the hottest keys' point queries completely (:mod:`.hot_tier`). Updates go to the chunks they touch
(:mod:`.updates`); a saved index is a directory of chunk files and checksummed manifests read lazily
(:mod:`.files`). Every option is a field of :class:`ChunkedConfig` (:mod:`.config`).

Without CUDA, or with ``device="cpu"``, the same code serves everything on the CPU; a positive ``gpu_budget``
then makes the "cache" a second CPU copy, so the cache and the scheduler run as they do on a GPU.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .._base import VALUE_DTYPES, _ops, check_bool, check_capacity
from .._keys import KEY_TYPES, check_key_tensor, check_queries, flip_sign, resolve_key_type
from ..results import Aggregate, CappedMatches, Lookup, Matches, UpdateResult
from .build import Builder
from .cache import ChunkCache, split_budget
from .config import ChunkBackend, ChunkedConfig, ChunkLayout, Eviction, Processors
from .cost import CostModel, Rates
from .executor import Executor
from .files import load_manifest, save_generation
from .hot_tier import HOT_CANDIDATE_BYTES, HotTier
from .merge import capped
from .stats import Stats
from .store import SEARCH_SLACK, ChunkStore, align, chunks_of_manifest, search_bytes
from .updates import Updater

__all__ = ["ChunkedIndex", "ChunkedConfig", "ChunkCache", "Rates"]

_I64 = (-(2**63), 2**63 - 1)
# The options a state or a saved directory holds; the others (the cache's) are chosen anew where it is loaded.
_HELD = ("chunk_bytes", "bucket_size", "layout", "backend", "updatable", "node_size", "growth")


def _option(name: str, doc: str, settable: bool = False) -> property:
    def get(self: "ChunkedIndex") -> Any:
        return getattr(self._config, name)

    def put(self: "ChunkedIndex", value: Any) -> None:
        self._reconfigure(**{name: value})

    return property(get, put if settable else None, doc=doc)


def _hot_flag(name: str, attr: str, doc: str) -> property:
    """A flag of the hot tier (its attribute ``attr``), settable with True or False."""
    def get(self: "ChunkedIndex") -> bool:
        return getattr(self._hot, attr)

    def put(self: "ChunkedIndex", value: bool) -> None:
        setattr(self._hot, attr, check_bool(value, name))

    return property(get, put, doc=doc)


class ChunkedIndex:
    """A cgRX index over more keys than the GPU holds: key-range chunks in host memory, a GPU chunk cache,
    per-chunk queues, the CPU and the GPU serving together (see the module doc for the design).

    Args:
        keys: 1-D tensor of int64, int32, float32, float64 or uint64 keys, on the CPU (the main case) or CUDA;
            duplicates allowed, NaN not. Row ID = position (int64).
        key_type: as for :class:`CgRXIndex` (``"uint64"`` reads int64 storage as unsigned).
        chunk_bytes: target bytes per chunk (its cgRX structure and row map); chunks are cut only between
            distinct keys, so a run of equal keys larger than this makes a larger chunk.
        gpu_budget: bytes on ``device`` for the chunk cache, the hot-key tier and the search parts of chunks read
            in place. Default: half the free GPU memory at construction; on the CPU, 0 (no cache tier: the CPU
            serves from the host copy). A positive budget smaller than the largest chunk is an error. The budget
            bounds the cache (and the build's GPU sort), not the queries' and answers' buffers of a batch.
        device: the cache's device: ``"cuda"`` (default where available) or ``"cpu"``.
        bucket_size, layout, backend: each chunk's cgRX parameters; ``layout`` and ``backend`` default by device
            as :class:`CgRXIndex` chooses them (``"radix"`` and ``"aligned_row"`` without RT cores), never OptiX
            (an OptiX scene is bound to its device address, and chunks move between host and GPU).
        processors: ``"auto"`` (GPU and CPU together where there is a cache, else the CPU), ``"gpu"`` (the cache
            only, every chunk copied in as needed; a chunk larger than the cache is still answered by the CPU),
            ``"cpu"`` (the host copies only) or ``"zero_copy"`` (CUDA only: the GPU's kernels read each queue's
            chunk in pinned host memory directly, without the cache). Settable between batches.
        critical_mass: ``None`` (default): queues planned by measured rates; an int >= 0: the GPU takes cached
            chunks' queues and others of at least this size, the CPU the rest. Settable.
        eviction: ``"demand"`` (default) or ``"lru"`` (see :class:`ChunkCache`).
        pipeline_depth: queues the GPU has in flight at once (2: double buffering). Settable.
        hot_keys: capacity (keys) of the hot tier, which answers point queries for the hottest keys completely on
            the queries' device. ``None`` (default): a sixteenth of ``gpu_budget`` at its bytes per key (at most
            2^24 keys), if the rest still holds two chunks; 0: off. The attributes ``hot_tier`` (use it) and
            ``hot_learn`` (learn its keys) switch it per batch.
        hot_sample: queries per batch the hot tier learns from. ``None`` (default): 2^20 where the queries are on
            a GPU, 2^16 on the CPU, where counting a larger sample costs more than the hits it adds. Settable.
        progress: show a progress bar (tqdm, if installed) for builds that take more than a few seconds;
            ``None``: when stderr is a terminal.
        updatable: ``False`` (default): each chunk is a read-only cgRX index, and an update rebuilds every chunk
            it touches. ``True``: each chunk holds node chains and an update applies in place to the chunks it
            touches (:mod:`.updates`).
        node_size, growth: the node chunks' pairs per node (even, 2 .. 4096) and spare node space (1 .. 16).
        read_in_place: whether the planned ``"auto"`` serving may have the GPU answer a small queue by reading
            its chunk in pinned host memory instead of copying it in: ``None`` (default) where the chunks are
            pinned and the cache is on CUDA; ``True`` also on a CPU index (reading the host copy). Settable.
        in_place_window: lookups in flight at once where the GPU reads a key-sorted batch's queues in place in
            one launch (0: no limit). Settable.
        cpu_group_queries: the CPU answers small point queues in groups of about this many queries. Settable.
        build_sort_keys: keys the build sorts at once; ``None``: from ``gpu_budget`` on CUDA, all on the CPU. Keys
            that fit one chunk are not sorted at all.

    Lookups: the :class:`~torch_rtindex.Index` protocol, with the answers :class:`CgRXIndex` gives over the same
    keys (range rows in (key, row ID) order), for query batches on the CPU or on ``device``; answers come on the
    queries' device. Every batch synchronizes with the host (queue sizes), so none can be captured in a CUDA graph
    (:attr:`capturable` is False); the capped forms compute the full answer and cut it. One batch at a time: two
    threads calling it at once would share its cache unsafely. Pickling, ``copy.deepcopy`` and ``torch.save`` go
    through :meth:`state_dict` (caches, the hot tier and learned rates are made anew).
    """

    range_rows_ascending = False

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        chunk_bytes: int = 256 << 20,
        gpu_budget: int | None = None,
        device: torch.device | str | None = None,
        bucket_size: int = 16,
        layout: ChunkLayout | None = None,
        backend: ChunkBackend | None = None,
        processors: Processors = "auto",
        critical_mass: int | None = None,
        eviction: Eviction = "demand",
        pipeline_depth: int = 2,
        hot_keys: int | None = None,
        hot_sample: int | None = None,
        progress: bool | None = None,
        updatable: bool = False,
        node_size: int = 32,
        growth: float = 1.25,
        read_in_place: bool | None = None,
        in_place_window: int = 1 << 14,
        cpu_group_queries: int = 1 << 16,
        build_sort_keys: int | None = None,
    ) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        options = ChunkedConfig(
            chunk_bytes=chunk_bytes, gpu_budget=gpu_budget, device=device, bucket_size=bucket_size, layout=layout,
            backend=backend, processors=processors, critical_mass=critical_mass, eviction=eviction,
            pipeline_depth=pipeline_depth, hot_keys=hot_keys, hot_sample=hot_sample, updatable=updatable,
            node_size=node_size, growth=growth, read_in_place=read_in_place, in_place_window=in_place_window,
            cpu_group_queries=cpu_group_queries, build_sort_keys=build_sort_keys, progress=progress)
        key_type = resolve_key_type(keys, key_type)
        self._assemble(options, key_type, keys.dtype)
        check_key_tensor(keys, "keys", dtype=self.key_dtype, device=keys.device)
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError("keys contain NaN, which has no place in a key order; drop or replace those rows")
        t0 = time.perf_counter()
        self._store.set(self._builder.build(keys))
        self._store.n = self._store.next_row = keys.numel()
        self._stats.data["time_s"]["build"] = time.perf_counter() - t0
        self._setup_tiers()

    # ------------------------------------------------------------------------------------------ configuration
    def _assemble(self, options: ChunkedConfig, key_type: str, key_dtype: torch.dtype) -> None:
        """The index's units over ``options`` (resolved for this machine), holding no chunk yet."""
        config = options.resolved()
        self._options, self._config = options, config  # as given (for a move to another device), as resolved
        self.key_type, self.key_dtype = key_type, key_dtype
        pin = config.device.type == "cuda"  # pinning starts CUDA: a CPU index on a GPU machine need not
        self._stats = Stats()
        self._store = ChunkStore(config, key_type, key_dtype, pin, self._stats)
        self._builder = Builder(config, key_type, pin)
        self._cost = CostModel(cuda=config.device.type == "cuda")
        self._executor = Executor(config, key_type, self._store, self._cost, self._stats)
        store = self._store
        self._hot = HotTier(config, key_type, key_dtype, self._stats, self._executor, lambda: store.next_row)
        self._updater = Updater(config, key_dtype, store, self._builder, self._hot, self._stats)
        self._cache: ChunkCache | None = None

    def _reconfigure(self, **changes: Any) -> None:
        """Sets options that may change between batches, checked as at construction and against this index."""
        settable = {"processors", "critical_mass", "read_in_place", "hot_sample", "pipeline_depth",
                    "in_place_window", "cpu_group_queries"}
        fixed = sorted(set(changes) - settable)
        if fixed:
            raise AttributeError(f"{fixed} are fixed at construction; build (or open) the index with them")
        old = self._config
        self._set_config(old.replace(**changes))
        try:
            self._check_serving()
        except BaseException:
            self._set_config(old)
            raise
        self._options = self._options.replace(**changes)

    def _set_config(self, config: ChunkedConfig) -> None:
        self._config = config
        for unit in (self._store, self._builder, self._executor, self._hot, self._updater):
            unit.config = config

    def _check_serving(self) -> None:
        """The serving options checked against this index (a cache, CUDA, pinned chunks)."""
        self._executor.processors()
        if self._config.read_in_place and self.device.type == "cuda" and not self._store.pin:
            raise ValueError("read_in_place=True needs the chunks in pinned host memory; set it to None or False")

    def _setup_tiers(self) -> None:
        """Splits gpu_budget between the hot-key tier and the chunk cache, now that the chunk sizes are known."""
        cfg, store = self._config, self._store
        # Search parts kept on the GPU only where this index reads chunks in place: its processors at construction
        # (or open) say so.
        in_place = self.device.type == "cuda" and store.pin and cfg.processors in ("auto", "zero_copy")
        search = int(sum(search_bytes(c.specs) for c in store.chunks) * SEARCH_SLACK) if in_place else 0
        hot, arena, search = split_budget(self.gpu_budget, align(max(c.nbytes for c in store.chunks)), cfg.hot_keys,
                                          HOT_CANDIDATE_BYTES + self._hot.pair_bytes(), search)
        self._hot.reserve(hot)
        # The search parts' reservation is a slab of its own that chunks use until search parts need its room.
        cache = ChunkCache(arena, self.device, cfg.eviction, spare=search) if arena > 0 else None
        self._cache = store.cache = self._executor.cache = cache
        self._check_serving()

    config = property(lambda self: self._config, doc="The index's options (:class:`ChunkedConfig`), resolved.")
    device = property(lambda self: self._config.device, doc="The cache's device.")
    gpu_budget = property(lambda self: self._config.gpu_budget, doc="Bytes on ``device`` for the cache and tiers.")
    chunk_bytes = _option("chunk_bytes", "Target bytes per chunk.")
    bucket_size = _option("bucket_size", "Each chunk's cgRX bucket size.")
    layout = _option("layout", "Each chunk's pair layout.")
    backend = _option("backend", "Each chunk's representative search.")
    updatable = _option("updatable", "Whether updates apply in place to node chunks.")
    node_size = _option("node_size", "Node chunks' pairs per node.")
    growth = _option("growth", "Node chunks' spare node space.")
    eviction = _option("eviction", "The cache's eviction policy.")
    processors = _option("processors", "Who serves the queues (settable between batches).", settable=True)
    critical_mass = _option("critical_mass", "None, or the queue size from which the GPU takes a queue.", True)
    read_in_place = _option("read_in_place", "Whether the GPU may read small queues' chunks in place.", True)
    hot_sample = _option("hot_sample", "Queries per batch the hot tier learns from.", True)
    pipeline_depth = _option("pipeline_depth", "Queues the GPU has in flight at once.", True)
    in_place_window = _option("in_place_window", "Lookups in flight in one in-place launch (0: no limit).", True)
    cpu_group_queries = _option("cpu_group_queries", "Queries per grouped CPU call.", True)

    hot_tier = _hot_flag("hot_tier", "enabled", "Whether point batches use the hot tier (False serves every query "
                         "through the chunks; the tier is kept).")
    hot_learn = _hot_flag("hot_learn", "learning", "Whether point batches teach the hot tier its keys (False keeps "
                          "them as they are; see :meth:`warm`).")

    @property
    def hot_capacity(self) -> int:
        """Keys the hot tier's reservation holds while it learns (0: no tier)."""
        return self._hot.capacity

    @property
    def hot_capacity_given(self) -> int:
        """Keys (of one row ID each) a tier given by :meth:`warm` with ``learn=False`` holds: the reservation of
        ``hot_capacity`` keys less the learning candidates, which such a tier does not keep."""
        return self._hot.capacity_given()

    @property
    def hot_pair_bytes(self) -> int:
        """The hot tier's bytes per (key, row ID) pair now: its cgRX pair, search part and, once row IDs reach
        2^32, a row map entry. ``hot_keys`` was priced at these when the tier's room was reserved, plus a learning
        candidate's few bytes (:data:`torch_rtindex.chunked.hot_tier.HOT_CANDIDATE_BYTES`) per key while the tier
        learns."""
        return self._hot.pair_bytes()

    @property
    def hot_tier_keys(self) -> torch.Tensor:
        """The keys the hot tier holds now, most important first, as keys of :attr:`key_dtype` on the CPU (empty
        while there is no tier, also from an update until the next point batch rebuilds the tier; a float
        ``-0.0`` comes back as ``0.0``, the key it equals)."""
        if self._hot.tier is None:
            return torch.empty(0, dtype=self.key_dtype)
        ordered = flip_sign(self._hot.keys().cpu())  # the tier keeps flipped ordered keys
        return _ops().unmap_keys(ordered, KEY_TYPES[self.key_type], self.key_dtype)

    @property
    def capturable(self) -> bool:
        """False: every batch learns its queue sizes on the host (and copies chunks in as needed), so no lookup
        of this index can be captured in a CUDA graph."""
        return False

    @property
    def next_row(self) -> int:
        """The row ID the next insertion without row IDs gets: one past the largest ever held (``aggregate``'s
        values need one per row ID below it once updates have changed the rows)."""
        return self._store.next_row

    # The sharded index restores it (an undone insertion frees its row IDs).
    _next_row = property(lambda self: self._store.next_row,
                         lambda self, v: setattr(self._store, "next_row", int(v)))

    def _export(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (ordered key, row ID) pair, on the CPU, chunk by chunk (key ranges in order)."""
        return self._store.export()

    # ----------------------------------------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return self._store.n

    @property
    def num_chunks(self) -> int:
        return len(self._store)

    def _check_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(lo, torch.Tensor):
            raise TypeError(f"queries must be a torch.Tensor, got {type(lo).__name__}")
        D = lo.device
        if D.type not in ("cpu", "cuda") or (D.type == "cuda" and self.device.type == "cuda" and D != self.device):
            raise ValueError(f"queries are on {D}; pass them on the CPU or on the index's device {self.device}")
        if D.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise NotImplementedError(
                "ChunkedIndex lookups cannot be captured in a CUDA graph (capturable is False): every batch learns "
                "its queue sizes on the host and copies chunks in as needed. Run them outside the graph, or capture "
                "the lookups of a CgRXIndex over the keys that fit the GPU"
            )
        lo, hi = check_queries(lo, hi, dtype=self.key_dtype, device=D, key_type=self.key_type)
        ops = _ops()
        if hi is None:
            return ops.map_keys(lo, KEY_TYPES[self.key_type]), None
        return ops.map_ranges(lo, hi, KEY_TYPES[self.key_type])

    def _check_values(self, values: torch.Tensor, device: torch.device) -> torch.Tensor:
        store = self._store
        need = store.n if store.rows_are_positions else store.next_row
        exact = store.rows_are_positions
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or values.numel() < need or (
                exact and values.numel() != need):
            what = f"one value per key ({need})" if exact else f"a value for every row ID (at least {need} values)"
            raise ValueError(f"values must be a 1-D tensor with {what}")
        if values.device != device:
            raise ValueError(f"values are on {values.device} but the queries on {device}; pass them on one device")
        if values.dtype not in VALUE_DTYPES:
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")
        return values.contiguous()

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups: per query the smallest matching row ID (-1 on a miss) and the match count. The hot-key
        tier answers the hottest keys; the other queries go through the chunks."""
        return Lookup(*self._run("lookup", queries, None))

    def lookup_rows(self, queries: torch.Tensor, miss_row: int = -1) -> torch.Tensor:
        """Point lookups answered by the smallest matching row ID alone, ``miss_row`` where a query has no match
        (``lookup(queries).first_row`` with the misses replaced; what :class:`~torch_rtindex.IdToRow` maps IDs
        with)."""
        if isinstance(miss_row, bool) or not isinstance(miss_row, int):
            raise TypeError(f"miss_row must be an int, got {type(miss_row).__name__}")
        if not _I64[0] <= miss_row <= _I64[1]:
            raise ValueError(f"miss_row must fit in int64 (the answers' dtype), got {miss_row}")
        first, count = self._run("lookup", queries, None)
        return first if miss_row == -1 else torch.where(count > 0, first, miss_row)

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive; empty when ``lo[i] > hi[i]``): smallest row ID, count."""
        return Lookup(*self._run("lookup", lo, hi))

    def range_count(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Per range the number of matching pairs (int64): ``range_lookup(lo, hi).count``, each chunk's piece
        counted from positions (:meth:`CgRXIndex.range_count`) and the pieces summed."""
        return self._run("count", lo, hi)

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Every matching row ID per query as CSR, ascending row IDs per query."""
        return Matches(*self._run("csr", queries, None))

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Every row ID in each range as CSR, in (key, row ID) order (chunk order is key order)."""
        return Matches(*self._run("csr", lo, hi))

    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`lookup_all` cut to ``capacity`` row IDs plus the true total (see :class:`CappedMatches`)."""
        capacity = int(check_capacity(capacity, queries.device if isinstance(queries, torch.Tensor) else self.device))
        return capped(self._run("csr", queries, None), capacity)

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`range` cut to ``capacity`` row IDs plus the true total (see :class:`CappedMatches`)."""
        capacity = int(check_capacity(capacity, lo.device if isinstance(lo, torch.Tensor) else self.device))
        return capped(self._run("csr", lo, hi), capacity)

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Per query the match count and the sum of ``values[row]`` over the matches (int64 or float64)."""
        return Aggregate(*self._run("aggregate", queries, None, values))

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Per range the match count and the sum of ``values[row]`` over the matches."""
        return Aggregate(*self._run("aggregate", lo, hi, values))

    def _run(self, form: str, lo: torch.Tensor, hi: torch.Tensor | None, values: torch.Tensor | None = None):
        t_start = time.perf_counter()
        qlo, qhi = self._check_queries(lo, hi)
        D = qlo.device
        if values is not None:
            values = self._check_values(values, D)
        stats, hot = self._stats, self._hot
        before = stats.snapshot()
        q = qlo.numel()
        tiered = qhi is None and q > 0 and hot.enabled and hot.capacity > 0
        if tiered:
            hot.before_batch(D)
        if tiered and hot.tier is not None:
            out, hits = hot.serve(form, qlo, values, D)
        else:
            out, hits = self._executor.serve(form, qlo, qhi, values, D), 0
        if tiered and hot.learning:
            t0 = time.perf_counter()
            hot.learn(qlo, hits / q)
            stats.time("hot", time.perf_counter() - t0)
        stats.count("queries", q)
        stats.time("total", time.perf_counter() - t_start)
        stats.last_batch = stats.since(before)
        return out

    def rates(self) -> Rates:
        """The rates and fixed times the scheduler plans with now: calibrated on the first batch that uses both
        processors, then fitted to the queues of every batch (:mod:`.cost`). ``in_place`` is 0 where the GPU does
        not read queues' chunks in place (:attr:`read_in_place`)."""
        return self._executor.rates()

    # --------------------------------------------------------------------------------------------- hot tier
    def warm(self, keys: torch.Tensor, *, learn: bool = False) -> int:
        """Builds the hot tier now from ``keys`` (in priority order: the first distinct keys that are in the index,
        as far as their row IDs fit the tier), on ``keys``' device. With ``learn=False`` (the default) the tier
        keeps these keys until the next ``warm`` or ``hot_learn = True``, and holds up to
        :attr:`hot_capacity_given` keys. Updates rebuild it over the same keys. Returns the number of keys in
        the tier."""
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        if not isinstance(learn, bool):
            raise TypeError(f"learn must be True or False, got {learn!r}")
        if not self._hot.capacity:
            raise ValueError("this index has no hot tier (hot_keys=0, or no gpu_budget to take it from)")
        qlo, _ = self._check_queries(keys.reshape(-1), None)
        return self._hot.warm(qlo, learn)

    def clear_hot(self) -> None:
        """Drops the hot tier and what it learned (learning starts over)."""
        self._hot.clear()

    # ------------------------------------------------------------------------------------------------ updates
    def update(self, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
               delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult:
        """One batch of insertions and deletions of (key, row ID) pairs: the index becomes (index + insertions)
        - deletions, as multisets, with :meth:`UpdatableCgRXIndex.update`'s semantics and counts (a deletion with
        a row ID removes one such pair, without row IDs every pair of its key; insertions without row IDs get the
        next free row IDs, returned as ``rows``; row IDs are int64 in 0 .. 2^48 - 1).

        The batch is routed to the chunks it touches: read-only chunks are rebuilt, node chunks
        (``updatable=True``) take their share in place where they can (:mod:`.updates`). All-or-nothing across
        chunks: on any error (bad input, out of memory) the index is unchanged. :meth:`stats` counts
        ``chunks_updated_in_place`` and ``chunks_rebuilt``."""
        return self._updater.update(insert_keys, insert_rows, delete_keys, delete_rows)

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Inserts keys (row IDs given, or the next free ones)."""
        return self.update(insert_keys=keys, insert_rows=rows)

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Deletes (key, row ID) pairs, or every pair of each key when rows is None."""
        return self.update(delete_keys=keys, delete_rows=rows)

    # ----------------------------------------------------------------------------------- state and devices
    _STATE_FORMAT = "torch_rtindex.ChunkedIndex.state"
    _STATE_VERSION = 1
    _STATE_CONFIG = ("key_type", "key_dtype", *_HELD, "next_row", "rows_are_positions")

    def _held(self) -> dict[str, Any]:
        return {k: getattr(self._config, k) for k in _HELD}

    def _cache_options(self, here: bool = True) -> dict[str, Any]:
        """The options a state does not hold, as given, in plain values (they pickle with weights_only); the
        device this index is on (``here``) or as given (None: chosen where the index is loaded)."""
        out = {k: v for k, v in vars(self._options).items() if k not in _HELD and k != "progress"}
        device = self.device if here else out["device"]
        out["device"] = None if device is None else str(device)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The index's (key, row ID) pairs and configuration as CPU tensors and plain values (the chunks' search
        structures are rebuilt on load), for ``torch.save`` or a :class:`ShardedIndex` state. It holds every key:
        for an index larger than host memory allows twice, use :meth:`save` / :meth:`open` instead. ``"keys"``
        are ordered keys (the uint64 order-preserving map as int64); the cache settings (``gpu_budget``, ...) are
        not part of it, they are chosen again at :meth:`from_state_dict`."""
        keys, rows = self._store.export()
        return {"format": self._STATE_FORMAT, "version": self._STATE_VERSION, "keys": keys, "rows": rows,
                "key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."), **self._held(),
                "next_row": self._store.next_row, "rows_are_positions": self._store.rows_are_positions}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], device: torch.device | str | None = None,
                        **options: Any) -> "ChunkedIndex":
        """A new index from :meth:`state_dict`'s output, its chunks built on the CPU from the pairs; ``device``
        and ``options`` (the :class:`ChunkedConfig` fields the state does not hold: ``gpu_budget``,
        ``processors``, ...) as for the constructor (default device: CUDA where there is one)."""
        if not isinstance(state, dict):
            raise TypeError(f"a ChunkedIndex state is a dict (from ChunkedIndex.state_dict()), got {type(state).__name__}")
        missing = [k for k in ("format", "version", "keys", "rows", *cls._STATE_CONFIG) if k not in state]
        if missing or state["format"] != cls._STATE_FORMAT or state["version"] != cls._STATE_VERSION:
            raise ValueError(f"not a ChunkedIndex state of version {cls._STATE_VERSION} (from "
                             f"ChunkedIndex.state_dict()); missing entries: {missing}")
        keys, rows = state["keys"], state["rows"]
        if not (isinstance(keys, torch.Tensor) and isinstance(rows, torch.Tensor) and keys.dim() == rows.dim() == 1
                and keys.dtype == rows.dtype == torch.int64 and keys.numel() == rows.numel()):
            raise ValueError("the state's keys and rows must be 1-D int64 tensors of one length")
        key_dtype = getattr(torch, str(state["key_dtype"]), None)
        if not isinstance(key_dtype, torch.dtype):
            raise ValueError(f"the state's key_dtype {state['key_dtype']!r} is not a torch dtype")
        self = cls.__new__(cls)
        self._assemble(_options(options, device, {k: state[k] for k in _HELD}), state["key_type"], key_dtype)
        chunks, end = self._builder.from_pairs(keys.cpu(), rows.cpu())
        store = self._store
        store.set(chunks)
        store.n = keys.numel()
        store.next_row = max(int(state["next_row"]), end)
        store.rows_are_positions = bool(state["rows_are_positions"])
        self._setup_tiers()
        return self

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces this index by the one ``state`` describes, with this index's device and cache options.
        All-or-nothing: if the state is malformed, the index is unchanged."""
        fresh = type(self).from_state_dict(state, **self._cache_options())
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    def to(self, device: torch.device | str | int) -> "ChunkedIndex":
        """The index with its cache on ``device``: a new index built there from the state (the cache options
        kept; ``gpu_budget`` chosen anew unless it was given), or ``self`` if it is there already."""
        from .config import check_device

        target = check_device(device)
        if target == self.device:
            return self
        options = self._cache_options()
        options["device"] = str(target)
        if self._options.gpu_budget is None:
            options["gpu_budget"] = None
        return type(self).from_state_dict(self.state_dict(), **options)

    def cpu(self) -> "ChunkedIndex":
        """The index on the CPU (see :meth:`to`)."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None) -> "ChunkedIndex":
        """The index on a CUDA device, the current one by default (see :meth:`to`)."""
        return self.to("cuda" if device is None else device)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (torch.save(index), copy.deepcopy) goes through state_dict: no lock, thread, stream or cached
        # structure is copied; plain values only, so torch.load(weights_only=True) reads it.
        return {"state": self.state_dict(), "options": self._cache_options(here=False)}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        if not isinstance(saved, dict) or "state" not in saved or "options" not in saved:
            raise ValueError("not a pickled ChunkedIndex (a dict of its state and options)")
        self.__dict__.update(type(self).from_state_dict(saved["state"], **saved["options"]).__dict__)

    # --------------------------------------------------------------------------------------- save and open
    def save(self, directory: str | os.PathLike) -> None:
        """Writes the index to ``directory`` as a new generation (one file per chunk, a checksummed manifest with
        their sizes and CRC-32), then switches ``CURRENT`` to it atomically; keeps the previous generation for
        readers that have it open, removes older ones. Chunks unchanged since they were read from or written to
        this directory are hard-linked, not rewritten."""
        store = self._store
        settings = {"key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."),
                    "n": store.n, "next_row": store.next_row, "rows_are_positions": store.rows_are_positions,
                    **self._held()}
        save_generation(directory, store.chunks, store.host, settings, self.updatable)

    @classmethod
    def open(cls, directory: str | os.PathLike, *, device: torch.device | str | None = None,
             updatable: bool | None = None, **options: Any) -> "ChunkedIndex":
        """The index saved in ``directory`` (its current generation), without a rebuild: chunk files are read
        lazily, on first use, and checked then (size and CRC-32); the manifest is checked now. ``updatable``:
        ``None`` (default) as saved; ``True`` / ``False`` switch the kind of chunk that updates make: each chunk
        keeps its saved kind (both kinds answer alike) until an update touches it. ``device`` and ``options``
        (``gpu_budget``, ``processors``, ...) as for the constructor."""
        if updatable is not None and not isinstance(updatable, bool):
            raise TypeError(f"updatable must be None (as saved), True or False, got {updatable!r}")
        directory = os.fspath(directory)
        _, m = load_manifest(directory)
        held = {"chunk_bytes": m["chunk_bytes"], "bucket_size": m["bucket_size"], "layout": m["layout"],
                "backend": m["backend"], "updatable": m.get("updatable", False) if updatable is None else updatable,
                "node_size": m.get("node_size", 32), "growth": m.get("growth", 1.25)}
        self = cls.__new__(cls)
        self._assemble(_options(options, device, held), m["key_type"], getattr(torch, m["key_dtype"]))
        store = self._store
        store.set(chunks_of_manifest(directory, m))
        store.n, store.next_row, store.rows_are_positions = m["n"], m["next_row"], m["rows_are_positions"]
        self._setup_tiers()
        return self

    # -------------------------------------------------------------------------------------------- reporting
    def reset_stats(self) -> None:
        """Zeroes the counters of :meth:`stats`."""
        self._stats.reset()

    def stats(self) -> dict[str, Any]:
        """Counters since construction or :meth:`reset_stats`: batches, queries and pieces (a range's share of
        one chunk), queries answered by the GPU (the cache tier, or reading their chunk in place: also counted in
        ``queries_in_place``) and by the CPU, chunk hits and misses of the GPU's queues, evictions, bytes copied
        into the cache (and by the one-time calibration) and read from disk, hot-tier hits and rebuilds, chunks
        updated in place and rebuilt by updates, the rates and the plan (queries per processor) of the last chunk
        batch, seconds per stage (partition, GPU issue and pacing waits, CPU lookups, copies, merge, disk loads,
        hot tier, calibration, total, and the build), ``calibrations`` (the last few of a lookup way: the way,
        whether on point lookups, each slice's lookups and seconds, warm-up first, the rate and fixed seconds
        after it, and whether it changed them), the cache's and the hot tier's current contents
        (``resident_chunks``, ``resident_bytes``, ``hot_keys``, ``hot_pairs``, ``search_budget``; the tier's
        ``hot_row_map`` entries, 0 where its pairs hold row offsets from ``hot_row_base`` as a chunk's do),
        ``hot_paused`` (point batches left that skip learning, after learning found nothing worth a tier),
        ``rates_measured`` (per rate of :meth:`rates`: ``"points"`` measured on point lookups, ``"other"`` on other
        forms only, ``None`` still a guess) and ``last_batch``: the same counters and seconds for the last call
        alone."""
        s = self._stats.copy()
        cache = self._cache
        s["resident_chunks"] = 0 if cache is None else len(cache)
        s["resident_bytes"] = 0 if cache is None else cache.used()
        s["search_budget"] = 0 if cache is None else cache.search_budget
        s["gpu_budget"], s["chunks"] = self.gpu_budget, len(self._store)
        s["hot_keys"], s["hot_pairs"] = self._hot.n_keys, self._hot.n_pairs
        tier = self._hot.tier
        s["hot_row_base"] = 0 if tier is None else tier["base"]
        s["hot_row_map"] = 0 if tier is None else tier["tensors"]["rows"].numel()
        s["hot_paused"] = self._hot.skip
        s["rates_measured"] = {k: v or None for k, v in self._cost.measured.items()}
        return s

    def memory(self) -> dict[str, int]:
        """Bytes: the chunks' host blobs loaded so far, all chunks, the chunk cache's slabs allocated on ``device``
        less the search parts in them, the hot-key tier and the search parts kept on ``device`` for in-place
        reads."""
        store, cache = self._store, self._cache
        resident = store.search_resident()
        return {
            "host": sum(c.nbytes for c in store.chunks if c.host is not None),
            "chunks": sum(c.nbytes for c in store.chunks),
            "cache": 0 if cache is None else cache.allocated() - resident,
            "hot": self._hot.nbytes(),
            "search": resident,
        }

    def chunk_info(self) -> list[dict[str, Any]]:
        """Per chunk: keys, bytes, first ordered key of its range, whether it is loaded and cached, its kind
        (``"pairs"`` or ``"nodes"``), and how it stores row IDs: ``row_map`` entries of an int64 row map, 0 where
        its rows span under 2^32 and its pairs hold each row's offset from ``row_base``."""
        info = self._store.info()
        for d, c in zip(info, self._store.chunks):
            d["row_base"] = c.base
            d["row_map"] = c.row_map_entries()
        return info

    def __repr__(self) -> str:
        return (f"ChunkedIndex(keys={len(self)}, key_type={self.key_type}, chunks={len(self._store)}, "
                f"device={self.device}, gpu_budget={self.gpu_budget}, "
                f"bytes={sum(c.nbytes for c in self._store.chunks)})")


def _options(options: dict[str, Any], device: Any, held: dict[str, Any]) -> ChunkedConfig:
    """The config of an index loaded from a state or a directory: its held options and the caller's others."""
    clash = sorted(set(options) & set(held))
    if clash:
        raise TypeError(f"{clash} come from the saved index; build a new index to change them")
    try:
        return ChunkedConfig(device=device if device is not None else options.pop("device", None), **held, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            allowed = sorted(set(ChunkedConfig.__dataclass_fields__) - set(held))
            raise TypeError(f"{e}; the options are {allowed}") from None
        raise
