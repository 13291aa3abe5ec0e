"""CUDA graphs and CUDA streams.

CUDA graphs: the cgRX radix-table and binary-search backends are plain CUDA kernels without host
synchronization, so their fixed-size lookups (lookup, range_lookup, aggregate, range_aggregate) and the
fixed-capacity CSR forms (lookup_all_capped, range_capped, join_capped, range_join_capped) are captured once
and replayed on new query values, giving the eager answers. OptiX launches (RX, cgRX backend="optix") and the
data-dependent CSR forms (lookup_all, range: a host sync to size the output) refuse capture with a clear error,
and the CUDA context stays usable.

Streams: lookups run on the caller's current stream; answers on a side stream equal eager ones; query
tensors made on another stream and dropped right after the call are not reused before the lookup has read
them (the operators record the stream on their inputs); an index rebuilt on one stream while another still
reads it keeps its old memory until that read is done (the operators record the index's tensors on every stream
that uses them); two indexes used concurrently from two streams both answer correctly.

Everything but the first test needs CUDA; torch.cuda._sleep keeps a stream busy so that a missing stream
record would show as a wrong answer, not pass by luck of timing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, point_queries, range_queries
from reference import Reference, check_capped, check_lookup
from torch.utils import _pytree as pytree

from torch_rtindex import CgRXIndex, RXIndex, UpdatableCgRXIndex, join_capped, range_join_capped

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams need CUDA")
SLEEP_CYCLES = 50_000_000  # ~30 ms on a current GPU: the lookups queued behind it run late

INDEXES = {
    "rx": lambda k: RXIndex(k),
    "cgrx-radix": lambda k: CgRXIndex(k, bucket_size=8, backend="radix"),
    "cgrx-binary_search": lambda k: CgRXIndex(k, bucket_size=8, backend="binary_search"),
    "cgrx-optix": lambda k: CgRXIndex(k, bucket_size=8, backend="optix"),
    "updatable": lambda k: UpdatableCgRXIndex(k, node_size=8, backend="radix"),
}
CAPTURABLE = ["cgrx-radix", "cgrx-binary_search", "updatable"]


def test_capturable_reports_the_backend():
    keys = torch.arange(100)
    for kind, make in INDEXES.items():
        assert make(keys).capturable  # CPU indexes: nothing to capture, nothing refused
    if torch.cuda.is_available():
        for kind, make in INDEXES.items():
            assert make(keys.cuda()).capturable == (kind in CAPTURABLE), kind


def same(got, want) -> None:
    for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        assert torch.equal(a, b)


@cuda_only
@pytest.mark.parametrize("sort_queries", [None, True])  # True: the query sort (a CUB radix sort) is captured too
@pytest.mark.parametrize("kind", CAPTURABLE)
def test_cgrx_lookups_replay_in_a_cuda_graph(gen, kind, sort_queries):
    keys = int64_keys("duplicates", 5000, gen)
    index = INDEXES[kind](keys.cuda())
    index.sort_queries = sort_queries
    values = torch.randn(keys.numel(), dtype=torch.float64, generator=gen).cuda()
    q = point_queries(keys, 512, gen).cuda()  # static inputs: replays read whatever they hold
    lo, hi = (t.cuda() for t in range_queries(keys, 512, gen, 3 * ROW))
    small, large = 1000, 1 << 17  # a capacity the answers overflow, and one they fit

    def step():
        return (
            index.lookup(q),
            index.range_lookup(lo, hi),
            index.aggregate(q, values),
            index.range_aggregate(lo, hi, values),
            index.lookup_all_capped(q, small),
            index.lookup_all_capped(q, large),
            index.range_capped(lo, hi, large),
            join_capped(index, q, small, how="left"),
            range_join_capped(index, lo, hi, large),
        )

    side = torch.cuda.Stream()  # warm up on a side stream, as torch.cuda.graph's documentation does
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for _ in range(3):  # new query values in the static inputs, replay, compare with eager and the reference
        new_q = point_queries(keys, 512, gen)
        new_lo, new_hi = range_queries(keys, 512, gen, 3 * ROW)
        q.copy_(new_q)
        lo.copy_(new_lo)
        hi.copy_(new_hi)
        graph.replay()
        torch.cuda.synchronize()
        same(captured, step())
        ref = Reference(keys, "int64")
        first, count, _ = ref.points(new_q)
        check_lookup(captured[0], first, count)
        full = index.lookup_all(q)
        assert int(captured[4].total) == full.rows.numel() > small  # the small capacity really overflows
        check_capped(captured[4], full, small, exact_prefix=True)
        check_capped(captured[5], full, large, exact_prefix=True)


@cuda_only
@pytest.mark.parametrize("kind", ["rx", "cgrx-optix"])
def test_optix_lookups_refuse_capture(gen, kind):
    """Capturing an OptiX launch fails inside OptiX and poisons the CUDA context; the API refuses it first."""
    keys = int64_keys("duplicates", 2000, gen)
    index = INDEXES[kind](keys.cuda())
    q = point_queries(keys, 256, gen).cuda()
    first, count, _ = Reference(keys, "int64").points(q.cpu())
    for call in (lambda: index.lookup(q), lambda: index.lookup_all_capped(q, 64), lambda: index.range_lookup(q, q)):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph.*OptiX"):
            with torch.cuda.graph(graph):
                call()
    torch.cuda.synchronize()
    check_lookup(index.lookup(q), first, count)  # the index and the CUDA context are fine


@cuda_only
def test_data_dependent_csr_refuses_capture(gen):
    keys = int64_keys("duplicates", 2000, gen)
    index = INDEXES["cgrx-radix"](keys.cuda())
    q = point_queries(keys, 256, gen).cuda()
    for method, call in (("lookup_all", lambda: index.lookup_all(q)), ("range", lambda: index.range(q, q))):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=f"{method} cannot be captured.*{method}_capped"):
            with torch.cuda.graph(graph):
                call()
    torch.cuda.synchronize()
    assert torch.equal(index.lookup_all(q).rows.cpu(), INDEXES["cgrx-radix"](keys).lookup_all(q.cpu()).rows)


def lookups(index, q, lo, hi, values):
    # room to spare in the capped answer: a cut RX answer may keep different rows of the cut query (hit order)
    return (index.lookup(q), index.lookup_all(q), index.range_capped(lo, hi, 1 << 18), index.aggregate(q, values))


@cuda_only
@pytest.mark.parametrize("kind", list(INDEXES))
def test_lookups_on_a_side_stream(gen, kind):
    keys = int64_keys("duplicates", 3000, gen)
    index = INDEXES[kind](keys.cuda())
    values = torch.randn(keys.numel(), dtype=torch.float64, generator=gen).cuda()
    q = point_queries(keys, 500, gen).cuda()
    lo, hi = (t.cuda() for t in range_queries(keys, 300, gen, 3 * ROW))
    want = lookups(index, q, lo, hi, values)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        got = lookups(index, q, lo, hi, values)
    torch.cuda.current_stream().wait_stream(side)
    same(got, want)
    first, count, _ = Reference(keys, "int64").points(q.cpu())
    check_lookup(got[0], first, count)


@cuda_only
@pytest.mark.parametrize("kind", list(INDEXES))
def test_queries_made_on_another_stream_are_safe(gen, kind):
    """The caller orders the streams (wait_stream) and drops the query tensor right after the call; the
    producer stream then allocates and overwrites: it must not get the query's memory before the lookup ran."""
    keys = int64_keys("duplicates", 3000, gen)
    index = INDEXES[kind](keys.cuda())
    producer = torch.cuda.Stream()
    ref = Reference(keys, "int64")
    for _ in range(3):
        host_q = point_queries(keys, 4096, gen)
        with torch.cuda.stream(producer):
            q = host_q.to("cuda")  # allocated and written on the producer stream
        torch.cuda.current_stream().wait_stream(producer)
        torch.cuda._sleep(SLEEP_CYCLES)  # the lookup below runs ~30 ms from now
        result = index.lookup(q)
        del q
        with torch.cuda.stream(producer):  # the producer does not wait: without the record it could reuse q's block
            junk = torch.full((host_q.numel(),), 12345, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        del junk
        first, count, _ = ref.points(host_q)
        check_lookup(result, first, count)


@cuda_only
@pytest.mark.parametrize("kind", list(INDEXES))
def test_index_rebuilt_while_another_stream_reads_it(gen, kind):
    keys_a, keys_b = int64_keys("duplicates", 3000, gen), int64_keys("uniform", 3000, gen)
    index = INDEXES[kind](keys_a.cuda())
    host_q = point_queries(keys_a, 2000, gen)
    q = host_q.cuda()
    reader = torch.cuda.Stream()
    reader.wait_stream(torch.cuda.current_stream())
    warm = torch.cuda.Stream()  # the bound eager path records the index's tensors once per stream: used here
    with torch.cuda.stream(warm):
        index.lookup(q)
    reader.wait_stream(warm)
    with torch.cuda.stream(reader):
        torch.cuda._sleep(SLEEP_CYCLES)
        result = index.lookup(q)  # reads the index's tensors late, on the reader stream
        rows = index.lookup_rows(q, -1) if hasattr(index, "lookup_rows") else None
        again = index.lookup(q)  # the reader stream's second call: recorded before, skipped now
    sizes = [t.nbytes for t in index._index_tensors()]
    index.rebuild(keys_b.cuda())  # frees the old structure on the default stream...
    junk = [torch.full((max(n, 1),), 0x55, dtype=torch.uint8, device="cuda") for n in sizes]  # ...and reuses memory
    torch.cuda.synchronize()
    del junk
    first, count, _ = Reference(keys_a, "int64").points(host_q)
    check_lookup(result, first, count)  # answered from the old keys, untouched until the read was done
    check_lookup(again, first, count)
    if rows is not None:
        np.testing.assert_array_equal(rows.cpu().numpy(), first)


@cuda_only
def test_two_indexes_on_two_streams(gen):
    keys_a, keys_b = int64_keys("duplicates", 4000, gen), int64_keys("uniform", 4000, gen)
    a = INDEXES["cgrx-radix"](keys_a.cuda())
    b = INDEXES["rx"](keys_b.cuda())
    qa = [point_queries(keys_a, 1000, gen) for _ in range(6)]
    qb = [point_queries(keys_b, 1000, gen) for _ in range(6)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    got_a, got_b = [], []
    for x, y in zip(qa, qb):
        with torch.cuda.stream(s1):
            got_a.append((a.lookup(x.to("cuda", non_blocking=True)), a.lookup_all_capped(x.to("cuda"), 8192)))
        with torch.cuda.stream(s2):
            got_b.append((b.lookup(y.to("cuda", non_blocking=True)), b.lookup_all(y.to("cuda"))))
    torch.cuda.synchronize()
    ref_a, ref_b = Reference(keys_a, "int64"), Reference(keys_b, "int64")
    for x, y, ga, gb in zip(qa, qb, got_a, got_b):
        check_lookup(ga[0], *ref_a.points(x)[:2])
        check_lookup(gb[0], *ref_b.points(y)[:2])
        check_capped(ga[1], a.lookup_all(x.cuda()), 8192, exact_prefix=True)
        assert torch.equal(gb[1].rows, b.lookup_all(y.cuda()).rows)
