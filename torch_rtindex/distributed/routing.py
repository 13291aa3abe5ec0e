"""Routing: the splitters (range partition of the ordered-key space, rank order = key order), each key's owner,
a batch cut into pieces (one per query and shard it touches) and grouped by owner, local rows made global."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .._grouping import group_by
from .._keys import KEY_TYPES, flip_sign
from . import header


def global_rows_in_shard(local: Any, local_to_global: torch.Tensor, num_rows: int) -> bool:
    """Whether the shard now answers in global rows: a read-only cgRX shard over aligned pairs keeps each pair's
    global row in the pair's spare word (written here), so its point and range lookups need no map
    (pack_answers' random reads of local_to_global). Other local indexes, and global rows from 2^32 on, keep
    the map. Runs where the shard is built, inside the agreed step (a failure is collective); the shard's rows
    never change without a rebuild (updates need node chains)."""
    attach = getattr(local, "_set_spare_rows", None)
    return attach is not None and num_rows <= 2**32 and bool(attach(local_to_global))


def set_splitters(ix, splitters: torch.Tensor) -> None:
    """The shard borders (:func:`choose_splitters`' form, which ``searchsorted`` takes) and the same borders as
    ordered keys (``_splitters_ordered``, which the partition kernels compare), made once here rather than on
    every call (a kernel per call, also in a captured graph)."""
    ix._splitters, ix._splitters_ordered = splitters, flip_sign(splitters)


def choose_splitters(ix, ordered: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """world - 1 splitters (ordered keys XOR the sign bit, ascending): key k goes to rank
    searchsorted(splitters, k ^ sign, right=True). Chosen from a fixed-size sample of every rank's keys,
    each sample key weighted by the number of keys it stands for; a splitter is always a sample key, placed
    before or after a run of equal keys, whichever leaves the shards closer to equal."""
    m, device = ix.sample_size, ordered.device
    n = ordered.numel()
    if n:
        g = torch.Generator().manual_seed(12345 + ix.rank)
        idx = torch.randint(0, n, (m,), generator=g).to(device)
        sample = flip_sign(ordered[idx])
    else:
        sample = torch.zeros(m, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(sample) for _ in range(ix.world)]
    dist.all_gather(gathered, sample, group=ix.group)
    values = torch.stack(gathered).cpu()
    weights = torch.tensor([c / m for c in counts], dtype=torch.float64)[:, None].expand(-1, m).reshape(-1)
    values = values.reshape(-1)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if values.numel() == 0 or ix.world == 1:
        return torch.zeros(ix.world - 1, dtype=torch.int64, device=device)
    values, order = torch.sort(values)
    weights = weights[order]
    distinct, inverse = torch.unique_consecutive(values, return_inverse=True)
    w = torch.zeros(distinct.numel(), dtype=torch.float64).index_add_(0, inverse, weights)
    before = torch.cumsum(w, 0) - w  # weight of the sample below each distinct value
    total = float(w.sum())
    chosen, last = [], 0
    for i in range(1, ix.world):
        target = total * i / ix.world
        j = int(torch.argmin((before - target).abs()))
        j = max(j, min(last + 1, distinct.numel() - 1)) if chosen else max(j, 1 if distinct.numel() > 1 else 0)
        chosen.append(j)
        last = j
    return distinct[torch.tensor(chosen)].to(device).contiguous()


def partition(ix, owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable partition by owner: (order, counts), ``order[i]`` = the piece at send position i."""
    return group_by(owner, ix.world)


def route(ix, ordered: torch.Tensor) -> torch.Tensor:
    """The rank owning each ordered key."""
    if ix.world == 1:
        return torch.zeros_like(ordered)
    return torch.searchsorted(ix._splitters, flip_sign(ordered), right=True)


def map_queries(ix, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if hi is None:
        return header.ops().map_keys(lo, KEY_TYPES[ix.key_type]), None
    return header.ops().map_ranges(lo, hi, KEY_TYPES[ix.key_type])


def pieces(ix, qlo: torch.Tensor, qhi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Splits queries into pieces, one per (query, owner) a query touches, in (query, owner) order:
    (query of each piece, owner, lo, hi). A point query is one piece; a range one piece per shard it
    overlaps (an empty range one piece, at the owner of lo). One host synchronization for ranges."""
    n = qlo.numel()
    if qhi is None:
        return torch.arange(n, device=ix.device), route(ix, qlo), qlo, qlo
    o_lo, o_hi = route(ix, qlo), route(ix, qhi)
    o_hi = torch.maximum(o_lo, o_hi)  # an empty range (lo > hi) routes to lo's owner only
    if ix.world == 1:
        return torch.arange(n, device=ix.device), o_lo, qlo, qhi
    per = o_hi - o_lo + 1
    total = int(per.sum())
    query = torch.repeat_interleave(torch.arange(n, device=ix.device), per, output_size=total)
    first = torch.cumsum(per, 0) - per
    owner = o_lo[query] + torch.arange(total, device=ix.device) - first[query]
    return query, owner, qlo[query], qhi[query]


def range_route(ix, lo: torch.Tensor, hi: torch.Tensor | None, with_owner: bool = False):
    """The route of :func:`~.exchange.send_pieces` for the CSR and capped forms: pieces as (lo, hi) pairs (a point
    query as lo = hi); extra: the query of each piece (and its owner)."""
    def pieces_of_batch():
        qlo, qhi = map_queries(ix, lo, hi)
        query, owner, plo, phi = pieces(ix, qlo, qhi)
        return (owner, [plo, phi], query, owner) if with_owner else (owner, [plo, phi], query)
    return pieces_of_batch


def to_global(ix, rows: torch.Tensor) -> torch.Tensor:
    """Local row IDs (-1: none) to global ones."""
    if ix._l2g.numel() == 0:
        return rows
    return torch.where(rows >= 0, ix._l2g[rows.clamp(min=0)], -1)


def fixed_pieces(ix, qlo: torch.Tensor, qhi: torch.Tensor | None):
    """Pieces with fixed shapes: a point query is one piece, a range one piece per rank (valid where the
    range overlaps that rank's shard), in (query, owner) order."""
    n = qlo.numel()
    if qhi is None:
        return torch.arange(n, device=ix.device), route(ix, qlo), qlo, qlo, None
    o_lo, o_hi = route(ix, qlo), route(ix, qhi)
    o_hi = torch.maximum(o_lo, o_hi)
    ranks = torch.arange(ix.world, device=ix.device)
    valid = ((ranks[None] >= o_lo[:, None]) & (ranks[None] <= o_hi[:, None])).reshape(-1)
    query = torch.arange(n, device=ix.device).repeat_interleave(ix.world, output_size=n * ix.world)
    owner = ranks.repeat(n)
    return query, owner, qlo[query], qhi[query], valid
