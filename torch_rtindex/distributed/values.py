"""Value columns of aggregates: each rank passes the values of the rows it contributed; they travel to the
shards holding those rows along a plan made when the rows change (no host synchronization per call)."""

from __future__ import annotations

import torch

from . import exchange, header, routing, stages


def check_values(ix, values: torch.Tensor) -> None:
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise ValueError("values must be a 1-D tensor with one value per row this rank contributed")
    if values.numel() != ix.num_contributed():
        raise ValueError(
            f"values must hold one value per row this rank contributed ({ix.num_contributed()}: its build "
            f"keys, then its inserted keys), got {values.numel()}"
        )
    if values.device != ix.device:
        raise ValueError(f"values are on {values.device} but the index is on {ix.device}")
    if values.dtype not in header.VALUE_DTYPES:
        raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")


def route_values(ix, values: torch.Tensor, st: stages.Stages, cached: bool) -> torch.Tensor:
    """The value column of the local rows, routed from the ranks that contributed them."""
    if cached:
        return ix._values_cache[2]
    order, send_splits, gather = ix._value_plan
    got = exchange.a2a(ix, values[order], send_splits, ix._recv_totals, st)
    local = got[gather]
    ix._values_cache = (values, values._version, local)
    return local


def plan_values(ix) -> None:
    """How value columns travel (send order and sizes, where each local row's value lands), planned when
    the rows change, so that routing a column needs no host synchronization (CUDA graphs)."""
    order, send_splits = routing.partition(ix, ix._contrib_owner)
    starts = torch.tensor([0] + ix._recv_totals, device=ix.device).cumsum(0)[:-1]
    gather = starts[ix._src] + ix._seq if ix._src.numel() else ix._src
    ix._value_plan = (order, send_splits.tolist(), gather)
    ix._values_cache = None


def values_header(ix, values: torch.Tensor | None) -> tuple[int, int]:
    if not isinstance(values, torch.Tensor) or values.dtype not in header.VALUE_DTYPES:
        return -1, 0
    c = ix._values_cache
    cached = c is not None and c[0] is values and c[1] == values._version
    return header.VALUE_DTYPES.index(values.dtype), int(cached)
