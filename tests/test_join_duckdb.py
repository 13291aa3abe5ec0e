"""join / range_join (and their capped forms) against the same SQL run by DuckDB, a real join engine.

Random tables with duplicates on both sides, misses (random and adjacent to build keys), band joins
(``ON b.key BETWEEN p.lo AND p.hi``, empty and single-key bands included) and the key types' edges (the full
int64 / uint64 range, int32, float32 and float64 with signed zeros and infinities). Every index is a build side:
RXIndex (ray and scan range paths), CgRXIndex with each backend (on the CPU ``optix`` answers by binary search
over the representatives), UpdatableCgRXIndex freshly built and after inserts and deletes (row IDs that are not
positions). On the CPU, and on the GPU where there is one (the ``device`` fixture).

NaN is left out on purpose: DuckDB treats NaN as equal to NaN, the indexes refuse NaN keys and a NaN query
matches nothing (test_join.py checks that against numpy).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_rtindex import CgRXIndex, RXIndex, UpdatableCgRXIndex, join, join_capped, range_join, range_join_capped

duckdb = pytest.importorskip("duckdb", reason="DuckDB is the reference join engine here: pip install -e '.[test]'")

KEY_TYPES = ("int64", "uint64", "int32", "float32", "float64")
NUMPY_DTYPES = {"int64": np.int64, "uint64": np.uint64, "int32": np.int32, "float32": np.float32, "float64": np.float64}


def build_side(kind: str, keys: torch.Tensor, key_type: str):
    kt = {"key_type": "uint64"} if key_type == "uint64" else {}
    if kind == "rx":
        return RXIndex(keys, **kt)
    if kind == "rx_scan":  # every range needs more rays than allowed: answered by scanning the keys
        return RXIndex(keys, max_range_rays=1, **kt)
    if kind.startswith("cgrx_"):
        return CgRXIndex(keys, bucket_size=4, backend=kind.removeprefix("cgrx_"), **kt)  # runs of equal keys span buckets
    if kind == "updatable":
        return UpdatableCgRXIndex(keys, node_size=4, **kt)
    raise ValueError(kind)


BUILD_SIDES = ("rx", "rx_scan", "cgrx_radix", "cgrx_binary_search", "cgrx_optix", "updatable", "updatable_updated")


# ------------------------------------------------------------------------------------------------- tables
def edges(key_type: str) -> np.ndarray:
    dt = NUMPY_DTYPES[key_type]
    if key_type.startswith("float"):
        return np.array([0.0, -0.0, np.inf, -np.inf, 1e-30, -1e-30, np.finfo(dt).max, np.finfo(dt).min], dtype=dt)
    info = np.iinfo(dt)
    return np.array([info.min, info.min + 1, info.max, info.max - 1, 0, 1, info.max // 2 + 1], dtype=dt)


def random_values(key_type: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dt = NUMPY_DTYPES[key_type]
    if key_type.startswith("float"):
        return (rng.standard_normal(n) * 1e6).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


def neighbours(values: np.ndarray) -> np.ndarray:
    """The next value up of each key: a miss unless it happens to be another key."""
    if values.dtype.kind == "f":
        with np.errstate(over="ignore"):  # the largest finite value steps to inf, another key
            return np.nextafter(values, np.inf, dtype=values.dtype)
    return values + np.array(1, dtype=values.dtype)  # wraps at the maximum: still a valid key


def make_tables(key_type: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(build keys, probe keys): ~150 distinct build values with multiplicities 1..5 (one value 40 times, an
    edge among them); probes hit (repeatedly), miss next to a key, miss at random, and sit on the edges."""
    distinct = np.unique(np.concatenate([edges(key_type), random_values(key_type, 140, rng)]))
    mult = rng.integers(1, 6, distinct.size)
    mult[rng.integers(0, distinct.size)] = 40
    build = np.repeat(distinct, mult)
    build = build[rng.permutation(build.size)]
    hits = build[rng.integers(0, build.size, 200)]
    probe = np.concatenate([hits, neighbours(hits[:80]), random_values(key_type, 80, rng), edges(key_type)])
    probe = np.concatenate([probe, probe[:30]])  # repeated probe keys
    return build, probe[rng.permutation(probe.size)]


