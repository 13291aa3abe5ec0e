"""ChunkedIndex against the numpy reference and CgRXIndex over the same keys, with tiny chunks and a tiny cache
budget so that chunks move all the time: every lookup form on each processor and key type, budgets, per-batch
stats, clear errors, the benchmark's smoke run and the README's section, the joins, row IDs past 2^32, CUDA and CPU
indexes and queries mixed, zero-copy serving and search parts kept on the GPU, cold chunk views. The hot tier, the
queues, updates and saved files are tested in test_chunked_tier.py, test_chunked_queues.py, test_chunked_updates.py
and test_chunked_files.py; chunked_support.py holds the helpers they share."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref

import pytest
import torch
from chunked_support import DUP_BUDGET, ROOT, SMALL, check_all_forms, chunk_of, chunked, fixed_rates
from keysets import I64_MAX, I64_MIN, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import CgRXIndex, ChunkedIndex
from torch_rtindex.chunked.build import Builder
from torch_rtindex.chunked.cache import Arena
from torch_rtindex.chunked.config import ChunkedConfig
from torch_rtindex.chunked.stats import Stats
from torch_rtindex.chunked.store import SEARCH_SLACK, TOP, ChunkStore, align, search_bytes


def test_point_queues_by_id_where_the_partition_operator_declines(gen, monkeypatch):
    """Point batches are grouped by partition_queries; with more chunks than it takes on CUDA, by chunk id
    (group_by): both give the same queues' answers."""
    import torch_rtindex.chunked.executor as executor_module

    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    monkeypatch.setattr(executor_module, "partition_points", lambda *a, **k: None)
    check_all_forms(index, keys, "int64", gen, "cpu", n_q=300, widths=(5,))


@pytest.mark.parametrize("kind", ["uniform", "duplicates", "clustered", "narrow"])
@pytest.mark.parametrize("processors", ["auto", "gpu", "cpu"])
def test_every_form_matches_reference_and_cgrx(device, gen, kind, processors):
    keys = int64_keys(kind, 3000, gen)
    index = chunked(keys.to(device), device, processors=processors,
                    gpu_budget=DUP_BUDGET if kind == "duplicates" else 3 * SMALL)
    assert index.num_chunks > 5
    check_all_forms(index, keys, "int64", gen, device)
    s = index.stats()
    if processors == "cpu":
        assert s["queries_gpu"] == 0 and s["chunk_misses"] == 0
    if processors == "gpu":
        assert s["queries_cpu"] == 0 and s["chunk_misses"] > s["chunks"] and s["evictions"] > 0
    assert s["resident_bytes"] <= index.gpu_budget


@pytest.mark.parametrize("key_type", ["int32", "float32", "float64", "uint64"])
def test_key_types(device, gen, key_type):
    keys = keys_of_type(key_type, 2000, gen)
    index = chunked(keys.to(device), device, key_type=key_type if key_type == "uint64" else None)
    check_all_forms(index, keys, key_type, gen, device, n_q=300)


