"""An independent reference: answers computed with numpy on the original key values (no ordered-key
mapping, no scene, nothing from the package), compared in the key type's own order."""

from __future__ import annotations

import numpy as np
import torch


def to_numpy(t: torch.Tensor, key_type: str) -> np.ndarray:
    a = t.cpu().numpy()
    return a.view(np.uint64) if key_type == "uint64" and a.dtype == np.int64 else a


class Reference:
    def __init__(self, keys: torch.Tensor, key_type: str):
        self.key_type = key_type
        k = to_numpy(keys, key_type)
        # A stable sort keeps equal keys in row order, so the first of a run is the smallest row ID.
        order = np.argsort(k, kind="stable")
        self.sorted = k[order]
        self.rows = order.astype(np.int64)

    def _bounds(self, lo: np.ndarray, hi: np.ndarray):
        a = np.searchsorted(self.sorted, lo, side="left")
        b = np.searchsorted(self.sorted, hi, side="right")
        nan = np.zeros(len(lo), dtype=bool)
        if lo.dtype.kind == "f":
            nan = np.isnan(lo) | np.isnan(hi)
        empty = (lo > hi) | nan
        b = np.where(empty, a, np.maximum(a, b))
        return a, b

    def ranges(self, lo: torch.Tensor, hi: torch.Tensor):
        """(first_row, count, list of sorted row arrays) for inclusive ranges."""
        a, b = self._bounds(to_numpy(lo, self.key_type), to_numpy(hi, self.key_type))
        rows = [np.sort(self.rows[x:y]) for x, y in zip(a, b)]
        first = np.array([r[0] if len(r) else -1 for r in rows], dtype=np.int64)
        return first, (b - a).astype(np.int64), rows

    def points(self, q: torch.Tensor):
        return self.ranges(q, q)

    @staticmethod
    def sums(rows, values: torch.Tensor):
        v = values.cpu().numpy()
        acc = np.float64 if v.dtype.kind == "f" else np.int64
        return np.array([v[r].astype(acc).sum() if len(r) else 0 for r in rows], dtype=acc)


def check_lookup(result, first, count):
    np.testing.assert_array_equal(result.count.cpu().numpy(), count)
    np.testing.assert_array_equal(result.first_row.cpu().numpy(), first)


def check_matches(result, rows):
    offsets = result.offsets.cpu().numpy()
    got = result.rows.cpu().numpy()
    assert offsets[0] == 0 and len(offsets) == len(rows) + 1
    assert offsets[-1] == len(got)
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(got[offsets[i] : offsets[i + 1]], r, err_msg=f"query {i}")


def check_capped(capped, full, capacity: int, exact_prefix: bool) -> None:
    """A fixed-capacity CSR answer (offsets, rows, total) against the full one (offsets, rows): the same offsets
    and total, ``capacity`` rows with -1 past the matches, every query that fits complete and identical, and the
    query straddling the capacity holding some of its rows: exactly the full answer's first ones where the fill
    order is the output order (``exact_prefix``), otherwise a subset in ascending order (RX: sorted hits)."""
    offsets, rows, total = (t.cpu() for t in capped)
    f_off, f_rows = (t.cpu() for t in full)
    assert rows.shape == (capacity,) and rows.dtype == torch.int64
    assert torch.equal(offsets, f_off) and total.dim() == 0 and int(total) == f_rows.numel()
    n = min(capacity, f_rows.numel())
    assert bool((rows[n:] == -1).all())
    if exact_prefix:
        assert torch.equal(rows[:n], f_rows[:n])
        return
    for i in range(offsets.numel() - 1):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if b <= capacity:
            assert torch.equal(rows[a:b], f_rows[a:b]), f"query {i}"
        elif a < capacity:
            seg = rows[a:capacity]
            assert set(seg.tolist()) <= set(f_rows[a:b].tolist()) and torch.equal(seg, seg.sort().values)
