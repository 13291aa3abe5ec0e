"""The CPU side as a serving engine: multithreaded kernels (answers equal at every thread count), the capped
forms' documented entries on every device, saved state equal to the index, row-ID and argument checks, and
the updatable index's rebuild policy under an append workload."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from keysets import int64_keys, point_queries, range_queries
from reference import Reference, check_capped, check_lookup, check_matches

import torch_rtindex
from torch_rtindex import CgRXIndex, IdToRow, RXIndex, UpdatableCgRXIndex, join

INDEXES = {
    "rx": lambda k: RXIndex(k),
    "cgrx_radix": lambda k: CgRXIndex(k, bucket_size=8, backend="radix"),
    "cgrx_binary": lambda k: CgRXIndex(k, bucket_size=8, backend="binary_search", layout="packed_row"),
    "updatable": lambda k: UpdatableCgRXIndex(k, node_size=8),
}


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("kind", sorted(INDEXES))
def test_answers_equal_at_every_thread_count(gen, threads, kind):
    """Builds and every lookup form split over threads (at::parallel_for) give the one-thread answers, which
    match the sorted-array reference."""
    keys = int64_keys("duplicates", 50_000, gen)
    q = point_queries(keys, 20_000, gen)
    lo, hi = range_queries(keys, 5_000, gen, max_width=2**40)
    values = torch.randint(-1000, 1000, (keys.numel(),), generator=gen)
    ref = Reference(keys, "int64")
    answers = []
    for n in (1, 2, 4):
        torch.set_num_threads(n)
        index = INDEXES[kind](keys)
        got = (index.lookup(q), index.lookup_all(q), index.range(lo, hi), index.aggregate(q, values),
               index.range_lookup(lo, hi), index.range_capped(lo, hi, 10_000))
        answers.append([type(r)(*(t.clone() for t in r)) for r in got])
    for other in answers[1:]:
        for a, b in zip(answers[0], other):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    first, count, rows = ref.points(q)
    check_lookup(answers[0][0], first, count)
    check_matches(answers[0][1], rows)
    np.testing.assert_array_equal(answers[0][3][1].numpy(), Reference.sums(rows, values))
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(answers[0][4], first, count)


@pytest.mark.parametrize("kind", sorted(INDEXES))
def test_capped_keeps_the_first_entries_of_the_full_answer(device, kind):
    """CappedMatches: entry j < min(total, capacity) is the full answer's entry j; the issue's example first."""
    keys = torch.tensor([5, 1, 5, 3, 5], device=device)
    index = INDEXES[kind](keys)
    lo, hi = torch.tensor([0], device=device), torch.tensor([10], device=device)
    full = index.range(lo, hi)
    capped = index.range_capped(lo, hi, 2)
    exact = not (kind == "rx" and device.type == "cuda")  # RX on CUDA keeps the rows its rays met first
    check_capped(capped, full, 2, exact_prefix=exact)
    if kind == "rx" and device.type == "cpu":
        assert full.rows.tolist()[:2] == [0, 1] and capped.rows.tolist() == [0, 1]
    gen = torch.Generator().manual_seed(7)
    keys = int64_keys("duplicates", 3000, gen).to(device)
    index = INDEXES[kind](keys)
    lo, hi = range_queries(keys.cpu(), 200, gen, max_width=2**58)
    lo, hi = lo.to(device), hi.to(device)
    full = index.range(lo, hi)
    for capacity in (0, 1, 17, int(full.rows.numel()) // 2, int(full.rows.numel()) + 5):
        check_capped(index.range_capped(lo, hi, capacity), full, capacity, exact_prefix=exact)


@pytest.mark.parametrize("cls", [RXIndex, CgRXIndex, UpdatableCgRXIndex])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
def test_state_keys_come_from_the_index(device, gen, cls, dtype):
    """The saved keys are read back from the index's own structure, in every key dtype (the inverse of the key
    map), including the edges of each type; -0.0 is saved as +0.0, the value the index holds."""
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        edges = [0.0, -0.0, 1.5, -1.5, info.min, info.max, info.tiny, -info.tiny, float("inf"), float("-inf")]
        keys = torch.cat([torch.tensor(edges, dtype=dtype), torch.randn(500, generator=gen).to(dtype) * 1e6])
    else:
        info = torch.iinfo(dtype)
        edges = [0, -1, 1, info.min, info.max, info.min + 1, info.max - 1]
        rand = torch.randint(info.min, info.max, (500,), generator=gen, dtype=torch.int64).to(dtype)
        keys = torch.cat([torch.tensor(edges, dtype=dtype), rand, rand[:50]])
    keys = keys.to(device)
    index = cls(keys)
    state = index.state_dict()
    saved = state["keys"]
    if cls is UpdatableCgRXIndex:  # ordered keys in (key, row) order with their rows
        order = torch.argsort(state["rows"])
        saved = torch.ops.rtindex.unmap_keys(saved[order].contiguous(), torch_rtindex._keys.KEY_TYPES[index.key_type], dtype)
    want = torch.where(keys == 0, torch.zeros_like(keys), keys)  # -0.0 -> +0.0
    assert saved.dtype == dtype and torch.equal(saved.cpu().view(torch.uint8), want.cpu().view(torch.uint8))


def test_unsigned_keys_state(device, gen):
    keys = torch.tensor([0, -1, 2**63 - 1, -(2**63), 5], device=device)
    for cls in (RXIndex, CgRXIndex):
        index = cls(keys, key_type="uint64")
        assert torch.equal(index.state_dict()["keys"], keys)
        clone = cls.from_state_dict(index.state_dict())
        assert clone.lookup(keys).first_row.tolist() == [0, 1, 2, 3, 4]


def test_row_ids_must_be_integers(device):
    index = UpdatableCgRXIndex(torch.tensor([1, 2, 3], device=device))
    before = index.lookup_all(torch.tensor([1, 2, 3, 7, 8], device=device))
    for rows in (torch.tensor([7.9, 8.2], device=device), torch.tensor([True, False], device=device)):
        with pytest.raises(TypeError, match="integer tensor of row IDs"):
            index.insert(torch.tensor([7, 8], device=device), rows=rows)
    with pytest.raises(TypeError, match="torch.Tensor"):
        index.insert([7, 8])
    with pytest.raises(TypeError, match="torch.Tensor"):
        index.update(delete_keys=[1])
    after = index.lookup_all(torch.tensor([1, 2, 3, 7, 8], device=device))
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    res = index.insert(torch.tensor([7, 8], device=device), rows=torch.tensor([10, 11], dtype=torch.int32, device=device))
    assert res.inserted == 2 and index.lookup(torch.tensor([8], device=device)).first_row.tolist() == [11]


@pytest.mark.parametrize("growth", [float("inf"), float("nan"), 1e30, 1e6, 0.5, "2", True, None])
def test_growth_is_checked(growth):
    with pytest.raises((TypeError, ValueError), match="growth"):
        UpdatableCgRXIndex(torch.tensor([1, 2]), growth=growth)


def test_integer_arguments(device):
    keys = torch.arange(100, device=device)
    assert CgRXIndex(keys, bucket_size=np.int64(8)).bucket_size == 8
    for bad in (True, 2.5, "8"):
        with pytest.raises(TypeError, match="bucket_size"):
            CgRXIndex(keys, bucket_size=bad)
    with pytest.raises(TypeError, match="max_range_rays"):
        RXIndex(keys, max_range_rays=2.7)
    assert RXIndex(keys, max_range_rays=np.int32(3)).max_range_rays == 3
    index = CgRXIndex(keys)
    with pytest.raises(ValueError, match="capacity"):
        index.lookup_all_capped(keys[:3], 2**63)
    with pytest.raises(TypeError, match="capacity"):
        index.lookup_all_capped(keys[:3], 2.0)
    assert index.lookup_all_capped(keys[:3], np.int64(3)).rows.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="sort_queries"):
        index.sort_queries = "no"
    index.sort_queries = False
    assert index.sort_queries is False


def test_lists_get_type_errors(device):
    keys = torch.arange(10, device=device)
    with pytest.raises(TypeError, match="torch.Tensor"):
        RXIndex(keys, allow_update=True).refit([1, 2])
    with pytest.raises(TypeError, match="torch.Tensor"):
        IdToRow(keys)([1, 2])
    with pytest.raises(TypeError, match="build side's index"):
        join(keys, keys)
    with pytest.raises(TypeError, match="torch.Tensor"):
        CgRXIndex(keys).rebuild([1, 2])


def test_small_memory_is_reported_in_bytes():
    r = repr(CgRXIndex(torch.arange(10)))
    assert "memory=" in r and "0.0 MiB" not in r and " B)" in r


def test_exports():
    assert torch_rtindex.MissingIdError is torch_rtindex.embedding.MissingIdError
    assert issubclass(torch_rtindex.MissingIdError, KeyError)


def test_append_workload_rebuild_policy(device):
    """Ever larger keys all land in the last bucket: with the policy on, the chains stay short (mean node reads
    within the threshold after every batch) and answers stay right; with it off, stats() shows the stretch."""
    base = torch.arange(0, 4096, device=device) * 10
    on = UpdatableCgRXIndex(base, node_size=8)
    off = UpdatableCgRXIndex(base, node_size=8, max_node_reads=None)
    assert on.stats()["mean_node_reads"] == 1.0 and on.stats()["longest_chain"] == 1
    model = Counter(base.tolist())
    for day in range(30):
        new = torch.arange(100, device=device) + 10**6 + day * 1000
        for index in (on, off):
            index.insert(new)
        model.update(new.tolist())
        assert on.stats()["mean_node_reads"] <= on.max_node_reads
    assert on.auto_rebuilds > 0 and off.auto_rebuilds == 0
    stretched = off.stats()
    assert stretched["mean_node_reads"] > 2 and stretched["longest_chain"] > 100
    everything = torch.tensor(sorted(model), device=device)
    for index in (on, off):
        got = index.lookup(everything)
        assert bool((got.count == 1).all())
        assert len(index) == sum(model.values())
    assert torch.equal(on.lookup(everything).first_row, off.lookup(everything).first_row)
    # Row IDs survive the automatic rebuilds: the next fresh ones continue after the last.
    assert on.insert(torch.tensor([-5], device=device)).rows.tolist() == [4096 + 30 * 100]


def test_rebuild_policy_argument():
    for bad in (0.5, float("inf"), float("nan"), "x", True):
        with pytest.raises((TypeError, ValueError), match="max_node_reads"):
            UpdatableCgRXIndex(torch.tensor([1]), max_node_reads=bad)


def test_missing_compiler_is_named(monkeypatch, tmp_path):
    from torch_rtindex import _extension

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.delenv("TORCH_RTINDEX_CXX", raising=False)
    with pytest.raises(RuntimeError, match="names no compiler"):
        _extension._cxx_for_build(tmp_path)


def test_build_lock_clears_the_baton_of_a_killed_build(tmp_path):
    """A build killed mid-way leaves cpp_extension's baton file `lock`, on which every later build of that
    extension would wait forever; under the build lock it is gone. The lock itself is an flock: a second holder
    in another process waits until the first lets go, and a dead holder releases it."""
    from torch_rtindex._extension import build_lock

    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    (build_dir / "lock").write_text("")  # what a killed cpp_extension build leaves
    with build_lock(build_dir):
        assert not (build_dir / "lock").exists()
    holder = ("import sys, time; from pathlib import Path; from torch_rtindex._extension import build_lock\n"
              "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder, str(build_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with open(build_dir / "rtindex.lock", "w") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the other process
            proc.kill()  # the holder dies mid-build
            proc.wait()
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by its death
    finally:
        proc.kill()
        proc.wait()


def test_updatable_index_attributes_are_true():
    index = UpdatableCgRXIndex(torch.arange(100), node_size=8)
    assert index.layout == "nodes" and index.representation == "naive" and index.bucket_size == 4
    clone = UpdatableCgRXIndex.from_state_dict(index.state_dict())
    assert clone.layout == "nodes" and torch.equal(clone.lookup(torch.arange(100)).first_row, torch.arange(100))