def test_both_processors_share_a_batch(gen, monkeypatch):
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu")
    q = keys[torch.randint(0, keys.numel(), (3000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    fixed_rates(index, monkeypatch, cpu=1e6, copy=1e6, gpu=1e6)  # as fast as each other: both get a share
    for _ in range(3):
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    s = index.stats()
    assert s["queries_gpu"] > 0 and s["queries_cpu"] > 0 and s["queries_gpu"] + s["queries_cpu"] == s["pieces"]


def test_a_run_of_equal_keys_stays_in_one_chunk(gen):
    keys = torch.cat([torch.arange(1000), torch.full((900,), 500), torch.arange(2000, 2600)])
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    info = index.chunk_info()
    assert sum(c["n"] for c in info) == keys.numel() and len(info) > 4
    assert max(c["n"] for c in info) >= 901  # the run made one larger chunk
    los = [c["lo"] for c in info]
    assert los[1:] == sorted(los[1:])
    ref = Reference(keys, "int64")
    q = torch.tensor([500, 499, 501, 0, 2599, 1500])
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q), first, count)
    check_matches(index.lookup_all(q), rows)


def test_ranges_across_many_chunks_and_edges(gen):
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu")
    cg = CgRXIndex(keys)
    lo = torch.tensor([I64_MIN, I64_MIN, 0, -1, I64_MAX, 5, I64_MAX])
    hi = torch.tensor([I64_MAX, -1, I64_MAX, 0, I64_MAX, 4, I64_MIN])
    got, want = index.range(lo, hi), cg.range(lo, hi)
    assert torch.equal(got.offsets, want.offsets) and torch.equal(got.rows, want.rows)
    assert int(got.offsets[1]) == keys.numel()
    g, w = index.range_lookup(lo, hi), cg.range_lookup(lo, hi)
    assert torch.equal(g.first_row, w.first_row) and torch.equal(g.count, w.count)
    assert index.stats()["pieces"] > index.num_chunks  # the full range was cut into one piece per chunk


def test_empty_index_empty_batches_and_one_chunk(gen):
    empty = chunked(torch.empty(0, dtype=torch.int64), "cpu")
    assert len(empty) == 0 and empty.num_chunks == 1
    r = empty.lookup(torch.tensor([1, 2]))
    assert r.first_row.tolist() == [-1, -1] and r.count.tolist() == [0, 0]
    assert empty.range(torch.tensor([I64_MIN]), torch.tensor([I64_MAX])).rows.numel() == 0
    keys = int64_keys("duplicates", 1000, gen)
    for updatable in (False, True):  # one chunk: built from the keys as given (no sort), pairs or node chains
        one = ChunkedIndex(keys, device="cpu", chunk_bytes=1 << 30, gpu_budget=0, updatable=updatable)
        assert one.num_chunks == 1
        assert one.chunk_info()[0]["lo"] == int((torch.ops.rtindex.map_keys(keys, 0) ^ TOP).min()) ^ TOP  # smallest
        check_all_forms(one, keys, "int64", gen, "cpu", n_q=200)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    e = torch.empty(0, dtype=torch.int64)
    assert index.lookup(e).first_row.shape == (0,)
    assert index.lookup_all(e).offsets.tolist() == [0]
    assert index.range(e, e).rows.numel() == 0
    assert index.aggregate(e, torch.zeros(keys.numel())).sum.dtype == torch.float64
    assert index.range_capped(e, e, 4).rows.tolist() == [-1] * 4


def test_budgets(gen, monkeypatch):
    keys = int64_keys("uniform", 2000, gen)
    with pytest.raises(ValueError, match="holds no chunk"):
        ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=1000)
    index = ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=1 << 30, processors="gpu", hot_keys=0)
    q = keys[:500]
    index.lookup(q)
    index.reset_stats()
    index.processors = "auto"  # every chunk is cached now: the GPU takes every queue (as fast as a GPU would be)
    fixed_rates(index, monkeypatch, gpu=1e15)
    index.lookup(q)
    s = index.stats()
    touched = chunk_of(index, torch.ops.rtindex.map_keys(q, 0)).unique().numel()
    # everything stayed cached
    assert s["chunk_misses"] == 0 and s["chunk_hits"] == touched > 0 and s["queries_cpu"] == 0
    assert all(c["cached"] for c in index.chunk_info()) and s["resident_chunks"] == index.num_chunks == touched
    host_only = ChunkedIndex(keys, device="cpu", chunk_bytes=SMALL, gpu_budget=0)
    assert host_only.lookup(q).count.tolist() == index.lookup(q).count.tolist()
    with pytest.raises(ValueError, match="gpu_budget > 0"):
        host_only.processors = "gpu"
        host_only.lookup(q)


