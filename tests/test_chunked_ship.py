"""The CPU's point answers to a GPU batch of ChunkedIndex cross to the GPU as each CPU call finishes (chunked.merge's
ship): ship through its own API with its copies held behind a spinning stream (a host block handed out again while
its copy may still read it would carry the next call's answers), and ChunkedIndex's answers against the independent
reference through the public API, also after a failed crossing."""

from __future__ import annotations

import pytest
import torch
from keysets import int64_keys, point_queries
from reference import Reference, check_lookup, check_matches

import torch_rtindex.chunked.executor as executor
from torch_rtindex import ChunkedIndex
from torch_rtindex.chunked.merge import ship

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def spin() -> None:
    torch.cuda._sleep(20_000_000)  # milliseconds of GPU time queued ahead on the current stream


class Claim:  # what ship reads and writes of a task
    def __init__(self, first: torch.Tensor, count: torch.Tensor):
        self.size, self.result = first.numel(), ("first", first, count)


def test_ship_keeps_each_host_block_until_its_copy_is_done():
    io, merging = torch.cuda.Stream(), torch.cuda.current_stream()
    shipped = []
    for i in range(4):  # the same sizes each time: blocks of one size class, reused only once their copy is done
        with torch.cuda.stream(io):
            spin()  # every copy below waits behind this
        claims = [Claim(torch.full((5000,), 10 * i + j), torch.full((5000,), -i)) for j in range(3)]
        ship(claims, torch.device("cuda", torch.cuda.current_device()), io, merging)
        shipped.append(claims)
    merging.wait_stream(io)  # as the executor's merge does
    for i, claims in enumerate(shipped):
        for j, c in enumerate(claims):
            assert c.result[0] == "first" and c.result[1].is_cuda and c.result[1].shape == (5000,)
            assert int(c.result[1].min()) == int(c.result[1].max()) == 10 * i + j
            assert int(c.result[2].min()) == int(c.result[2].max()) == -i


@pytest.mark.parametrize("kind", ["uniform", "duplicates"])
def test_cpu_answers_of_a_gpu_batch_match_the_reference_while_the_stream_is_behind(gen, kind):
    keys = int64_keys(kind, 20_000, gen)
    index = ChunkedIndex(keys, device="cuda", processors="cpu", chunk_bytes=4096, progress=False)
    ref = Reference(keys, "int64")
    for n in (1, 500, 3000, 20_000, 700):  # the CPU's share grows and shrinks: blocks are reused between batches
        q = point_queries(keys, n, gen).cuda()
        spin()
        result = index.lookup(q)
        first, count, rows = ref.points(q)
        check_lookup(result, first, count)
        check_matches(index.lookup_all(q), rows)  # the CSR form still crosses in the merge
    assert index.stats()["queries_cpu"] > 0 and index.stats()["queries_gpu"] == 0


def test_cpu_and_gpu_answers_of_one_batch_are_joined_right(gen):
    keys = int64_keys("duplicates", 20_000, gen)
    # Queues of 100 queries and more go to the GPU, smaller ones to the CPU: both serve every batch.
    index = ChunkedIndex(keys, device="cuda", processors="auto", critical_mass=100, chunk_bytes=4096,
                         gpu_budget=1 << 20, progress=False)
    ref = Reference(keys, "int64")
    for n in (4000, 9000):
        q = point_queries(keys, n, gen).cuda()
        spin()
        result = index.lookup(q)
        first, count, _ = ref.points(q)
        check_lookup(result, first, count)
    stats = index.stats()
    assert stats["queries_cpu"] > 0 and stats["queries_gpu"] > 0


def test_a_failed_crossing_fails_the_batch_and_leaves_the_index_usable(gen, monkeypatch):
    keys = int64_keys("uniform", 5000, gen)
    index = ChunkedIndex(keys, device="cuda", processors="cpu", chunk_bytes=4096, progress=False)
    ref = Reference(keys, "int64")
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("pinned memory exhausted (injected)")
        return ship(*args)

    monkeypatch.setattr(executor, "ship", failing)
    q = point_queries(keys, 2000, gen).cuda()
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        index.lookup(q)
    first, count, _ = ref.points(q)
    check_lookup(index.lookup(q), first, count)
