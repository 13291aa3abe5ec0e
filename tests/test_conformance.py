"""The conformance suite (issue 41): every index class of one process, in its main configurations, against the
contract of torch_rtindex/index.py (``Index``, ``UpdatableIndex``), every answer checked against one independent
reference (tests/reference.py's Multiset: numpy brute force over the (key, row ID) pairs). ShardedIndex runs
the same checks over process groups in tests/test_conformance_sharded.py.

Two tables say where a class departs from the plain contract:

- ``NOT_IMPLEMENTED``: (class, form) -> the form cannot exist for the class, which raises NotImplementedError
  naming the alternative (the README's table of methods x classes mirrors it);
- ``KNOWN_GAPS``: (class, check) -> a gap another branch is closing; the case is xfail(strict=True), so an entry
  whose case starts passing fails loudly and is deleted as the branch lands.
"""

from __future__ import annotations

import copy
import gc
import io
import pickle
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch

from conformance_cases import (
    KEY_TYPES, NP_DTYPES, arr, check_aggregate, check_capped, check_lookup, check_matches, make_keys,
    point_queries, range_queries, to_torch, update_batches, values_for,
)
from reference import Multiset
from torch_rtindex import CgRXIndex, ChunkedIndex, Index, RXIndex, UpdatableCgRXIndex, UpdatableIndex

CUDA = torch.cuda.is_available()
N_KEYS = 200

# (class, form) -> what to use instead: the form cannot exist for the class and raises NotImplementedError.
# "cuda_graph_capture": a lookup captured in a CUDA graph (torch.cuda.graph) on a CUDA index.
NOT_IMPLEMENTED: dict[tuple[str, str], str] = {
    ("ShardedIndex", "to"): "gathered_state_dict / from_gathered_state",
    ("ShardedIndex", "cpu"): "gathered_state_dict / from_gathered_state",
    ("ShardedIndex", "cuda"): "gathered_state_dict / from_gathered_state",
    ("ChunkedIndex", "cuda_graph_capture"): "eager lookups (every batch learns its queue sizes on the host)",
    ("RXIndex", "cuda_graph_capture"): "CgRXIndex(backend='radix'), whose lookups are capturable",
}

# (class, check) -> "<branch>: <what>": cases failing today because of a gap that branch is closing.
KNOWN_GAPS: dict[tuple[str, str], str] = {
}


@dataclass(frozen=True)
class Config:
    """One class in one configuration: how to build it from CPU keys, where its queries go, and the order its
    ``range`` answers in ("row": ascending row IDs per query; "key": (key, row ID) order)."""

    id: str
    cls: type
    build: Callable[[torch.Tensor, str], Any]
    device: str = "cpu"
    range_order: str = "key"
    updatable: bool = False
    exact_prefix: bool = True  # a capped answer cut inside a query holds that query's first rows

    @property
    def cls_name(self) -> str:
        return self.cls.__name__


def _configs() -> list[Config]:
    out: list[Config] = []
    devices = ["cpu"] + (["cuda"] if CUDA else [])
    for dev in devices:
        out.append(Config(f"rx-{dev}", RXIndex, lambda k, kt, d=dev: RXIndex(k.to(d), key_type=kt), dev, "row",
                          exact_prefix=dev == "cpu"))
        backends = ["radix", "binary_search"] + (["optix"] if dev == "cuda" else [])
        for be in backends:
            for layout in ("packed_row", "aligned_row", "column"):
                out.append(Config(f"cgrx-{dev}-{be}-{layout}", CgRXIndex,
                                  lambda k, kt, d=dev, b=be, lay=layout: CgRXIndex(k.to(d), key_type=kt, backend=b,
                                                                                   layout=lay), dev))
            out.append(Config(f"ucgrx-{dev}-{be}", UpdatableCgRXIndex,
                              lambda k, kt, d=dev, b=be: UpdatableCgRXIndex(k.to(d), key_type=kt, backend=b,
                                                                            node_size=4), dev, updatable=True))
    # Chunked: chunks of at most 1 KiB, so that a couple of hundred keys make many chunks.
    for upd in (False, True):
        name = "u" if upd else ""
        out.append(Config(f"chunked{name}-cpu", ChunkedIndex,
                          lambda k, kt, u=upd: ChunkedIndex(k, key_type=kt, chunk_bytes=1024, device="cpu",
                                                            processors="cpu", updatable=u, progress=False),
                          "cpu", updatable=True))
        if CUDA:
            for proc in ("gpu", "auto"):
                out.append(Config(f"chunked{name}-cuda-{proc}", ChunkedIndex,
                                  lambda k, kt, u=upd, p=proc: ChunkedIndex(k, key_type=kt, chunk_bytes=1024,
                                                                            device="cuda", processors=p,
                                                                            gpu_budget=64 << 10, updatable=u,
                                                                            progress=False),
                                  "cuda", updatable=True))
    return out


