"""Grouping of queries by a small integer id: the queues of the out-of-core index (one per chunk) and the sends
of the sharded index (one per rank) are both made this way, by an id per position (group_by) or, for point
queries, by key ranges in one operator (partition_queries)."""

from __future__ import annotations

import torch

# The send buckets (chunks x owners) partition_queries takes on CUDA (csrc/distributed/partition_checks.h).
MAX_CUDA_BUCKETS = 2048


def group_by(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts) for ids in [0, n): ``order[i]`` is the position at slot i, ids ascending and positions
    ascending within an id; ``counts[j]`` how many positions have id j. The ids are sorted as int16 (int32 from
    2^15 ids on), so a radix sort makes 2 (4) passes instead of 8."""
    if n == 1:
        return torch.arange(ids.numel(), device=ids.device), torch.full((1,), ids.numel(), dtype=torch.int64,
                                                                        device=ids.device)
    narrow = ids.to(torch.int16 if n < 2**15 else torch.int32)
    return torch.sort(narrow, stable=True).indices, torch.bincount(ids, minlength=n)


def partition_points(queries: torch.Tensor, key_type: int, splitters: torch.Tensor,
                     chunks: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Point queries grouped by key range in one pass (torch.ops.rtindex_internal.partition_queries): the
    queries mapped to ordered keys in bucket order, each one's position in ``queries``, and the counts
    [chunks, len(splitters) + 1], where bucket = searchsorted(splitters, key, right=True) over ascending ordered
    keys. None where the device's operator does not take that many buckets (the caller groups by id instead)."""
    if queries.device.type == "cuda" and chunks * (splitters.numel() + 1) > MAX_CUDA_BUCKETS:
        return None
    return torch.ops.rtindex_internal.partition_queries(queries, key_type, splitters, chunks)