def make_bands(key_type: str, build: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] bands a few distinct keys wide, starting at keys and at random values; 10% empty (lo > hi),
    10% one value (lo == hi), and bands reaching the ends of the key range."""
    n = 300
    dt = NUMPY_DTYPES[key_type]
    lo = np.concatenate([build[rng.integers(0, build.size, n // 2)], random_values(key_type, n - n // 2, rng)])
    lo = lo[rng.permutation(n)]
    if key_type.startswith("float"):
        hi = (lo + rng.uniform(0, 3e4, n)).astype(dt)  # ~ a few key spacings of the N(0, 1e6) keys
    else:
        info = np.iinfo(dt)
        step = (int(info.max) - int(info.min)) // 150  # the spacing of ~150 uniform distinct keys
        width = rng.integers(0, 4 * step, n, dtype=dt, endpoint=True)
        hi = np.where(lo > info.max - width, info.max, lo + width).astype(dt)  # saturating lo + width
    hi[: n // 10], lo[: n // 10] = lo[: n // 10].copy(), hi[: n // 10].copy()  # swapped: empty unless lo == hi
    hi[n // 10 : n // 5] = lo[n // 10 : n // 5]
    e = edges(key_type)
    lo = np.concatenate([lo, [e.min(), e.min(), build[0], e.max()]]).astype(dt)
    hi = np.concatenate([hi, [e.max(), build[1], e.max(), e.max()]]).astype(dt)
    return lo, hi


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A numpy key column as the index takes it: uint64 as int64 bits (with key_type="uint64")."""
    return torch.from_numpy(a.view(np.int64) if a.dtype == np.uint64 else a).contiguous()


# ---------------------------------------------------------------------------------------------------- DuckDB
@pytest.fixture(scope="module")
def con():
    c = duckdb.connect(config={"threads": 1})  # tiny tables; leave the cores to the other tests
    yield c
    c.close()