CONFIGS = _configs()


def gap(cls_name: str, check: str) -> list:
    reason = KNOWN_GAPS.get((cls_name, check))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def cases(check: str, *, key_types=KEY_TYPES, only: Callable[[Config], bool] = lambda c: True,
          chunked_key_types=None):
    """(config, key type) cases of ``check``; ``chunked_key_types``: fewer for ChunkedIndex, whose batches cost
    the most (the suite's time budget)."""
    return [pytest.param(c, kt, id=f"{c.id}-{kt}", marks=gap(c.cls_name, check))
            for c in CONFIGS if only(c)
            for kt in (chunked_key_types or key_types if c.cls is ChunkedIndex else key_types)]


def build(cfg: Config, key_type: str, n: int = N_KEYS, seed: int = 0):
    keys = make_keys(key_type, n, seed)
    return cfg.build(to_torch(keys), key_type), Multiset(keys, key_type)


def on(cfg: Config, a: np.ndarray) -> torch.Tensor:
    return to_torch(a).to(cfg.device)


def check_answers(idx, ref: Multiset, cfg: Config, key_type: str, seed: int = 1) -> None:
    """The answers every later check (round trips, updates) compares: len, lookup, range_lookup, lookup_all,
    range."""
    assert len(idx) == len(ref)
    q = point_queries(ref.keys, key_type, 60, seed)
    lo, hi = range_queries(ref.keys, key_type, 40, seed)
    check_lookup(idx.lookup(on(cfg, q)), ref, q)
    check_lookup(idx.range_lookup(on(cfg, lo), on(cfg, hi)), ref, lo, hi, "range_lookup")
    check_matches(idx.lookup_all(on(cfg, q)), ref.point_rows(q), "lookup_all")
    check_matches(idx.range(on(cfg, lo), on(cfg, hi)), ref.range_rows(lo, hi, cfg.range_order), "range")


# ------------------------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("cfg,key_type", cases("protocol", key_types=("int64",)))
def test_protocol(cfg, key_type):
    idx, _ = build(cfg, key_type)
    assert isinstance(idx, Index)
    if cfg.updatable:
        assert isinstance(idx, UpdatableIndex)
    else:  # the read-only classes have no update methods
        assert not isinstance(idx, UpdatableIndex)
    assert idx.key_type == key_type and idx.key_dtype == to_torch(make_keys(key_type, 1, 0)).dtype
    assert idx.device.type == cfg.device


@pytest.mark.parametrize("cfg,key_type", cases("lookups"))
@pytest.mark.parametrize("seed", [0, 1])
def test_lookups(cfg, key_type, seed):
    idx, ref = build(cfg, key_type, seed=seed)
    check_answers(idx, ref, cfg, key_type, seed)
    lo, hi = range_queries(ref.keys, key_type, 40, seed + 7)
    rc = idx.range_count(on(cfg, lo), on(cfg, hi))
    assert rc.dtype == torch.int64
    np.testing.assert_array_equal(arr(rc), [len(r) for r in ref.range_rows(lo, hi, "row")])
    # Every key of the index is found with all its rows.
    check_matches(idx.lookup_all(on(cfg, ref.keys)), ref.point_rows(ref.keys), "lookup_all of every key")
    # Empty batches: empty answers of the right types.
    e = ref.keys[:0]
    check_lookup(idx.lookup(on(cfg, e)), ref, e)
    check_lookup(idx.range_lookup(on(cfg, e), on(cfg, e)), ref, e, e, "range_lookup")
    assert idx.range_count(on(cfg, e), on(cfg, e)).shape == (0,)
    check_matches(idx.lookup_all(on(cfg, e)), [], "lookup_all")
    check_matches(idx.range(on(cfg, e), on(cfg, e)), [], "range")


