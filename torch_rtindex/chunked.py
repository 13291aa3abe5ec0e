"""ChunkedIndex: an index larger than GPU memory, after Budge et al., "Out-of-core data management for path tracing
on hybrid resources" (EG 2009; notes in ../shared/docs/PAPERS-NOTES.md).

The keys are cut into key-range **chunks**; each chunk is a cgRX structure (``CgRXIndex`` over the chunk's keys,
in global row order, so its local row order is the global one) whose pairs hold each row's offset from the
chunk's smallest row (a chunk whose rows span 2^32 or more keeps local rows and a ``local -> global row`` map), or
with ``updatable=True`` the node chains of ``UpdatableCgRXIndex`` (see **Updates**). Every chunk
lives in host memory (pinned where CUDA is available) as one contiguous blob; a **cache** on the fast device
(``device``, the GPU) holds whole chunks, none twice, within a byte budget (``gpu_budget``).

A lookup batch is **partitioned** by chunk on the queries' device: a point batch in one operator
(``partition_queries``, the sharded index's routing: chunk id by a binary search over the chunk boundaries,
counts, scatter), a range batch by its pieces' chunk ids (a stable sort by chunk id, counts): one **queue** per
chunk; a point batch sorted by key (the hot tier's misses) is already grouped, each queue a run of it found by one
search of the boundaries (``SORTED_RUNS``). A range that spans chunks becomes one
piece per chunk. Two processors then serve the queues at the same time: the GPU (the calling thread: a chunk not
in the cache is copied in on a copy stream, overlapping the lookups of the previous one; at most
``pipeline_depth`` queues in flight) and the CPU (a worker thread answering from the host copies; torch operators
release the GIL). The CPU worker answers small point queues of chunks holding row offsets in groups of about
``CPU_GROUP_QUERIES`` queries, one ``cgrx_lookup_queues`` call spreading all of a group's queries over the cores (a
queue alone would pay its call and a parallel region). The GPU reads the queues of a batch sorted by key (the hot
tier's misses) in place in one launch, queue after queue in the planner's order with a window of lookups in flight
(``IN_PLACE_WINDOW``), the batch's queues of cached chunks in the same launch from their slots
(``GROUP_CACHED``); those of any other batch each in a launch of its own (one launch for them read every chunk's
host memory at once and was slower).

**Scheduling** (:func:`plan`): each queue costs the CPU ``size / cpu rate`` and the GPU ``max(chunk bytes / copy
rate, size / GPU rate)`` (no copy when the chunk is cached), or, where the GPU can read the pinned host chunks in
place (``read_in_place``) and that is cheaper, ``size / in-place rate``: a queue too small to pay for its chunk's
copy is answered over PCIe without one (random reads within one chunk's region; a whole batch's random reads over
all of host memory run far slower, which is why queues come first). Such a read keeps the chunk's search part (its
representatives and radix table, about 0.6 bytes per key) in GPU memory, made on the chunk's first in-place read, so
that only the pairs (and a row map, where there is one) are read over PCIe; their reservation (all chunks' search
parts and a quarter more for updates) comes out of ``gpu_budget`` where the rest still holds two chunks and the
index is built or opened with ``processors`` ``"auto"`` or ``"zero_copy"`` (the reservation stays if they change
later); chunks beyond it (updates that grew the keys past the quarter) read their search part in place too. The
reservation is a second slab of the cache (:class:`ChunkCache`): until search parts need its room, cached chunks
use it (batches that copy every chunk make no search part). Queues
go, in order of CPU cost over GPU cost, to the processor whose projected finish with the queue is earlier, then
single queues move off the processor that ends last while that ends the batch sooner: a greedy makespan balance, so
the CPU never keeps a queue the GPU would end the batch sooner with. A chunk larger than the cache is the CPU's. The
plan is handed out on demand (the paper's scheme): a processor that runs out of its own queues takes over the
other's last one if it would finish it before the other got through its backlog. The rates are calibrated once on
the first batch that uses both processors (a lookup way on its largest queue: a warm-up, then two slices of other
queries timed, of two sizes; a slice of a chunk copied in) and then measured on every batch. A queue (a CPU call)
costs a fixed time plus its lookups at a rate, both fitted to the measured queues of recent batches
(:class:`_CostFit`): lookups over seconds of tiny queues is mostly their fixed time, not a rate. The copy rate is an
exponential average. Rates are those of point lookups: a batch of another form sets one only until a point batch
has measured it, and a point batch calibrates the CPU's,
the in-place or the cache's rate again when 4 point batches have not measured it (a rate that priced its way out of
every plan; the cache's on a big queue of a cached chunk), a wait that doubles, up to 64 batches, while such
recalibrations confirm the rate. :meth:`ChunkedIndex.rates` shows them.
``critical_mass`` (an int) replaces the plan by a fixed rule: the GPU takes cached chunks' queues and others of at
least that size.

**Cache policy** (``eviction``): to make room the cache evicts, among its chunks, the one with the least
demand still pending in the current batch, then the least "heat" (an exponential average of each chunk's queue
sizes over past batches: the demand the next batch is likely to bring), then the least recently used.

**Build**: keys anywhere (a CPU tensor larger than GPU memory is the main case). With CUDA the sort runs on the
GPU within ``gpu_budget``: splitters from a sample, the keys partitioned by splitter range piece by piece (mapped
and bucketed on the GPU, grouped in host memory), each range sorted on the GPU one at a time. Chunk boundaries
fall only between distinct keys, so every key's rows live in one chunk (a point lookup touches one chunk); a run
of equal keys longer than a chunk makes one larger chunk. Row IDs are int64 positions: more than 2^32 keys are
fine, as long as no chunk holds 2^32 keys or more.

**Hot keys**: a second, GPU-resident tier: a cgRX index over the hottest keys with all their row IDs, so that a
point query (:meth:`ChunkedIndex.lookup`, ``lookup_all``, ``aggregate``, the capped form) for a hot key gets its
complete answer without touching a chunk; the other queries go through the chunks (sorted by key, so that each
chunk's queue reads its memory in address order: ``SORT_TIER_MISSES``), ranges always do. Skewed
lookups of hashed IDs touch every chunk, so a key-range cache alone cannot serve them from the GPU. Which keys:
learned from the point batches (a sample of each counted into decayed per-key counts; keys counted at least twice
are candidates, keys seen once too where that adds a useful share), the tier rebuilt (its keys' rows fetched
through the chunks, one batch) only when the candidates would answer clearly more of a batch than the tier did,
what they would answer estimated by Good-Turing (raw counts credit uniform IDs that repeat by chance); or given
with :meth:`ChunkedIndex.warm`. Like a chunk's, the tier's pairs hold row offsets from its smallest row where
its rows span less than 2^32 (else a row map). Its reservation, ``hot_keys`` x (12 bytes of learning candidate
plus :meth:`ChunkedIndex._hot_pair_bytes`: 14 bytes for packed_row pairs, 18 for aligned_row, 8 more where row
IDs reach 2^32), is taken from ``gpu_budget`` and holds ``hot_keys`` pairs (fewer once updates hand out row IDs
past 2^32, where the tier needs a row map the reservation did not price); a tier given by
``warm(learn=False)`` keeps no candidates, so the same bytes hold :attr:`ChunkedIndex.hot_capacity_given` pairs.
Its keys stay in host memory in their priority order, over which an update rebuilds it from the new chunks.

**Updates** (:meth:`ChunkedIndex.update`): the batch is routed to the chunks it touches; semantics are
:meth:`UpdatableCgRXIndex.update`'s. By default each touched chunk is rebuilt from its pairs plus the batch's
insertions minus its deletions (cost: the touched chunks' sizes, not the batch's). With ``updatable=True`` each
chunk holds :class:`UpdatableCgRXIndex`'s node chains (row IDs stored as offsets from the chunk's smallest, so
global row order is chain order), and a chunk's share is planned and then applied in place: a batch costs its
own size plus one pass over the touched chunks' node headers (the plan visits every bucket), with no sort, build
or copy of a chunk, so a random batch over all chunks no longer rebuilds the whole index. A chunk is rebuilt
instead when its share needs more nodes than its slack (``growth``), when it grows past twice the chunk size
(unless it holds one key's run, which no cut can split), or when its rows span 2^32 or more (a row map, in
global row order, that insertions cannot extend). Either way a chunk that outgrew twice the chunk size is split
and an emptied one dropped. All-or-nothing: every touched
chunk is planned (and rebuilt ones built) before anything changes; the in-place applies save the chains they
touch first and restore them on any error; chunks are swapped and cached copies of changed chunks evicted only
after every chunk succeeded.

**Files** (:meth:`ChunkedIndex.save`, :meth:`ChunkedIndex.open`): a directory with one file per chunk and a
manifest (sizes and CRC-32 of every chunk file) per generation, and ``CURRENT`` naming the live manifest. A save
writes a new generation and then replaces ``CURRENT`` atomically, so a reader sees the old or the new state;
the previous generation is kept for readers that opened it. Opening loads no chunk: each is read (and checked)
on first use. A corrupt or truncated chunk file raises an error naming the file; a chunk file's header names its
kind (sorted pairs or node chains). The manifest is version 3 where a chunk of sorted pairs holds row offsets
(older code would answer them without the chunk's base), else version 2 for an updatable index, else version 1.

Without CUDA, or with ``device="cpu"``, the same code serves everything on the CPU; a positive ``gpu_budget``
then makes the "cache" a second CPU copy, so the cache and the scheduler run as they do on a GPU (the tests).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import threading
import time
import weakref
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ._base import VALUE_DTYPES, _ops, resolve_device
from ._grouping import group_by, partition_points
from ._keys import KEY_TYPES, MAX_KEYS, check_key_tensor, check_queries, resolve_key_type
from .cgrx import LAYOUTS, CgRXIndex, CgRXSearch
from .cgrx_updatable import (UpdatableCgRXIndex, _check_growth, bucket_offsets, cancel_batch, plan_insertions,
                              ranks_within, sort_pairs)
from .results import Aggregate, CappedMatches, Lookup, Matches, UpdateResult

TOP = -(2**63)  # XOR with this maps unsigned order (ordered keys) onto signed order (torch's sorts and searches)
I64_MAX = 2**63 - 1
_ALIGN = 256  # byte alignment of every tensor inside a chunk blob (and of cache slots)
# A chunk file's first bytes say its kind: sorted cgRX pairs, or node chains (updatable=True).
_MAGICS = {"pairs": b"RTXCHNK1", "nodes": b"RTXNODE1"}
_FORMAT = "torch_rtindex.ChunkedIndex"
# Version 2: an updatable index (node chunks); an index without updatable chunks still writes version 1, which
# older readers open, and version 1 manifests read as updatable=False. Version 3: some chunk of sorted pairs holds
# row offsets in its pairs and no row map (_build_chunk), which older readers would answer without the base.
_VERSIONS = (1, 2, 3)
_DTYPES = {"int32": torch.int32, "int64": torch.int64}
PROCESSORS = ("auto", "gpu", "cpu", "zero_copy")
EVICTIONS = ("demand", "lru")
# The hot tier's reservation per key of capacity: a candidate (key and score, 12 bytes) and about one
# (key, row ID) pair of the tier's index (ChunkedIndex._hot_pair_bytes: cgRX pair, search part, row map).
HOT_CANDIDATE_BYTES = 12
HOT_MAX_KEYS = 1 << 24
HOT_DECAY = 0.5  # a candidate's count halves every batch
HOT_REPEAT = 2.0  # a key counts as hot once its decayed count reaches this: a key seen once says nothing
HOT_USEFUL, HOT_PAUSE = 0.01, 8  # learning that finds under 1% of a batch worth a tier pauses for 8 batches
HOT_DRIFT = 0.02  # rebuild when the candidates would answer this share of a batch more than the tier did
HOT_SAMPLE_GPU, HOT_SAMPLE_CPU = 1 << 20, 1 << 16  # the default learning sample, by the queries' device
HOT_GT_EXACT = 5  # Good-Turing estimates for keys seen fewer times than this in a sample, raw counts above
# A chunk's search part, kept in GPU memory for its in-place reads: each lookup's first dependent reads (the
# representatives and the radix table) then stay off PCIe. Reserved for all chunks and a quarter more.
SEARCH_PARTS = ("reps", "table")
SEARCH_SLACK = 1.25
# The CPU worker answers small point queues in groups of about this many queries, one call over all cores (a
# queue alone would pay its call and a parallel region); the rest stay claimable, by the GPU too.
CPU_GROUP_QUERIES = 1 << 16
# A stale rate (below) is calibrated again only on a slice of at least this many lookups: a smaller one's time is
# mostly its fixed cost. The cache's rate is learned only from queues this large: a smaller cached queue's time is
# mostly the host issuing it while the GPU waits, which varies with the batch around it, so no fixed time fitted
# on one batch takes it out of another's (small cached queues of tiered batches once priced the cache below the
# in-place reads, and a uniform batch then read every chunk in place instead of copying: benchmarks/results/).
RATE_QUEUE = 1 << 14
# A point batch calibrates a lookup way's rate (the CPU's, in place, the cache's) again once RATE_STALE point batches
# have not timed it on a queue or call of RATE_QUEUE+ lookups: a rate that prices its way out of every plan is never
# measured by the batches, right or wrong (a calibration timed while the host was busy once priced the CPU at a
# tenth of its rate). A recalibration within RATE_CONFIRM of the way's last calibration doubles its wait for the
# next, up to RATE_STALE_MAX batches (a way rightly out of the plans, or one whose queues are all small, pays
# rarely); one that differs more, or a batch that times the rate, starts the wait over.
RATE_STALE, RATE_STALE_MAX, RATE_CONFIRM = 4, 64, 1.5
# A lookup way's rate that no calibration has set for a kind of batch (its queues too small to time one) is learned
# from the batches' samples of at least this many lookups (a calibration's smallest queue).
RATE_MIN_SAMPLE = 256
CALIBRATIONS_KEPT = 16  # lookup ways' calibrations stats() shows, the latest
# The in-place queues of a batch sorted by key (the tier's misses) go in one launch with at most about this many
# lookups in flight, swept queue by queue (cgrx_lookup_queues; 0: no limit); None: a launch per queue. Other
# batches' queues, in no order within a chunk, always get a launch per queue (and so do processors="zero_copy"
# batches, which were not measured so): every window measured for them was slower, their lookups in flight spread
# over more host memory than the GPU's address translation covers at speed (benchmarks/results/). The in-place
# rate's fit takes a launch for many queues as one sample, beside the per-queue samples of other batches.
IN_PLACE_WINDOW: int | None = 1 << 14
# The hot tier's misses go to the chunks sorted by key, so that within a chunk's queue the lookups read its memory
# in address order (the GPU's in-place reads, the CPU's searches) rather than all over it. False: as they come.
SORT_TIER_MISSES = True
# A batch sorted by key (the tier's misses) is already grouped by chunk: each chunk's queue is a run of it, found by
# a search of the chunk bounds, so the partition scatters nothing and every queue keeps the batch's full key order.
# False: partitioned like any other batch (on CUDA a queue then keeps its tiles together, not its order).
SORTED_RUNS = True
# In a batch sorted by key, the cached chunks' queues join the in-place queues' one launch (each with its cache slot's
# view: the launch takes views in GPU memory and in pinned host memory alike) rather than a launch each before it,
# so that the in-place reads start sooner. Such a launch is an in-place rate sample with the cached queues' share of its
# time taken out (their lookups at the cache's planned rate against the others' at the in-place one), and no sample
# of the cache's rate. False: a launch per cached queue.
GROUP_CACHED = True


def _calibration_slices(size: int, warm: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """A calibration's slices (offset, queries) of a queue of ``size`` queries: the warm-up's ``warm`` queries, then
    two timed slices (up to 2^15 lookups and an eighth of that), no query in two of them."""
    big = min((size - warm) * 8 // 9, 1 << 15)
    return (0, warm), [(warm, big), (warm + big, max(1, big // 8))]


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _cuda_ok() -> bool:
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------- chunk blobs
def _blob_specs(tensors: dict[str, torch.Tensor]) -> tuple[list[list], int]:
    """Where each tensor sits in a chunk's blob: [name, dtype, numel, byte offset], and the blob's size."""
    specs, off = [], 0
    for name, t in tensors.items():
        specs.append([name, str(t.dtype).removeprefix("torch."), int(t.numel()), off])
        off = _align(off + t.numel() * t.element_size())
    return specs, max(off, _ALIGN)


def _views(buf: torch.Tensor, specs: list[list]) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, numel, off in specs:
        dt = _DTYPES[dtype]
        size = numel * torch.empty(0, dtype=dt).element_size()
        out[name] = buf[off : off + size].view(dt)
    return out


def _search_bytes(specs: list[list]) -> int:
    """Bytes of a chunk's search part (SEARCH_PARTS) kept on the GPU, each part in a slot of aligned size."""
    return sum(_align(numel * torch.empty(0, dtype=_DTYPES[dtype]).element_size())
               for name, dtype, numel, _ in specs if name in SEARCH_PARTS)


def _pack(tensors: dict[str, torch.Tensor], pin: bool) -> tuple[torch.Tensor, list[list]]:
    """One host blob holding every tensor (copied asynchronously from CUDA: synchronize before reading it)."""
    specs, size = _blob_specs(tensors)
    buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    for (name, *_), view in zip(specs, _views(buf, specs).values()):
        view.copy_(tensors[name], non_blocking=True)
    return buf, specs


class _Chunk:
    """One key-range chunk: its host blob (or the file it is lazily read from) and what describes it."""

    def __init__(self, lo: int, n: int, base: int, kmin: int | None, kmax: int | None, specs: list[list], size: int,
                 host: torch.Tensor | None, file: dict | None = None, *, kind: str = "pairs", used: int = 0) -> None:
        self.lo = lo  # the range's first ordered key (int64 bit pattern); chunk 0's is ignored (it starts at 0)
        self.n, self.base, self.kmin, self.kmax = n, base, kmin, kmax
        self.specs, self.nbytes = specs, size
        self.host = host  # uint8 blob (pinned where CUDA is available), None until loaded from `file`
        self.file = file  # {"path", "size", "crc32"} when the chunk is (also) in a saved directory
        self.heat = 0.0
        self.host_view: _View | None = None
        self.mapped_view: _View | None = None  # processors="zero_copy": the host blob as the GPU addresses it
        self.lock = threading.Lock()
        self.kind = kind  # "pairs" (a CgRXIndex) or "nodes" (node chains, updated in place)
        self.used = used  # nodes: the region's nodes in use (the rest is slack for updates)

    def rows_in_place(self) -> bool:
        """Whether the pairs (or node chains) hold each row's offset from base: no row map (rows spanning < 2^32)."""
        return next(int(count) for name, _, count, _ in self.specs if name == "l2g") == 0