def duck_pairs(con, sql: str, **tables: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(probe position, build row) columns of a query over numpy tables; a NULL build row (left join) is -1."""
    for name, columns in tables.items():
        con.register(name, columns)
    try:
        out = con.execute(sql).fetchnumpy()
    finally:
        for name in tables:
            con.unregister(name)
    probe, build = (np.ma.filled(out[c], -1).astype(np.int64) for c in ("pos", "row"))
    return probe, build


def sql(how: str, on: str) -> str:
    join_kw = "JOIN" if how == "inner" else "LEFT JOIN"
    return f"SELECT p.pos, b.row FROM p {join_kw} b ON {on} ORDER BY p.pos, b.row"


EQUI = "p.key = b.key"
BAND = "b.key BETWEEN p.lo AND p.hi"


# ---------------------------------------------------------------------------------------------------- checks
def check_pairs(got: tuple[torch.Tensor, torch.Tensor], want: tuple[np.ndarray, np.ndarray]) -> None:
    """Same multiset of (probe, build row) pairs as DuckDB, and in the documented order (by probe position,
    then build row; each pair once, so strictly increasing)."""
    probe, build = (t.cpu().numpy() for t in got)
    assert got[0].dtype == got[1].dtype == torch.int64 and probe.shape == build.shape
    order = np.lexsort((build, probe))
    np.testing.assert_array_equal(probe[order], want[0], err_msg="probe positions differ from DuckDB's")
    np.testing.assert_array_equal(build[order], want[1], err_msg="pairs differ from DuckDB's")
    step_ok = (probe[1:] > probe[:-1]) | ((probe[1:] == probe[:-1]) & (build[1:] > build[:-1]))
    assert step_ok.all(), f"pairs not ordered by (probe, build row) at {np.nonzero(~step_ok)[0][:5]}"


def check_capped(got, want: tuple[np.ndarray, np.ndarray], capacity: int) -> None:
    """The true pair count, -1 past the stored pairs, the exact pairs where they all fit; cut short, the
    probes before the last stored one are complete and that one holds some of its pairs."""
    probe, build, total = (t.cpu().numpy() for t in got)
    assert probe.shape == build.shape == (capacity,)
    assert int(total) == want[0].size, "the capped join's total differs from DuckDB's row count"
    n = min(capacity, want[0].size)
    assert (probe[n:] == -1).all() and (build[n:] == -1).all()
    np.testing.assert_array_equal(probe[:n], want[0][:n])
    if n == want[0].size:
        np.testing.assert_array_equal(build[:n], want[1][:n])
        return
    cut = want[0][n]  # the probe whose pairs are cut
    whole = probe[:n] != cut
    np.testing.assert_array_equal(build[:n][whole], want[1][:n][whole])
    assert set(build[:n][~whole]) <= set(want[1][want[0] == cut])


# ----------------------------------------------------------------------------------------------------- tests
def tables_and_index(kind: str, key_type: str, seed: int, device: torch.device):
    rng = np.random.default_rng(seed)
    build, probe = make_tables(key_type, rng)
    index = build_side("updatable" if kind == "updatable_updated" else kind, to_torch(build).to(device), key_type)
    rows = np.arange(build.size, dtype=np.int64)
    if kind == "updatable_updated":
        build, rows = update(index, build, rows, key_type, rng, device)
    return index, build, rows, probe, rng


def update(index, build: np.ndarray, rows: np.ndarray, key_type: str, rng: np.random.Generator, device: torch.device):
    """Inserts (new keys and more copies of old ones, with fresh row IDs), deletes single pairs and whole keys;
    returns the (key, row) table the index should now hold, tracked here independently."""
    new = np.concatenate([random_values(key_type, 40, rng), build[rng.integers(0, build.size, 40)]])
    result = index.insert(to_torch(new).to(device))
    fresh = np.arange(build.size, build.size + new.size, dtype=np.int64)
    np.testing.assert_array_equal(result.rows.cpu().numpy(), fresh)
    build, rows = np.concatenate([build, new]), np.concatenate([rows, fresh])
    gone = rng.choice(build.size, 60, replace=False)
    index.delete(to_torch(build[gone]).to(device), torch.from_numpy(rows[gone]).to(device))
    keep = np.ones(build.size, dtype=bool)
    keep[gone] = False
    build, rows = build[keep], rows[keep]
    dropped = build[rng.integers(0, build.size, 3)]
    index.delete(to_torch(dropped).to(device))  # every pair of these keys
    keep = ~np.isin(build, dropped)
    return build[keep], rows[keep]


@pytest.mark.parametrize("key_type", KEY_TYPES)
@pytest.mark.parametrize("kind", BUILD_SIDES)
def test_equi_join_matches_duckdb(con, device, kind, key_type):
    index, build, rows, probe, _ = tables_and_index(kind, key_type, BUILD_SIDES.index(kind), device)
    b = {"key": build, "row": rows}
    p = {"pos": np.arange(probe.size, dtype=np.int64), "key": probe}
    q = to_torch(probe).to(device)
    for how in ("inner", "left"):
        want = duck_pairs(con, sql(how, EQUI), b=b, p=p)
        check_pairs(join(index, q, how=how), want)
        for capacity in (want[0].size, want[0].size + 7, want[0].size // 3):
            check_capped(join_capped(index, q, capacity, how=how), want, capacity)
        if how == "inner":  # the tables really have duplicates on both sides and misses
            matched = np.unique(want[0])
            assert want[0].size > matched.size and matched.size < probe.size
            assert np.unique(probe[matched]).size < matched.size  # repeated probe keys matched


@pytest.mark.parametrize("key_type", KEY_TYPES)
@pytest.mark.parametrize("kind", BUILD_SIDES)
def test_band_join_matches_duckdb(con, device, kind, key_type):
    index, build, rows, _, rng = tables_and_index(kind, key_type, 100 + BUILD_SIDES.index(kind), device)
    lo, hi = make_bands(key_type, build, rng)
    b = {"key": build, "row": rows}
    p = {"pos": np.arange(lo.size, dtype=np.int64), "lo": lo, "hi": hi}
    tlo, thi = to_torch(lo).to(device), to_torch(hi).to(device)
    for how in ("inner", "left"):
        want = duck_pairs(con, sql(how, BAND), b=b, p=p)
        check_pairs(range_join(index, tlo, thi, how=how), want)
        for capacity in (want[0].size, want[0].size + 7, want[0].size // 3):
            check_capped(range_join_capped(index, tlo, thi, capacity, how=how), want, capacity)
        if how == "inner":  # bands with several keys, and bands with none
            counts = np.bincount(want[0], minlength=lo.size)
            assert (counts > 5).sum() > 10 and (counts == 0).sum() > 10
