"""The CPU's point answers to a GPU batch of ChunkedIndex cross to the GPU as each CPU call finishes (chunked.merge's
ship): answers against the independent reference through the public API while the caller's stream runs behind, so
that a merge that read them before their copies were done, or a host block handed out again while its copy was
still reading it, would show as wrong answers."""

from __future__ import annotations

import pytest
import torch
from keysets import int64_keys, point_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import ChunkedIndex

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def spin() -> None:
    torch.cuda._sleep(20_000_000)  # milliseconds of GPU time queued ahead of the lookup on the caller's stream


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
