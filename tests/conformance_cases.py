"""What the conformance suite feeds every index class: keys over the full range of each key type with its edges
and duplicates, point and range queries, value columns and random update batches, from fixed seeds
(numpy default_rng), plus the checks of every protocol answer against tests/reference.py's Multiset.

Shared by tests/test_conformance.py (single-process classes) and tests/test_conformance_sharded.py (the ranks
of ShardedIndex); nothing here uses the package."""

from __future__ import annotations

import numpy as np
import torch

from reference import Multiset

KEY_TYPES = ("int64", "int32", "uint64", "float32", "float64")
NP_DTYPES = {"int64": np.int64, "int32": np.int32, "uint64": np.uint64, "float32": np.float32, "float64": np.float64}


def edges(key_type: str) -> np.ndarray:
    """The values at the ends of the key type and around zero."""
    dt = NP_DTYPES[key_type]
    if key_type in ("float32", "float64"):
        fi = np.finfo(dt)
        return np.array([0.0, -0.0, -1.0, 1.0, fi.max, -fi.max, fi.tiny, -fi.tiny, np.inf, -np.inf], dtype=dt)
    ii = np.iinfo(dt)
    vals = [ii.min, ii.max, 0, 1, ii.max - 1, ii.min + 1]
    if key_type != "uint64":
        vals += [-1, -2]
    else:
        vals += [2**63, 2**63 - 1]  # the sign bit of the int64 storage
    return np.array(vals, dtype=dt)