def test_per_batch_stats_equal_what_moved(gen):
    """Bytes copied per batch = the bytes of the chunks the batch touched that were not cached when it began
    (GPU-only serving: each touched chunk is copied at most once per batch), and the batches sum to the total."""
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu", gpu_budget=4 * SMALL + 1024, processors="gpu", hot_keys=0)
    total = 0
    for step in range(6):
        q = keys[torch.randint(0, keys.numel(), (50 + 200 * step,), generator=gen)]
        resident = {i for i, c in enumerate(index.chunk_info()) if c["cached"]}
        touched = set(torch.unique(chunk_of(index, torch.ops.rtindex.map_keys(q, 0))).tolist())
        sizes = [c["bytes"] for c in index.chunk_info()]
        index.lookup(q)
        last = index.stats()["last_batch"]
        assert last["bytes_copied"] == sum(sizes[i] for i in touched - resident), step
        assert last["chunk_misses"] == len(touched - resident) and last["chunk_hits"] == len(touched & resident)
        assert last["queries_gpu"] == q.numel() and last["queries_cpu"] == 0 and last["queries"] == q.numel()
        total += last["bytes_copied"]
    assert index.stats()["bytes_copied"] == total


def test_splitter_range_build_equals_one_sort(gen):
    keys = torch.cat([int64_keys("duplicates", 3000, gen), int64_keys("uniform", 2000, gen)])
    whole = chunked(keys, "cpu", gpu_budget=DUP_BUDGET)
    ranged = chunked(keys, "cpu", gpu_budget=DUP_BUDGET, build_sort_keys=700)
    assert [c["n"] for c in ranged.chunk_info()] != [] and len(ranged) == keys.numel()
    check_all_forms(ranged, keys, "int64", gen, "cpu", n_q=300)
    q = keys[:800]
    a, b = whole.lookup_all(q), ranged.lookup_all(q)
    assert torch.equal(a.rows, b.rows)


def test_out_of_memory_making_the_cache_slab_keeps_the_index_usable(gen, monkeypatch):
    """The cache's slab is allocated on the first copy; out of memory then fails that batch with a clear error and
    gives the slot it had taken back: the next batch allocates the slab and answers."""
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", processors="gpu", hot_keys=0)
    plain = Arena.storage

    def no_memory(self):
        raise torch.OutOfMemoryError("injected: no room for the slab")

    monkeypatch.setattr(Arena, "storage", no_memory)
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        index.lookup(keys[:500])
    # nothing allocated, nothing cached (the cache's own test checks that the slot went back)
    assert index.memory()["cache"] == 0 and index.stats()["resident_chunks"] == 0
    monkeypatch.setattr(Arena, "storage", plain)
    check_lookup(index.lookup(keys[:500]), *Reference(keys, "int64").points(keys[:500])[:2])


