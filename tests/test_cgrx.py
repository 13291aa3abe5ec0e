"""CgRXIndex against the numpy reference, for every backend, layout and bucket search, on every device."""

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

import torch_rtindex
from torch_rtindex import CgRXIndex, UpdatableCgRXIndex

# Index options per backend; "optix" is tried in both scene representations (optimized is its default).
BACKENDS = [
    {"backend": "radix"},
    {"backend": "optix"},
    {"backend": "optix", "representation": "naive"},
    {"backend": "binary_search"},
]
BACKEND_IDS = ["-".join(b.values()) for b in BACKENDS]


def check_range_matches(result, rows, keys, key_type="int64"):
    """cgRX reports range rows in (key, row ID) order: compare as sets, then check the order."""
    offsets = result.offsets.cpu().numpy()
    got = result.rows.cpu().numpy()
    k = keys.cpu().numpy()
    if key_type == "uint64":
        k = k.view(np.uint64)
    assert len(offsets) == len(rows) + 1 and offsets[-1] == len(got)
    for i, r in enumerate(rows):
        seg = got[offsets[i] : offsets[i + 1]]
        np.testing.assert_array_equal(np.sort(seg), r, err_msg=f"query {i}")
        order = np.lexsort((seg, k[seg]))
        np.testing.assert_array_equal(order, np.arange(len(seg)), err_msg=f"query {i} not in key order")


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates", "narrow", "clustered"])
@pytest.mark.parametrize("bucket_size", [1, 4, 16, 256])
def test_point_and_range_lookups(device, gen, backend, kind, bucket_size):
    keys = int64_keys(kind, 3000, gen)
    index = CgRXIndex(keys.to(device), bucket_size=bucket_size, **backend)
    ref = Reference(keys, "int64")
    q = point_queries(keys, 2000, gen)
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q.to(device)), first, count)
    check_matches(index.lookup_all(q.to(device)), rows)
    lo, hi = range_queries(keys, 400, gen, 3 * ROW)
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
    check_range_matches(index.range(lo.to(device), hi.to(device)), rows, keys)
    np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), count)


@pytest.mark.parametrize("layout", ["packed_row", "aligned_row", "column"])
@pytest.mark.parametrize("bucket_search", ["binary", "linear"])
def test_layouts_and_bucket_searches(device, gen, layout, bucket_search):
    keys = int64_keys("duplicates", 2000, gen)
    index = CgRXIndex(keys.to(device), layout=layout, bucket_search=bucket_search, bucket_size=8)
    ref = Reference(keys, "int64")
    q = point_queries(keys, 1000, gen)
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(q.to(device)), first, count)
    check_matches(index.lookup_all(q.to(device)), rows)
    lo, hi = range_queries(keys, 500, gen, 3 * ROW)
    np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), ref.ranges(lo, hi)[1])


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float32", "float64"])
def test_key_types(device, gen, key_type):
    keys = keys_of_type(key_type, 2000, gen)
    ref = Reference(keys, key_type)
    q = point_queries(keys, 800, gen)
    width = 10.0 if keys.dtype.is_floating_point else 2**40
    lo, hi = range_queries(keys, 300, gen, width)
    for backend in BACKENDS:
        index = CgRXIndex(keys.to(device), key_type=key_type if key_type == "uint64" else None, **backend)
        first, count, _ = ref.points(q)
        check_lookup(index.lookup(q.to(device)), first, count)
        first, count, rows = ref.ranges(lo, hi)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
        check_range_matches(index.range(lo.to(device), hi.to(device)), rows, keys, key_type)
        np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), count)


def test_edges(device):
    keys = torch.tensor([-(2**63), 2**63 - 1, 0, -1, 0, 0], dtype=torch.int64)
    for backend in BACKENDS:
        index = CgRXIndex(keys.to(device), bucket_size=2, **backend)
        r = index.lookup(torch.tensor([-(2**63), 2**63 - 1, 0, -1, 5], device=device))
        assert r.first_row.cpu().tolist() == [0, 1, 2, 3, -1]
        assert r.count.cpu().tolist() == [1, 1, 3, 1, 0]
        u = CgRXIndex(keys.to(device), key_type="uint64", **backend)
        assert u.lookup(torch.tensor([0, -1], device=device)).first_row.cpu().tolist() == [2, 3]
        empty = CgRXIndex(torch.empty(0, dtype=torch.int64, device=device), **backend)
        assert empty.lookup(torch.tensor([1], device=device)).first_row.cpu().tolist() == [-1]
        assert empty.range(torch.tensor([0], device=device), torch.tensor([9], device=device)).rows.numel() == 0
        nothing = index.lookup(torch.empty(0, dtype=torch.int64, device=device))
        assert nothing.first_row.numel() == 0