class _Mapped:
    """A pinned host tensor presented through ``__cuda_array_interface__`` (its address is valid on the GPU), so
    that ``torch.as_tensor(_Mapped(t), device="cuda")`` aliases it as a CUDA tensor; the tensor made keeps this
    object, and so ``t``, alive."""

    def __init__(self, t: torch.Tensor) -> None:
        if not t.is_pinned():
            raise ValueError("a zero-copy view needs pinned host memory")
        self.t = t
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "|u1", "data": (t.data_ptr(), False),
                                         "version": 3}


@dataclass
class _View:
    """A chunk's structure on one device: the cgRX index and how its rows become global ones (a base plus the
    pairs' offsets, or a local -> global row map)."""

    index: CgRXSearch  # CgRXIndex (pairs) or UpdatableCgRXIndex (nodes)
    l2g: torch.Tensor  # offsets from base: int32 holding unsigned 32-bit values, or int64
    base: int
    resident: int = 0  # bytes of the search part this view keeps in GPU memory (an in-place view)
    # Node chunks whose rows span < 2^32 store each row's offset from base itself (no map): an update inserts
    # a row by its offset, and the chains' (key, offset) order stays the (key, global row) order.
    # (Read-only chunks whose rows span < 2^32 likewise hold each row's offset from base in their pairs.)
    direct: bool = False

    def global_rows(self, local: torch.Tensor) -> torch.Tensor:
        """Local row IDs (int64; -1, no row, stays -1) as global ones, in one operator pass: every queue's
        answer goes through here, and the same steps as separate tensor operations cost a queue several
        launches (a GPU) or small passes (the CPU)."""
        return torch.ops.rtindex_internal.global_rows(local, self.l2g, self.base)

    @staticmethod
    def _widen(offsets: torch.Tensor) -> torch.Tensor:
        wide = offsets.to(torch.int64)
        return wide & 0xFFFFFFFF if offsets.dtype == torch.int32 else wide

    def global_first(self, first: torch.Tensor) -> torch.Tensor:
        if self.l2g.numel() == 0 and not self.direct:
            return first
        return self.global_rows(first)

    def all_rows(self) -> torch.Tensor:
        return self._widen(self.l2g) + self.base

    def values_fit(self, values: torch.Tensor) -> bool:
        """Whether the aggregate kernel takes :meth:`local_values`: it wants one value per pair, which values from
        base on lack where updates gave several pairs one row ID (those views sum through their CSR rows)."""
        return not self.direct or isinstance(self.index, UpdatableCgRXIndex) or values.numel() - self.base >= len(self.index)

    def local_values(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (indexed by global row) indexed by the chunk's local rows."""
        if self.direct:
            return values[self.base :]  # a view: local row r is global row base + r
        return values.index_select(0, self.all_rows()) if self.l2g.numel() else values[:0]


# ------------------------------------------------------------------------------------------------ the cache
class _Arena:
    """One slab of the cache's memory: one allocation of ``budget`` bytes, carved into slots (chunks first fit
    from the bottom, search parts from the top; coalescing). Chunks are copied into slots and read through views,
    so the cache never holds more than its budget and a slot is reused exactly when the GPU has finished the last
    lookup that read it (events, not the allocator)."""

    def __init__(self, budget: int, device: torch.device) -> None:
        self.budget, self.device = budget, device
        self.buf: torch.Tensor | None = None
        self.free = [(0, budget)]
        self.retired: list[tuple[int, int, Any]] = []  # (offset, size, last-use event) of evicted slots
        # (offset, size) of dropped views' slots, queued by the views' finalizers: those may run on any thread, in
        # the middle of an arena operation, so the arena's user takes them back (reclaim).
        self.dropped: deque = deque()

    def storage(self) -> torch.Tensor:
        if self.buf is None:
            try:
                self.buf = torch.empty(self.budget, dtype=torch.uint8, device=self.device)
            except torch.OutOfMemoryError as e:
                raise torch.OutOfMemoryError(
                    f"ChunkedIndex: the chunk cache of gpu_budget={self.budget} bytes does not fit on {self.device} "
                    f"next to what is allocated there; pass a smaller gpu_budget ({e})"
                ) from e
        return self.buf

    def reclaim(self) -> None:
        """Frees the slots of dropped views, once the device is done with them (views are dropped by updates,
        rarely: a device-wide wait is simpler than tracking the streams that read them)."""
        if self.dropped:
            if self.buf is not None and self.buf.is_cuda:
                torch.cuda.synchronize(self.device)
            while self.dropped:
                self.release(*self.dropped.popleft(), None)

    def alloc(self, size: int) -> int | None:
        self.reclaim()
        size = _align(size)
        for i, (off, length) in enumerate(self.free):
            if length >= size:
                if length == size:
                    del self.free[i]
                else:
                    self.free[i] = (off + size, length - size)
                return off
        return None

    def alloc_top(self, size: int) -> int | None:
        """A slot of ``size`` bytes carved from the top of the highest free space that holds it (chunks fill
        from the bottom, so the two kinds of slot stay apart)."""
        self.reclaim()
        size = _align(size)
        for i in range(len(self.free) - 1, -1, -1):
            off, length = self.free[i]
            start = off + length - size
            if start >= off:
                if start == off:
                    del self.free[i]
                else:
                    self.free[i] = (off, length - size)
                return start
        return None

    def release(self, off: int, size: int, event: Any) -> None:
        size = _align(size)
        if event is not None:
            self.retired.append((off, size, event))
        self.free.append((off, size))
        self.free.sort()
        merged = [self.free[0]]
        for o, s in self.free[1:]:
            if merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged

    def events_over(self, off: int, size: int) -> list:
        """The last-use events of evicted slots overlapping [off, off + size) (completed ones are forgotten)."""
        self.retired = [r for r in self.retired if not r[2].query()]
        return [ev for o, s, ev in self.retired if o < off + size and off < o + s]


@dataclass
class _Entry:
    chunk: _Chunk
    arena: _Arena  # the slab its slot is in
    off: int
    view: _View
    ready: Any = None  # event: the copy into the slot is done
    last_use: Any = None  # event: the last lookup reading the slot is done
    tick: int = 0


class ChunkCache:
    """The fast tier: whole chunks within a byte budget, none twice.

    Eviction (``policy="demand"``, the default): the chunk with the least demand still pending in the current
    batch, then the least heat (its queue sizes over past batches, exponentially averaged), then the least
    recently used; ``policy="lru"``: least recently used only. A chunk larger than the budget is never cached
    (its queues go to the CPU).

    Its memory is a slab (``arena``) of ``budget`` bytes and, with ``spare``, a second one (``shared``) whose
    room :meth:`place_top` carves slots from, top first, for the index's search parts: chunks use it too while
    those do not need the room, and are evicted from it when they do. A chunk up to ``budget`` always fits the
    first. Each slab is allocated on first use."""

    def __init__(self, budget: int, device: torch.device, policy: str = "demand", spare: int = 0) -> None:
        self.budget, self.device, self.policy = budget, device, policy
        self.arena = _Arena(budget, device)
        self.shared = _Arena(spare, device) if spare > 0 else None
        self.arenas = [self.arena] + ([self.shared] if self.shared is not None else [])
        self.entries: dict[_Chunk, _Entry] = {}
        self.tick = 0

    def __contains__(self, chunk: _Chunk) -> bool:
        return chunk in self.entries

    def used(self) -> int:
        return sum(_align(e.chunk.nbytes) for e in self.entries.values())

    def victim_order(self, demand: dict[_Chunk, int]) -> list[_Chunk]:
        """Resident chunks, the first to evict first."""
        if self.policy == "lru":
            key = lambda c: self.entries[c].tick  # noqa: E731
        else:
            key = lambda c: (demand.get(c, 0), c.heat, self.entries[c].tick)  # noqa: E731
        return sorted(self.entries, key=key)

    def evict(self, chunk: _Chunk) -> None:
        e = self.entries.pop(chunk)
        # A slot copied into but not yet read is free once its copy is done (its reader may be another stream).
        e.arena.release(e.off, chunk.nbytes, e.last_use if e.last_use is not None else e.ready)

    def place_top(self, size: int) -> int | None:
        """A slot of ``size`` bytes in the shared slab, evicting chunks there (by the policy, without a batch's
        demand) until one fits; None if it cannot hold it. Write it only after the last uses of the chunks it
        overlaps (``shared.events_over``)."""
        if self.shared is None:
            return None
        off = self.shared.alloc_top(size)
        while off is None:
            there = [c for c in self.victim_order({}) if self.entries[c].arena is self.shared]
            if not there:
                return None
            self.evict(there[0])
            off = self.shared.alloc_top(size)
        return off

    def _alloc(self, size: int) -> tuple[_Arena, int] | None:
        for arena in self.arenas:
            off = arena.alloc(size)
            if off is not None:
                return arena, off
        return None

    def make_room(self, chunk: _Chunk, demand: dict[_Chunk, int]) -> tuple[tuple[_Arena, int] | None, int]:
        """A slot (slab, offset) for ``chunk``, evicting by the policy as needed, and how many chunks were evicted;
        None if it cannot fit at all."""
        if _align(chunk.nbytes) > self.budget:
            return None, 0
        evicted = 0
        slot = self._alloc(chunk.nbytes)
        while slot is None and self.entries:
            self.evict(self.victim_order(demand)[0])
            evicted += 1
            slot = self._alloc(chunk.nbytes)
        return slot, evicted

    def allocated(self) -> int:
        """Bytes of the slabs allocated so far."""
        return sum(a.budget for a in self.arenas if a.buf is not None)

    def clear(self) -> None:
        for c in list(self.entries):
            self.evict(c)


# -------------------------------------------------------------------------------------------- the scheduler
@dataclass
class _Task:
    chunk: _Chunk
    start: int  # the queue is entries start .. start + size of the partitioned batch
    size: int
    resident: bool
    fits: bool
    proc: str = ""
    result: tuple = ()
    grouped: bool = False  # the CPU answers it in one call with others (ChunkedIndex._groups)


@dataclass(frozen=True)
class Rates:
    """What the planner assumes of the machine: CPU lookups/s (from the host copies), bytes/s copied into the
    cache, GPU lookups/s (from the cache) and GPU lookups/s reading a chunk in place in pinned host memory
    (``in_place``; 0: not an option for this batch); and the fixed seconds of a CPU call (``cpu_call_s``), a GPU
    queue served from the cache (``gpu_queue_s``) and one read in place (``in_place_queue_s``): a queue costs its
    fixed time plus its lookups at the rate; the CPU's grouped queues pay a call per CPU_GROUP_QUERIES of them,
    whole calls (:meth:`cpu_end`)."""

    cpu: float
    copy: float
    gpu: float
    in_place: float = 0.0
    cpu_call_s: float = 0.0
    gpu_queue_s: float = 0.0
    in_place_queue_s: float = 0.0

    def cpu_s(self, t: _Task) -> float:
        """``t``'s CPU seconds alone (a grouped queue: its share of a call's fixed time)."""
        seconds, grouped = self.cpu_part(t)
        return seconds + self.cpu_call_s * grouped / CPU_GROUP_QUERIES

    def cpu_part(self, t: _Task) -> tuple[float, int]:
        """``t``'s CPU seconds but a grouped queue's call, and its queries that join a group (for cpu_finish). A
        queue of CPU_GROUP_QUERIES or more is answered alone, in one call."""
        grouped = t.grouped and t.size < CPU_GROUP_QUERIES
        return t.size / self.cpu + (0.0 if grouped else self.cpu_call_s), t.size if grouped else 0

    def cpu_finish(self, seconds: float, grouped: int) -> float:
        """The CPU's finish with ``seconds`` of cpu_part and ``grouped`` queries in groups: whole calls each (an
        upper bound: the CPU fills a call up to twice that, see ChunkedIndex._cpu_loop)."""
        return seconds + self.cpu_call_s * math.ceil(grouped / CPU_GROUP_QUERIES)

    def cpu_load(self, tasks: list[_Task]) -> tuple[float, int]:
        """``tasks``' cpu_part summed."""
        parts = [self.cpu_part(t) for t in tasks]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def cpu_end(self, tasks: list[_Task]) -> float:
        return self.cpu_finish(*self.cpu_load(tasks))

    def _copied_s(self, t: _Task) -> float:
        # Copies overlap the previous queue's lookups (copy stream, double buffering): a queue costs the GPU the
        # slower of its two stages.
        copy = 0.0 if t.resident else _align(t.chunk.nbytes) / self.copy
        return max(copy, self.gpu_queue_s + t.size / self.gpu)

    def _in_place_s(self, t: _Task) -> float:
        return self.in_place_queue_s + t.size / self.in_place

    def reads_in_place(self, t: _Task) -> bool:
        """Whether the GPU answers ``t`` reading its chunk where it is rather than copying it in: a queue too small
        to pay for its chunk's copy (never a cached chunk's; on a tie, in place: a copy would evict)."""
        return self.in_place > 0 and not t.resident and self._in_place_s(t) <= self._copied_s(t)

    def gpu_s(self, t: _Task) -> float:
        return self._in_place_s(t) if self.reads_in_place(t) else self._copied_s(t)


class _CostFit:
    """One way's time per queue or call, t = fixed + n / rate, fitted to (n lookups, t seconds) samples by least
    squares; the sums halve with every batch that brings the way samples (decay), so recent batches count most
    while sizes seen earlier still anchor the slope. Where the sizes barely vary the two cannot be told apart:
    samples whose time is mostly the fixed time (under twice it) then refine only the fixed time, the others only
    the rate. Calibrations time two sizes, so a fit starts with both."""

    SPREAD = 0.25  # a two-parameter fit needs sizes whose deviation is at least this share of their mean

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.w = self.sn = self.st = self.snn = self.snt = 0.0

    def decay(self) -> None:
        self.w, self.sn, self.st, self.snn, self.snt = (0.5 * x for x in (self.w, self.sn, self.st, self.snn, self.snt))

    def add(self, n: float, t: float) -> None:
        """Adds a sample (one without lookups or time is ignored)."""
        if n > 0 and t > 0 and math.isfinite(t):
            self.w, self.sn, self.st = self.w + 1, self.sn + n, self.st + t
            self.snn, self.snt = self.snn + n * n, self.snt + n * t

    def solve(self, fixed: float, rate: float) -> tuple[float, float, bool]:
        """(fixed seconds, lookups/s, whether the samples set the rate) from the samples, given the current ones
        (rate 0: none yet); False: they refined the fixed time only, the rate kept."""
        if self.w <= 0 or self.st <= 0:
            return fixed, rate, False
        mn, mt = self.sn / self.w, self.st / self.w
        var, cov = max(self.snn / self.w - mn * mn, 0.0), self.snt / self.w - mn * mt
        if var > (self.SPREAD * mn) ** 2 and cov > 0:
            slope = cov / var  # > 0, so mt - slope * mn < mt
            fixed = mt - slope * mn
            return (fixed, 1 / slope, True) if fixed >= 0 else (0.0, mn / mt, True)
        if mt >= 2 * fixed or rate <= 0:
            return fixed, mn / (mt - fixed), True  # mt - fixed >= mt / 2 > 0
        return max(mt - mn / rate, 0.0), rate, False


def _balance(forced: list[_Task], free: list[_Task], rates: Rates) -> tuple[list[_Task], list[_Task]]:
    """The greedy makespan balance of :func:`plan`, then single moves from the processor that ends last to the
    other while a move ends the batch earlier (the greedy order can leave one)."""
    # The CPU's load as (seconds, grouped queries): its finish counts whole calls of grouped queries (Rates).
    on_gpu: list[_Task] = []
    on_cpu = list(forced)
    g_end, (c_sec, c_grp) = 0.0, rates.cpu_load(forced)
    c_end = rates.cpu_finish(c_sec, c_grp)

    def cpu_with(t: _Task, sign: int) -> tuple[float, int, float]:
        sec, grp = rates.cpu_part(t)
        sec, grp = c_sec + sign * sec, c_grp + sign * grp
        return sec, grp, rates.cpu_finish(sec, grp)

    def edge(t: _Task) -> float:
        g = rates.gpu_s(t)
        return rates.cpu_s(t) / g if g > 0 else float("inf")

    for t in sorted(free, key=lambda t: (-edge(t), -t.size)):
        g, (sec, grp, c) = g_end + rates.gpu_s(t), cpu_with(t, 1)
        if c < g:
            on_cpu.append(t)
            c_sec, c_grp, c_end = sec, grp, c
        else:
            on_gpu.append(t)
            g_end = g
    for _ in range(len(free)):
        if c_end > g_end:
            moves = [(max(g_end + rates.gpu_s(t), cpu_with(t, -1)[2]), i) for i, t in enumerate(on_cpu) if t.fits]
        else:
            moves = [(max(g_end - rates.gpu_s(t), cpu_with(t, 1)[2]), i) for i, t in enumerate(on_gpu)]
        if not moves or min(moves)[0] >= max(g_end, c_end):
            break
        _, i = min(moves)
        if c_end > g_end:
            t = on_cpu.pop(i)
            on_gpu.append(t)
            g_end = g_end + rates.gpu_s(t)
            c_sec, c_grp, c_end = cpu_with(t, -1)
        else:
            t = on_gpu.pop(i)
            on_cpu.append(t)
            g_end = g_end - rates.gpu_s(t)
            c_sec, c_grp, c_end = cpu_with(t, 1)
    return on_gpu, on_cpu


def plan(tasks: list[_Task], rates: Rates, *, gpu: bool = True, cpu: bool = True,
         critical_mass: int | None = None) -> tuple[list[_Task], list[_Task]]:
    """Which processor serves each queue: (the GPU's queues in serving order, the CPU's).

    A queue whose chunk does not fit the cache is the CPU's. With ``critical_mass`` set, the GPU takes the
    resident queues and the others of at least that size. Otherwise a greedy makespan balance: queues in order of
    how much more the CPU would spend on them than the GPU (CPU seconds / GPU seconds, largest first), each to the
    processor whose projected finish, with the queue added, is earlier (the GPU on a tie); then single queues
    move from the processor that ends last while that ends the batch earlier. So the CPU keeps no queue whose
    move to the GPU would end the batch sooner."""
    forced = [t for t in tasks if not t.fits]
    free = [t for t in tasks if t.fits]
    if not gpu:
        on_gpu, on_cpu = [], forced + free
    elif not cpu:
        on_gpu, on_cpu = free, forced
    elif critical_mass is not None:
        on_gpu = [t for t in free if t.resident or t.size >= critical_mass]
        on_cpu = forced + [t for t in free if not (t.resident or t.size >= critical_mass)]
    else:
        on_gpu, on_cpu = _balance(forced, free, rates)
    # The GPU serves its resident queues first (no copy to wait for), then the largest; the CPU the smallest first
    # (its last queues are the ones the GPU may take over when it runs out of work).
    on_gpu.sort(key=lambda t: (not t.resident, -t.size))
    on_cpu.sort(key=lambda t: (t.fits, t.size))
    return on_gpu, on_cpu


class _Scheduler:
    """One batch's queues, planned (:func:`plan`) and then handed out on demand: each processor, when ready,
    takes the next queue of its own list; one that has run out takes the last queue of the other's list if it
    would finish it before the other would have got through its remaining list (the measured rates can be
    off)."""

    def __init__(self, tasks: list[_Task], gpu: bool, cpu: bool, rates: Rates, critical_mass: int | None = None):
        self.gpu, self.cpu, self.rates = gpu, cpu, rates
        self.own = dict(zip(("gpu", "cpu"), plan(tasks, rates, gpu=gpu, cpu=cpu, critical_mass=critical_mass)))
        self.planned = {p: sum(t.size for t in q) for p, q in self.own.items()}
        self.lock = threading.Lock()
        self.abort = False

    @property
    def tasks(self) -> list[_Task]:
        return self.own["gpu"] + self.own["cpu"]

    def demand(self) -> dict[_Chunk, int]:
        with self.lock:
            return {t.chunk: t.size for t in self.tasks}

    def _cost(self, proc: str, tasks: list[_Task]) -> float:
        # A queue the CPU takes over is answered alone: a whole call (cpu_end), not a grouped share.
        return sum(self.rates.gpu_s(t) for t in tasks) if proc == "gpu" else self.rates.cpu_end(tasks)

    def claim(self, proc: str) -> _Task | None:
        with self.lock:
            if self.abort:
                return None
            mine = self.own[proc]
            best = mine.pop(0) if mine else None  # the GPU's list holds only queues whose chunk fits the cache
            if best is None and self.gpu and self.cpu:
                other_name = "cpu" if proc == "gpu" else "gpu"
                other = self.own[other_name]
                cand = next((t for t in reversed(other) if proc == "cpu" or t.fits), None)
                if cand is not None:
                    if self._cost(proc, [cand]) < self._cost(other_name, other):
                        other.remove(cand)
                        best = cand
            if best is not None:
                best.proc = proc
            return best

    def claim_more(self, proc: str, fits_group, limit: int | None = None, needs=None) -> list[_Task]:
        """More of ``proc``'s own queues to serve with one it has claimed, in one call: those ``fits_group``
        accepts, in list order, until their sizes reach ``limit`` (None: all); with ``needs``, none unless one of
        them is a queue ``needs`` accepts."""
        with self.lock:
            if self.abort:
                return []
            taken, kept, size = [], [], 0
            for t in self.own[proc]:
                if (limit is None or size < limit) and fits_group(t):
                    taken.append(t)
                    size += t.size
                else:
                    kept.append(t)
            if needs is not None and not any(needs(t) for t in taken):
                return []
            for t in taken:
                t.proc = proc
            self.own[proc] = kept
            return taken


# ---------------------------------------------------------------------------------------------- the index
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
            in place (module doc). Default: half the free GPU memory at construction;
            on the CPU, 0 (no cache tier: the CPU serves from the host copy). A positive budget smaller than the
            largest chunk is an error. The budget bounds the cache (and the build's GPU sort), not the queries'
            and answers' buffers of a batch.
        device: the cache's device: ``"cuda"`` (default where available) or ``"cpu"``.
        bucket_size, layout: each chunk's cgRX parameters (default 16, ``"packed_row"``: the fewest bytes to copy).
        backend: ``"radix"`` (default) or ``"binary_search"``: representative searches whose structure is plain
            data that can be copied between devices (an OptiX scene is bound to a device address).
        processors: ``"auto"`` (GPU and CPU together where there is a cache, else the CPU), ``"gpu"`` (the cache
            only, every chunk copied in as needed; a chunk larger than the cache is still answered by the CPU),
            ``"cpu"`` (the host copies only) or ``"zero_copy"`` (CUDA only: the GPU's kernels read each queue's
            chunk in pinned host memory directly, over PCIe, without the cache: the comparison the chunk cache
            is measured against). An attribute: change it between batches.
        critical_mass: ``None`` (default): queues planned by measured rates (module doc, :func:`plan`); an int:
            the GPU takes cached chunks' queues and others of at least this size, the CPU the rest. An attribute.
        eviction: ``"demand"`` (default) or ``"lru"`` (see :class:`ChunkCache`).
        pipeline_depth: queues the GPU has in flight at once (2: double buffering).
        hot_keys: capacity (keys) of the hot tier (module doc), which answers point queries for the hottest keys
            completely on the queries' device. ``None`` (default): a sixteenth of ``gpu_budget`` at its bytes per
            key (module doc; at most 2^24 keys), taken from the chunk cache, if the rest still holds two chunks; 0: off. The
            attributes ``hot_tier`` (use it) and ``hot_learn`` (learn its keys) switch it per batch.
        hot_sample: queries per batch the hot-key tier learns from (a random sample of the batch). ``None``
            (default): 2^20 where the queries are on a GPU, 2^16 on the CPU, where counting a larger sample
            costs more than the hits it adds (``benchmarks/results/``). An attribute.
        progress: show a progress bar (tqdm, if installed) for builds that take more than a few seconds;
            ``None``: when stderr is a terminal.
        updatable: ``False`` (default): each chunk is a read-only cgRX index (sorted pairs), and an update
            rebuilds every chunk it touches. ``True``: each chunk holds the node chains of
            :class:`UpdatableCgRXIndex` (``bucket_size`` and ``layout`` then only shape the hot tier), and an
            update applies in place to the chunks it touches (module doc, **Updates**).
        node_size, growth: the node chunks' pairs per node (even, 2 .. 4096) and spare node space (a factor in
            1 .. 16) reserved at each chunk's build for in-place updates (``updatable=True`` only).

    The attribute ``read_in_place`` (``None``, ``True`` or ``False``) says whether the planned ``"auto"`` serving
    may have the GPU answer a queue by reading its chunk in pinned host memory instead of copying it in, where
    the measured rates say that is faster (small queues): ``None`` (default) where the chunks are pinned and
    the cache is on CUDA; ``True`` also on a CPU index (reading the host copy: what the tests run).

    Lookups: :meth:`lookup`, :meth:`lookup_all`, :meth:`lookup_all_capped`, :meth:`range`, :meth:`range_capped`,
    :meth:`range_lookup`, :meth:`aggregate`, :meth:`range_aggregate` with the answers :class:`CgRXIndex` gives
    over the same keys (range rows in (key, row ID) order), for query batches on the CPU or on ``device``; answers
    come on the queries' device. Every batch synchronizes with the host (queue sizes), so none can be captured in
    a CUDA graph; the capped forms compute the full answer and cut it. One batch at a time: the index runs its
    own CPU worker per batch, but two threads calling it at once would share its cache unsafely.
    """

    range_rows_ascending = False
    #: keys sorted at once by the build (None: from the budget on CUDA, all on the CPU); tests set it to run the
    #: splitter-range build on the CPU
    _build_range_keys: int | None = None

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        chunk_bytes: int = 256 << 20,
        gpu_budget: int | None = None,
        device: torch.device | str | None = None,
        bucket_size: int = 16,
        layout: str = "packed_row",
        backend: str = "radix",
        processors: str = "auto",
        critical_mass: int | None = None,
        eviction: str = "demand",
        pipeline_depth: int = 2,
        hot_keys: int | None = None,
        hot_sample: int | None = None,
        progress: bool | None = None,
        updatable: bool = False,
        node_size: int = 32,
        growth: float = 1.25,
    ) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        self._configure(key_type=resolve_key_type(keys, key_type), key_dtype=keys.dtype, chunk_bytes=chunk_bytes,
                        gpu_budget=gpu_budget, device=device, bucket_size=bucket_size, layout=layout,
                        backend=backend, processors=processors, critical_mass=critical_mass, eviction=eviction,
                        pipeline_depth=pipeline_depth, hot_keys=hot_keys, hot_sample=hot_sample,
                        updatable=updatable, node_size=node_size, growth=growth)
        check_key_tensor(keys, "keys", dtype=self.key_dtype, device=keys.device)
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError("keys contain NaN, which has no place in a key order; drop or replace those rows")
        t0 = time.perf_counter()
        self._build(keys, progress)
        self._stats["time_s"]["build"] = time.perf_counter() - t0
        self._setup_tiers()

    # ------------------------------------------------------------------------------------------ configuration
    def _configure(self, *, key_type, key_dtype, chunk_bytes, gpu_budget, device, bucket_size, layout, backend,
                   processors, critical_mass, eviction, pipeline_depth, hot_keys, hot_sample, updatable=False,
                   node_size=32, growth=1.25) -> None:
        if not isinstance(updatable, bool):
            raise TypeError(f"updatable must be True or False, got {updatable!r}")
        if isinstance(node_size, bool) or not isinstance(node_size, int) or not 2 <= node_size <= 4096 or node_size % 2:
            raise ValueError(f"node_size must be an even integer in 2 .. 4096, got {node_size!r}")
        self.updatable, self.node_size, self.growth = updatable, node_size, _check_growth(growth)
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be an integer of at least 1024, got {chunk_bytes!r}")
        if not isinstance(bucket_size, int) or not 1 <= bucket_size <= 2**16:
            raise ValueError(f"bucket_size must be an integer in 1 .. 65536, got {bucket_size!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        if backend not in ("radix", "binary_search"):
            raise ValueError(
                f"backend must be 'radix' or 'binary_search', got {backend!r} (chunks move between host and GPU, "
                "and an OptiX scene is bound to its device address)"
            )
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")
        if not isinstance(pipeline_depth, int) or pipeline_depth < 1:
            raise ValueError(f"pipeline_depth must be a positive integer, got {pipeline_depth!r}")
        if hot_keys is not None and (isinstance(hot_keys, bool) or not isinstance(hot_keys, int) or hot_keys < 0):
            raise ValueError(f"hot_keys must be None (automatic) or a non-negative integer, got {hot_keys!r}")
        _check_hot_sample(hot_sample)
        dev = resolve_device(device if device is not None else ("cuda" if _cuda_ok() else "cpu"))
        if dev.type == "cuda" and not _cuda_ok():
            raise ValueError("device='cuda' but CUDA is not available; pass device='cpu'")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {dev}")
        if gpu_budget is None:
            gpu_budget = int(torch.cuda.mem_get_info(dev)[0] * 0.5) if dev.type == "cuda" else 0
        if isinstance(gpu_budget, bool) or not isinstance(gpu_budget, int) or gpu_budget < 0:
            raise ValueError(f"gpu_budget must be a non-negative number of bytes, got {gpu_budget!r}")
        self.key_type, self.key_dtype, self.device = key_type, key_dtype, dev
        self.chunk_bytes, self.bucket_size, self.layout, self.backend = chunk_bytes, bucket_size, layout, backend
        self.gpu_budget = gpu_budget
        self.processors = processors
        self.critical_mass = critical_mass
        self.pipeline_depth = pipeline_depth
        self._eviction, self._hot_request, self.hot_sample = eviction, hot_keys, hot_sample
        self._cache: ChunkCache | None = None  # made by _setup_tiers, once the chunk sizes are known
        self.hot_capacity = 0
        self._search_budget = 0  # bytes for search parts kept on the GPU (_setup_tiers)
        self.hot_tier = True  # an attribute: False serves every query through the chunks (the tier is kept)
        self.hot_learn = True  # an attribute: False keeps the tier's keys as they are (see warm)
        self._clear_hot()
        self._pin = _cuda_ok()
        self._set_chunks([])
        self._n = 0
        self._next_row = 0
        self._rows_are_positions = True
        self._copy_stream = None
        self._io_stream = None
        self._cpu_rate = 4e6 * torch.get_num_threads()  # queries/s: a guess until the first measurement
        self._copy_rate = 25e9 if dev.type == "cuda" else 5e9  # bytes/s: likewise
        self._gpu_rate = 1e9 if dev.type == "cuda" else self._cpu_rate  # lookups/s from the cache: likewise
        self._in_place_rate = 0.0  # lookups/s reading a chunk in place: measured before it is ever planned with
        # Each way's fixed seconds per call or queue, fitted beside its rate (_CostFit; Rates' *_s fields).
        self._fixed_s = {"cpu": 0.0, "gpu": 0.0, "in_place": 0.0}
        self._fits = {name: _CostFit() for name in self._fixed_s}
        # Per rate: False (a guess), "other" (measured on CSR, range or aggregate batches) or "points" (on point
        # lookups, the workload the rates are for: a CSR or range query's rows cost more, so a rate from such a
        # batch, like warm()'s row fetch, serves only until a point batch measures it).
        self._measured = {"cpu": False, "copy": False, "gpu": False, "in_place": False}
        self._calibrated: set = set()  # (rate, points) _calibrate has measured (each once; batches measure them after)
        self._rate_age = {"cpu": 0, "in_place": 0, "gpu": 0}  # point batches since a point batch measured the rate
        self._stale_after = dict.fromkeys(self._rate_age, RATE_STALE)  # the age that calibrates it again
        self._calibrated_rate: dict[str, float] = {}  # each lookup way's rate as its last point calibration set it
        self.read_in_place: bool | None = None  # an attribute: see the class doc
        self._fault: Any = None  # test hook: called with a stage name, may raise (fault injection)
        self.reset_stats()

    def _setup_tiers(self) -> None:
        """Splits gpu_budget between the hot-key tier and the chunk cache, now that the chunk sizes are known."""
        largest = _align(max(c.nbytes for c in self._chunks))
        budget = self.gpu_budget
        if budget and largest > budget:
            raise ValueError(
                f"gpu_budget={budget} bytes holds no chunk: the largest chunk takes {largest} bytes; "
                "raise gpu_budget, lower chunk_bytes (a run of equal keys always stays in one chunk), or pass "
                "gpu_budget=0 to serve from host memory only"
            )
        cap = self._hot_request
        self._hot_reserved_pair = self._hot_pair_bytes()
        per_key = HOT_CANDIDATE_BYTES + self._hot_reserved_pair
        if cap is None:  # automatic: a sixteenth of the budget, if the rest still holds two chunks
            cap = min(HOT_MAX_KEYS, budget // 16 // per_key)
            if budget - cap * per_key < 2 * largest:
                cap = 0
        elif budget and budget - cap * per_key < largest:
            raise ValueError(
                f"hot_keys={cap} takes {cap * per_key} bytes of gpu_budget={budget}, and the rest holds no "
                f"chunk (the largest takes {largest} bytes); lower hot_keys or raise gpu_budget"
            )
        self.hot_capacity = cap
        self._clear_hot()
        rest = budget - cap * per_key if budget else 0
        search = 0
        # Only where this index reads chunks in place: its processors at construction (or open) say so.
        if self.device.type == "cuda" and self._pin and rest and self.processors in ("auto", "zero_copy"):
            search = int(sum(_search_bytes(c.specs) for c in self._chunks) * SEARCH_SLACK)
            if rest - search < 2 * largest:
                search = 0
        self._search_budget = search
        arena = rest - search
        # The search parts' reservation is a slab of its own that chunks use until search parts need its room.
        self._cache = ChunkCache(arena, self.device, self._eviction, spare=search) if arena > 0 else None

    def _pair_bytes(self) -> int:
        """Bytes of one sorted (key, row) pair in the index's layout (csrc/cgrx/cgrx_core.h)."""
        return 16 if self.layout == "aligned_row" else 12

    def _hot_pair_bytes(self) -> int:
        """The tier's bytes per (key, row ID) pair: its cgRX pair, search part and, where the index's row IDs
        reach 2^32, a row map (_rebuild_hot)."""
        search = 8 // self.bucket_size + 2  # representatives, and under a byte of radix table
        return self._pair_bytes() + search + (8 if self._next_row > 2**32 else 0)

    def _bytes_per_key(self, rows: int) -> float:
        """Bytes per key of a chunk in an index whose row IDs lie below ``rows``."""
        if self.updatable:  # a node per node_size / 2 pairs (half full), growth times that, reps, table
            N = self.node_size
            return (3 * N + 2) * 4 * 2 / N * self.growth + 16 / N + 1
        row_map = 4 if rows > 2**32 else 0  # rows spanning < 2^32: the pairs hold row offsets (_build_chunk)
        return self._pair_bytes() + row_map + 8 / self.bucket_size + 1

    def _chunk_keys(self, rows: int) -> int:
        return max(1, int(self.chunk_bytes // self._bytes_per_key(rows)))

    def _work_device(self, keys: torch.Tensor) -> torch.device:
        """Where the build sorts: the cache's GPU (within the budget) when there is one, else the CPU."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _maybe_fault(self, stage: str) -> None:
        if self._fault is not None:
            self._fault(stage)

    # ------------------------------------------------------------------------------------------------ build
    def _map(self, keys: torch.Tensor) -> torch.Tensor:
        return _ops().map_keys(keys.contiguous(), KEY_TYPES[self.key_type])

    def _build(self, keys: torch.Tensor, progress: bool | None) -> None:
        n = keys.numel()
        W = self._work_device(keys)
        T = self._chunk_keys(n)
        if self._build_range_keys is not None:
            bucket_keys = self._build_range_keys
        elif W.type == "cuda":
            # ~64 bytes per key while a range is sorted (keys, positions, the sort's output and scratch), plus a
            # chunk's own build (~64 bytes per key of the chunk).
            bucket_keys = max(T, (self.gpu_budget - 64 * T) // 64) if self.gpu_budget else 1 << 26
        else:
            bucket_keys = max(n, 1)
        bar = _progress_bar(n, progress)
        chunks: list[_Chunk] = []
        if n <= bucket_keys:
            o = self._map(keys.to(W))
            sf, pos = torch.sort(o ^ TOP, stable=True)
            del o
            carry = self._cut(sf, pos, T, True, chunks)
            assert carry is None
            bar.update(n)
        else:
            carry = None
            for sf, pos, last in self._ranges(keys, W, bucket_keys, bar):
                if carry is not None:  # the previous range's tail: its keys are smaller than all of this range's
                    sf, pos = torch.cat([carry[0], sf]), torch.cat([carry[1], pos])
                carry = self._cut(sf, pos, T, last, chunks)
        if not chunks:
            chunks.append(self._build_chunk(torch.empty(0, dtype=torch.int64, device=W),
                                            torch.empty(0, dtype=torch.int64, device=W), 0))
        if W.type == "cuda":
            torch.cuda.current_stream(W).synchronize()  # the blobs were copied out asynchronously
        bar.close()
        self._set_chunks(chunks)
        self._n, self._next_row = n, n

    def _ranges(self, keys: torch.Tensor, W: torch.device, bucket_keys: int, bar):
        """The keys' (flipped ordered key, position) pairs sorted, one splitter range at a time; each range's keys
        are greater than every earlier range's (a key's copies all fall in one range). Yields (sf, pos, last)."""
        n = keys.numel()
        buckets = -(-n * 5 // (bucket_keys * 4))  # 1.25x as many as needed: sample noise stays under the limit
        gen = torch.Generator(device=keys.device).manual_seed(0x5EED)
        s = min(n, buckets * 1024)
        sample = self._map(keys[torch.randint(0, n, (s,), generator=gen, device=keys.device)]).to(W) ^ TOP
        sample = torch.sort(sample).values
        spl = torch.unique(sample[(torch.arange(1, buckets, device=W) * s) // buckets])  # sorted, distinct
        B = spl.numel() + 1
        piece = max(1, bucket_keys // 2)  # a piece and the next one's first tensors may be alive at once

        def pieces():
            for a in range(0, n, piece):
                b = min(n, a + piece)
                o = self._map(keys[a:b].to(W, non_blocking=True))
                yield a, o, torch.searchsorted(spl, o ^ TOP, right=True, out_int32=True)

        counts = torch.stack([torch.bincount(bid, minlength=B).cpu() for _, _, bid in pieces()])  # [pieces, B]
        counts = counts.to(torch.int64)
        per_bucket = counts.sum(0)
        bucket_start = torch.cumsum(per_bucket, 0) - per_bucket
        dest = bucket_start[None, :] + torch.cumsum(counts, 0) - counts  # [pieces, B]: where each piece's share goes
        hk = torch.empty(n, dtype=torch.int64)
        hp = torch.empty(n, dtype=torch.int32 if n <= 2**31 else torch.int64)  # positions: 4 bytes where they fit
        for p, (a, o, bid) in enumerate(pieces()):
            by_bucket = torch.sort(bid, stable=True).indices
            ok = o.index_select(0, by_bucket).cpu()
            op = (by_bucket + a).to(hp.dtype).cpu()
            src = 0
            for j, c in enumerate(counts[p].tolist()):
                d = int(dest[p, j])
                hk[d : d + c] = ok[src : src + c]
                hp[d : d + c] = op[src : src + c]
                src += c
        for j in range(B):
            a, c = int(bucket_start[j]), int(per_bucket[j])
            # Within a range the pairs are in position order (pieces in order, each grouped stably): a stable
            # sort by key gives (key, position) order.
            sf, perm = torch.sort(hk[a : a + c].to(W) ^ TOP, stable=True)
            pos = hp[a : a + c].to(W).index_select(0, perm).to(torch.int64)
            bar.update(c)
            yield sf, pos, j == B - 1

    def _cut(self, sf: torch.Tensor, pos: torch.Tensor, T: int, last: bool, out: list) -> tuple | None:
        """Cuts sorted pairs into chunks of about T keys, only between distinct keys; returns the tail that should
        join the next range (None on the last one)."""
        m, start = sf.numel(), 0
        while start < m:
            if m - start < T and not last:
                return sf[start:].clone(), pos[start:].clone()
            end = min(start + T, m)
            if end < m:
                end = int(torch.searchsorted(sf, sf[end - 1 : end], right=True))
            out.append(self._build_chunk(sf[start:end] ^ TOP, pos[start:end], int(sf[start]) ^ TOP if start < m else 0))
            start = end
        return None

    def _build_chunk(self, ordered: torch.Tensor, rows: torch.Tensor, lo: int) -> _Chunk:
        """A chunk over (ordered key, global row) pairs (any order): its cgRX structure over the keys in row
        order, so that local row order is global row order, and the local -> global map."""
        self._maybe_fault("build_chunk")
        if self.updatable:
            return self._build_node_chunk(ordered, rows, lo)
        rows_sorted, perm = torch.sort(rows)
        k = ordered.index_select(0, perm).contiguous()
        n = k.numel()
        pairs, reps, table = _ops().cgrx_build(k, self.bucket_size, LAYOUTS[self.layout])
        if n:
            flipped = torch.aminmax(k ^ TOP)
            kmin, kmax = int(flipped.min) ^ TOP, int(flipped.max) ^ TOP
        else:
            kmin = kmax = None
        if n >= 2**32 - 1:
            raise ValueError(f"a chunk would hold {n} keys (one key repeated that often?); a chunk holds < 2^32 - 1")
        base, l2g = _place_rows(pairs, self.layout, rows_sorted)
        blob, specs = _pack({"pairs": pairs, "reps": reps, "table": table, "l2g": l2g}, self._pin)
        return _Chunk(lo, n, base, kmin, kmax, specs, blob.numel(), blob)

    def _build_node_chunk(self, ordered: torch.Tensor, rows: torch.Tensor, lo: int) -> _Chunk:
        """An updatable chunk: the node chains of :class:`UpdatableCgRXIndex` (bulk-loaded half full, slack
        ``growth``) over the pairs. Rows spanning < 2^32 are stored as offsets from the smallest (no row map, so
        updates insert in place); wider spans get local rows in global row order and an int64 map, and every
        update of such a chunk rebuilds it."""
        n = ordered.numel()
        if n >= MAX_KEYS:
            raise ValueError(f"a chunk would hold {n} keys (one key repeated that often?); a chunk holds < 2^32 - 1")
        kmin = kmax = None
        base = last = 0
        if n:
            flipped = torch.aminmax(ordered ^ TOP)
            kmin, kmax = int(flipped.min) ^ TOP, int(flipped.max) ^ TOP
            span = torch.aminmax(rows)
            base, last = int(span.min), int(span.max)
        if last - base <= MAX_KEYS - 1:  # 2^32 - 1 is the node chains' "no row"
            local, l2g = rows - base, torch.empty(0, dtype=torch.int64, device=rows.device)
        else:
            rows_sorted, perm = torch.sort(rows, stable=True)
            ordered = ordered.index_select(0, perm)
            local, l2g = torch.arange(n, device=rows.device), rows_sorted - base
        nodes, reps, table, used = _ops().cgrx_nodes_load(ordered.contiguous(), local.to(torch.int32), self.node_size,
                                                          self.growth)
        blob, specs = _pack({"nodes": nodes, "reps": reps, "table": table, "l2g": l2g}, self._pin)
        return _Chunk(lo, n, base, kmin, kmax, specs, blob.numel(), blob, kind="nodes", used=int(used))

    # ------------------------------------------------------------------------------------- chunk structures
    def _host(self, chunk: _Chunk) -> torch.Tensor:
        """The chunk's host blob, read from its file on first use (checked: size, then CRC-32)."""
        if chunk.host is not None:
            return chunk.host
        with chunk.lock:
            if chunk.host is None:
                t0 = time.perf_counter()
                chunk.host = _read_chunk_file(chunk.file, chunk.nbytes, self._pin)
                with self._stats_lock:
                    self._stats["disk_loads"] += 1
                    self._stats["bytes_loaded"] += chunk.nbytes
                    self._stats["time_s"]["load"] += time.perf_counter() - t0
        return chunk.host

    def _mapped_view(self, chunk: _Chunk) -> _View:
        """The chunk's structure over its pinned host blob as the GPU addresses it (processors='zero_copy'): a
        CUDA tensor aliasing the host memory (pinned memory is mapped into the GPU's address space at the same
        address), so the lookup kernels read it over PCIe. Made once, as the host view."""
        view = chunk.mapped_view
        if view is None:
            buf = torch.as_tensor(_Mapped(self._host(chunk)), device=self.device)
            view = chunk.mapped_view = self._view(chunk, buf, resident=True)
        return view

    def _search_resident(self) -> int:
        return sum(c.mapped_view.resident for c in self._chunks if c.mapped_view is not None)

    def _resident_search(self, chunk: _Chunk, parts: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        """Copies of the chunk's search part (from its mapped blob) in the cache's shared slab (evicting cached
        chunks there), and that slot's offset; if the reservation has no room, none (the view reads them over
        PCIe too) and -1. Out of memory here is no error: the view reads in place."""
        need = _search_bytes(chunk.specs)
        cache = self._cache
        if need == 0 or cache is None or self._search_resident() + need > self._search_budget:
            return {}, -1
        try:
            buf = self._slab(cache.shared)
        except torch.OutOfMemoryError:
            return {}, -1
        off = cache.place_top(need)
        if off is None:
            return {}, -1
        stream = torch.cuda.current_stream(self.device)
        for ev in cache.shared.events_over(off, _align(need)):
            stream.wait_event(ev)  # the evicted chunks' last lookups (or copies) are done with the slot
        kept, at = {}, off
        for name in SEARCH_PARTS:  # each part at an aligned offset, as an allocation of its own would be
            src = parts[name]
            kept[name] = buf[at : at + src.nbytes].view(src.dtype)
            kept[name].copy_(src)
            at += _align(src.nbytes)
        return kept, off

    def _host_view(self, chunk: _Chunk) -> _View:
        """The chunk's structure over its host blob (made once; an in-place update of a node chunk drops it)."""
        view = chunk.host_view
        if view is None:
            view = chunk.host_view = self._view(chunk, self._host(chunk))
        return view

    def _view(self, chunk: _Chunk, buf: torch.Tensor, resident: bool = False) -> _View:
        t = _views(buf, chunk.specs)
        kept, slot = self._resident_search(chunk, t) if resident else ({}, -1)
        t.update(kept)
        nbytes = sum(_align(v.nbytes) for v in kept.values())
        view = self._chunk_view(chunk, t, nbytes)
        if slot >= 0:  # the slot goes back with the view (an update drops a changed chunk's views)
            weakref.finalize(view, self._cache.shared.dropped.append, (slot, nbytes)).atexit = False
        return view

    def _chunk_view(self, chunk: _Chunk, t: dict[str, torch.Tensor], nbytes: int) -> _View:
        span = None if chunk.kmin is None else (chunk.kmin, chunk.kmax)
        if chunk.kind == "nodes":  # looked up as UpdatableCgRXIndex does: layout "nodes" over the node region
            index = UpdatableCgRXIndex._from_structure(
                t["nodes"], t["reps"], t["table"], chunk.n, chunk.used, node_size=self.node_size,
                key_type=self.key_type, key_dtype=self.key_dtype, key_span=span, num_values=0, backend=self.backend,
            )
            return _View(index, t["l2g"], chunk.base, resident=nbytes, direct=chunk.rows_in_place())
        index = CgRXIndex._from_structure(
            t["pairs"], t["reps"], t["table"], chunk.n, key_type=self.key_type, key_dtype=self.key_dtype,
            key_span=span, bucket_size=self.bucket_size, layout=self.layout, backend=self.backend,
            cold=True,  # a chunk's queue comes once per batch: its lines are not in the CPU's caches
        )
        return _View(index, t["l2g"], chunk.base, resident=nbytes, direct=chunk.rows_in_place())

    def _decode(self, chunk: _Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's (ordered key, global row) pairs on the CPU, in key order."""
        view = self._host_view(chunk)
        p, n = view.index._pairs, chunk.n
        if chunk.kind == "nodes":  # chain order: (key, local row)
            keys, local = _ops().cgrx_nodes_export(p, self.node_size, view.index.num_buckets)
            local = local.to(torch.int64) & 0xFFFFFFFF
            return keys.clone(), view.global_rows(local) if n else local
        keys, local = _ops().cgrx_pairs_export(p, LAYOUTS[self.layout])  # row words: local rows or offsets
        return keys, view.global_rows(local) if n else local

    # ----------------------------------------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return self._n

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def _set_chunks(self, chunks: list[_Chunk]) -> None:
        self._chunks = chunks
        self._bounds_on: dict[torch.device, torch.Tensor] = {}

    def _bounds(self, device: torch.device) -> torch.Tensor:
        """The chunks' first ordered keys (flipped to signed order) after the first, on ``device``."""
        if device not in self._bounds_on:
            self._bounds_on[device] = torch.tensor([c.lo for c in self._chunks[1:]], dtype=torch.int64).to(device) ^ TOP
        return self._bounds_on[device]

    def _chunk_of(self, ordered: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self._bounds(ordered.device), ordered ^ TOP, right=True)

    def _run_ends(self, ordered: torch.Tensor) -> list[int]:
        """Where each chunk's run of ``ordered`` ends, for keys in the chunks' order (:func:`_key_sorted`): chunk
        j's queries are ordered[ends[j - 1] : ends[j]] (the same chunks as :meth:`_chunk_of`; a host sync)."""
        return torch.searchsorted(ordered ^ TOP, self._bounds(ordered.device)).tolist() + [ordered.numel()]

    def _check_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(lo, torch.Tensor):
            raise TypeError(f"queries must be a torch.Tensor, got {type(lo).__name__}")
        D = lo.device
        if D.type not in ("cpu", "cuda") or (D.type == "cuda" and self.device.type == "cuda" and D != self.device):
            raise ValueError(f"queries are on {D}; pass them on the CPU or on the index's device {self.device}")
        if D.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "ChunkedIndex lookups cannot be captured in a CUDA graph: every batch learns its queue sizes on the "
                "host (and copies chunks in as needed)"
            )
        lo, hi = check_queries(lo, hi, dtype=self.key_dtype, device=D, key_type=self.key_type)
        ops = _ops()
        if hi is None:
            return ops.map_keys(lo, KEY_TYPES[self.key_type]), None
        return ops.map_ranges(lo, hi, KEY_TYPES[self.key_type])

    def _check_values(self, values: torch.Tensor, device: torch.device) -> torch.Tensor:
        need = self._n if self._rows_are_positions else self._next_row
        exact = self._rows_are_positions
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
        return _capped(self._run("csr", queries, None), _capacity(capacity))

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`range` cut to ``capacity`` row IDs plus the true total (see :class:`CappedMatches`)."""
        return _capped(self._run("csr", lo, hi), _capacity(capacity))

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Per query the match count and the sum of ``values[row]`` over the matches (int64 or float64)."""
        return Aggregate(*self._run("aggregate", queries, None, values))

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Per range the match count and the sum of ``values[row]`` over the matches."""
        return Aggregate(*self._run("aggregate", lo, hi, values))

    # -------------------------------------------------------------------------------------- batch execution
    def _processors(self) -> tuple[bool, bool]:
        if self.processors not in PROCESSORS:
            raise ValueError(f"processors must be one of {PROCESSORS}, got {self.processors!r}")
        if self.processors == "gpu" and self._cache is None:
            raise ValueError("processors='gpu' needs a chunk cache: build or open the index with gpu_budget > 0")
        if self.processors == "zero_copy":
            if self.device.type != "cuda" or not self._pin:
                raise ValueError("processors='zero_copy' needs a CUDA index (its kernels read the chunks' pinned "
                                 "host memory directly); use 'gpu', 'cpu' or 'auto' here")
            return True, False
        gpu = self._cache is not None and self.processors in ("auto", "gpu")
        return gpu, not gpu or self.processors == "auto"

    def rates(self) -> Rates:
        """The rates and fixed times the scheduler plans with now: calibrated on the first batch that uses both
        processors, then fitted to the queues of every batch (module doc). ``in_place`` is 0 where the GPU does
        not read queues' chunks in place (:attr:`read_in_place`)."""
        return Rates(self._cpu_rate, self._copy_rate, self._gpu_rate,
                     self._in_place_rate if self._in_place_on() and self._measured["in_place"] else 0.0,
                     self._fixed_s["cpu"], self._fixed_s["gpu"], self._fixed_s["in_place"])

    def _in_place_on(self) -> bool:
        """Whether the planner may have the GPU read a queue's chunk in place (``read_in_place``): only for the
        planned ``processors="auto"`` with a cache; by default where the chunks are pinned host memory that a
        CUDA index's kernels can address."""
        if self.read_in_place not in (None, True, False):
            raise ValueError(f"read_in_place must be None (automatic), True or False, got {self.read_in_place!r}")
        if self.processors != "auto" or self.critical_mass is not None or self._cache is None:
            return False
        pinned = self.device.type == "cuda" and self._pin
        if self.read_in_place is None:
            return pinned
        if self.read_in_place and self.device.type == "cuda" and not pinned:
            raise ValueError("read_in_place=True needs the chunks in pinned host memory; set it to None or False")
        return self.read_in_place

    def _in_place_view(self, chunk: _Chunk) -> _View:
        """The chunk's structure where it lies in host memory, as the cache's device reads it (on a CPU index,
        the host view: the tests' stand-in for the GPU's reads over PCIe)."""
        return self._mapped_view(chunk) if self.device.type == "cuda" else self._host_view(chunk)

    def _break_even(self) -> int:
        """The queue size at which copying a mean-sized chunk in costs as long as answering the queue on the CPU."""
        mean = sum(c.nbytes for c in self._chunks) / len(self._chunks)
        return max(1, int(mean / self._copy_rate * self._cpu_rate))

    def _calibrate(self, batch: "_Batch", tasks: list[_Task]) -> None:
        """Measures the rates a batch needs and lacks (:meth:`_uncalibrated`) before it is planned (guesses would
        misplace a whole batch): slices of two sizes of the largest queue answered from its host copy and, where the
        GPU may read chunks in place, answered so; a slice of its chunk copied into the (still empty) cache; and,
        for a stale cache rate, slices of the largest queue of a cached chunk answered from the cache."""
        t = max(tasks, key=lambda t: t.size)
        points = batch.points
        cache = self._cache
        if self._in_place_on() and self._uncalibrated("in_place", points) and t.size >= self._slice_min("in_place", 512):
            self._calibrate_way("in_place", self._in_place_view(t.chunk), batch, t, self.device)
            for r in tasks:  # the in-place view's search part may have evicted a cached chunk: the plan must know
                r.resident = r.resident and r.chunk in cache
        resident = [r for r in tasks if r.resident]
        if cache is not None and resident and self._uncalibrated("gpu", points):
            r = max(resident, key=lambda r: r.size)
            if r.size >= self._slice_min("gpu", RATE_QUEUE):  # smaller cached queues time the host's issue
                entry = cache.entries[r.chunk]
                if self.device.type == "cuda" and entry.ready is not None:
                    torch.cuda.current_stream(self.device).wait_event(entry.ready)
                self._calibrate_way("gpu", entry.view, batch, r, self.device)
        if self._uncalibrated("cpu", points) and t.size >= self._slice_min("cpu", 256):
            self._calibrate_way("cpu", self._host_view(t.chunk), batch, t, torch.device("cpu"))
        if self._uncalibrated("copy", points) and cache is not None and not cache.entries:
            host = self._host(t.chunk)
            size = min(host.numel(), cache.budget, 64 << 20)
            buf = self._slab(cache.arena)
            if self.device.type == "cuda":
                stream = torch.cuda.current_stream(self.device)
                for ev in cache.arena.events_over(0, _align(size)):
                    stream.wait_event(ev)
                buf[:size].copy_(host[:size], non_blocking=True)  # warm
            seconds = _seconds(lambda: buf[:size].copy_(host[:size], non_blocking=True), self.device)
            self._count("bytes_calibration", size * (2 if self.device.type == "cuda" else 1))
            self._calibrated.add(("copy", True))  # once: a chunk under 1 MiB times too short to trust; batches measure it
            if size >= 1 << 20:
                self._learn("copy", [(size, seconds)], True)

    def _calibrate_way(self, name: str, view: _View, batch: "_Batch", t: _Task, S: torch.device) -> None:
        """Calibrates way ``name`` on queue ``t`` answered with ``view`` on S: a warm-up (first calls pay one-time
        costs), then two timed slices of other queries (a slice the warm-up had read would come from the caches,
        the CPU's or the GPU's, not from where the chunk lies), of two sizes, so that the fit starts with a fixed
        time and a rate (module doc)."""
        if S.type == "cuda":
            warm = min(t.size // 8, 256)
        else:  # wide enough to start every thread of a parallel region (the CPU kernels take 256 queries per task,
            # csrc/core/results_cpu.h), which the timed slices would otherwise pay
            warm = min(t.size // 4, 256 * torch.get_num_threads())
        warm, timed = _calibration_slices(t.size, warm)
        slices = self._timed(view, batch, S, t, [warm])
        samples = self._timed(view, batch, S, t, timed)
        before = (getattr(self, f"_{name}_rate"), self._fixed_s[name])
        self._learn(name, samples, batch.points, reset=True)
        after = (getattr(self, f"_{name}_rate"), self._fixed_s[name])
        with self._stats_lock:  # what each calibration timed, for stats(): a rate that came out wrong says why
            kept = self._stats["calibrations"]
            kept.append({"way": name, "points": batch.points, "slices": [list(x) for x in slices + samples],
                         "rate": after[0], "fixed_s": after[1], "set": after != before})
            del kept[:-CALIBRATIONS_KEPT]

    def _timed(self, view: _View, batch: "_Batch", S: torch.device, t: _Task, slices: list) -> list:
        """(queries, seconds) of answering each (offset, size) slice of queue ``t`` on S with ``view``."""
        out = []
        for offset, size in slices:
            qlo, qhi = batch.queue(_Task(t.chunk, t.start + offset, size, False, t.fits), S, self)
            out.append((size, _seconds(lambda: self._answer(view, batch, qlo, qhi, S), S)))
        return out

    def _by_points(self, name: str) -> bool:
        """Whether a point batch measured rate ``name`` (True: set so by a test)."""
        return self._measured[name] in ("points", True)

    def _uncalibrated(self, name: str, points: bool) -> bool:
        """Whether a batch (of point lookups or not) calibrates rate ``name``: not yet measured on such a batch
        (a point batch: on one like it; the copy rate: on any) and not yet calibrated on one; or, on a point batch,
        a rate no point batch has measured for its wait (RATE_STALE). The cache's rate
        (``gpu``) only so: the batches' cached queues measure it first."""
        if points and self._stale(name):
            return True
        if name == "gpu":  # the batches' big cached queues measure it; calibrated only when stale
            return False
        points = points or name == "copy"
        have = self._by_points(name) if points else bool(self._measured[name])
        return not have and (name, points) not in self._calibrated

    def _stale(self, name: str) -> bool:
        return name in self._rate_age and self._rate_age[name] >= self._stale_after[name]

    def _slice_min(self, name: str, least: int) -> int:
        """The smallest queue a calibration of ``name`` takes: ``least`` for a rate still a guess or not measured on
        point lookups; a stale point rate is replaced only from RATE_QUEUE more, so that the larger timed slice
        (most of the queue beyond the warm-up: _calibration_slices) is timed by its lookups, not its call."""
        return least + RATE_QUEUE if self._by_points(name) else least

    def _learn(self, name: str, samples: list, points: bool, reset: bool = False) -> None:
        """Measurements of way ``name``, (lookups or bytes, seconds) per queue or call, from a point batch or
        another. The copy rate is an average (half weight per batch) of bytes over seconds; a lookup way's rate and
        fixed time are fitted to its samples with those of earlier batches (:class:`_CostFit`), which start over
        where the rate came from the other kind of batch, or with ``reset`` (a calibration, which also makes the rate
        fresh and marks it calibrated for this kind of batch, though its slices may be under RATE_QUEUE). Other
        batches never change a point batch's rate (see ``_measured``); the copy rate counts as a point one. Samples
        without time (a clock too coarse) change nothing. A recalibration of a stale point rate sets the way's next
        wait (RATE_STALE); a batch that times the rate makes it fresh."""
        recal = reset and points and self._stale(name) and self._by_points(name)
        timed = False  # whether a batch's (not a calibration's) big samples set the rate, not only the fixed time
        if reset:
            self._calibrated.add((name, points))
            if points and name in self._rate_age:
                self._rate_age[name] = 0
        points = points or name == "copy"
        if self._by_points(name) and not points:
            return
        samples = [(n, t) for n, t in samples if n > 0 and t > 0 and math.isfinite(t)]
        if not samples:
            return
        same = not reset and (self._by_points(name) if points else self._measured[name] == "other")
        attr = f"_{name}_rate"
        if name == "copy":
            rate = sum(n for n, _ in samples) / sum(t for _, t in samples)
            setattr(self, attr, 0.5 * getattr(self, attr) + 0.5 * rate if same else rate)
        else:
            rate0 = getattr(self, attr)
            # A small call or queue whose lookups, at the rate the way has, explain under half its time is timed by
            # its fixed cost (the idle CPU's take-over of a few leftover queries pays a call): it refines the fixed
            # time only: fed to the fit, a run of them drags the rate down towards their call's cost.
            if same and rate0 > 0:
                fixed_only = [(n, t) for n, t in samples if n < RATE_QUEUE and n / rate0 < t / 2]
                if fixed_only:
                    self._fixed_s[name] = sum(t - n / rate0 for n, t in fixed_only) / len(fixed_only)
                    samples = [x for x in samples if x not in fixed_only]
            elif not reset:
                # A rate no calibration has set for this kind of batch (its queues were too small to time one)
                # starts only from samples a calibration could have taken: a take-over of a few queries times
                # its call, and a rate from it would price the way out of every plan.
                samples = [(n, t) for n, t in samples if n >= RATE_MIN_SAMPLE]
                if not samples:
                    return
            if samples:
                fit = self._fits[name]
                if same:
                    fit.decay()
                else:
                    fit.reset()
                for n, t in samples:
                    fit.add(n, t)
                fixed, rate, set_rate = fit.solve(self._fixed_s[name] if same else 0.0, rate0 if same else 0.0)
                setattr(self, attr, rate)
                self._fixed_s[name] = fixed
                timed = not reset and set_rate and any(n >= RATE_QUEUE for n, _ in samples)
        self._measured[name] = "points" if points else "other"
        if reset and points and name in self._rate_age:
            # Confirmed: within RATE_CONFIRM of the last calibration (same method, same slices; the batches may
            # have moved the rate in between, by samples too small to keep it fresh).
            new_rate, last = getattr(self, attr), self._calibrated_rate.get(name, 0.0)
            if recal:
                confirmed = last > 0 and max(new_rate / last, last / new_rate) <= RATE_CONFIRM
                wait = self._stale_after[name]
                self._stale_after[name] = min(2 * wait, RATE_STALE_MAX) if confirmed else RATE_STALE
            self._calibrated_rate[name] = new_rate
        # Only a batch whose big queues or calls (RATE_QUEUE+) set the rate makes it fresh and starts its wait over (a
        # way that falls out of the plans after that is checked soon). Smaller samples may time a call more than
        # lookups, and a rate the fit kept was not measured: a way priced out of every plan still gets the idle CPU's
        # take-overs and an occasional queue, which would otherwise hold off its recalibration forever.
        if points and name in self._rate_age and timed:
            self._rate_age[name] = 0
            self._stale_after[name] = RATE_STALE

    def _run(self, form: str, lo: torch.Tensor, hi: torch.Tensor | None, values: torch.Tensor | None = None):
        t_start = time.perf_counter()
        qlo, qhi = self._check_queries(lo, hi)
        _check_hot_sample(self.hot_sample)  # an attribute: checked before the batch is served
        D = qlo.device
        if values is not None:
            values = self._check_values(values, D)
        before = self._snapshot()
        q = qlo.numel()
        hot = qhi is None and q > 0 and self.hot_tier and self.hot_capacity > 0
        if hot and self._hot_pending is not None:  # an update made the tier stale: rebuild it over the new chunks
            keys, self._hot_pending = self._hot_pending, None
            self._rebuild_hot(keys, D)
        if hot and self.hot_learn and self._tier is not None and self._tier["pairs_n"] > self._tier_room():
            self._rebuild_hot(self._tier_keys(), D)  # a given tier, now learning: its first keys, room for candidates
        if hot and self._tier is not None:
            out, hits = self._serve_with_tier(form, qlo, values, D)
        else:
            out, hits = self._serve(form, qlo, qhi, values, D), 0
        if hot and self.hot_learn:
            t0 = time.perf_counter()
            self._learn_hot(qlo, hits / q)
            self._stats["time_s"]["hot"] += time.perf_counter() - t0
        self._count("queries", q)
        self._stats["time_s"]["total"] += time.perf_counter() - t_start
        self._last_batch = self._since(before)
        return out

    # --------------------------------------------------------------------------------------- the hot tier
    def _clear_hot(self) -> None:
        self._tier: dict | None = None  # the tier: its index's view on a device, its keys (host), sizes
        self._hot_cand: tuple[torch.Tensor, torch.Tensor] | None = None  # candidates: flipped keys (sorted), counts
        self._hot_pending: torch.Tensor | None = None  # the tier's keys, to rebuild after an update
        self._hot_skip = 0  # point batches left that skip learning (it found nothing worth a tier)

    def clear_hot(self) -> None:
        """Drops the hot tier and what it learned (learning starts over)."""
        self._clear_hot()

    def warm(self, keys: torch.Tensor, *, learn: bool = False) -> int:
        """Builds the hot tier now from ``keys`` (in priority order: the first distinct keys that are in the index,
        as far as their row IDs fit the tier; twice as many keys as fit are fetched, room for absent ones), on
        ``keys``' device. With ``learn=False`` (the default) the tier keeps these keys until the next ``warm`` or
        ``hot_learn = True``, and, learning nothing, it also has the learning candidates' share of the
        reservation: up to :attr:`hot_capacity_given` keys of one row ID each instead of ``hot_capacity``. Once
        learning resumes, the next point batch keeps as many of its first keys as the learning tier's room holds
        (which learning may then replace). Updates rebuild it over the same keys. Returns the number of keys in
        the tier."""
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        if not self.hot_capacity:
            raise ValueError("this index has no hot tier (hot_keys=0, or no gpu_budget to take it from)")
        qlo, _ = self._check_queries(keys.reshape(-1), None)
        flipped = qlo ^ TOP
        uniq, inverse = torch.unique(flipped, return_inverse=True)
        first = torch.full((uniq.numel(),), flipped.numel(), dtype=torch.int64, device=flipped.device)
        first.scatter_reduce_(0, inverse, torch.arange(flipped.numel(), device=flipped.device), "amin")
        prio = uniq.index_select(0, torch.sort(first).indices)  # (_rebuild_hot fetches twice what fits, at most)
        self._clear_hot()
        self.hot_learn = learn
        self._rebuild_hot(prio, qlo.device)
        return 0 if self._tier is None else self._tier["n_keys"]

    @property
    def hot_capacity_given(self) -> int:
        """Keys (of one row ID each) a tier given by :meth:`warm` with ``learn=False`` holds: the reservation of
        ``hot_capacity`` keys less the learning candidates, which such a tier does not keep."""
        return self._tier_room(learn=False)

    def _tier_room(self, learn: bool | None = None) -> int:
        """Pairs the tier's reservation holds (``learn``: whether candidates share it; None: ``hot_learn``). At the
        pair size priced at construction; fewer where row IDs have since grown past 2^32 (an update) and the tier
        needs a row map the reservation did not price."""
        learn = self.hot_learn if learn is None else learn
        per_key = self._hot_reserved_pair + (HOT_CANDIDATE_BYTES if not learn else 0)
        return self.hot_capacity * per_key // self._hot_pair_bytes()

    def _tier_view(self, D: torch.device) -> _View:
        tier = self._tier
        if tier["device"] != D:  # the tier follows the queries' device
            tier["tensors"] = {k: v.to(D) for k, v in tier["tensors"].items()}
            tier["device"] = D
            tier["view"] = self._tier_make_view(tier)
        return tier["view"]

    def _tier_make_view(self, tier: dict) -> _View:
        t = tier["tensors"]
        index = CgRXIndex._from_structure(
            t["pairs"], t["reps"], t["table"], tier["pairs_n"], key_type=self.key_type, key_dtype=self.key_dtype,
            key_span=tier["span"], bucket_size=self.bucket_size, layout=self.layout, backend=self.backend,
        )
        return _View(index, t["rows"], tier["base"], direct=tier["direct"])

    def _tier_keys(self) -> torch.Tensor:
        """The tier's keys (flipped ordered keys, most important first), kept in host memory (not the budget's)."""
        return self._tier["keys"]

    def _rebuild_hot(self, prio: torch.Tensor, D: torch.device) -> None:
        """The tier over the keys ``prio`` (flipped ordered keys, most important first) with all their row IDs,
        fetched through the chunks (one CSR batch), as many keys as their pairs fit the reservation."""
        t0 = time.perf_counter()
        self._tier = None
        if not self.hot_learn:
            self._hot_cand = None  # learning nothing: the candidates' share of the reservation holds pairs
        room = self._tier_room()
        prio = prio[: 2 * room].to(D)  # room for keys that turn out to be absent, without an unbounded fetch
        if prio.numel() == 0:
            return
        offsets, rows = self._serve("csr", prio ^ TOP, None, None, D)
        per = offsets[1:] - offsets[:-1]
        present = per > 0  # absent keys stay out: the tier's hit test is "has rows"
        keep = present & (torch.cumsum(per, 0) <= room)
        if not bool(keep.any()):
            return
        pair_keys = torch.repeat_interleave(prio ^ TOP, per, output_size=rows.numel())
        pair_keep = torch.repeat_interleave(keep, per, output_size=rows.numel())
        pair_keys, rows = pair_keys[pair_keep], rows[pair_keep]
        rows_sorted, perm = torch.sort(rows)  # local row order = global row order: smallest and ascending rows
        k = pair_keys.index_select(0, perm).contiguous()
        pairs, reps, table = _ops().cgrx_build(k, self.bucket_size, LAYOUTS[self.layout])
        flipped = torch.aminmax(k ^ TOP)
        base, row_map = _place_rows(pairs, self.layout, rows_sorted)  # as a chunk's (_build_chunk)
        kept = prio[keep].cpu()  # host memory, in priority order: what an update rebuilds the tier over
        tier = {"device": D, "keys": kept, "n_keys": kept.numel(), "pairs_n": k.numel(), "base": base,
                "direct": row_map.numel() == 0, "span": (int(flipped.min) ^ TOP, int(flipped.max) ^ TOP),
                "tensors": {"pairs": pairs, "reps": reps, "table": table, "rows": row_map}}
        tier["view"] = self._tier_make_view(tier)
        self._tier = tier
        with self._stats_lock:
            self._stats["hot_rebuilds"] += 1
            self._stats["time_s"]["hot_rebuild"] += time.perf_counter() - t0

    def _serve_with_tier(self, form: str, qlo: torch.Tensor, values: torch.Tensor | None, D: torch.device):
        """Point queries: the tier's keys answered by the tier (their complete answer), the others through the
        chunks; returns the answer and the number of tier hits."""
        t0 = time.perf_counter()
        view = self._tier_view(D)
        q = qlo.numel()
        _, first, count = self._answer(view, _Batch("lookup", qlo, None, None, D, None), qlo, None, D)
        hit = count > 0  # the tier holds only keys with rows: a tier key always has some
        miss = torch.nonzero(~hit).reshape(-1)
        hits = q - miss.numel()
        self._stats["time_s"]["hot"] += time.perf_counter() - t0
        self._count("hot_hits", hits)
        qmiss = qlo.index_select(0, miss)
        if SORT_TIER_MISSES and miss.numel() > 1:
            qmiss, order = _key_sorted(qmiss)
            miss = miss.index_select(0, order)
        key_order = SORT_TIER_MISSES
        if form == "lookup":
            if miss.numel():
                rf, rc = self._serve("lookup", qmiss, None, None, D, key_order)
                first.index_copy_(0, miss, rf)
                count.index_copy_(0, miss, rc)
            return (first, count), hits
        idx = torch.nonzero(hit).reshape(-1)
        qhit = qlo.index_select(0, idx)
        if form == "aggregate":
            sum_dtype = torch.float64 if values.dtype.is_floating_point else torch.int64
            hc, hs = _aggregated(self._answer(view, _Batch("aggregate", qhit, None, values, D, None), qhit, None, D),
                                 values, D, sum_dtype)
            count = torch.zeros(q, dtype=torch.int64, device=D).index_copy_(0, idx, hc)
            total = torch.zeros(q, dtype=sum_dtype, device=D).index_copy_(0, idx, hs)
            if miss.numel():
                mc, ms = self._serve("aggregate", qmiss, None, values, D, key_order)
                count.index_copy_(0, miss, mc)
                total.index_copy_(0, miss, ms)
            return (count, total), hits
        _, hoff, hrows = self._answer(view, _Batch("csr", qhit, None, None, D, None), qhit, None, D)
        parts = [(idx, hoff, hrows)]
        if miss.numel():
            parts.append((miss, *self._serve("csr", qmiss, None, None, D, key_order)))
        return _combine_csr(q, parts, D), hits

    def _learn_hot(self, qlo: torch.Tensor, share: float) -> None:
        """Counts the keys of a sample of the batch into the candidates (decayed counts, the hot_capacity best
        kept) and rebuilds the tier when the candidates seen repeatedly would answer clearly more of a batch
        than the tier did (``share``); a tier that answers too little, with nothing better, is dropped."""
        if self._hot_skip:
            self._hot_skip -= 1
            return
        D, q = qlo.device, qlo.numel()
        if self.hot_sample is not None:
            S = min(q, self.hot_sample)
        else:
            S = min(q, HOT_SAMPLE_GPU if D.type == "cuda" else HOT_SAMPLE_CPU)
        # A stratified sample, one query from each of S strata spanning the whole batch: no query drawn twice
        # (drawing with replacement repeats about S^2 / 2q queries, which read as keys seen twice and built
        # tiers for uniform IDs), and no part of the batch left out.
        i = torch.arange(S, device=D)
        lo = i * q // S
        width = (i + 1) * q // S - lo
        idx = lo + (torch.rand(S, device=D) * width).long().clamp_(max=width - 1)
        keys, seen = torch.unique(qlo.index_select(0, idx) ^ TOP, return_counts=True)
        score = seen.to(torch.float32)
        if self._hot_cand is not None:
            ck, cs = (t.to(D) for t in self._hot_cand)
            allk = torch.cat([ck, keys])
            keys, inverse = torch.unique(allk, return_inverse=True)
            score = torch.zeros(keys.numel(), dtype=torch.float32, device=D).index_add_(
                0, inverse, torch.cat([cs * HOT_DECAY, score]))
        if keys.numel() > self.hot_capacity:
            top = torch.topk(score, self.hot_capacity).indices.sort().values  # keys stay sorted
            keys, score = keys[top], score[top]
        self._hot_cand = (keys, score)
        # What the tier would answer of the next batch, by Good-Turing over this sample: a key seen r times in S
        # draws has probability about (r + 1) N_{r+1} / (N_r S) (N_r: keys seen r times), the raw r / S being
        # an overestimate for rare keys (uniform IDs seen twice by chance are no hotter than the rest); counts
        # from HOT_GT_EXACT up are accurate as they are. The tier holds the candidates with the highest scores,
        # so it is credited with the most probable keys of the sample, as many as it would hold. Keys seen once
        # join it when that adds a useful share (skewed IDs, not uniform ones; an underestimate for them, as their
        # scores also hold what earlier batches saw).
        levels = torch.bincount(seen, minlength=HOT_GT_EXACT + 1)[: HOT_GT_EXACT + 1].to(torch.float64)
        rate = torch.zeros(HOT_GT_EXACT + 1, dtype=torch.float64, device=D)  # per-key probability x S, by count
        r = torch.arange(1, HOT_GT_EXACT, device=D)
        rate[1:HOT_GT_EXACT] = (r + 1) * levels[2:] / levels[1:HOT_GT_EXACT].clamp(min=1)
        likely = torch.sort(torch.where(seen >= HOT_GT_EXACT, seen.to(torch.float64), rate[seen.clamp(max=HOT_GT_EXACT)]),
                            descending=True).values.cumsum(0) / S
        strong = score >= HOT_REPEAT
        n_strong, n_all = int(strong.sum()), int((score >= 1.0).sum())
        credit = lambda k: float(likely[min(k, likely.numel()) - 1]) if k else 0.0  # noqa: E731
        weak = credit(n_all) - credit(n_strong) >= HOT_USEFUL
        chosen = score >= 1.0 if weak else strong
        projected = credit(n_all if weak else n_strong)
        if projected < HOT_USEFUL:
            if share < HOT_USEFUL:
                self._tier = None
                self._hot_skip = HOT_PAUSE
            return
        if projected - share > max(HOT_DRIFT, 0.1 * projected):
            order = torch.sort(torch.where(chosen, score, -1.0), descending=True).indices
            order = order[: int(chosen.sum())]
            self._rebuild_hot(keys.index_select(0, order), D)
            if self._tier is None:  # not one candidate's rows fit the room: pause rather than fetch them every batch
                self._hot_skip = HOT_PAUSE

    def _serve(self, form: str, qlo: torch.Tensor, qhi: torch.Tensor | None, values: torch.Tensor | None,
               D: torch.device, key_order: bool = False):
        """One batch of ordered queries through the chunks: partition, serve (GPU and CPU), merge. ``key_order``:
        point queries sorted by key (the tier's misses; they must be, ascending in unsigned order: the queues are cut as
        runs of them, ``SORTED_RUNS``), so that each queue is in key order and the GPU reads them in place in one
        launch (``IN_PLACE_WINDOW``)."""
        t_start = time.perf_counter()
        st, tm = self._stats, self._stats["time_s"]
        q = qlo.numel()
        # ---- partition: one piece per (query, chunk it needs), in query-major order, then grouped by chunk
        piece_q, P = None, q
        if qhi is None and key_order and SORTED_RUNS:
            # Sorted by key: queue j is the run of keys below chunk j + 1's first key; one search, no scatter, and
            # every queue keeps the batch's key order.
            ends = self._run_ends(qlo)
            counts = [b - a for a, b in zip([0, *ends[:-1]], ends)]
            s_lo, s_hi = qlo, None
            order = sq = torch.arange(q, device=D)
        elif qhi is None and (grouped := partition_points(qlo, KEY_TYPES["uint64"], self._bounds(D) ^ TOP)) is not None:
            # Point queries in one pass where the operator takes this many chunks: chunk ids, counts, scatter.
            s_lo, order, counts = grouped
            counts = counts[0].tolist()
            sq, s_hi = order, None  # the query of each queue entry
        else:
            if qhi is None:
                pchunk = self._chunk_of(qlo)
            else:
                clo = self._chunk_of(qlo)
                chi = self._chunk_of(qhi)
                npieces = (chi - clo + 1).clamp(min=0)
                P = int(npieces.sum())
                piece_q = torch.repeat_interleave(torch.arange(q, device=D), npieces, output_size=P)
                first_piece = torch.cumsum(npieces, 0) - npieces
                pchunk = clo.index_select(0, piece_q) + torch.arange(P, device=D) - first_piece.index_select(0, piece_q)
            order, counts = group_by(pchunk, len(self._chunks))
            counts = counts.tolist()
            sq = order if piece_q is None else piece_q.index_select(0, order)  # the query of each queue entry
            s_lo = qlo.index_select(0, sq)
            s_hi = None if qhi is None else qhi.index_select(0, sq)
        gpu_on, cpu_on = self._processors()
        cache = self._cache
        tasks, start = [], 0
        mapped = self.processors == "zero_copy"  # every chunk "fits": the GPU reads it where it is
        for chunk, c in zip(self._chunks, counts):
            if c:
                tasks.append(_Task(chunk, start, c, not mapped and cache is not None and chunk in cache,
                                   mapped or (cache is not None and _align(chunk.nbytes) <= cache.budget)))
            start += c
        if D.type == "cuda" and self._io_stream is None:
            self._io_stream = torch.cuda.Stream(D)  # made here, not racing in the worker
        if gpu_on and self.device.type == "cuda" and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        if D.type == "cpu" and gpu_on and self.device.type == "cuda" and P:
            s_lo = s_lo.pin_memory()
            s_hi = None if s_hi is None else s_hi.pin_memory()
        part_event = None
        if D.type == "cuda":
            part_event = torch.cuda.Event()
            part_event.record()
        tm["partition"] += time.perf_counter() - t_start
        # ---- serve: the GPU in this thread, the CPU in a worker, each claiming queues when ready
        batch = _Batch(form, s_lo, s_hi, values, D, part_event, key_order=key_order and qhi is None)
        for t in tasks:
            t.grouped = self._groups(batch, t)
        # The rates the calibration measures (the cache's lookup rate only when stale: the batches measure it).
        wanted = ("cpu", "copy", "gpu") + (("in_place",) if self._in_place_on() else ())
        if (tasks and gpu_on and cpu_on and self.critical_mass is None
                and any(self._uncalibrated(k, batch.points) for k in wanted)):
            t0 = time.perf_counter()
            self._calibrate(batch, tasks)
            tm["calibrate"] += time.perf_counter() - t0
        rates = self.rates()
        sched = _Scheduler(list(tasks), gpu_on, cpu_on, rates, self.critical_mass)
        planned = dict(sched.planned)
        if tasks:
            if gpu_on and cpu_on:
                worker_error: list[BaseException] = []
                worker = threading.Thread(target=self._cpu_loop, args=(sched, batch, worker_error), daemon=True)
                worker.start()
                try:
                    self._gpu_loop(sched, batch)
                except BaseException:
                    sched.abort = True
                    raise
                finally:
                    worker.join()
                if worker_error:
                    raise worker_error[0]
            elif gpu_on:
                self._gpu_loop(sched, batch)
                if sched.tasks:  # chunks larger than the cache (a run of equal keys grown by updates): the CPU's
                    sched.gpu = False
                    self._cpu_loop(sched, batch, None)
            else:
                self._cpu_loop(sched, batch, None)
        # ---- merge, in chunk order
        t0 = time.perf_counter()
        out = self._merge(form, tasks, q, P, sq, order, piece_q, D, values)
        tm["merge"] += time.perf_counter() - t0
        for chunk, c in zip(self._chunks, counts):
            chunk.heat = 0.5 * chunk.heat + c
        st["batches"] += 1
        st["pieces"] += P
        st["critical_mass"], st["break_even_queue"] = self.critical_mass, self._break_even()
        st["plan"] = {"gpu_queries": planned["gpu"], "cpu_queries": planned["cpu"], "rates": vars(rates).copy()}
        self._learn_rates(batch)
        return out

    def _cpu_loop(self, sched: _Scheduler, batch: "_Batch", error: list | None) -> None:
        try:
            cpu = torch.device("cpu")
            while (task := sched.claim("cpu")) is not None:
                self._maybe_fault("cpu_task")
                t0 = time.perf_counter()
                group = [task]
                if task.grouped:  # small point queues: several in one call over all cores
                    group += sched.claim_more("cpu", lambda t: t.grouped, CPU_GROUP_QUERIES - task.size)
                if len(group) > 1:
                    self._answer_group([self._host_view(t.chunk) for t in group], group, batch, cpu)
                else:
                    qlo, qhi = batch.queue(task, cpu, self)
                    task.result = self._answer(self._host_view(task.chunk), batch, qlo, qhi, cpu)
                dt = time.perf_counter() - t0
                size = sum(t.size for t in group)
                with self._stats_lock:
                    self._stats["queries_cpu"] += size
                    self._stats["time_s"]["cpu"] += dt
                batch.cpu_calls.append((size, dt))
        except BaseException as e:  # handed to the calling thread, which raises it
            sched.abort = True
            if error is None:
                raise
            error.append(e)

    def _gpu_loop(self, sched: _Scheduler, batch: "_Batch") -> None:
        cache, dev = self._cache, self.device
        cuda = dev.type == "cuda"
        mapped = self.processors == "zero_copy"
        compute = torch.cuda.current_stream(dev) if cuda else None
        inflight: deque = deque()
        tm = self._stats["time_s"]
        try:
            while True:
                if len(inflight) >= self.pipeline_depth:
                    t0 = time.perf_counter()
                    inflight.popleft().synchronize()  # the GPU is ready for the next queue: pacing
                    tm["gpu_wait"] += time.perf_counter() - t0
                task = sched.claim("gpu")
                if task is None:
                    break
                self._maybe_fault("gpu_task")
                t0 = time.perf_counter()
                in_place = mapped or sched.rates.reads_in_place(task)
                group, cached_size = [task], 0
                if not mapped and IN_PLACE_WINDOW is not None and batch.key_order and task.grouped:
                    # One launch for the in-place queues and, with GROUP_CACHED, the cached chunks' (a cached chunk
                    # evicted since the plan is left to a launch of its own); only a launch that reads some queue in
                    # place takes cached ones.
                    def joins(t: _Task) -> bool:
                        return t.grouped and (sched.rates.reads_in_place(t)
                                              or (GROUP_CACHED and t.resident and t.chunk in cache))

                    if joins(task):
                        group += sched.claim_more("gpu", joins, needs=None if in_place else sched.rates.reads_in_place)
                if len(group) > 1:
                    view = None
                    views, cached = self._group_views(group, sched.rates)
                    used = list(cached.values())
                    # A group reads some queue in place (claim_more's needs): an in-place sample, its cached queues'
                    # lookups left out of its size and their share of its time (by the planned rates) out of its time.
                    cached_size = sum(t.size for t in group if t.chunk in cached)
                    in_place = True
                    self._count("chunk_hits", len(used))
                elif in_place:
                    view, used = self._in_place_view(task.chunk), []
                else:
                    entry = cache.entries.get(task.chunk)
                    if entry is None:
                        entry = self._copy_in(task.chunk, sched.demand(), batch)
                        self._count("chunk_misses", 1)
                    else:
                        self._count("chunk_hits", 1)
                    view, used = entry.view, [entry]
                for e in used:  # the slots read: waited for, and kept until the lookups have read them
                    if cuda and e.ready is not None:
                        compute.wait_event(e.ready)
                size = sum(t.size for t in group)
                timed_size, share = size, 1.0
                if cached_size:  # a group's
                    timed_size = size - cached_size
                    r = sched.rates
                    ours, theirs = (timed_size / r.in_place, cached_size / r.gpu) if r.in_place > 0 and r.gpu > 0 \
                        else (timed_size, cached_size)
                    share = ours / (ours + theirs)

                def serve():
                    if view is None:
                        self._answer_group([views[t.chunk] for t in group], group, batch, dev)
                    else:
                        qlo, qhi = batch.queue(task, dev, self)
                        task.result = self._answer(view, batch, qlo, qhi, dev)

                timed = batch.in_place_lookups if in_place else batch.gpu_lookups
                if cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(compute)
                    serve()
                    b.record(compute)
                    timed.append((a, b, timed_size, share))
                else:
                    t1 = time.perf_counter()
                    serve()
                    timed.append((None, time.perf_counter() - t1, timed_size, share))
                for e in used:
                    cache.tick += 1
                    e.tick = cache.tick
                if cuda:
                    done = torch.cuda.Event()
                    done.record(compute)
                    inflight.append(done)
                    for e in used:
                        e.last_use = done
                self._count("queries_gpu", size)
                if in_place:
                    self._count("queries_in_place", size - cached_size)
                tm["gpu_issue"] += time.perf_counter() - t0
        finally:
            for ev in inflight:
                ev.synchronize()

    def _group_views(self, group: list[_Task], rates: Rates) -> tuple[dict[_Chunk, _View], dict[_Chunk, _Entry]]:
        """The views one launch reads its queues with (:meth:`_gpu_loop`): a cached chunk's slot, else the chunk in
        place; and the cache entries read. The in-place views are made first: making one may carve its search part
        out of the shared slab, evicting cached chunks there, the launch's own among them, which are then read in
        place too."""
        cache = self._cache
        cached = {t.chunk: cache.entries[t.chunk] for t in group if not rates.reads_in_place(t)}
        views: dict[_Chunk, _View] = {}
        while True:
            for t in group:
                if t.chunk not in cached and t.chunk not in views:
                    views[t.chunk] = self._in_place_view(t.chunk)
            gone = [c for c, e in cached.items() if cache.entries.get(c) is not e]
            if not gone:
                break
            for c in gone:
                del cached[c]
        views.update((c, e.view) for c, e in cached.items())
        return views, cached

    def _slab(self, arena: _Arena) -> torch.Tensor:
        """One of the cache's slabs, allocated on first use (on the current stream, which the copy stream then
        follows)."""
        fresh = arena.buf is None
        buf = arena.storage()
        if fresh and self.device.type == "cuda":
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(self.device)
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        return buf

    def _copy_in(self, chunk: _Chunk, demand: dict, batch: "_Batch") -> _Entry:
        """Places ``chunk`` in the cache: a slot (evicting by the policy), then the copy on the copy stream, after
        the last lookups that read the slot's space."""
        cache = self._cache
        host = self._host(chunk)
        place, evicted = cache.make_room(chunk, demand)
        if place is None:
            raise RuntimeError(f"ChunkedIndex: chunk of {chunk.nbytes} bytes does not fit gpu_budget={cache.budget}")
        arena, off = place
        try:
            buf = self._slab(arena)
        except BaseException:  # out of memory making the slab: the slot goes back, the index stays usable
            arena.release(off, chunk.nbytes, None)
            raise
        self._count("evictions", evicted)
        slot = buf[off : off + chunk.nbytes]
        ready = None
        if self.device.type == "cuda":
            copy = self._copy_stream
            for ev in arena.events_over(off, _align(chunk.nbytes)):
                copy.wait_event(ev)
            start, ready = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(copy):
                start.record(copy)
                slot.copy_(host, non_blocking=True)
                ready.record(copy)
            batch.copies.append((start, ready, chunk.nbytes))
        else:
            t0 = time.perf_counter()
            slot.copy_(host)
            batch.cpu_copy_time += time.perf_counter() - t0
            batch.cpu_copy_bytes += chunk.nbytes
        self._count("bytes_copied", chunk.nbytes)
        entry = _Entry(chunk, arena, off, self._view(chunk, slot), ready=ready)
        cache.entries[chunk] = entry
        return entry

    def _answer(self, view: _View, batch: "_Batch", qlo: torch.Tensor, qhi: torch.Tensor | None,
                S: torch.device) -> tuple:
        """One queue answered on device S with a chunk's structure there; row IDs are global."""
        ops = _ops()
        # The queues hold ordered keys already: the index's configuration for ordered queries (key type uint64).
        args = (*view.index._lead, view.index._cfg_ordered, qlo, qhi)
        if batch.form == "lookup":
            first, count = ops.cgrx_lookup(*args)
            return "first", view.global_first(first), count
        if batch.form == "count":
            return "count", ops.cgrx_range_count(*args)
        if batch.form == "aggregate" and batch.values.device == S and view.values_fit(batch.values):
            return ("agg", *ops.cgrx_aggregate(*args, view.local_values(batch.values)))
        offsets, rows = ops.cgrx_lookup_csr(*args)  # csr, and aggregates with the values on the other device
        return "csr", offsets, view.global_rows(rows) if rows.numel() else rows

    @staticmethod
    def _groups(batch: "_Batch", task: _Task) -> bool:
        """Whether ``task`` joins others in one call (:meth:`_answer_group`): a point lookup's queue of a chunk of
        sorted pairs holding row offsets (their configuration is the index's, alike for all such chunks)."""
        return batch.points and task.chunk.kind == "pairs" and task.chunk.rows_in_place()

    def _answer_group(self, views: list[_View], tasks: list[_Task], batch: "_Batch", S: torch.device) -> None:
        """The point queues ``tasks`` (:meth:`_groups`), each with its chunk's view on S, answered in one operator
        call; each task's result is its slice of the answers, with global row IDs."""
        if S == batch.D:
            queries, starts = batch.s_lo, [t.start for t in tasks]
        else:
            queries = batch.joined_queues(tasks, S, self)
            starts = list(itertools.accumulate((t.size for t in tasks[:-1]), initial=0))
        lead = [v.index._lead for v in views]
        first, count = torch.ops.rtindex_internal.cgrx_lookup_queues(
            [x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], views[0].index._cfg_ordered, queries,
            starts, [t.size for t in tasks], [v.base for v in views], IN_PLACE_WINDOW or 0)
        at = 0
        for t in tasks:
            t.result = ("first", first[at : at + t.size], count[at : at + t.size])
            at += t.size

    def _merge(self, form, tasks, q, P, sq, order, piece_q, D, values):
        """The queues' answers scattered back to the caller's order (pieces of a range merged in chunk order)."""
        if any(not t.result for t in tasks):
            raise RuntimeError("ChunkedIndex: a queue was left unserved (internal scheduler error)")
        if form == "count":  # range counts: each query's pieces summed
            count = torch.zeros(q, dtype=torch.int64, device=D)
            for t in tasks:
                count.index_add_(0, sq[t.start : t.start + t.size], t.result[1].to(D))
            return count
        if form == "lookup" and piece_q is None:  # point lookups: one piece per query, a plain scatter
            first = torch.full((q,), -1, dtype=torch.int64, device=D)
            count = torch.zeros(q, dtype=torch.int64, device=D)
            for idx, f, c in _joined(tasks, sq, D):
                first.index_copy_(0, idx, f)
                count.index_copy_(0, idx, c)
            return first, count
        if form == "lookup":
            first = torch.full((q,), I64_MAX, dtype=torch.int64, device=D)
            count = torch.zeros(q, dtype=torch.int64, device=D)
            for t in tasks:
                f, c = (x.to(D) for x in t.result[1:])
                idx = sq[t.start : t.start + t.size]
                first.scatter_reduce_(0, idx, torch.where(f >= 0, f, I64_MAX), "amin")
                count.index_add_(0, idx, c)
            return torch.where(first == I64_MAX, -1, first), count
        if form == "aggregate":
            sum_dtype = torch.float64 if values.dtype.is_floating_point else torch.int64
            count = torch.zeros(q, dtype=torch.int64, device=D)
            total = torch.zeros(q, dtype=sum_dtype, device=D)
            for t in tasks:
                idx = sq[t.start : t.start + t.size]
                a, b = _aggregated(t.result, values, D, sum_dtype)
                count.index_add_(0, idx, a)
                total.index_add_(0, idx, b)
            return count, total
        # CSR: piece p's rows go to piece_start[p]; a query's pieces are consecutive (query-major piece order)
        per_piece = torch.zeros(P, dtype=torch.int64, device=D)
        results = []
        for t in tasks:
            off, rows = (x.to(D) for x in t.result[1:])
            pid = order[t.start : t.start + t.size]
            per_piece.index_copy_(0, pid, off[1:] - off[:-1])
            results.append((pid, off, rows))
        piece_start = torch.cumsum(per_piece, 0) - per_piece
        per_query = per_piece if piece_q is None else torch.zeros(q, dtype=torch.int64, device=D).index_add_(
            0, piece_q, per_piece)
        offsets = torch.zeros(q + 1, dtype=torch.int64, device=D)
        torch.cumsum(per_query, 0, out=offsets[1:])
        total = sum(r[2].numel() for r in results)
        out_rows = torch.empty(total, dtype=torch.int64, device=D)
        for pid, off, rows in results:
            if rows.numel():
                per = off[1:] - off[:-1]
                shift = torch.repeat_interleave(piece_start.index_select(0, pid) - off[:-1], per, output_size=rows.numel())
                out_rows.index_copy_(0, shift + torch.arange(rows.numel(), device=D), rows)
        return offsets, out_rows

    def _learn_rates(self, batch: "_Batch") -> None:
        """Updates the rates the planner uses from what the batch measured (:meth:`_learn`)."""
        if batch.points:
            on = {"cpu": True, "in_place": self._in_place_on(), "gpu": self._cache is not None}
            for name in self._rate_age:
                if on[name]:  # a way that is off has no calibration to trigger
                    self._rate_age[name] += 1
        # Lookups over seconds of small calls or queues is mostly their fixed cost: a rate taken so from a batch of
        # tiny queues once priced in-place reads (and the CPU) out of every later batch. Hence the fit of a fixed
        # time per call or queue beside each rate.
        if batch.cpu_calls:
            self._learn("cpu", batch.cpu_calls, batch.points)
        copied, seconds = batch.cpu_copy_bytes, batch.cpu_copy_time
        for start, end, nbytes in batch.copies:
            end.synchronize()
            copied += nbytes
            seconds += start.elapsed_time(end) / 1e3
        if copied >= 1 << 20 and seconds > 0:
            self._learn("copy", [(copied, seconds)], True)
        self._stats["time_s"]["copy"] += seconds
        # A zero_copy batch reads every queue in place, of every size: not the small queues the planner's rate
        # is for.
        learned = [(batch.gpu_lookups, "gpu")] + ([] if self.processors == "zero_copy" else
                                                  [(batch.in_place_lookups, "in_place")])
        for timed, name in learned:
            samples = [(n, (b if a is None else a.elapsed_time(b) / 1e3) * share) for a, b, n, share in timed]
            if name == "gpu":  # see RATE_QUEUE
                samples = [(n, t) for n, t in samples if n >= RATE_QUEUE]
            if samples:
                self._learn(name, samples, batch.points)
        self._stats["cpu_rate"], self._stats["copy_rate"] = self._cpu_rate, self._copy_rate
        self._stats["gpu_rate"] = self._gpu_rate
        self._stats["in_place_rate"] = self._in_place_rate if self._measured["in_place"] else None
        self._stats["fixed_s"] = {k: v if self._measured[k] else None for k, v in self._fixed_s.items()}

    # ------------------------------------------------------------------------------------------------ updates
    def _side(self, keys, rows, what: str):
        if keys is None:
            keys = torch.empty(0, dtype=self.key_dtype)
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"{what} keys must be a torch.Tensor, got {type(keys).__name__}")
        check_key_tensor(keys, f"{what} keys", dtype=self.key_dtype, device=keys.device)
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError(f"{what} keys contain NaN, which has no place in a key order; drop or replace those rows")
        ordered = self._map(keys).cpu()
        if rows is not None:
            if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.numel() != keys.numel():
                raise ValueError(f"{what} rows must be a 1-D tensor with one row ID per key")
            if rows.dtype.is_floating_point or rows.dtype == torch.bool:
                raise TypeError(f"{what} rows must be an integer tensor, got {rows.dtype}")
            rows = rows.to("cpu", torch.int64)
            if rows.numel() and bool((rows < 0).any()):
                raise ValueError(f"{what} rows must be row IDs >= 0")
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
        ik, ir = self._side(insert_keys, insert_rows, "insert")
        dk, dr = self._side(delete_keys, delete_rows, "delete")
        n_ins = ik.numel()
        fresh = ir is None
        if fresh:
            ir = torch.arange(self._next_row, self._next_row + n_ins, dtype=torch.int64)
        ci, cd = self._chunk_of(ik), self._chunk_of(dk)
        touched = torch.unique(torch.cat([ci, cd])).tolist()
        T = self._chunk_keys(max(self._next_row, int(ir.max()) + 1 if ir.numel() else 0))
        W = self._work_device(ik)  # chunks are rebuilt where the build sorts (the GPU where there is one)
        removed = absent = 0
        replace: dict[int, list[_Chunk]] = {}
        in_place: list[_InPlace] = []
        # ---- plan every touched chunk (nothing changes yet): an in-place plan, or the chunk rebuilt
        for c in touched:
            chunk = self._chunks[c]
            mi, md = ci == c, cd == c
            side = (ik[mi], ir[mi], dk[md], None if dr is None else dr[md])
            planned = self._plan_in_place(chunk, *side, T) if self.updatable else None
            if planned is not None:
                in_place.append(planned)
                continue
            allk, allr, c_removed, c_absent = self._merged(chunk, *side)
            removed, absent = removed + c_removed, absent + c_absent
            replace[c] = self._rebuilt(chunk, allk.to(W), allr.to(W), T)
        if W.type == "cuda":
            torch.cuda.current_stream(W).synchronize()  # the new blobs were copied out asynchronously
        # ---- apply in place, undoably. Undo log rather than copy-on-write: only the chains of the buckets a
        # batch touches change (new nodes come from slack no chain reaches), so saving those nodes costs about
        # the batch, where copying the touched chunks would cost their whole size, like a rebuild's copy.
        # The tier's keys, to rebuild it over the new chunks, read now: an error leaves everything as it was.
        hot_keys = None if self._tier is None else self._tier_keys()
        undo: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        try:
            for p in in_place:
                self._maybe_fault("apply_chunk")
                undo.append(p.snapshot())
                c_removed, c_absent = p.apply()
                removed, absent = removed + c_removed, absent + c_absent
            self._maybe_fault("commit")
        except BaseException:
            for grid, ids, saved in reversed(undo):
                grid.index_copy_(0, ids, saved)
            raise
        # ---- commit: nothing above changed what the index answers, and nothing below can fail
        for p in in_place:
            p.commit()
        new_chunks: list[_Chunk] = []
        for c, chunk in enumerate(self._chunks):
            new_chunks.extend(replace.get(c, [chunk]))
        if len(new_chunks) > 1:
            nonempty = [ch for ch in new_chunks if ch.n]
            new_chunks = nonempty or new_chunks[:1]
        if self._cache is not None:
            for old in [self._chunks[c] for c in replace] + [p.chunk for p in in_place]:
                if old in self._cache:  # a changed chunk's cached copy would answer stale: copied in again on use
                    self._cache.evict(old)
        self._set_chunks(new_chunks)
        with self._stats_lock:
            self._stats["chunks_updated_in_place"] += len(in_place)
            self._stats["chunks_rebuilt"] += len(replace)
        self._n += n_ins - removed
        if fresh:
            self._next_row += n_ins
        elif ir.numel():
            self._next_row = max(self._next_row, int(ir.max()) + 1)
        if n_ins or removed:
            self._rows_are_positions = False
        if hot_keys is not None:  # the tier's answers may be stale now: rebuilt over the new chunks at the next batch
            self._hot_pending = hot_keys
            self._tier = None
        self._check_budget_after_update()
        rows_out = ir if insert_keys is None else ir.to(insert_keys.device)  # where the caller's keys are
        return UpdateResult(inserted=n_ins, deleted=removed, absent=absent, rows=rows_out)

    def _plan_in_place(self, chunk: _Chunk, ik, ir, dk, dr, T: int) -> "_InPlace | None":
        """A node chunk's share of a batch planned for an in-place apply (as :meth:`UpdatableCgRXIndex.update`
        plans it: cancellation, then cgrx_nodes_plan), changing nothing; None when the chunk must be rebuilt
        instead: rows outside its 32-bit window of offsets, more new nodes than its slack, or more than 2T keys."""
        if chunk.kind != "nodes":
            return None
        self._maybe_fault("plan_chunk")
        view = self._host_view(chunk)
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
        N, nodes = self.node_size, idx._pairs
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
        return _InPlace(chunk, nodes, N, dk, dr32, doff, ik, ir32, ioff, first_new, chunk.used + extra, (kmin, kmax),
                        cancelled, removed, found, None if found_by_key is None else int((~found_by_key).sum()), far)

    def _merged(self, chunk: _Chunk, ik, ir, dk, dr) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """The chunk's pairs plus its insertions minus its deletions (what a rebuild builds), and the pairs
        removed and the deletions absent."""
        keys, rows = self._decode(chunk)
        allk, allr = torch.cat([keys, ik]), torch.cat([rows, ir])
        if dr is None:
            gone = torch.isin(allk, dk)
            absent, removed = int((~torch.isin(dk, allk)).sum()), int(gone.sum())
        else:
            gone, removed, absent = _remove_pairs(allk, allr, dk, dr)
        keep = ~gone
        return allk[keep], allr[keep], removed, absent

    def _rebuilt(self, chunk: _Chunk, keys: torch.Tensor, rows: torch.Tensor, T: int) -> list[_Chunk]:
        """The chunk (range start kept) over new pairs, split into chunks of about T keys (between distinct
        keys) when it holds more than 2T."""
        if keys.numel() <= 2 * T:
            return [self._build_chunk(keys, rows, chunk.lo)]
        flipped = keys ^ TOP
        by_row = torch.sort(rows, stable=True).indices
        sf, perm = torch.sort(flipped.index_select(0, by_row), stable=True)
        pos = rows.index_select(0, by_row).index_select(0, perm)
        out: list[_Chunk] = []
        self._cut(sf, pos, T, True, out)
        out[0].lo = chunk.lo
        return out

    def _check_budget_after_update(self) -> None:
        if self._cache is not None and max(_align(c.nbytes) for c in self._chunks) > self._cache.budget:
            # A run of equal keys outgrew the budget: its queues are answered by the CPU (never an error here, the
            # update is done); say so once.
            self._stats["oversized_chunks"] = sum(_align(c.nbytes) > self._cache.budget for c in self._chunks)

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Inserts keys (row IDs given, or the next free ones)."""
        return self.update(insert_keys=keys, insert_rows=rows)

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Deletes (key, row ID) pairs, or every pair of each key when rows is None."""
        return self.update(delete_keys=keys, delete_rows=rows)

    # --------------------------------------------------------------------------------------- save and open
    def save(self, directory: str | os.PathLike) -> None:
        """Writes the index to ``directory`` as a new generation (one file per chunk, a manifest with their sizes
        and CRC-32), then switches ``CURRENT`` to it atomically; keeps the previous generation for readers that
        have it open, removes older ones. Chunks unchanged since they were read from or written to this directory
        are hard-linked, not rewritten."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        gens = _generations(directory)
        g = (max(gens) + 1) if gens else 1
        name = f"gen-{g:06d}"
        tmp = os.path.join(directory, name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        entries, files = [], []
        # Version 2 where node chunks are (or will be made), 3 where pairs hold row offsets: older readers refuse
        # what they would misread and open the rest.
        nodes = self.updatable or any(c.kind == "nodes" for c in self._chunks)
        offsets = any(c.kind == "pairs" and c.n and c.rows_in_place() for c in self._chunks)
        for i, chunk in enumerate(self._chunks):
            fname = f"chunk-{i:06d}.bin"
            path = os.path.join(tmp, fname)
            if chunk.file is not None and os.path.exists(chunk.file["path"]):
                try:
                    os.link(chunk.file["path"], path)
                except OSError:
                    shutil.copyfile(chunk.file["path"], path)
                crc = chunk.file["crc32"]
            else:
                crc = _write_chunk_file(path, self._host(chunk), chunk.kind)
            entry = {"file": f"{name}/{fname}", "size": chunk.nbytes, "crc32": crc, "n": chunk.n,
                     "lo": chunk.lo, "base": chunk.base, "kmin": chunk.kmin, "kmax": chunk.kmax,
                     "specs": chunk.specs}
            if nodes:
                entry.update(kind=chunk.kind, used=chunk.used)
            entries.append(entry)
            files.append((chunk, fname, crc))
        manifest = {
            "format": _FORMAT, "version": 3 if offsets else 2 if nodes else 1, "generation": g,
            "key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."), "n": self._n,
            "next_row": self._next_row,
            "rows_are_positions": self._rows_are_positions, "chunk_bytes": self.chunk_bytes,
            "bucket_size": self.bucket_size, "layout": self.layout, "backend": self.backend, "chunks": entries,
        }
        if nodes:
            manifest.update(updatable=self.updatable, node_size=self.node_size, growth=self.growth)
        _fsync_dir(tmp)
        os.replace(tmp, os.path.join(directory, name))
        _atomic_write(os.path.join(directory, name + ".json"), json.dumps(manifest, indent=1).encode())
        _atomic_write(os.path.join(directory, "CURRENT"), (name + ".json\n").encode())
        for chunk, fname, crc in files:
            chunk.file = {"path": os.path.join(directory, name, fname), "size": chunk.nbytes, "crc32": crc,
                          "kind": chunk.kind}
        for old in gens:
            if old < g - 1:
                shutil.rmtree(os.path.join(directory, f"gen-{old:06d}"), ignore_errors=True)
                try:
                    os.remove(os.path.join(directory, f"gen-{old:06d}.json"))
                except FileNotFoundError:
                    pass

    # ------------------------------------------------------------------------------------ state in memory
    _STATE_FORMAT = "torch_rtindex.ChunkedIndex.state"
    _STATE_VERSION = 1
    _STATE_CONFIG = ("key_type", "key_dtype", "chunk_bytes", "bucket_size", "layout", "backend", "updatable",
                     "node_size", "growth", "next_row", "rows_are_positions")

    def _export(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (ordered key, row ID) pair, on the CPU: chunk by chunk (key ranges in order), row IDs int64."""
        parts = [self._decode(c) for c in self._chunks]
        if not parts:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        return torch.cat([k.cpu() for k, _ in parts]), torch.cat([r.cpu() for _, r in parts])

    def state_dict(self) -> dict[str, Any]:
        """The index's (key, row ID) pairs and configuration as CPU tensors and plain values (the chunks' search
        structures are rebuilt on load), for ``torch.save`` or a :class:`ShardedIndex` state. It holds every key:
        for an index larger than host memory allows twice, use :meth:`save` / :meth:`open` instead. ``"keys"``
        are ordered keys (the uint64 order-preserving map as int64); the cache settings (``gpu_budget``, ...) are
        not part of it, they are chosen again at :meth:`from_state_dict`."""
        keys, rows = self._export()
        return {"format": self._STATE_FORMAT, "version": self._STATE_VERSION, "keys": keys, "rows": rows,
                "key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."),
                "chunk_bytes": self.chunk_bytes, "bucket_size": self.bucket_size, "layout": self.layout,
                "backend": self.backend, "updatable": self.updatable, "node_size": self.node_size,
                "growth": self.growth, "next_row": self._next_row, "rows_are_positions": self._rows_are_positions}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], device: torch.device | str | None = None, *,
                        gpu_budget: int | None = None, processors: str = "auto", critical_mass: int | None = None,
                        eviction: str = "demand", pipeline_depth: int = 2, hot_keys: int | None = None,
                        hot_sample: int | None = None) -> "ChunkedIndex":
        """A new index from :meth:`state_dict`'s output, its chunks built on the CPU from the pairs; ``device``
        and the cache settings as for the constructor (default device: CUDA where there is one)."""
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
        self._configure(key_type=state["key_type"], key_dtype=key_dtype, chunk_bytes=state["chunk_bytes"],
                        gpu_budget=gpu_budget, device=device, bucket_size=state["bucket_size"],
                        layout=state["layout"], backend=state["backend"], processors=processors,
                        critical_mass=critical_mass, eviction=eviction, pipeline_depth=pipeline_depth,
                        hot_keys=hot_keys, hot_sample=hot_sample, updatable=bool(state["updatable"]),
                        node_size=state["node_size"], growth=state["growth"])
        keys, rows = keys.cpu(), rows.cpu()
        # (key, row ID) order: by row, then stably by key. Row IDs are distinct and non-negative.
        by_row = torch.sort(rows, stable=True)
        if rows.numel() and (int(by_row.values[0]) < 0 or bool((by_row.values[1:] == by_row.values[:-1]).any())):
            raise ValueError("the state's rows must be distinct non-negative row IDs")
        sf, perm = torch.sort(keys.index_select(0, by_row.indices) ^ TOP, stable=True)
        pos = by_row.values.index_select(0, perm)
        chunks: list[_Chunk] = []
        self._cut(sf, pos, self._chunk_keys(int(by_row.values[-1]) + 1 if rows.numel() else 0), True, chunks)
        if not chunks:
            chunks.append(self._build_chunk(keys[:0], rows[:0], 0))
        self._set_chunks(chunks)
        self._n = keys.numel()
        self._next_row = max(int(state["next_row"]), int(by_row.values[-1]) + 1 if rows.numel() else 0)
        self._rows_are_positions = bool(state["rows_are_positions"])
        self._setup_tiers()
        return self

    @classmethod
    def open(cls, directory: str | os.PathLike, *, gpu_budget: int | None = None,
             device: torch.device | str | None = None, processors: str = "auto", critical_mass: int | None = None,
             eviction: str = "demand", pipeline_depth: int = 2, hot_keys: int | None = None,
             hot_sample: int | None = None, updatable: bool | None = None) -> "ChunkedIndex":
        """The index saved in ``directory`` (its current generation), without a rebuild: chunk files are read
        lazily, on first use, and checked then (size and CRC-32). ``updatable``: ``None`` (default) as saved;
        ``True`` / ``False`` switch the kind of chunk that updates make: each chunk keeps its saved kind (both
        kinds answer alike) until an update touches it, which then makes it a node chunk or a rebuilt one."""
        if updatable is not None and not isinstance(updatable, bool):
            raise TypeError(f"updatable must be None (as saved), True or False, got {updatable!r}")
        directory = os.fspath(directory)
        try:
            with open(os.path.join(directory, "CURRENT")) as f:
                mpath = os.path.join(directory, f.read().strip())
            with open(mpath) as f:
                m = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{directory} holds no readable ChunkedIndex (CURRENT and its manifest): {e}") from e
        if m.get("format") != _FORMAT or m.get("version") not in _VERSIONS:
            raise ValueError(f"{mpath} is not a {_FORMAT} manifest of a version this code reads {_VERSIONS}")
        self = cls.__new__(cls)
        self._configure(key_type=m["key_type"], key_dtype=getattr(torch, m["key_dtype"]), chunk_bytes=m["chunk_bytes"],
                        gpu_budget=gpu_budget, device=device, bucket_size=m["bucket_size"], layout=m["layout"],
                        backend=m["backend"], processors=processors, critical_mass=critical_mass, eviction=eviction,
                        pipeline_depth=pipeline_depth, hot_keys=hot_keys, hot_sample=hot_sample,
                        updatable=m.get("updatable", False) if updatable is None else updatable,
                        node_size=m.get("node_size", 32),
                        growth=m.get("growth", 1.25))
        chunks = []
        for e in m["chunks"]:
            file = {"path": os.path.join(directory, e["file"]), "size": e["size"], "crc32": e["crc32"],
                    "kind": e.get("kind", "pairs")}
            chunks.append(_Chunk(e["lo"], e["n"], e["base"], e["kmin"], e["kmax"], e["specs"], e["size"], None, file,
                                 kind=e.get("kind", "pairs"), used=e.get("used", 0)))
        self._set_chunks(chunks)
        self._n, self._next_row, self._rows_are_positions = m["n"], m["next_row"], m["rows_are_positions"]
        self._setup_tiers()
        return self

    # -------------------------------------------------------------------------------------------- reporting
    def reset_stats(self) -> None:
        """Zeroes the counters of :meth:`stats`."""
        self._stats_lock = threading.Lock()
        old = getattr(self, "_stats", {}).get("time_s", {}).get("build")
        self._stats = {
            "batches": 0, "queries": 0, "pieces": 0, "hot_hits": 0, "hot_rebuilds": 0, "queries_gpu": 0,
            "queries_cpu": 0, "queries_in_place": 0, "chunk_hits": 0, "chunk_misses": 0, "evictions": 0, "bytes_copied": 0,
            "bytes_calibration": 0, "disk_loads": 0, "bytes_loaded": 0, "chunks_updated_in_place": 0,
            "chunks_rebuilt": 0,
            "critical_mass": None, "break_even_queue": None, "cpu_rate": None, "copy_rate": None, "gpu_rate": None,
            "in_place_rate": None, "fixed_s": None,
            "plan": None, "calibrations": [],
            "time_s": {"partition": 0.0, "gpu_issue": 0.0, "gpu_wait": 0.0, "cpu": 0.0, "copy": 0.0, "merge": 0.0,
                       "load": 0.0, "hot": 0.0, "hot_rebuild": 0.0, "calibrate": 0.0, "total": 0.0},
        }
        self._last_batch: dict[str, Any] | None = None
        if old is not None:
            self._stats["time_s"]["build"] = old

    _PER_BATCH = ("queries", "pieces", "hot_hits", "hot_rebuilds", "queries_gpu", "queries_cpu", "queries_in_place",
                  "chunk_hits", "chunk_misses", "evictions", "bytes_copied", "bytes_calibration", "disk_loads",
                  "bytes_loaded")

    def _snapshot(self) -> dict[str, Any]:
        with self._stats_lock:
            return {**{k: self._stats[k] for k in self._PER_BATCH}, "time_s": dict(self._stats["time_s"])}

    def _since(self, before: dict[str, Any]) -> dict[str, Any]:
        """The counters' growth since ``before``: one call's share (the copies, CPU/GPU split, seconds)."""
        now = self._snapshot()
        out = {k: now[k] - before[k] for k in self._PER_BATCH}
        out["time_s"] = {k: v - before["time_s"].get(k, 0.0) for k, v in now["time_s"].items() if k != "build"}
        out["plan"] = self._stats["plan"]
        return out

    def _count(self, name: str, amount: int) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    def stats(self) -> dict[str, Any]:
        """Counters since construction or :meth:`reset_stats`: batches, queries and pieces (a range's share of
        one chunk), queries answered by the GPU (the cache tier, or reading their chunk in place: also counted in
        ``queries_in_place``) and by the CPU, chunk hits and misses of the
        GPU's queues, evictions, bytes copied into the cache (and by the one-time calibration) and read from
        disk, hot-tier hits and rebuilds, chunks updated in place (``chunks_updated_in_place``) and rebuilt
        (``chunks_rebuilt``) by updates, the rates and the plan (queries per processor) of the last chunk batch,
        seconds per stage (partition, GPU issue and pacing waits, CPU lookups, copies as timed on the copy stream,
        merge, disk loads, hot tier, calibration, total, and the build), ``calibrations`` (the last
        ``CALIBRATIONS_KEPT`` of a lookup way: the way, whether on point lookups, each slice's lookups and seconds,
        warm-up first, the way's rate and fixed seconds after it, and whether it changed them), the cache's and the
        hot tier's current contents, and ``last_batch``: the same counters and seconds for the last call alone."""
        with self._stats_lock:
            s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._stats.items()}
            s["calibrations"] = [dict(c, slices=[list(x) for x in c["slices"]]) for c in s["calibrations"]]
        s["resident_chunks"] = 0 if self._cache is None else len(self._cache.entries)
        s["resident_bytes"] = 0 if self._cache is None else self._cache.used()
        s["gpu_budget"], s["chunks"] = self.gpu_budget, len(self._chunks)
        s["hot_keys"] = 0 if self._tier is None else self._tier["n_keys"]
        s["hot_pairs"] = 0 if self._tier is None else self._tier["pairs_n"]
        s["last_batch"] = None if self._last_batch is None else {
            k: (dict(v) if isinstance(v, dict) else v) for k, v in self._last_batch.items()}
        return s

    def memory(self) -> dict[str, int]:
        """Bytes: the chunks' host blobs loaded so far, all chunks, the chunk cache's slabs allocated on ``device``
        less the search parts in them, the hot-key tier and the search parts kept on ``device`` for in-place reads
        (module doc)."""
        return {
            "host": sum(c.nbytes for c in self._chunks if c.host is not None),
            "chunks": sum(c.nbytes for c in self._chunks),
            "cache": 0 if self._cache is None else self._cache.allocated() - self._search_resident(),
            "hot": self._hot_bytes(),
            "search": self._search_resident(),
        }

    def _hot_bytes(self) -> int:
        n = 0 if self._tier is None else sum(t.nbytes for t in self._tier["tensors"].values())
        n += 0 if self._hot_cand is None else sum(t.nbytes for t in self._hot_cand)
        return n

    def chunk_info(self) -> list[dict[str, Any]]:
        """Per chunk: keys, bytes, first ordered key of its range, whether it is loaded and cached, its kind
        (``"pairs"`` or ``"nodes"``)."""
        return [{"n": c.n, "bytes": c.nbytes, "lo": c.lo, "loaded": c.host is not None,
                 "cached": self._cache is not None and c in self._cache, "kind": c.kind} for c in self._chunks]

    def __repr__(self) -> str:
        return (f"ChunkedIndex(keys={self._n}, key_type={self.key_type}, chunks={len(self._chunks)}, "
                f"device={self.device}, gpu_budget={self.gpu_budget}, bytes={sum(c.nbytes for c in self._chunks)})")