# ------------------------------------------------------------------------------------------------- errors
def test_clear_errors(gen):
    keys = int64_keys("uniform", 500, gen)
    with pytest.raises(ValueError, match="NaN"):
        ChunkedIndex(torch.tensor([1.0, float("nan")]), device="cpu")
    with pytest.raises(ValueError, match="backend"):
        ChunkedIndex(keys, device="cpu", backend="optix")
    with pytest.raises(ValueError, match="chunk_bytes"):
        ChunkedIndex(keys, device="cpu", chunk_bytes=10)
    with pytest.raises(ValueError, match="gpu_budget"):
        ChunkedIndex(keys, device="cpu", gpu_budget=-1)
    index = chunked(keys, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        index.lookup(torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="same length"):
        index.range(keys[:3], keys[:2])
    with pytest.raises(ValueError, match="one value per key"):
        index.aggregate(keys[:3], torch.ones(3))
    with pytest.raises(TypeError, match="capacity"):
        index.range_capped(keys[:3], keys[:3], 2.5)
    with pytest.raises(ValueError, match="processors"):
        index.processors = "both"
    with pytest.raises(ValueError, match="zero_copy.*CUDA"):
        index.processors = "zero_copy"  # the GPU reading pinned host memory: a CUDA index only
    assert index.lookup(keys[:3]).count.tolist() == [1, 1, 1]
    assert "ChunkedIndex(keys=505" in repr(index) and index.memory()["chunks"] > 0


def test_benchmark_smoke_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chunked_bench.py"), "--device", "cpu", "--log-keys", "14",
         "--log-lookups", "10,12", "--zipf", "0.99", "--chunk-mib", "0.0625", "--repeats", "1", "--hot-given",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, "RTINDEX_COMMIT": "testcommit"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "chunked_k14_testcommit.json").read_text())
    assert result["commit"] == "testcommit" and result["runs"]
    modes = {r["mode"] for r in result["runs"]}
    assert {"chunked", "cpu_only", "in_core", "hot_given"} <= modes
    assert all(r["checked"] for r in result["runs"] if not r.get("skipped"))
    given = [r for r in result["runs"] if r["mode"] == "hot_given"]
    # the tier holds what it was given
    assert all(r["hot_keys"] == result["build"]["hot_capacity_given"] > 0 for r in given)


def test_readme_section_runs():
    from test_readme_examples import python_blocks

    blocks = python_blocks("Indexes larger than GPU memory")
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md (Indexes larger than GPU memory)", "exec"), {})


def test_joins_take_a_chunked_index(gen):
    """The joins are written against lookup_all / range / their capped forms: a ChunkedIndex plugs in."""
    from torch_rtindex import join, join_capped, range_join

    keys = int64_keys("duplicates", 1500, gen)
    index, cg = chunked(keys, "cpu", gpu_budget=DUP_BUDGET), CgRXIndex(keys)
    probe = point_queries(keys, 300, gen)
    for how in ("inner", "left"):
        assert all(torch.equal(a, b) for a, b in zip(join(index, probe, how), join(cg, probe, how)))
    lo, hi = range_queries(keys, 100, gen, 2**40)
    assert all(torch.equal(a, b) for a, b in zip(range_join(index, lo, hi), range_join(cg, lo, hi)))
    assert all(torch.equal(a, b) for a, b in zip(join_capped(index, probe, 50), join_capped(cg, probe, 50)))


def test_row_ids_past_2_31_and_2_32():
    """A chunk's row map holds unsigned 32-bit offsets when its rows span < 2^32, int64 beyond."""
    index = chunked(torch.tensor([5, 6, 7]), "cpu", gpu_budget=0)
    index.insert(torch.tensor([5, 6]), rows=torch.tensor([3_000_000_000, 2**31]))
    assert index.chunk_info()[0]["row_map"] == 0  # rows spanning < 2^32: offsets from the chunk's base
    assert index.lookup_all(torch.tensor([5, 6])).rows.tolist() == [0, 3_000_000_000, 1, 2**31]
    index.insert(torch.tensor([7]), rows=torch.tensor([2**40]))
    assert index.chunk_info()[0]["row_map"] == 6  # past it: an int64 row map
    assert index.range(torch.tensor([5]), torch.tensor([7])).rows.tolist() == [0, 3_000_000_000, 1, 2**31, 2, 2**40]
    values = torch.zeros(2**20, dtype=torch.int64)
    with pytest.raises(ValueError, match="at least"):
        index.aggregate(torch.tensor([5]), values)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("processors", ["auto", "gpu", "cpu"])
