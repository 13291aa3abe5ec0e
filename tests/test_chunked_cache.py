"""The out-of-core index's chunk cache through its own API: eviction policies, slots in its slabs, the shared slab
lent to chunks until search parts need it."""

from __future__ import annotations

import pytest
import torch

from torch_rtindex.chunked.cache import ChunkCache, split_budget
from torch_rtindex.chunked.store import Chunk


def _cache_chunk(nbytes, heat=0.0):
    c = Chunk(0, 1, 0, 0, 0, [], nbytes, None)
    c.heat = heat
    return c


def _entry(chunk, slot):
    arena, off = slot
    return type("E", (), {"arena": arena, "off": off, "last_use": None, "ready": None, "tick": 0, "chunk": chunk})()


def test_cache_policy_demand_then_heat_then_lru():
    chunk = _cache_chunk
    cache = ChunkCache(4 * 256, torch.device("cpu"))
    a, b, c, d = chunk(256, 5.0), chunk(256, 1.0), chunk(256, 1.0), chunk(256, 0.0)
    for x in (a, b, c, d):
        slot, evicted = cache.make_room(x, {})
        assert evicted == 0
        cache.entries[x] = _entry(x, slot)
    cache.entries[b].tick, cache.entries[c].tick, cache.entries[d].tick = 3, 2, 1
    # pending demand first: d is needed by this batch, the rest are not
    assert cache.victim_order({d: 10}) == [c, b, a, d]  # then heat (b, c: 1.0 < a: 5.0), then LRU (c before b)
    new = chunk(512, 0.0)
    slot, evicted = cache.make_room(new, {d: 10})
    assert slot is not None and evicted == 2 and set(cache.entries) == {a, d}  # c, b evicted, freed space coalesced
    lru = ChunkCache(4 * 256, torch.device("cpu"), policy="lru")
    for x in (a, d):
        slot, _ = lru.make_room(x, {})
        lru.entries[x] = _entry(x, slot)
    lru.entries[a].tick, lru.entries[d].tick = 2, 1
    assert lru.victim_order({d: 10}) == [d, a]  # recency alone: demand and heat do not count
    assert cache.make_room(chunk(4096, 0.0), {}) == (None, 0)  # larger than the budget: never cached


def test_the_cache_lends_its_shared_slab_to_chunks_until_slots_need_it():
    """With ``spare``, the cache has a second slab: chunks fill the first, then the second while no slot is
    carved from it; carving a slot there (top first) evicts chunks from it (by the policy), never from the first,
    and a chunk of the whole budget always fits the first. A dropped view's slot comes back at the next use."""
    cache = ChunkCache(4 * 256, torch.device("cpu"), spare=2 * 256)
    main, shared = cache.arena, cache.shared
    assert (main.budget, shared.budget, cache.allocated()) == (4 * 256, 2 * 256, 0)
    chunks = [_cache_chunk(256, heat) for heat in (6.0, 5.0, 4.0, 3.0, 2.0, 1.0)]
    want = [(main, i * 256) for i in range(4)] + [(shared, 0), (shared, 256)]
    for x, slot in zip(chunks, want):  # six chunks: the shared slab holds two of them
        assert cache.make_room(x, {}) == (slot, 0)
        cache.entries[x] = _entry(x, slot)
    assert cache.place_top(100) == 256  # an aligned slot at the top: the coolest chunk there is evicted
    assert set(cache.entries) == set(chunks[:5])
    assert cache.place_top(256) == 0 and set(cache.entries) == set(chunks[:4])
    assert cache.place_top(256) is None  # the slab is all slots: nothing in the first slab is evicted
    assert set(cache.entries) == set(chunks[:4])
    cache.evict(chunks[0])
    y = _cache_chunk(256)
    assert cache.make_room(y, {}) == ((main, 0), 0)  # chunks go to the first slab's room
    cache.entries[y] = _entry(y, (main, 0))
    cache.clear()
    assert cache.make_room(_cache_chunk(4 * 256), {}) == ((main, 0), 0)  # a chunk of the whole budget fits
    shared.dropped.append((0, 256))  # a dropped view's slot (as its finalizer queues it)
    assert cache.make_room(_cache_chunk(256), {}) == ((shared, 0), 0)
    assert not shared.dropped


def test_the_budget_is_split_between_the_hot_tier_the_cache_and_search_parts():
    # automatic tier: a sixteenth of the budget at its bytes per key, if the rest still holds two chunks
    assert split_budget(1 << 20, 4096, None, 32, 0) == ((1 << 20) // 16 // 32, (1 << 20) - (1 << 20) // 16, 0)
    assert split_budget(8500, 4096, None, 32, 0) == (0, 8500, 0)  # the rest would not hold two chunks
    assert split_budget(1 << 20, 4096, 100, 32, 5000) == (100, (1 << 20) - 3200 - 5000, 5000)
    assert split_budget(20000, 4096, 100, 32, 10000) == (100, 20000 - 3200, 0)  # search parts would crowd chunks
    assert split_budget(0, 4096, None, 32, 5000) == (0, 0, 0)  # no budget: no tier, no cache
    with pytest.raises(ValueError, match="holds no chunk"):
        split_budget(1000, 4096, None, 32, 0)
    with pytest.raises(ValueError, match="hot_keys=1000 takes 32000 bytes"):
        split_budget(32000, 4096, 1000, 32, 0)



def test_out_of_memory_making_a_slab_gives_the_slot_back(monkeypatch):
    """The slab is allocated on the first copy; out of memory there raises, allocates nothing, caches nothing and
    gives the slot back, so the next copy (with memory) takes the whole slab again."""
    from torch_rtindex.chunked.cache import Arena

    cache = ChunkCache(4 * 256, torch.device("cpu"))
    chunk, host = _cache_chunk(200), torch.arange(200, dtype=torch.uint8)
    plain = Arena.storage

    def no_memory(self):
        raise torch.OutOfMemoryError("injected: no room for the slab")

    monkeypatch.setattr(Arena, "storage", no_memory)
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        cache.copy_in(chunk, host, {}, lambda c, slot: slot)
    arena = cache.arena
    assert arena.buf is None and arena.free == [(0, arena.budget)] and not cache.entries and cache.allocated() == 0
    monkeypatch.setattr(Arena, "storage", plain)
    entry, evicted, _ = cache.copy_in(chunk, host, {}, lambda c, slot: slot)
    assert evicted == 0 and chunk in cache and entry.off == 0 and torch.equal(entry.view, host)