@pytest.mark.parametrize("layout", ["packed_row", "aligned_row", "column"])
@pytest.mark.parametrize("bucket_size", [1, 3, 8, 16, 40, 256])
def test_radix_table_ties_and_wide_slices(device, gen, layout, bucket_size):
    """The radix table compares 8-bit words cut from 64-bit offsets: keys 1 apart inside one slice share a word
    and need the units' exact representatives; a dense cluster far from the extremes makes one slice hold
    thousands of units (a long binary search over words, then over representatives). Bucket sizes below, at
    and above the units' line sizes (4, 8, 16 pairs)."""
    cluster = torch.arange(2**40, 2**40 + 3000, dtype=torch.int64).repeat_interleave(torch.randint(1, 4, (3000,), generator=gen))
    keys = torch.cat([cluster, torch.tensor([-(2**63), 2**63 - 1, -5, 2**62])])
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    ref = Reference(keys, "int64")
    q = torch.cat([cluster[::7], cluster[::11] + 1, cluster[:100] - 1, torch.tensor([2**40 + 3000, -(2**63), 2**63 - 1, 2**62 + 1])])
    first, count, rows = ref.points(q)
    index = CgRXIndex(keys.to(device), bucket_size=bucket_size, layout=layout, backend="radix")
    check_lookup(index.lookup(q.to(device)), first, count)
    check_matches(index.lookup_all(q.to(device)), rows)
    lo = q[:500]
    hi = lo + torch.randint(0, 30, (lo.numel(),), generator=gen)
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
    check_range_matches(index.range(lo.to(device), hi.to(device)), rows, keys)
    np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), count)