def test_cuda_index_with_cpu_queries_and_cpu_index_with_cuda_queries(gen, processors):
    keys = int64_keys("uniform", 3000, gen)
    cg = CgRXIndex(keys)
    q = point_queries(keys, 500, gen)
    lo, hi = range_queries(keys, 200, gen, 2**40)
    values = torch.arange(keys.numel(), dtype=torch.float64)
    for index_device, query_device in (("cuda", "cpu"), ("cpu", "cuda")):
        index = chunked(keys, index_device, processors=processors)
        for _ in range(2):
            got = index.lookup(q.to(query_device))
            assert got.first_row.device.type == query_device
            assert torch.equal(got.first_row.cpu(), cg.lookup(q).first_row)
            m = index.range(lo.to(query_device), hi.to(query_device))
            assert torch.equal(m.rows.cpu(), cg.range(lo, hi).rows)
            agg = index.range_aggregate(lo.to(query_device), hi.to(query_device), values.to(query_device))
            torch.testing.assert_close(agg.sum.cpu(), cg.range_aggregate(lo, hi, values).sum)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("updatable", [False, True])
def test_zero_copy_serving_matches_cgrx(gen, updatable):
    """processors='zero_copy': the kernels read the pinned host chunks directly; the same answers, nothing cached."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cuda", gpu_budget=DUP_BUDGET, updatable=updatable, processors="zero_copy", hot_keys=0)
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=300)
    s = index.stats()
    assert s["queries_cpu"] == 0 and s["chunk_misses"] == 0 and s["queries_gpu"] > 0
    if updatable:  # an in-place update is seen through the mapped view at once
        new_key = int(keys.max()) + 1 if int(keys.max()) < 2**63 - 1 else int(keys.min()) - 1
        index.insert(torch.tensor([new_key], device="cuda"), torch.tensor([keys.numel()], device="cuda"))
        got = index.lookup(torch.tensor([new_key], device="cuda"))
        assert got.first_row.tolist() == [keys.numel()] and got.count.tolist() == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("updatable", [False, True])
def test_in_place_reads_keep_the_search_part_on_the_gpu(gen, updatable):
    """Where gpu_budget holds every chunk's search part and still two chunks, in-place reads keep each chunk's
    representatives and radix table in GPU memory (made on its first read) and read only the rest over PCIe;
    the answers are unchanged, also after updates that rewrite chunks; a budget without that room keeps none."""
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cuda", gpu_budget=64 * SMALL, updatable=updatable, processors="zero_copy", hot_keys=0)
    assert index.stats()["search_budget"] > 0 and index.memory()["search"] == 0
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=300)
    assert 0 < index.memory()["search"] <= index.stats()["search_budget"]
    assert index._cache.arena.buf is None  # reading in place only: the chunks' slab is never allocated
    assert index.memory()["search"] + index._cache.budget + index.memory()["hot"] <= index.gpu_budget
    for c in index._store.chunks:  # a view made by an in-place read: its search part is not in the pinned blob
        if c.mapped_view is not None and c.mapped_view.resident:
            lo, hi = c.host.data_ptr(), c.host.data_ptr() + c.host.numel()
            assert not lo <= c.mapped_view.index._reps.data_ptr() < hi
            assert not lo <= c.mapped_view.index._table.data_ptr() < hi
            assert lo <= c.mapped_view.index._pairs.data_ptr() < hi
    ref_keys, ref_rows = keys.tolist(), list(range(keys.numel()))
    ins = keys[:50] + 1  # lands in existing chunks (node chunks: applied in place)
    index.insert(ins.cuda(), torch.arange(keys.numel(), keys.numel() + 50, device="cuda"))
    index.delete(keys[100:150].cuda())
    ref_keys, ref_rows = ref_keys + ins.tolist(), ref_rows + list(range(keys.numel(), keys.numel() + 50))
    kept = [(k, r) for k, r in zip(ref_keys, ref_rows) if not (100 <= r < 150)]
    probe = [k for k, _ in kept[::7]] + keys[100:150:5].tolist()
    cg = CgRXIndex(torch.tensor([k for k, _ in kept]))
    got, want = index.lookup(torch.tensor(probe, device="cuda")), cg.lookup(torch.tensor(probe))
    rows = torch.tensor([r for _, r in kept])
    assert torch.equal(got.count.cpu(), want.count)
    hit = want.count > 0
    assert torch.equal(got.first_row.cpu()[hit], rows[want.first_row[hit]])
    largest = max(align(c["bytes"]) for c in index.chunk_info())
    tight = chunked(keys, "cuda", gpu_budget=2 * largest + 64, processors="zero_copy", hot_keys=0)
    assert tight.stats()["search_budget"] == 0  # less the search parts, the budget holds fewer than two chunks
    assert chunked(keys, "cuda", gpu_budget=64 * SMALL, processors="gpu", hot_keys=0).stats()["search_budget"] == 0
    check_lookup(tight.lookup(keys[:500].cuda()), *Reference(keys, "int64").points(keys[:500])[:2])
    assert tight.memory()["search"] == 0


def _arena_accounted(index, views=()):
    """Every byte of the cache's slabs is free, a cached chunk's slot or a live view's search part: the index's
    views and those of ``views`` (weak references to views of replaced chunks) still alive, which must keep
    their slots (the memory checker, for one, keeps some frames and so their views alive)."""
    gc.collect()
    cache = index._cache
    for arena in cache.arenas:
        arena.reclaim()
    live = {id(c.mapped_view): c.mapped_view for c in index._store.chunks if c.mapped_view is not None}
    live.update((id(v), v) for v in (r() for r in views) if v is not None)
    free = sum(size for arena in cache.arenas for _, size in arena.free)
    search = sum(v.resident for v in live.values())
    return free + cache.used() + search == sum(arena.budget for arena in cache.arenas)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_search_parts_take_the_shared_slab_back_from_chunks(gen):
    """The search parts' reservation is the cache's second slab: chunks fill it while no search part is made;
    each chunk's first in-place read carves its search part there, evicting the chunks in the way (never one in
    the first slab); answers stay right through copies and in-place reads, and an update's changed chunks give
    their slots back."""
    keys = int64_keys("uniform", 4000, gen)
    probe = chunked(keys, "cpu", hot_keys=0)
    largest = max(align(c["bytes"]) for c in probe.chunk_info())
    search = int(sum(search_bytes(c.specs) for c in probe._store.chunks) * SEARCH_SLACK)
    index = chunked(keys, "cuda", gpu_budget=3 * largest + search, hot_keys=0)
    cache = index._cache
    assert index.stats()["search_budget"] == search and cache.shared.budget == search and cache.budget == 3 * largest
    index.processors = "gpu"  # every queue copied in (the reservation stays), none taken over by the CPU
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # chunks fill both slabs
    assert any(e.arena is cache.shared for e in cache.entries.values())
    # ids: chunks kept alive would keep their views
    in_first = {id(c) for c, e in cache.entries.items() if e.arena is cache.arena}
    assert all(index._store.in_place_view(c).resident == search_bytes(c.specs) for c in index._store.chunks)
    assert index.memory()["search"] == sum(search_bytes(c.specs) for c in index._store.chunks)
    assert in_first <= {id(c) for c in cache.entries}  # the first slab's chunks stayed
    base = cache.shared.buf.data_ptr()
    parts = [p for c in index._store.chunks for p in (c.mapped_view.index._reps.data_ptr(),
                                                 c.mapped_view.index._table.data_ptr())]
    assert all(base <= p < base + cache.shared.budget for p in parts)
    assert not any(base + e.off <= p < base + e.off + align(c.nbytes)
                   for c, e in cache.entries.items() if e.arena is cache.shared for p in parts)
    assert _arena_accounted(index)
    assert index.memory()["cache"] + index.memory()["search"] + index.memory()["hot"] <= index.gpu_budget
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # copies beside the search parts
    index.processors = "zero_copy"
    check_all_forms(index, keys, "int64", gen, "cuda", n_q=3000)  # in-place reads through them
    before = index.memory()["search"]
    views = [weakref.ref(c.mapped_view) for c in index._store.chunks]
    index.insert((keys[:40] + 1).cuda(), torch.arange(4000, 4040, device="cuda"))  # its chunks' views go
    assert index.memory()["search"] < before and _arena_accounted(index, views)
    ref = Reference(torch.cat([keys, keys[:40] + 1]), "int64")
    q = point_queries(keys, 500, gen)
    check_lookup(index.lookup(q.cuda()), *ref.points(q)[:2])
    assert index.memory()["search"] > 0 and _arena_accounted(index, views)


def test_chunk_views_are_cold_and_a_plain_index_is_not(gen):
    """A chunk's queue visits it once per batch, so its views ask the CPU kernels to prefetch whatever the chunk's
    size (the config's cold bit); an index of its own, and the hot tier, do not. The answers are the same."""
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys, "cpu", hot_keys=0)
    config = ChunkedConfig(chunk_bytes=SMALL, gpu_budget=0, device="cpu", layout="packed_row").resolved()
    store = ChunkStore(config, "int64", torch.int64, False, Stats())  # the chunk store on its own, as the index's
    store.set(Builder(config, "int64", pin=False).build(keys))
    view = store.host_view(store.chunks[0])
    plain = CgRXIndex(keys)
    assert view.index._cold and not plain._cold
    assert index.lookup(keys[:5]).count.tolist() == [1] * 5
    from torch_rtindex._config import CGRX_CONFIG_FIELDS, cgrx_config
    at = sum(bits for name, bits in CGRX_CONFIG_FIELDS[: [f for f, _ in CGRX_CONFIG_FIELDS].index("cold")])
    base = cgrx_config("uint64", "packed_row", 16, "binary", "radix", [23, 23, 18, 0, 0])
    assert cgrx_config("uint64", "packed_row", 16, "binary", "radix", [23, 23, 18, 0, 0], cold=True) == base | 1 << at