@dataclass
class _InPlace:
    """One node chunk's share of an update batch, planned (:meth:`ChunkedIndex._plan_in_place`): sorted by
    (key, row offset), sliced by bucket, nodes reserved from the chunk's slack."""

    chunk: _Chunk
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


@dataclass
class _Batch:
    """One batch's partitioned queries and what its processors measured."""

    form: str
    s_lo: torch.Tensor
    s_hi: torch.Tensor | None
    values: torch.Tensor | None
    D: torch.device
    part_event: Any
    key_order: bool = False  # the queries came sorted by key (ChunkedIndex._serve's key_order)
    copies: list = field(default_factory=list)
    # (start event, end event or seconds, queries, the share of the time that is theirs) per GPU queue or launch
    gpu_lookups: list = field(default_factory=list)
    in_place_lookups: list = field(default_factory=list)  # the same for queues the GPU read in place
    cpu_calls: list = field(default_factory=list)  # (queries, seconds) of each CPU call
    cpu_copy_bytes: int = 0
    cpu_copy_time: float = 0.0

    @property
    def points(self) -> bool:
        """Whether the batch is point lookups (first row and count), the workload the planner's rates are for."""
        return self.form == "lookup" and self.s_hi is None

    def queue(self, task: _Task, S: torch.device, index: ChunkedIndex) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The task's queries on the serving device S."""
        a, b = task.start, task.start + task.size
        lo = self.s_lo[a:b]
        hi = None if self.s_hi is None else self.s_hi[a:b]
        if S == self.D:
            return lo, hi
        if self.D.type == "cuda":  # to the CPU worker
            out = self._to_host(lambda: [lo, hi], index)
            return out[0], out[1]
        return lo.to(S, non_blocking=True), None if hi is None else hi.to(S, non_blocking=True)

    def joined_queues(self, tasks: list[_Task], S: torch.device, index: ChunkedIndex) -> torch.Tensor:
        """The point queries of ``tasks`` one after the other on S (for :meth:`ChunkedIndex._answer_group`)."""
        parts = lambda: [torch.cat([self.s_lo[t.start : t.start + t.size] for t in tasks])]  # noqa: E731
        if self.D.type == "cuda" and S.type == "cpu":
            return self._to_host(parts, index)[0]
        return parts()[0].to(S)

    def _to_host(self, make, index: ChunkedIndex) -> list:
        """The tensors ``make()`` returns (made on the I/O stream, after the partition), copied to pinned host
        memory and waited for: what the CPU worker reads."""
        io = index._io_stream
        with torch.cuda.stream(io):
            io.wait_event(self.part_event)
            out = [None if t is None else torch.empty(t.numel(), dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                   for t in make()]
            io.synchronize()
        return out


# ------------------------------------------------------------------------------------------------- helpers
def _joined(tasks: list, sq: torch.Tensor, D: torch.device):
    """The point answers of ``tasks`` (``result`` = (tag, a, b)) joined per serving device: yields (positions in
    ``sq``'s order, a, b) on D, one scatter per device rather than one per queue (a batch has a queue per chunk).
    The CPU's answers cross to D in one pinned copy."""
    by_device: dict[torch.device, list] = {}
    for t in tasks:
        by_device.setdefault(t.result[1].device, []).append(t)
    for dev, ts in by_device.items():
        # Every queue on one device: their positions are all of sq, in order (queues follow sq).
        idx = sq if len(ts) == len(tasks) else torch.cat([sq[t.start : t.start + t.size] for t in ts])
        parts = []
        for k in (1, 2):
            xs = [t.result[k] for t in ts]
            if D.type == "cuda" and dev.type == "cpu":  # joined in pinned memory, then one asynchronous copy
                x = torch.empty(sum(v.numel() for v in xs), dtype=xs[0].dtype, pin_memory=True)
                torch.cat(xs, out=x)
            else:
                x = torch.cat(xs) if len(xs) > 1 else xs[0]
            parts.append(x.to(D, non_blocking=D.type == "cuda"))  # to the CPU: waited for, it is read next
        yield idx, parts[0], parts[1]


def _key_sorted(ordered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordered keys (int64 holding uint64) in the chunks' order, ascending unsigned, and the permutation that sorts
    them."""
    flipped, order = torch.sort(ordered ^ TOP)
    return flipped ^ TOP, order


def _aggregated(result: tuple, values: torch.Tensor, D: torch.device, sum_dtype: torch.dtype) -> tuple:
    """A queue's aggregate answer (:meth:`ChunkedIndex._answer`) as (count, sum) on D: the kernel's, or summed
    here from the CSR rows where the kernel could not take the values (another device, or values that do not
    cover one per pair)."""
    a, b = (x.to(D) for x in result[1:])
    if result[0] != "csr":
        return a.to(torch.int64), b.to(sum_dtype)
    per = a[1:] - a[:-1]
    owner = torch.repeat_interleave(torch.arange(per.numel(), device=D), per, output_size=b.numel())
    total = torch.zeros(per.numel(), dtype=sum_dtype, device=D)
    return per, total.index_add_(0, owner, values.index_select(0, b).to(sum_dtype))


def _pair_rows(pairs: torch.Tensor, n: int, layout: str) -> torch.Tensor:
    """The row words of ``n`` pairs in ``layout`` (csrc/cgrx/cgrx_core.h), as a view of ``pairs``."""
    if layout == "packed_row":
        return pairs.view(-1, 3)[:n, 2]
    if layout == "aligned_row":
        return pairs.view(-1, 4)[:n, 2]
    return pairs[2 * n : 3 * n]


def _place_rows(pairs: torch.Tensor, layout: str, rows_sorted: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The row IDs of a cgRX structure built over keys in row order (local row r is ``rows_sorted[r]``, ascending):
    returns (base, row map), base the smallest row. Rows spanning < 2^32 (every chunk of an index under 2^32 keys):
    each pair holds its row's offset from base in place of its local row (rewritten here) and the map is empty, so
    a lookup needs no map (one dependent read fewer, over PCIe where the GPU reads a chunk in place) and the
    structure carries none; offsets ascend with local rows, so the pairs' order (key, then row) is unchanged.
    Wider spans keep local rows and the map holds each one's offset from base (int64)."""
    n = rows_sorted.numel()
    base = int(rows_sorted[0]) if n else 0
    offsets = rows_sorted - base
    if n == 0 or int(rows_sorted[-1]) - base < 2**32:
        _rows_as_offsets(pairs, n, layout, offsets.to(torch.int32))
        return base, torch.empty(0, dtype=torch.int32, device=pairs.device)
    return base, offsets


def _rows_as_offsets(pairs: torch.Tensor, n: int, layout: str, offsets: torch.Tensor) -> None:
    """Replaces each pair's local row r by ``offsets[r]`` (int32 holding unsigned 32-bit values), in place."""
    if n:
        words = _pair_rows(pairs, n, layout)
        words.copy_(offsets.index_select(0, words.to(torch.int64) & 0xFFFFFFFF))


def _seconds(fn, device: torch.device) -> float:
    """Seconds ``fn`` takes on ``device``: CUDA events around it on the current stream (waited for), else the
    host clock."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    stream = torch.cuda.current_stream(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    fn()
    b.record(stream)
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def _check_hot_sample(hot_sample) -> None:
    if hot_sample is not None and (isinstance(hot_sample, bool) or not isinstance(hot_sample, int) or hot_sample < 1):
        raise ValueError(f"hot_sample must be None (by device) or a positive integer, got {hot_sample!r}")


def _capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
    if capacity < 0:
        raise ValueError(f"capacity must be non-negative, got {capacity}")
    return capacity


def _capped(full: tuple[torch.Tensor, torch.Tensor], capacity: int) -> CappedMatches:
    offsets, rows = full
    out = torch.full((capacity,), -1, dtype=torch.int64, device=rows.device)
    m = min(capacity, rows.numel())
    out[:m] = rows[:m]
    return CappedMatches(offsets, out, torch.tensor(rows.numel(), dtype=torch.int64, device=rows.device))


def _combine_csr(q: int, parts: list, D: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One CSR answer for q queries from parts (query ids, offsets, rows) over disjoint sets of queries."""
    per = torch.zeros(q, dtype=torch.int64, device=D)
    for idx, off, _ in parts:
        per.index_copy_(0, idx, (off[1:] - off[:-1]).to(D))
    offsets = torch.zeros(q + 1, dtype=torch.int64, device=D)
    torch.cumsum(per, 0, out=offsets[1:])
    out = torch.empty(sum(r.numel() for _, _, r in parts), dtype=torch.int64, device=D)
    for idx, off, rows in parts:
        if rows.numel():
            off, rows = off.to(D), rows.to(D)
            cnt = off[1:] - off[:-1]
            shift = torch.repeat_interleave(offsets.index_select(0, idx) - off[:-1], cnt, output_size=rows.numel())
            out.index_copy_(0, shift + torch.arange(rows.numel(), device=D), rows)
    return offsets, out


def _remove_pairs(keys, rows, del_k, del_r) -> tuple[torch.Tensor, int, int]:
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


def _progress_bar(total: int, progress: bool | None):
    class _Silent:
        def update(self, n):
            pass

        def close(self):
            pass

    if progress is False:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    import sys

    if progress is None and not sys.stderr.isatty():
        return _Silent()
    return tqdm(total=total, unit="key", unit_scale=True, desc="ChunkedIndex build", delay=3.0)


def _generations(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.startswith("gen-") and name.endswith(".json"):
            try:
                out.append(int(name[4:-5]))
            except ValueError:
                pass
        elif name.startswith("gen-") and not name.endswith(".tmp") and name[4:].isdigit():
            out.append(int(name[4:]))
    return sorted(set(out))


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _write_chunk_file(path: str, blob: torch.Tensor, kind: str = "pairs") -> int:
    """Header (magic of the chunk's kind, payload size) and the blob; returns the CRC-32 of the whole file."""
    header = _MAGICS[kind] + blob.numel().to_bytes(8, "little")
    data = memoryview(blob.numpy())
    with open(path, "wb") as f:
        f.write(header)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return zlib.crc32(data, zlib.crc32(header))


def _read_chunk_file(file: dict | None, size: int, pin: bool) -> torch.Tensor:
    if file is None:
        raise RuntimeError("ChunkedIndex: a chunk has neither a host copy nor a file (internal error)")
    path = file["path"]
    try:
        actual = os.path.getsize(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"ChunkedIndex chunk file {path} is gone (the directory was saved over at least twice since this index "
            "was opened, or files were removed); open the directory again"
        ) from None
    if actual != size + 16:
        raise ValueError(f"ChunkedIndex chunk file {path} is truncated or corrupt: {actual} bytes, expected {size + 16}")
    buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    with open(path, "rb") as f:
        header = f.read(16)
        got = f.readinto(memoryview(buf.numpy()))
    magic = _MAGICS[file.get("kind", "pairs")]
    if got != size or header[:8] != magic or int.from_bytes(header[8:], "little") != size:
        raise ValueError(f"ChunkedIndex chunk file {path} is corrupt: bad header (not a {file.get('kind', 'pairs')} "
                         "chunk) or short read")
    crc = zlib.crc32(memoryview(buf.numpy()), zlib.crc32(header))
    if crc != file["crc32"]:
        raise ValueError(
            f"ChunkedIndex chunk file {path} is corrupt: CRC-32 {crc:#010x}, the manifest says {file['crc32']:#010x}"
        )
    return buf
