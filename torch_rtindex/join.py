"""Feature-store joins: probe keys against an :class:`RXIndex` built over the build side's key column.

The build side is the indexed table (row ID = position of its key); the probe side is a batch of keys (or of
``[lo, hi]`` ranges). A join returns one ``(probe_position, build_row)`` pair per match, duplicates on either
side included, as two aligned int64 tensors sorted by probe position and then by build row::

    index = RXIndex(features_key_column)
    probe_pos, build_row = join(index, request_keys)               # inner equi-join
    features = feature_table[build_row]                            # gather the matched build rows
    probe_pos, build_row = join(index, request_keys, how="left")   # misses kept once, with build_row -1

Every function here is built from tensor operations on the CSR answer of the index (no host loop); the number
of pairs depends on the data, so under ``torch.compile`` it needs
``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` (see the README).
"""

from __future__ import annotations

import torch

from .results import Matches
from .rx import RXIndex

JOIN_TYPES = ("inner", "left")


def _check_how(how: str) -> None:
    if how not in JOIN_TYPES:
        raise ValueError(f"how must be one of {JOIN_TYPES}, got {how!r}")


def _pairs(matches: Matches, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(probe position, build row) per match of a CSR answer; with how="left" a probe without matches appears
    once, with build row -1."""
    if how == "inner":
        return matches.query_ids(), matches.rows
    offsets, rows = matches.offsets, matches.rows
    counts = offsets[1:] - offsets[:-1]
    kept = counts.clamp(min=1)  # a probe without matches still takes one slot
    kept_offsets = torch.cumsum(kept, 0) - kept  # where each probe's slots start in the output
    probe = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), kept)
    # Match j of probe q goes to kept_offsets[q] + (j - offsets[q]); every other slot keeps -1.
    owner = matches.query_ids()
    slot = kept_offsets[owner] + torch.arange(rows.numel(), device=rows.device) - offsets[:-1][owner]
    build = torch.full((probe.numel(),), -1, dtype=rows.dtype, device=rows.device).index_put((slot,), rows)
    return probe, build


def join(index: RXIndex, probe_keys: torch.Tensor, how: str = "inner") -> tuple[torch.Tensor, torch.Tensor]:
    """Equi-join of ``probe_keys`` against the index's keys.

    Args:
        index: the build side.
        probe_keys: 1-D tensor of keys, with the index's dtype and device.
        how: ``"inner"`` (one pair per match) or ``"left"`` (also one pair ``(i, -1)`` per probe key ``i``
            without any match).

    Returns:
        ``(probe_positions, build_rows)``: int64 tensors of equal length, one entry per pair, ordered by
        probe position and then by build row (ascending).
    """
    _check_how(how)
    return _pairs(index.lookup_all(probe_keys), how)


def range_join(
    index: RXIndex, lo: torch.Tensor, hi: torch.Tensor, how: str = "inner"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Band join: probe row ``i`` matches every build row whose key lies in ``[lo[i], hi[i]]`` (inclusive,
    in the key type's order; empty when ``lo[i] > hi[i]``).

    Args:
        index: the build side.
        lo, hi: 1-D tensors of range bounds, one pair per probe row, with the index's dtype and device.
        how: ``"inner"`` or ``"left"``, as in :func:`join`.

    Returns:
        ``(probe_positions, build_rows)`` as in :func:`join`.
    """
    _check_how(how)
    return _pairs(index.range(lo, hi), how)
