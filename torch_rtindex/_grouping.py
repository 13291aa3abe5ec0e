"""Stable grouping of positions by a small integer id: the queues of the out-of-core index (one per chunk) and
the sends of the sharded index (one per rank) are both made this way."""

from __future__ import annotations

import torch


def group_by(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts) for ids in [0, n): ``order[i]`` is the position at slot i, ids ascending and positions
    ascending within an id; ``counts[j]`` how many positions have id j. The ids are sorted as int16 (int32 from
    2^15 ids on), so a radix sort makes 2 (4) passes instead of 8."""
    if n == 1:
        return torch.arange(ids.numel(), device=ids.device), torch.full((1,), ids.numel(), dtype=torch.int64,
                                                                        device=ids.device)
    narrow = ids.to(torch.int16 if n < 2**15 else torch.int32)
    return torch.sort(narrow, stable=True).indices, torch.bincount(ids, minlength=n)