@pytest.mark.parametrize("cfg,key_type", cases("lookup_rows"))
def test_lookup_rows(cfg, key_type):
    idx, ref = build(cfg, key_type)
    q = point_queries(ref.keys, key_type, 80, 3)
    first, count = Multiset.first_count(ref.point_rows(q))
    got = idx.lookup_rows(on(cfg, q))
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(arr(got), np.where(count > 0, first, -1))
    for miss in (7, -(2**63), 2**63 - 1):
        np.testing.assert_array_equal(arr(idx.lookup_rows(on(cfg, q), miss_row=miss)), np.where(count > 0, first, miss))
    assert idx.lookup_rows(on(cfg, q[:0])).shape == (0,)


@pytest.mark.parametrize("cfg,key_type", cases("capped"))
def test_capped(cfg, key_type):
    idx, ref = build(cfg, key_type)
    q = point_queries(ref.keys, key_type, 60, 4)
    lo, hi = range_queries(ref.keys, key_type, 30, 4)
    for what, call, rows in (
        ("lookup_all_capped", lambda c: idx.lookup_all_capped(on(cfg, q), c), ref.point_rows(q)),
        ("range_capped", lambda c: idx.range_capped(on(cfg, lo), on(cfg, hi), c), ref.range_rows(lo, hi, cfg.range_order)),
    ):
        total = sum(len(r) for r in rows)
        assert total > 2, "the queries must match something for the overflow cases to mean anything"
        # No overflow (exact and with room to spare), overflow inside a query, nothing fits.
        for cap in sorted({total, total + 5, total // 2, 1, 0}):
            check_capped(call(cap), rows, cap, cfg.exact_prefix, f"{what} capacity {cap} of {total}")


@pytest.mark.parametrize("cfg,key_type", cases("capacity_forms", key_types=("int64",)))
def test_capacity_forms(cfg, key_type):
    """A capacity is any integer: a numpy integer or a 0-d integer tensor too."""
    idx, ref = build(cfg, key_type)
    q = point_queries(ref.keys, key_type, 40, 4)
    rows = ref.point_rows(q)
    total = sum(len(r) for r in rows)
    for cap in (np.int64(total), torch.tensor(total), torch.tensor(total // 2, dtype=torch.int32)):
        check_capped(idx.lookup_all_capped(on(cfg, q), cap), rows, int(cap), cfg.exact_prefix, f"capacity {cap!r}")
        check_capped(idx.range_capped(on(cfg, q), on(cfg, q), cap), rows, int(cap), cfg.exact_prefix,
                     f"range capacity {cap!r}")


@pytest.mark.parametrize("cfg,key_type", cases("aggregate"))
def test_aggregate(cfg, key_type):
    idx, ref = build(cfg, key_type)
    q = point_queries(ref.keys, key_type, 60, 5)
    lo, hi = range_queries(ref.keys, key_type, 30, 5)
    for kind in ("int64", "int32", "float64", "float32"):
        v = values_for(len(ref), kind, 6)
        vt = torch.from_numpy(v).to(cfg.device)
        check_aggregate(idx.aggregate(on(cfg, q), vt), ref.point_rows(q), v, f"aggregate {kind}")
        check_aggregate(idx.range_aggregate(on(cfg, lo), on(cfg, hi), vt), ref.range_rows(lo, hi, "row"), v,
                        f"range_aggregate {kind}")


@pytest.mark.parametrize("cfg,key_type", cases("memory", key_types=("int64", "float32")))
def test_memory(cfg, key_type):
    idx, _ = build(cfg, key_type)
    mem = idx.memory()
    assert isinstance(mem, dict) and mem
    assert all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in mem.items()), mem
    assert sum(mem.values()) > 0


def _defined_in(obj: Any) -> str:
    """module:name of a function, or of an object's class."""
    if isinstance(obj, types.FunctionType):
        return f"{obj.__module__}:{obj.__qualname__}"
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


@pytest.mark.parametrize("cfg,key_type", cases("freed", key_types=("int64",)))
def test_freed_with_its_last_reference(cfg, key_type):
    """An index that has answered goes, with what it holds (device memory, pinned host memory, a chunk cache),
    when its last reference does: nothing of the package waits in a reference cycle for Python's collector."""
    gc.collect()
    gc.disable()
    try:
        idx, ref = build(cfg, key_type)
        check_answers(idx, ref, cfg, key_type)
        gone = weakref.ref(idx)
        del idx
        assert gone() is None, "something still holds the index after its last reference went"
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sorted({name for name in map(_defined_in, gc.garbage) if name.startswith("torch_rtindex")})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    assert not left, f"left in reference cycles after the index went: {left}"


@pytest.mark.parametrize("cfg,key_type", cases("capturable", key_types=("int64",)))
def test_capturable(cfg, key_type):
    idx, _ = build(cfg, key_type)
    # A property (index.py): True on the CPU; on CUDA whether the fixed-size lookups can be captured.
    cap = idx.capturable
    assert type(cap) is bool
    if cfg.cls is ChunkedIndex:  # every batch learns its queue sizes on the host
        assert cap is False
    elif cfg.device == "cpu":
        assert cap is True


@pytest.mark.parametrize("cfg,key_type", cases("empty_index", key_types=("int64", "float64")))
def test_empty_index(cfg, key_type):
    idx, ref = build(cfg, key_type, n=0)
    assert len(idx) == 0
    check_answers(idx, ref, cfg, key_type)
    q = point_queries(ref.keys, key_type, 20, 8)
    check_capped(idx.lookup_all_capped(on(cfg, q), 4), ref.point_rows(q), 4, True, "lookup_all_capped")
    v = torch.zeros(0, dtype=torch.int64, device=cfg.device)
    check_aggregate(idx.aggregate(on(cfg, q), v), ref.point_rows(q), np.zeros(0, dtype=np.int64), "aggregate")
    assert np.all(arr(idx.range_count(on(cfg, q), on(cfg, q))) == 0)


# ------------------------------------------------------------------------------------ state and devices


def _roundtrip_cases(check: str):
    return cases(check, key_types=("int64", "uint64", "float32"))


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("state_dict"))
def test_state_dict(cfg, key_type):
    idx, ref = build(cfg, key_type)
    state = idx.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)  # plain tensors and values: torch.load's weights_only default reads it
    buf.seek(0)
    for s in (state, torch.load(buf)):
        check_answers(type(idx).from_state_dict(s), ref, cfg, key_type)
    # from_state_dict onto an explicit device
    check_answers(type(idx).from_state_dict(state, device=cfg.device), ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("load_state_dict"))
def test_load_state_dict(cfg, key_type):
    idx, ref = build(cfg, key_type)
    other, _ = build(cfg, key_type, n=N_KEYS // 2, seed=9)
    other.load_state_dict(idx.state_dict())
    check_answers(other, ref, cfg, key_type)
    # A malformed state is refused and leaves the index as it was.
    with pytest.raises((KeyError, ValueError, TypeError)):
        other.load_state_dict({"format": "nonsense"})
    check_answers(other, ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("pickle"))
def test_pickle(cfg, key_type):
    idx, ref = build(cfg, key_type)
    idx.lookup(on(cfg, ref.keys[:5]))  # a used index pickles too
    check_answers(pickle.loads(pickle.dumps(idx)), ref, cfg, key_type)
    check_answers(idx, ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("torch_save"))
def test_torch_save(cfg, key_type):
    idx, ref = build(cfg, key_type)
    buf = io.BytesIO()
    torch.save({"index": idx}, buf)
    buf.seek(0)
    check_answers(torch.load(buf)["index"], ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("deepcopy"))
def test_deepcopy(cfg, key_type):
    idx, ref = build(cfg, key_type)
    idx.lookup(on(cfg, ref.keys[:5]))
    dup = copy.deepcopy(idx)
    assert dup is not idx
    check_answers(dup, ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", _roundtrip_cases("to_cpu"))
def test_to_cpu(cfg, key_type):
    idx, ref = build(cfg, key_type)
    assert idx.to(cfg.device) is idx and idx.to(torch.device(cfg.device)) is idx
    on_cpu = idx.cpu()
    assert on_cpu.device.type == "cpu"
    check_answers(on_cpu, ref, Config(cfg.id, cfg.cls, cfg.build, "cpu", cfg.range_order, cfg.updatable), key_type)
    if CUDA:
        back = on_cpu.to("cuda")
        assert back.device.type == "cuda"
        check_answers(back, ref, Config(cfg.id, cfg.cls, cfg.build, "cuda", cfg.range_order, cfg.updatable), key_type)


# ---------------------------------------------------------------------------------------------- updates


def _apply(idx, ref: Multiset, cfg: Config, batch: dict) -> None:
    args = {k: (None if v is None else (on(cfg, v) if k.endswith("keys") else torch.from_numpy(v).to(cfg.device)))
            for k, v in batch.items()}
    want = ref.update(**batch)
    got = idx.update(**args)
    what = {k: (None if v is None else len(v)) for k, v in batch.items()}
    assert (got.inserted, got.deleted, got.absent) == want[:3], f"{what}: got {got[:3]}, want {want[:3]}"
    assert got.rows.dtype == torch.int64
    np.testing.assert_array_equal(arr(got.rows), want[3], err_msg=f"{what}: rows")


@pytest.mark.parametrize("cfg,key_type", cases("updates", only=lambda c: c.updatable,
                                               chunked_key_types=("int64", "uint64", "float64")))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_updates(cfg, key_type, seed):
    idx, ref = build(cfg, key_type, n=[N_KEYS, 0, 30][seed], seed=seed)
    for i, batch in enumerate(update_batches(ref, key_type, seed=100 + seed, batches=9)):
        _apply(idx, ref, cfg, batch)
        check_answers(idx, ref, cfg, key_type, seed=i)
        v = values_for(ref.next_row, "int64", i)
        q = point_queries(ref.keys, key_type, 30, i)
        check_aggregate(idx.aggregate(on(cfg, q), torch.from_numpy(v).to(cfg.device)), ref.point_rows(q), v,
                        f"aggregate after batch {i}")
    # The insert / delete forms: insert with and without rows, delete by key and by (key, row).
    k = make_keys(key_type, 6, 50 + seed)
    rows = np.arange(ref.next_row + 3, ref.next_row + 9, dtype=np.int64)
    for call, batch in (
        (lambda: idx.insert(on(cfg, k)), {"insert_keys": k}),
        (lambda: idx.insert(on(cfg, k), torch.from_numpy(rows + 6).to(cfg.device)), {"insert_keys": k, "insert_rows": rows + 6}),
        (lambda: idx.delete(on(cfg, k[:2]), torch.from_numpy(rows[:2] + 6).to(cfg.device)), {"delete_keys": k[:2], "delete_rows": rows[:2] + 6}),
        (lambda: idx.delete(on(cfg, k[2:4])), {"delete_keys": k[2:4]}),
    ):
        want = ref.update(**batch)
        got = call()
        assert (got.inserted, got.deleted, got.absent) == want[:3]
        np.testing.assert_array_equal(arr(got.rows), want[3])
        check_answers(idx, ref, cfg, key_type, seed=seed)


@pytest.mark.parametrize("cfg,key_type", cases("state_after_updates", key_types=("int64", "uint64"),
                                               only=lambda c: c.updatable))
def test_state_after_updates(cfg, key_type):
    """Row IDs given at insertion survive every round trip."""
    idx, ref = build(cfg, key_type, n=60)
    for batch in update_batches(ref, key_type, seed=7, batches=6):
        _apply(idx, ref, cfg, batch)
    check_answers(type(idx).from_state_dict(idx.state_dict()), ref, cfg, key_type)
    check_answers(pickle.loads(pickle.dumps(idx)), ref, cfg, key_type)
    check_answers(copy.deepcopy(idx), ref, cfg, key_type)


# -------------------------------------------------------------------------------------------- bad input

# (key type, query dtype) pairs converted exactly (accepted) and refused (TypeError naming both dtypes).
LOSSLESS = [("int64", torch.int32), ("int64", torch.int16), ("int32", torch.int16), ("float64", torch.float32),
            ("float64", torch.float16), ("float32", torch.float16)]
if hasattr(torch, "uint32"):
    LOSSLESS.append(("uint64", torch.uint32))
LOSSY = [("int64", torch.float64), ("int64", torch.float32), ("int32", torch.int64), ("int32", torch.float32),
         ("float32", torch.float64), ("float64", torch.int64), ("float32", torch.int32), ("uint64", torch.int32)]


def _expect_same(idx, ref, cfg, key_type):
    check_answers(idx, ref, cfg, key_type, seed=11)


@pytest.mark.parametrize("cfg,key_type", cases("dtype_policy", key_types=tuple(dict(LOSSLESS + LOSSY))))
def test_dtype_policy(cfg, key_type):
    idx, ref = build(cfg, key_type)
    small = [0, 1, 2, 3, 100, 0] + ([] if key_type == "uint64" else [-1, -100])
    for kt, dt in LOSSLESS:
        if kt != key_type:
            continue
        # Values exact in the narrower dtype: small ones and the index's keys that fit it.
        fit = [x for x in ref.keys if _fits(x, dt)]
        exact = np.array(small + fit, dtype=NP_DTYPES[key_type])
        qt = to_torch(exact).to(dt).to(cfg.device)
        check_lookup(idx.lookup(qt), ref, exact, what=f"{dt} queries")
        check_lookup(idx.range_lookup(qt, qt), ref, exact, exact, f"{dt} ranges")
        check_matches(idx.lookup_all(qt), ref.point_rows(exact), f"{dt} lookup_all")
    for kt, dt in LOSSY:
        if kt != key_type:
            continue
        qt = torch.zeros(4, dtype=dt, device=cfg.device)
        for call in (lambda: idx.lookup(qt), lambda: idx.range_lookup(qt, qt), lambda: idx.lookup_all(qt),
                     lambda: idx.range_count(qt, qt)):
            with pytest.raises(TypeError) as e:
                call()
            msg = str(e.value)
            key_dtype = "int64" if key_type == "uint64" else key_type
            assert str(dt).removeprefix("torch.") in msg and key_dtype in msg, msg
    _expect_same(idx, ref, cfg, key_type)


def _fits(x, dt: torch.dtype) -> bool:
    """Whether the value converts to ``dt`` exactly."""
    if dt.is_floating_point:
        return bool(np.isfinite(x)) and float(torch.tensor(float(x), dtype=torch.float64).to(dt)) == float(x) \
            or bool(np.isinf(x))
    info = torch.iinfo(dt)
    return float(x) == int(x) and info.min <= int(x) <= info.max if np.isfinite(float(x)) else False


@pytest.mark.parametrize("cfg,key_type", cases("bad_queries", key_types=("int64", "float32")))
def test_bad_queries(cfg, key_type):
    idx, ref = build(cfg, key_type)
    q = on(cfg, ref.keys[:8])
    bad = [
        ("2-D", lambda: idx.lookup(q.reshape(2, 4))),
        ("0-d", lambda: idx.lookup(q[0])),
        ("non-contiguous", lambda: idx.lookup(q[::2])),
        ("non-contiguous range", lambda: idx.range_lookup(q[::2], q[::2])),
        ("lo/hi lengths", lambda: idx.range_lookup(q, q[:3])),
        ("lo/hi lengths range", lambda: idx.range(q, q[:3])),
        ("meta device", lambda: idx.lookup(torch.empty(4, dtype=q.dtype, device="meta"))),
        ("not a tensor", lambda: idx.lookup(ref.keys[:4].tolist())),
        ("negative capacity", lambda: idx.lookup_all_capped(q, -1)),
        ("float capacity", lambda: idx.lookup_all_capped(q, 1.5)),
        ("values length", lambda: idx.aggregate(q, torch.zeros(3, dtype=torch.int64, device=cfg.device))),
        ("values dtype", lambda: idx.aggregate(q, torch.zeros(len(ref), dtype=torch.bool, device=cfg.device))),
        ("values 2-D", lambda: idx.aggregate(q, torch.zeros(len(ref), 1, dtype=torch.int64, device=cfg.device))),
    ]
    if CUDA:
        other = "cpu" if cfg.device == "cuda" else "cuda"
        if cfg.cls is not ChunkedIndex:  # ChunkedIndex takes queries on the CPU or on a CUDA device, either way
            bad.append(("other device", lambda: idx.lookup(q.to(other))))
    for what, call in bad:
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        assert str(e.value), what
    _expect_same(idx, ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", cases("bad_updates", key_types=("int64", "float64"),
                                               only=lambda c: c.updatable))
def test_bad_updates(cfg, key_type):
    """A refused batch leaves the index exactly as it was (all-or-nothing)."""
    idx, ref = build(cfg, key_type, n=80)
    k = on(cfg, ref.keys[:4])
    wrong = torch.float64 if key_type == "int64" else torch.int64
    bad = [
        ("insert dtype", TypeError, lambda: idx.update(insert_keys=torch.zeros(3, dtype=wrong, device=cfg.device))),
        ("delete dtype", TypeError, lambda: idx.update(delete_keys=torch.zeros(3, dtype=wrong, device=cfg.device))),
        ("insert rows length", ValueError, lambda: idx.update(insert_keys=k, insert_rows=torch.arange(3, device=cfg.device) + 1000)),
        ("negative rows", ValueError, lambda: idx.update(insert_keys=k, insert_rows=torch.arange(4, device=cfg.device) - 10)),
        ("delete rows length", ValueError, lambda: idx.update(delete_keys=k, delete_rows=torch.arange(2, device=cfg.device))),
        ("2-D keys", ValueError, lambda: idx.update(insert_keys=k.reshape(2, 2))),
        ("valid inserts, bad deletes", TypeError,
         lambda: idx.update(insert_keys=k, delete_keys=torch.zeros(3, dtype=wrong, device=cfg.device))),
    ]
    for what, exc, call in bad:
        with pytest.raises(exc):
            call()
        _expect_same(idx, ref, cfg, key_type)
    # ... and the index still takes a good batch, numbering its rows as if nothing had happened.
    _apply(idx, ref, cfg, {"insert_keys": ref.keys[:3], "delete_keys": ref.keys[5:6]})
    _expect_same(idx, ref, cfg, key_type)


@pytest.mark.parametrize("cfg,key_type", cases("row_bound", key_types=("int64",), only=lambda c: c.updatable))
def test_row_bound(cfg, key_type):
    """An explicit row ID past what the index can hold (32 bits in cgRX nodes, less than 2^48 in chunks) is
    refused, the index unchanged."""
    idx, ref = build(cfg, key_type, n=40)
    k = on(cfg, ref.keys[:2])
    for row in (2**62, 2**63 - 1):
        with pytest.raises(ValueError):
            idx.update(insert_keys=k, insert_rows=torch.tensor([5000, row], device=cfg.device))
        _expect_same(idx, ref, cfg, key_type)
    # ... and the next fresh row IDs follow the index's own, not the refused ones.
    _apply(idx, ref, cfg, {"insert_keys": ref.keys[:3]})
    _expect_same(idx, ref, cfg, key_type)


# ------------------------------------------------------------------------------ forms that cannot exist


@pytest.mark.skipif(not CUDA, reason="CUDA-graph capture needs CUDA")
@pytest.mark.parametrize("cls_name", [pytest.param(c, marks=gap(c, "cuda_graph_capture"))
                                      for c, f in NOT_IMPLEMENTED if f == "cuda_graph_capture"])
def test_not_implemented_capture(cls_name):
    cfg = next(c for c in CONFIGS if c.cls_name == cls_name and c.device == "cuda"
               and (cls_name != "CgRXIndex" or "optix" in c.id))
    idx, ref = build(cfg, "int64")
    q = on(cfg, ref.keys[:16])
    idx.lookup(q)  # warm up outside the capture
    g = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError):
        with torch.cuda.graph(g):
            idx.lookup(q)
    torch.cuda.synchronize()
    check_answers(idx, ref, cfg, "int64")
