"""The fast tier: whole chunks within a byte budget on the cache's device, none twice, in slabs carved into slots.

Eviction is a policy object (:class:`DemandPolicy`, the default, or :class:`LruPolicy`). The cache copies chunks
in on its own copy stream and reuses a slot exactly when the device has finished the last lookup that read it
(events, not the allocator). A second slab (``shared``) is the index's reservation for search parts kept on the
GPU for in-place reads (:meth:`ChunkCache.keep_search_part`); chunks use it until search parts need its room.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .hot_tier import HOT_MAX_KEYS
from .store import ALIGN, SEARCH_PARTS, Chunk, ChunkView, align

if TYPE_CHECKING:
    from .config import Eviction


class Arena:
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
        size = align(size)
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
        size = align(size)
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
        size = align(size)
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

    def free_bytes(self) -> int:
        self.reclaim()
        return sum(s for _, s in self.free)

    def events_over(self, off: int, size: int) -> list:
        """The last-use events of evicted slots overlapping [off, off + size) (completed ones are forgotten)."""
        self.retired = [r for r in self.retired if not r[2].query()]
        return [ev for o, s, ev in self.retired if o < off + size and off < o + s]


@dataclass
class Entry:
    """A cached chunk: its slot and view, when its copy is done and when its last lookup is."""

    chunk: Chunk
    arena: Arena  # the slab its slot is in
    off: int
    view: ChunkView
    ready: Any = None  # event: the copy into the slot is done
    last_use: Any = None  # event: the last lookup reading the slot is done
    tick: int = 0


class DemandPolicy:
    """Evicts the chunk with the least demand still pending in the current batch, then the least heat (its queue
    sizes over past batches, exponentially averaged: the demand the next batch is likely to bring), then the
    least recently used."""

    name = "demand"

    def order_key(self, entries: dict[Chunk, Entry], demand: dict[Chunk, int]) -> Callable[[Chunk], Any]:
        return lambda c: (demand.get(c, 0), c.heat, entries[c].tick)


class LruPolicy:
    """Evicts the least recently used chunk."""

    name = "lru"

    def order_key(self, entries: dict[Chunk, Entry], demand: dict[Chunk, int]) -> Callable[[Chunk], Any]:
        return lambda c: entries[c].tick


POLICIES = {p.name: p for p in (DemandPolicy, LruPolicy)}


class ChunkCache:
    """The fast tier: whole chunks within a byte budget, none twice.

    Eviction by ``policy`` (``"demand"``, the default, see :class:`DemandPolicy`; or ``"lru"``). A chunk larger
    than the budget is never cached (its queues go to the CPU).

    Its memory is a slab (``arena``) of ``budget`` bytes and, with ``spare``, a second one (``shared``) whose
    room :meth:`place_top` carves slots from, top first, for the index's search parts: chunks use it too while
    those do not need the room, and are evicted from it when they do. A chunk up to ``budget`` always fits the
    first. Each slab is allocated on first use."""

    def __init__(self, budget: int, device: torch.device, policy: "Eviction" = "demand", spare: int = 0) -> None:
        self.budget, self.device = budget, device
        self.policy = POLICIES[policy]()
        self.arena = Arena(budget, device)
        self.shared = Arena(spare, device) if spare > 0 else None
        self.arenas = [self.arena] + ([self.shared] if self.shared is not None else [])
        self.entries: dict[Chunk, Entry] = {}
        self.tick = 0
        self.copy_stream = None  # CUDA: the stream chunks are copied in on, made on first use

    def __contains__(self, chunk: Chunk) -> bool:
        return chunk in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def search_budget(self) -> int:
        """Bytes reserved for search parts kept on the device (the shared slab)."""
        return 0 if self.shared is None else self.shared.budget

    def fits(self, chunk: Chunk) -> bool:
        return align(chunk.nbytes) <= self.budget

    def used(self) -> int:
        return sum(align(e.chunk.nbytes) for e in self.entries.values())

    def victim_order(self, demand: dict[Chunk, int]) -> list[Chunk]:
        """Resident chunks, the first to evict first."""
        return sorted(self.entries, key=self.policy.order_key(self.entries, demand))

    def evict(self, chunk: Chunk) -> None:
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

    def _alloc(self, size: int) -> tuple[Arena, int] | None:
        for arena in self.arenas:
            off = arena.alloc(size)
            if off is not None:
                return arena, off
        return None

    def make_room(self, chunk: Chunk, demand: dict[Chunk, int]) -> tuple[tuple[Arena, int] | None, int]:
        """A slot (slab, offset) for ``chunk``, evicting by the policy as needed, and how many chunks were evicted;
        None if it cannot fit at all."""
        if align(chunk.nbytes) > self.budget:
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

    # ------------------------------------------------------------------------------------- device memory
    def slab(self, arena: Arena) -> torch.Tensor:
        """One of the slabs, allocated on first use (on the current stream, which the copy stream then follows)."""
        fresh = arena.buf is None
        buf = arena.storage()
        if fresh and self.device.type == "cuda":
            self._copy_stream().wait_stream(torch.cuda.current_stream(self.device))
        return buf

    def _copy_stream(self):
        if self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(self.device)
        return self.copy_stream

    def copy_in(self, chunk: Chunk, host: torch.Tensor, demand: dict[Chunk, int],
                make_view: Callable[[Chunk, torch.Tensor], ChunkView]) -> tuple[Entry, int, tuple]:
        """Places ``chunk`` (its host blob ``host``): a slot (evicting by the policy), then the copy on the copy
        stream, after the last lookups that read the slot's space. Returns the entry, the chunks evicted and how
        the copy is timed: (start event, end event, bytes) on CUDA, else (None, seconds, bytes)."""
        place, evicted = self.make_room(chunk, demand)
        if place is None:
            raise RuntimeError(f"ChunkedIndex: chunk of {chunk.nbytes} bytes does not fit gpu_budget={self.budget}")
        arena, off = place
        try:
            buf = self.slab(arena)
        except BaseException:  # out of memory making the slab: the slot goes back, the index stays usable
            arena.release(off, chunk.nbytes, None)
            raise
        slot = buf[off : off + chunk.nbytes]
        ready = None
        if self.device.type == "cuda":
            copy = self._copy_stream()
            for ev in arena.events_over(off, align(chunk.nbytes)):
                copy.wait_event(ev)
            start, ready = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(copy):
                start.record(copy)
                slot.copy_(host, non_blocking=True)
                ready.record(copy)
            timing = (start, ready, chunk.nbytes)
        else:
            t0 = time.perf_counter()
            slot.copy_(host)
            timing = (None, time.perf_counter() - t0, chunk.nbytes)
        entry = Entry(chunk, arena, off, make_view(chunk, slot), ready=ready)
        self.entries[chunk] = entry
        return entry, evicted, timing

    def keep_search_part(self, parts: dict[str, torch.Tensor], need: int, resident: int) -> tuple[dict, int]:
        """Copies of a chunk's search part (``parts``: its tensors, read from its mapped blob; ``need`` bytes) in
        the shared slab, evicting cached chunks there, and that slot's offset; with ``resident`` bytes of search
        parts already kept, if the reservation has no room, none (the view reads them over PCIe too) and -1. Out
        of memory here is no error: the view reads in place."""
        if need == 0 or resident + need > self.search_budget:
            return {}, -1
        try:
            buf = self.slab(self.shared)
        except torch.OutOfMemoryError:
            return {}, -1
        off = self.place_top(need)
        if off is None:
            return {}, -1
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:
            for ev in self.shared.events_over(off, align(need)):
                stream.wait_event(ev)  # the evicted chunks' last lookups (or copies) are done with the slot
        kept, at = {}, off
        for name in SEARCH_PARTS:  # each part at an aligned offset, as an allocation of its own would be
            src = parts[name]
            kept[name] = buf[at : at + src.nbytes].view(src.dtype)
            kept[name].copy_(src)
            at += align(src.nbytes)
        return kept, off


def split_budget(budget: int, largest: int, hot_keys: int | None, hot_key_bytes: int,
                 search: int) -> tuple[int, int, int]:
    """``budget`` bytes split between the hot tier, the chunk cache and the search parts kept for in-place reads:
    (hot tier keys, cache bytes, search-part bytes). ``largest``: the largest chunk's aligned bytes; ``hot_keys``:
    the tier's requested capacity (None: a sixteenth of the budget, at most HOT_MAX_KEYS, if the rest still holds
    two chunks); ``hot_key_bytes``: its reservation per key; ``search``: the search parts' bytes wanted (kept
    only if the rest still holds two chunks). A budget that holds no chunk next to what is asked is a ValueError
    saying what to change; 0 is no cache."""
    if budget and largest > budget:
        raise ValueError(
            f"gpu_budget={budget} bytes holds no chunk: the largest chunk takes {largest} bytes; "
            "raise gpu_budget, lower chunk_bytes (a run of equal keys always stays in one chunk), or pass "
            "gpu_budget=0 to serve from host memory only"
        )
    cap = hot_keys
    if cap is None:  # automatic: a sixteenth of the budget, if the rest still holds two chunks
        cap = min(HOT_MAX_KEYS, budget // 16 // hot_key_bytes)
        if budget - cap * hot_key_bytes < 2 * largest:
            cap = 0
    elif budget and budget - cap * hot_key_bytes < largest:
        raise ValueError(
            f"hot_keys={cap} takes {cap * hot_key_bytes} bytes of gpu_budget={budget}, and the rest holds no "
            f"chunk (the largest takes {largest} bytes); lower hot_keys or raise gpu_budget"
        )
    rest = budget - cap * hot_key_bytes if budget else 0
    if not rest or rest - search < 2 * largest:
        search = 0
    return cap, rest - search, search


__all__ = ["ALIGN", "Arena", "ChunkCache", "DemandPolicy", "Entry", "LruPolicy", "split_budget"]
