"""Key and query generators shared by the tests: the full 64-bit range, edges, dense runs across scene rows,
heavy duplicates, and every supported key type."""

from __future__ import annotations

import torch

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
ROW = 2**23  # keys per scene row with the default 23/23/18 split


def int64_keys(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "uniform":
        k = torch.randint(I64_MIN, I64_MAX, (n,), generator=gen, dtype=torch.int64)
        return torch.cat([k, torch.tensor([I64_MIN, I64_MAX, 0, -1, 1])])
    if kind == "dense":
        start = int(torch.randint(-(2**40), 2**40, (1,), generator=gen)) // ROW * ROW - n // 2  # straddles a row edge
        k = torch.arange(start, start + n, dtype=torch.int64)
        return k[torch.randperm(n, generator=gen)]
    if kind == "duplicates":
        distinct = torch.randint(I64_MIN, I64_MAX, (max(1, n // 50),), generator=gen, dtype=torch.int64)
        mult = torch.randint(1, 101, (distinct.numel(),), generator=gen)
        mult[0] = 1000  # one key with multiplicity 1000
        k = torch.repeat_interleave(distinct, mult)
        return k[torch.randperm(k.numel(), generator=gen)]
    if kind == "clustered":  # a dense run plus a sparse tail: uneven slices of the radix table
        dense = torch.arange(0, n - n // 8, dtype=torch.int64)
        sparse = torch.randint(I64_MIN, I64_MAX, (n // 8,), generator=gen, dtype=torch.int64)
        k = torch.cat([dense, sparse])
        return k[torch.randperm(k.numel(), generator=gen)]
    if kind == "narrow":  # everything inside one scene row and its neighbours
        return torch.randint(-3 * ROW, 3 * ROW, (n,), generator=gen, dtype=torch.int64)
    raise ValueError(kind)


def keys_of_type(key_type: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if key_type in ("int64", "uint64"):
        return int64_keys("uniform", n, gen)
    if key_type == "int32":
        k = torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen, dtype=torch.int64)
        return torch.cat([k, torch.tensor([-(2**31), 2**31 - 1, 0, -1])]).to(torch.int32)
    dtype = torch.float32 if key_type == "float32" else torch.float64
    k = torch.randn(n, generator=gen, dtype=torch.float64) * 1e6
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-30, -1e-30, 3.0, 3.0, 3.0])
    return torch.cat([k, special]).to(dtype)


def point_queries(keys: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """Half hits (keys drawn from the index), half random values of the same type (mostly misses)."""
    if keys.numel():
        hits = keys[torch.randint(0, keys.numel(), (n // 2,), generator=gen)]
    else:
        hits = keys[:0]
    if keys.dtype.is_floating_point:
        misses = (torch.randn(n - hits.numel(), generator=gen, dtype=torch.float64) * 1e6).to(keys.dtype)
    else:
        info = torch.iinfo(keys.dtype)
        misses = torch.randint(info.min, info.max, (n - hits.numel(),), generator=gen, dtype=torch.int64).to(keys.dtype)
    q = torch.cat([hits, misses])
    return q[torch.randperm(q.numel(), generator=gen)]


def range_queries(keys: torch.Tensor, n: int, gen: torch.Generator, max_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranges starting at keys (and at random points), of widths 0..max_width, some with lo > hi."""
    lo = point_queries(keys, n, gen)
    if keys.dtype.is_floating_point:
        width = torch.rand(n, generator=gen, dtype=torch.float64) * max_width
        hi = (lo.double() + width).to(keys.dtype)
        hi[: n // 10] = lo[: n // 10] - 1  # empty ranges
        return lo, hi
    info = torch.iinfo(keys.dtype)
    width = torch.randint(0, max_width + 1, (n,), generator=gen, dtype=torch.int64)
    hi = torch.clamp(lo.to(torch.int64) + width, max=info.max)
    hi[: n // 10] = lo[: n // 10].to(torch.int64) - 1  # empty ranges (lo > hi), wrapping at the minimum is fine
    hi[n // 10 : n // 5] = lo[n // 10 : n // 5].to(torch.int64)  # lo == hi
    return lo, hi.to(keys.dtype)
