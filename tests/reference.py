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


class Multiset:
    """The (key, row ID) pairs an index should hold, as plain numpy arrays, with every answer of the
    ``torch_rtindex.Index`` protocol computed by brute force over them and the ``UpdatableIndex`` semantics
    applied to them: a batch inserts first, then deletes (a key: every pair of it; a key and a row: that pair).
    Keys compare in the key type's own order (uint64 read as unsigned; floats by value)."""

    def __init__(self, keys, key_type: str, rows=None):
        self.key_type = key_type
        self.keys = self._np(keys)
        self.rows = (np.arange(len(self.keys), dtype=np.int64) if rows is None
                     else np.asarray(rows.cpu().numpy() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64))
        self.next_row = int(self.rows.max()) + 1 if len(self.rows) else 0

    def _np(self, t) -> np.ndarray:
        if isinstance(t, torch.Tensor):
            return to_numpy(t, self.key_type).copy()
        a = np.asarray(t)
        return a.view(np.uint64) if self.key_type == "uint64" and a.dtype == np.int64 else a

    def __len__(self) -> int:
        return len(self.keys)

    # ------------------------------------------------------------------------------------------- answers
    def _match(self, lo, hi) -> np.ndarray:
        """[queries, pairs] bool: pair j lies in query i's inclusive range (empty when lo > hi or NaN)."""
        lo, hi = self._np(lo)[:, None], self._np(hi)[:, None]
        return (self.keys[None, :] >= lo) & (self.keys[None, :] <= hi)

    def range_rows(self, lo, hi, order: str) -> list[np.ndarray]:
        """Each range's row IDs: ``"row"``: ascending row IDs; ``"key"``: (key, row ID) order."""
        m = self._match(lo, hi)
        out = []
        for i in range(m.shape[0]):
            at = np.nonzero(m[i])[0]
            if order == "row":
                out.append(np.sort(self.rows[at]))
            else:
                o = np.lexsort((self.rows[at], self.keys[at]))
                out.append(self.rows[at][o])
        return out

    def point_rows(self, q) -> list[np.ndarray]:
        return self.range_rows(q, q, "row")

    @staticmethod
    def first_count(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        first = np.array([r.min() if len(r) else -1 for r in rows], dtype=np.int64)
        return first, np.array([len(r) for r in rows], dtype=np.int64)

    @staticmethod
    def csr(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(r) for r in rows])
        flat = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        return offsets, flat

    @staticmethod
    def sums(rows: list[np.ndarray], values: np.ndarray):
        acc = np.float64 if values.dtype.kind == "f" else np.int64
        return np.array([values[r].astype(acc).sum() if len(r) else 0 for r in rows], dtype=acc)

    # ------------------------------------------------------------------------------------------- updates
    def update(self, insert_keys=None, insert_rows=None, delete_keys=None, delete_rows=None):
        """Applies one batch; returns (inserted, deleted, absent, rows of the inserted keys) as the protocol's
        UpdateResult counts them: ``deleted`` counts every pair removed (cancelled insertions included),
        ``absent`` each deletion entry that named nothing present after the insertions."""
        ik = self._np(insert_keys) if insert_keys is not None else self.keys[:0]
        if insert_rows is None:
            ir = np.arange(self.next_row, self.next_row + len(ik), dtype=np.int64)
        else:
            ir = np.asarray(insert_rows.cpu().numpy() if isinstance(insert_rows, torch.Tensor) else insert_rows,
                            dtype=np.int64)
        keys = np.concatenate([self.keys, ik.astype(self.keys.dtype)])
        rows = np.concatenate([self.rows, ir])
        dk = self._np(delete_keys) if delete_keys is not None else self.keys[:0]
        keep = np.ones(len(keys), dtype=bool)
        absent = 0
        if delete_rows is None:
            for k in dk:
                hit = keys == k
                if not hit.any():
                    absent += 1
                keep &= ~hit
        else:
            dr = np.asarray(delete_rows.cpu().numpy() if isinstance(delete_rows, torch.Tensor) else delete_rows,
                            dtype=np.int64)
            for k, r in zip(dk, dr):
                hit = np.nonzero(keep & (keys == k) & (rows == r))[0]
                if len(hit):
                    keep[hit[0]] = False
                else:
                    absent += 1
        deleted = int((~keep).sum())
        self.keys, self.rows = keys[keep], rows[keep]
        if len(ir):
            self.next_row = max(self.next_row, int(ir.max()) + 1)
        return len(ik), deleted, absent, ir