@pytest.mark.parametrize("layout", ["packed_row", "aligned_row", "column"])
@pytest.mark.parametrize("bucket_size", [1, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("repeat", [None, "across_lines", "last"])
@pytest.mark.parametrize("bucket_search", ["binary", "linear"])
def test_radix_lines_and_unique_keys(device, gen, layout, bucket_size, repeat, bucket_search):
    """The radix table's units are lines of the pairs (4, 8 or 16 pairs, at most a bucket), and a point lookup
    stops at its first match where the build found no two equal keys. Full-range unique keys, or the same keys
    with one key repeated where the repeat crosses a boundary of every line size (sorted positions 799 and 800)
    or sits at the very end: the repeat must be seen (both rows found) by every backend."""
    keys = torch.unique(int64_keys("uniform", 3000, gen))  # sorted, unique
    if repeat == "across_lines":
        keys[800] = keys[799]
    elif repeat == "last":
        keys[-1] = keys[-2]
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    ref = Reference(keys, "int64")
    q = torch.cat([point_queries(keys, 2000, gen), torch.unique(keys)])
    first, count, rows = ref.points(q)
    for backend in ("radix", "binary_search"):
        index = CgRXIndex(keys.to(device), bucket_size=bucket_size, layout=layout, bucket_search=bucket_search, backend=backend)
        check_lookup(index.lookup(q.to(device)), first, count)
        check_matches(index.lookup_all(q.to(device)), rows)
    assert count.max() == (1 if repeat is None else 2)


@pytest.mark.parametrize("backend, bucket_size", [("radix", 16), ("binary_search", 4)])
def test_points_and_ranges_mixed_in_one_batch(device, gen, backend, bucket_size):
    """Point queries (lo == hi) over unique aligned rows take their own path on the GPU, a warp's lines read
    together; here every other query of a range batch (of a size no multiple of 32) is a point and the others
    ranges, misses and the 64-bit edges, so the two paths meet in every warp."""
    keys = torch.unique(int64_keys("uniform", 3000, gen))
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    lo = torch.cat([point_queries(keys, 1234, gen), torch.tensor([-(2**63), 2**63 - 1, 0])])
    width = torch.randint(0, 1 << 60, lo.shape, generator=gen)
    hi = torch.where(lo > 2**63 - 1 - width, 2**63 - 1, lo + width)
    hi[::2] = lo[::2]
    first, count, rows = Reference(keys, "int64").ranges(lo, hi)
    index = CgRXIndex(keys.to(device), backend=backend, bucket_size=bucket_size, layout="aligned_row")
    check_lookup(index.range_lookup(lo.to(device), hi.to(device)), first, count)
    check_range_matches(index.range(lo.to(device), hi.to(device)), rows, keys)
    check_lookup(index.lookup(lo[::2].contiguous().to(device)), first[::2], count[::2])


@pytest.mark.parametrize("layout", ["packed_row", "aligned_row", "column"])
def test_radix_word_blocks_at_every_table_end(device, gen, layout):
    """The radix search reads a slice's words a block (16 or 32 bytes) at a time and bisects where a block would reach
    past the table: tables of every word count near the block boundaries (units 1 .. 80), with exact words
    (dense keys) and cut words (keys over the full range, where ties are settled by representatives); every key
    and the keys next to it are looked up."""
    for n in list(range(1, 40)) + list(range(40, 1300, 37)):
        for kind in ("dense", "uniform"):
            keys = int64_keys(kind, n, gen)
            q = torch.cat([keys, keys + 1, keys - 1, torch.tensor([-(2**63), 2**63 - 1])])
            first, count, _ = Reference(keys, "int64").points(q)
            index = CgRXIndex(keys.to(device), layout=layout, backend="radix")
            check_lookup(index.lookup(q.to(device)), first, count)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_aggregate(device, gen, dtype):
    keys = int64_keys("duplicates", 2000, gen)
    values = (torch.randn(keys.numel(), generator=gen) * 100).to(dtype)
    ref = Reference(keys, "int64")
    q = point_queries(keys, 500, gen)
    _, count, rows = ref.points(q)
    for backend in BACKENDS:
        index = CgRXIndex(keys.to(device), **backend)
        agg = index.aggregate(q.to(device), values.to(device))
        np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
        np.testing.assert_allclose(agg.sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_backends_agree(device, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    kind = ["uniform", "dense", "duplicates", "narrow"][seed % 4]
    keys = int64_keys(kind, int(torch.randint(1, 6000, (1,), generator=gen)), gen)
    bucket_size = int(torch.randint(1, 300, (1,), generator=gen))
    ref = Reference(keys, "int64")
    q = point_queries(keys, 1500, gen)
    lo, hi = range_queries(keys, 300, gen, 40 * ROW)
    p_first, p_count, _ = ref.points(q)
    r_first, r_count, _ = ref.ranges(lo, hi)
    for backend in BACKENDS:
        index = CgRXIndex(keys.to(device), bucket_size=bucket_size, **backend)
        check_lookup(index.lookup(q.to(device)), p_first, p_count)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), r_first, r_count)


@pytest.mark.parametrize("seed", range(6))
def test_radix_wide_slices_fuzz(device, seed):
    """Skewed keys: dense clusters of different spacings at random places, duplicates and the 64-bit edges, so
    that some slices of the radix table hold most units. A wide slice's words are scanned a few blocks, then
    bisected (RadixTable::word_bounds), for the first word >= and > the key's."""
    gen = torch.Generator().manual_seed(500 + seed)
    parts = [torch.tensor([-(2**63), 2**63 - 1, 0, -1])]
    for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
        size = int(torch.randint(1, 4000, (1,), generator=gen))
        step = 1 << int(torch.randint(0, 40, (1,), generator=gen))
        start = int(torch.randint(-(2**62), 2**62, (1,), generator=gen))
        parts.append(start + step * torch.arange(size, dtype=torch.int64))
    parts.append(torch.randint(-(2**63), 2**63 - 1, (int(torch.randint(0, 50, (1,), generator=gen)),), generator=gen))
    keys = torch.cat(parts)
    keys = torch.cat([keys, keys[torch.randint(0, keys.numel(), (keys.numel() // 10,), generator=gen)]])
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    ref = Reference(keys, "int64")
    q = point_queries(keys, 2000, gen)
    lo, hi = range_queries(keys, 500, gen, 1 << int(torch.randint(0, 44, (1,), generator=gen)))
    p_first, p_count, _ = ref.points(q)
    r_first, r_count, _ = ref.ranges(lo, hi)
    for bucket_size in (1, 4, int(torch.randint(5, 300, (1,), generator=gen))):
        index = CgRXIndex(keys.to(device), backend="radix", bucket_size=bucket_size)
        check_lookup(index.lookup(q.to(device)), p_first, p_count)
        check_lookup(index.range_lookup(lo.to(device), hi.to(device)), r_first, r_count)
        np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), r_count)

def test_bad_arguments(device):
    keys = torch.tensor([1, 2, 3], device=device)
    with pytest.raises(ValueError, match="bucket_size"):
        CgRXIndex(keys, bucket_size=0)
    with pytest.raises(ValueError, match="layout"):
        CgRXIndex(keys, layout="rows")
    with pytest.raises(ValueError, match="backend"):
        CgRXIndex(keys, backend="rtcores")
    with pytest.raises(ValueError, match="bucket_search"):
        CgRXIndex(keys, bucket_search="hash")
    index = CgRXIndex(keys)
    with pytest.raises(TypeError, match="dtype"):
        index.lookup(torch.tensor([1.0], device=device))
    assert index.lookup(torch.tensor([2], device=device)).first_row.cpu().tolist() == [1]
    assert "backend=" in repr(index) and set(index.memory()) == {"pairs", "representatives", "radix_table", "bvh"}


def test_raw_build_refuses_the_node_layout(device):
    """Layout 3 is the updatable index's node region: the sorted-pairs build and scene refuse it."""
    keys = torch.tensor([1, 2, 3], device=device)
    with pytest.raises(RuntimeError, match="layout 3"):
        torch.ops.rtindex.cgrx_build(keys, 4, 3)


def test_auto_layout_follows_the_backend(device):
    """layout="auto" (the default): aligned_row for the radix table (a lookup reads one 64-byte line), the paper's
    packed_row for the backends that search whole buckets; a saved index keeps "auto" and resolves it again."""
    keys = torch.arange(100, device=device) * 3
    for backend, layout in [("radix", "aligned_row"), ("binary_search", "packed_row"), ("optix", "packed_row")]:
        index = CgRXIndex(keys, backend=backend)
        assert index.layout == layout and f"layout={layout}" in repr(index)
        assert index.memory()["pairs"] == 100 * (16 if layout == "aligned_row" else 12)
        assert index.state_dict()["layout"] == "auto"
        assert CgRXIndex.from_state_dict(index.state_dict()).layout == layout
    assert CgRXIndex(keys, backend="radix", layout="packed_row").layout == "packed_row"


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_range_count_at_the_edges_of_the_key_range(device, gen, backend):
    """range_count from positions, against the sorted array: keys and bounds at both ends of the 64-bit range
    (hi = max: no upper search; lo = min), empty and reversed ranges, one key's run, ranges around every key."""
    lo64, hi64 = -(2**63), 2**63 - 1
    keys = torch.cat([torch.tensor([lo64, lo64, lo64 + 1, -1, 0, 0, 1, hi64 - 1, hi64, hi64]),
                      torch.randint(lo64, hi64, (500,), generator=gen), torch.full((40,), 12345)])
    index = CgRXIndex(keys.to(device), bucket_size=4, **backend)
    sk = np.sort(keys.numpy())
    edges = torch.tensor([lo64, lo64 + 1, -1, 0, 1, 12344, 12345, 12346, hi64 - 1, hi64])
    lo = torch.cat([edges.repeat_interleave(edges.numel()), keys[:200], keys[:200]])
    hi = torch.cat([edges.repeat(edges.numel()), keys[:200], keys[200:400]])  # every pair, reversed ones too
    want = np.maximum(np.searchsorted(sk, hi.numpy(), "right") - np.searchsorted(sk, lo.numpy(), "left"), 0)
    np.testing.assert_array_equal(index.range_count(lo.to(device), hi.to(device)).cpu().numpy(), want)
    np.testing.assert_array_equal(index.range_lookup(lo.to(device), hi.to(device)).count.cpu().numpy(), want)
    empty = CgRXIndex(keys[:0].to(device), **backend)
    assert empty.range_count(lo.to(device), hi.to(device)).sum().item() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_default_backend_follows_the_rt_cores_optix_reports():
    """The default asks OptiX only where the GPU's capability does not say already; either way it is OptiX
    where OptiX reports RT cores and the radix table elsewhere (OptiX's answer for the capabilities it skips)."""
    from torch_rtindex.cgrx import NO_RT_CORES

    for d in range(torch.cuda.device_count()):
        device = torch.device("cuda", d)
        rt_cores = torch_rtindex.optix_info(device)["has_rt_cores"]
        if torch.cuda.get_device_capability(device) in NO_RT_CORES:
            assert not rt_cores
        index = CgRXIndex(torch.arange(100, device=device))
        assert index.backend == ("optix" if rt_cores else "radix")
        assert UpdatableCgRXIndex(torch.arange(100, device=device)).backend == index.backend


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_radix_lookups_over_a_large_table():
    """2^26 keys: a radix table of 2^20 slices, where GPU lookups guess a slice's word block before scanning
    (RadixTable::word_bounds). Points and range counts against torch.searchsorted over the stably sorted keys."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 1 << 26
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, device="cuda")
    keys[: 1 << 16] = keys[1 << 16 : 1 << 17]  # duplicates
    keys[-2:] = torch.tensor([-(2**63), 2**63 - 1], device="cuda")
    index = CgRXIndex(keys, backend="radix")
    assert index.memory()["radix_table"] > 20 << 20  # 2^20 slices and more: the guessing path
    sorted_keys, order = torch.sort(keys, stable=True)
    hits = keys[torch.randint(0, n, (1 << 21,), generator=gen, device="cuda")]
    misses = torch.randint(-(2**63), 2**63 - 1, (1 << 21,), generator=gen, device="cuda")
    q = torch.cat([hits, misses, torch.tensor([-(2**63), 2**63 - 1, 0, -1], device="cuda")])
    left = torch.searchsorted(sorted_keys, q)
    count = torch.searchsorted(sorted_keys, q, right=True) - left
    first = torch.where(count > 0, order[left.clamp(max=n - 1)], -1)
    got = index.lookup(q)
    assert torch.equal(got.count, count) and torch.equal(got.first_row, first)
    width = torch.randint(0, 2**50, q.shape, generator=gen, device="cuda")
    hi = torch.where(q > 2**63 - 1 - width, 2**63 - 1, q + width)
    want = torch.searchsorted(sorted_keys, hi, right=True) - left
    assert torch.equal(index.range_count(q, hi), want)


@pytest.mark.parametrize("kind", ["uniform", "duplicates", "clustered"])
@pytest.mark.parametrize("backend", ["radix", "binary_search"])
def test_spare_rows_answer_with_the_written_rows(device, gen, kind, backend):
    """A sharded index's shard keeps each pair's global row in the aligned pair's spare word: its point and
    range lookups then answer with map[row] (the smallest per query: the map rises with the row), counts as
    before; aggregates refuse (their values are indexed by row ID); other layouts have no spare word; a rebuild
    drops the written rows."""
    keys = int64_keys(kind, 3000, gen).to(device)
    index = CgRXIndex(keys, backend=backend, layout="aligned_row", bucket_size=4)
    steps = torch.randint(1, (1 << 31) // keys.numel(), (keys.numel(),), generator=gen)
    mapping = (torch.cumsum(steps, 0) + (1 << 31)).to(device)  # rising, up to the edge of 32 bits
    assert int(mapping[-1]) < 2**32
    assert index._set_spare_rows(mapping)
    ref = Reference(keys, "int64")
    as_mapped = lambda first: np.where(first >= 0, mapping.cpu().numpy()[np.maximum(first, 0)], -1)  # noqa: E731
    q = point_queries(keys.cpu(), 2000, gen).to(device)
    first, count, _ = ref.points(q)
    check_lookup(index._spare_lookup(q), as_mapped(first), count)
    lo, hi = (t.to(device) for t in range_queries(keys.cpu(), 1000, gen, 1 << 60))
    rfirst, rcount, _ = ref.ranges(lo, hi)
    check_lookup(index._spare_lookup(lo, hi), as_mapped(rfirst), rcount)
    check_lookup(index.lookup(q), first, count)  # the index's own lookups keep their row IDs
    cfg = index._config(index.key_type, True)
    with pytest.raises(RuntimeError, match="spare rows"):
        torch.ops.rtindex.cgrx_aggregate(*index._lead, cfg, q, None, torch.ones(len(index), device=device))
    assert not CgRXIndex(keys, layout="packed_row")._set_spare_rows(mapping)
    assert not index._set_spare_rows(mapping[:-1])  # not one row per key
    assert index._spare_lookup(q) is None
    assert index._set_spare_rows(mapping)
    index.rebuild(keys[:100])
    assert index._spare_lookup(q) is None
    with pytest.raises(RuntimeError, match="aligned_row"):
        torch.ops.rtindex.cgrx_set_spare_rows(CgRXIndex(keys, layout="packed_row")._pairs, 0, mapping)