@pytest.mark.parametrize("dist", ["uniform", "duplicates"])
def test_cold_lookups_answer_as_warm_ones(gen, dist):
    """The cold bit changes only how the CPU kernels prefetch: every form answers as the same structure without
    it, over tables below and above the prefetch's size threshold, ranges and misses included."""
    for n in (3000, 1 << 21):
        keys = int64_keys(dist, n, gen)
        warm = CgRXIndex(keys, layout="packed_row")
        cold = CgRXIndex._from_structure(warm._pairs, warm._reps, warm._table, len(warm), key_type="int64",
                                         key_dtype=torch.int64, key_span=None, layout="packed_row", cold=True)
        q = torch.cat([point_queries(keys, 3000, gen), torch.tensor([I64_MIN, I64_MAX])])
        for a, b in ((warm.lookup(q), cold.lookup(q)), (warm.lookup_all(q), cold.lookup_all(q))):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        lo, hi = range_queries(keys, 1000, gen, 2**40)
        assert all(torch.equal(x, y) for x, y in zip(warm.range(lo, hi), cold.range(lo, hi)))
        assert torch.equal(warm.range_count(lo, hi), cold.range_count(lo, hi))


def test_a_cpu_index_keeps_no_search_part():
    index = chunked(torch.arange(2000), "cpu", gpu_budget=64 * SMALL, hot_keys=0)
    assert index.stats()["search_budget"] == 0 and index.memory()["search"] == 0


def test_a_chunk_grown_past_the_cache_is_served_by_the_cpu():
    index = chunked(torch.arange(2000), "cpu", gpu_budget=4 * SMALL, hot_keys=0)
    index.insert(torch.full((1500,), 7))  # one run of equal keys: one chunk, now larger than the cache
    assert index.stats()["oversized_chunks"] == 1
    for processors in ("gpu", "auto"):
        index.processors = processors
        assert index.lookup(torch.tensor([7, 8, 1999])).count.tolist() == [1501, 1, 1]
        assert index.lookup_all(torch.tensor([7])).rows.numel() == 1501
