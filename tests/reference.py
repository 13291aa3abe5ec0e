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