def random_values(key_type: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Values spread over the whole key type (floats over many magnitudes, both signs)."""
    dt = NP_DTYPES[key_type]
    if key_type in ("float32", "float64"):
        mag = 38 if key_type == "float32" else 300
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-mag // 2, mag // 2, n)
        small = rng.integers(-50, 50, n).astype(np.float64)  # collisions with other small keys
        return np.where(rng.random(n) < 0.3, small, v).astype(dt)
    ii = np.iinfo(dt)
    return rng.integers(ii.min, ii.max, n, dtype=dt, endpoint=True)


def make_keys(key_type: str, n: int, seed: int) -> np.ndarray:
    """n keys: random over the full range, the edges, and duplicates (runs of 2..6 copies of some keys)."""
    rng = np.random.default_rng(seed)
    if n == 0:
        return np.zeros(0, dtype=NP_DTYPES[key_type])
    base = np.concatenate([edges(key_type), random_values(key_type, max(0, n // 2), rng)])
    dups = np.repeat(base[rng.integers(0, len(base), max(1, n // 10))], rng.integers(2, 7, max(1, n // 10)))
    k = np.concatenate([base, dups])[:n] if n >= len(edges(key_type)) else base[rng.integers(0, len(base), n)]
    if len(k) < n:
        k = np.concatenate([k, random_values(key_type, n - len(k), rng)])
    return rng.permutation(k)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A numpy batch as the tensor the index takes (uint64 keys in int64 storage with key_type="uint64")."""
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def point_queries(keys: np.ndarray, key_type: str, n: int, seed: int) -> np.ndarray:
    """Hits (keys of the index), misses (random values), neighbours of keys, and every edge."""
    rng = np.random.default_rng(seed)
    parts = [edges(key_type), random_values(key_type, n // 3, rng)]
    if len(keys):
        parts.append(keys[rng.integers(0, len(keys), n // 3)])
        near = keys[rng.integers(0, len(keys), n // 6)]
        if key_type in ("float32", "float64"):
            with np.errstate(over="ignore"):  # the largest finite value's neighbour is inf: a valid query
                parts.append(np.nextafter(near, np.array(np.inf, dtype=near.dtype)))
        else:
            with np.errstate(over="ignore"):
                parts.append(near + np.array(1, dtype=near.dtype))  # wraps at the maximum: still a valid value
    q = np.concatenate(parts).astype(NP_DTYPES[key_type])
    return rng.permutation(q)


def range_queries(keys: np.ndarray, key_type: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ranges from keys and random points, widths over every scale, lo == hi, lo > hi (empty), the whole key
    range, and ranges ending at the edges."""
    rng = np.random.default_rng(seed)
    lo = point_queries(keys, key_type, n, seed + 1)
    dt = NP_DTYPES[key_type]
    if key_type in ("float32", "float64"):
        width = 10.0 ** rng.integers(-3, 8, len(lo))
        with np.errstate(over="ignore"):
            hi = (lo.astype(np.float64) + width).astype(dt)
        hi = np.where(np.isnan(hi), lo, hi)  # inf + width
    else:
        ii = np.iinfo(dt)
        bits = rng.integers(0, 64 if key_type != "int32" else 32, len(lo))
        width = [int(rng.integers(0, 2 ** int(b), dtype=np.uint64, endpoint=True)) for b in bits]
        hi = np.array([min(int(a) + w, int(ii.max)) for a, w in zip(lo, width)], dtype=dt)
    m = len(lo)
    hi[: m // 10] = lo[: m // 10]  # lo == hi
    swap = slice(m // 10, m // 5)  # lo > hi where they differ
    lo[swap], hi[swap] = np.maximum(lo[swap], hi[swap]), np.minimum(lo[swap], hi[swap])
    e = edges(key_type)
    lo = np.concatenate([lo, [e.min(), e.min(), e.max()]]).astype(dt)
    hi = np.concatenate([hi, [e.max(), e.min(), e.max()]]).astype(dt)
    return lo, hi


# ------------------------------------------------------------------------------------------------- checks


def arr(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def check_lookup(got, ref: Multiset, lo, hi=None, what: str = "lookup") -> None:
    rows = ref.point_rows(lo) if hi is None else ref.range_rows(lo, hi, "row")
    first, count = Multiset.first_count(rows)
    assert got.first_row.dtype == torch.int64 and got.count.dtype == torch.int64, what
    np.testing.assert_array_equal(arr(got.count), count, err_msg=f"{what} count")
    np.testing.assert_array_equal(arr(got.first_row), first, err_msg=f"{what} first_row")


def check_matches(got, want_rows: list[np.ndarray], what: str) -> None:
    offsets, flat = Multiset.csr(want_rows)
    assert got.offsets.dtype == torch.int64 and got.rows.dtype == torch.int64, what
    np.testing.assert_array_equal(arr(got.offsets), offsets, err_msg=f"{what} offsets")
    np.testing.assert_array_equal(arr(got.rows), flat, err_msg=f"{what} rows")


def check_capped(got, want_rows: list[np.ndarray], capacity: int, exact_prefix: bool, what: str) -> None:
    """The CappedMatches contract against the full answer: same offsets and total, ``capacity`` rows with -1
    past the matches, every query that fits complete; the query straddling the capacity holds the full answer's
    first rows (``exact_prefix``) or, where the fill order differs (RX on CUDA), some of them ascending."""
    offsets, flat = Multiset.csr(want_rows)
    rows, total = arr(got.rows), int(got.total)
    assert got.rows.shape == (capacity,) and got.rows.dtype == torch.int64, what
    assert got.total.dim() == 0, what
    np.testing.assert_array_equal(arr(got.offsets), offsets, err_msg=f"{what} offsets")
    assert total == len(flat), f"{what}: total {total} != {len(flat)}"
    assert bool(got.overflowed()) == (len(flat) > capacity), what
    n = min(capacity, len(flat))
    assert (rows[n:] == -1).all(), f"{what}: entries past the matches are not -1"
    if exact_prefix:
        np.testing.assert_array_equal(rows[:n], flat[:n], err_msg=f"{what} rows")
    else:
        for i in range(len(want_rows)):
            a, b = offsets[i], offsets[i + 1]
            if b <= capacity:
                np.testing.assert_array_equal(rows[a:b], flat[a:b], err_msg=f"{what} query {i}")
            elif a < capacity:
                seg = rows[a:capacity]
                assert set(seg.tolist()) <= set(flat[a:b].tolist()) and (np.diff(seg) > 0).all(), what
    if len(flat) <= capacity:  # without overflow, to_matches is the uncapped answer
        m = got.to_matches()
        np.testing.assert_array_equal(arr(m.rows), flat, err_msg=f"{what} to_matches")


def check_aggregate(got, want_rows: list[np.ndarray], values: np.ndarray, what: str) -> None:
    want = Multiset.sums(want_rows, values)
    np.testing.assert_array_equal(arr(got.count), [len(r) for r in want_rows], err_msg=f"{what} count")
    s = arr(got.sum)
    if values.dtype.kind == "f":
        assert got.sum.dtype == torch.float64, what
        np.testing.assert_allclose(s, want, rtol=1e-9, atol=1e-9, err_msg=f"{what} sum")
    else:
        assert got.sum.dtype == torch.int64, what
        np.testing.assert_array_equal(s, want, err_msg=f"{what} sum")


def values_for(num_rows: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "int64":
        return rng.integers(-(2**40), 2**40, num_rows, dtype=np.int64)
    if kind == "int32":
        return rng.integers(-(2**31), 2**31 - 1, num_rows, dtype=np.int32)
    if kind == "float32":
        return rng.standard_normal(num_rows).astype(np.float32)
    return rng.standard_normal(num_rows)


# ------------------------------------------------------------------------------------------------ updates


def update_batches(ref: Multiset, key_type: str, seed: int, batches: int = 6, *, explicit_rows: bool = True,
                   cancel_rows: bool = True, ascending_rows: bool = False):
    """Random update batches against the current multiset (consumed one at a time, the reference applied in
    between by the caller): each yields keyword arguments of ``update`` (numpy arrays or None). Mixes new keys,
    duplicates of present keys and edges; deletes of present keys, absent keys and keys of the same batch; by
    key or by (key, row); explicit row IDs (fresh, with gaps) or none; empty batches. ``explicit_rows=False``:
    never explicit rows; ``cancel_rows=False``: no deletion by (key, row) of a pair the same batch inserts;
    ``ascending_rows``: explicit rows ascend in batch order (ShardedIndex's rule: fresh rows ascend across ranks)."""
    rng = np.random.default_rng(seed)
    for b in range(batches):
        mode = b % 6 if b < 6 else int(rng.integers(0, 6))
        n_ins = int(rng.integers(0, 25))
        present = ref.keys
        parts = [random_values(key_type, n_ins // 2, rng)]
        if len(present):
            parts.append(present[rng.integers(0, len(present), n_ins - n_ins // 2)])
        parts.append(edges(key_type)[rng.integers(0, len(edges(key_type)), int(rng.integers(0, 3)))])
        ik = np.concatenate(parts).astype(NP_DTYPES[key_type])
        explicit = bool(rng.integers(0, 2)) and explicit_rows
        ir = None
        fresh = np.arange(ref.next_row, ref.next_row + len(ik), dtype=np.int64)
        if explicit:
            fresh = ref.next_row + np.cumsum(rng.integers(1, 4, len(ik))).astype(np.int64) - 1
            ir = fresh if ascending_rows else rng.permutation(fresh)
        rows_of_ins = ir if explicit else fresh
        if mode == 0:  # empty batch
            yield {}
            continue
        if mode == 1:  # insertions alone
            yield {"insert_keys": ik, "insert_rows": ir}
            continue
        by_row = mode in (3, 5)
        dk, dr = [], []
        if len(present):
            at = rng.choice(len(present), min(len(present), int(rng.integers(0, 12))), replace=False)
            dk.append(ref.keys[at])
            dr.append(ref.rows[at])
        if len(ik) and (cancel_rows or mode in (2, 4)):  # same-batch cancellations
            at = rng.choice(len(ik), min(len(ik), int(rng.integers(1, 5))), replace=False)
            dk.append(ik[at])
            dr.append(rows_of_ins[at])
        absent = random_values(key_type, int(rng.integers(0, 4)), rng)
        dk.append(absent)
        dr.append(np.full(len(absent), 2**31 - 7, dtype=np.int64))  # a row ID nobody holds
        if by_row and len(present):  # a present key with a row it does not have
            dk.append(ref.keys[:1])
            dr.append(np.array([2**31 - 9], dtype=np.int64))
        dk = np.concatenate(dk).astype(NP_DTYPES[key_type])
        dr = np.concatenate(dr).astype(np.int64)
        if not by_row:  # one entry per key: a key named twice is one deletion found twice
            dk, first = np.unique(dk, return_index=True)
            dk = dk[np.argsort(first)]
        else:  # one entry per pair
            _, first = np.unique(np.stack([dk.astype(np.float64) if dk.dtype.kind == "f" else dk.view(np.int64 if dk.itemsize == 8 else np.int32).astype(np.int64), dr]), axis=1, return_index=True)
            first = np.sort(first)
            dk, dr = dk[first], dr[first]
        perm = rng.permutation(len(dk))
        dk, dr = dk[perm], dr[perm]
        if mode == 4:  # deletions alone
            yield {"delete_keys": dk}
        elif mode == 5:
            yield {"delete_keys": dk, "delete_rows": dr} if b % 2 else {"insert_keys": ik, "insert_rows": ir,
                                                                        "delete_keys": dk, "delete_rows": dr}
        elif by_row:
            yield {"insert_keys": ik, "insert_rows": ir, "delete_keys": dk, "delete_rows": dr}
        else:
            yield {"insert_keys": ik, "insert_rows": ir, "delete_keys": dk}
