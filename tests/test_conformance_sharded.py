"""The conformance suite for ShardedIndex: the checks of tests/test_conformance.py run on every rank of a
process group (tests/dist_harness.py: one pool of processes per world size, each check its own test case), for
each local index kind (default cgRX shards, updatable shards, chunked shards), over gloo with 2 and 3 ranks on
the CPU, and over NCCL on CUDA machines (one rank per GPU).

Every rank generates every rank's keys from one seed, so each compares its own answers (global row IDs) with
the reference over the concatenation of all ranks' keys. The comparisons record failures and raise them at the
end, so that a wrong answer on one rank never leaves the others waiting in a collective; only the package's own
exceptions (raised on every rank alike by its collective checks) stop a rank early. The tables of exceptions
(NOT_IMPLEMENTED, KNOWN_GAPS) are test_conformance.py's.
"""

from __future__ import annotations

import copy
import functools
import io
import pickle

import numpy as np
import pytest
import torch

from conformance_cases import (
    check_aggregate, check_capped, check_lookup, check_matches, make_keys, point_queries, range_queries, to_torch,
    update_batches, values_for, arr,
)
from dist_harness import available, run_on_ranks
from reference import Multiset
from test_conformance import KNOWN_GAPS, NOT_IMPLEMENTED

CUDA = torch.cuda.is_available()
NGPU = torch.cuda.device_count() if CUDA else 0

# (backend, world, device): gloo on the CPU with 2 and 3 ranks; NCCL with one rank per GPU where there are GPUs.
GROUPS = [("gloo", 2, "cpu"), ("gloo", 3, "cpu")]
if NGPU >= 1:
    GROUPS.append(("nccl", 1, "cuda"))
if NGPU >= 2:
    GROUPS.append(("nccl", 2, "cuda"))
# Checks of the API's shape (not of answers that depend on the number of ranks) run on the smallest group of
# each backend only: the suite's time budget.
API_GROUPS = [g for g in GROUPS if g[:2] != ("gloo", 3)]
KINDS = ("default", "updatable", "chunked")
UPDATABLE_KINDS = ("updatable", "chunked")

pytestmark = pytest.mark.skipif(not available(2)[0], reason=available(2)[1])


def _gap(kind: str, check: str) -> list:
    reason = KNOWN_GAPS.get((f"ShardedIndex/{kind}", check)) or KNOWN_GAPS.get(("ShardedIndex", check))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def cases(check: str, kinds=KINDS, key_types=("int64",), groups=None):
    out = []
    for backend, world, device in groups or GROUPS:
        for kind in kinds:
            for kt in key_types:
                out.append(pytest.param(check, backend, world, device, kind, kt, id=f"{check}-{backend}{world}-{kind}-{kt}",
                                        marks=_gap(kind, check)))
    return out


def run(check: str, backend: str, world: int, device: str, *args, timeout: float = 120):
    __tracebackhide__ = True
    return run_on_ranks(world, f"test_conformance_sharded:rank_{check}", device, *args, backend=backend,
                        timeout=timeout)


# ------------------------------------------------------------------------------------------ on every rank


class Soft:
    """Collects a rank's failed comparisons, raised together by :meth:`done` after the last collective."""

    def __init__(self, rank: int):
        self.rank, self.items = rank, []

    def __call__(self, what: str, fn, *args, **kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except AssertionError as e:
            self.items.append(f"rank {self.rank} {what}: {e}")

    def done(self) -> None:
        if self.items:
            raise AssertionError("\n".join(self.items))


SIZES = (70, 45, 0, 20)  # keys per rank (rank 2 of three holds none)
N_QUERIES = (40, 25, 0, 13)  # queries per rank (rank 2 asks nothing)


def _factory(kind: str, device: str):
    from torch_rtindex import ChunkedIndex

    if kind != "chunked":
        return None
    opts = dict(chunk_bytes=1024, device=device, progress=False)
    opts.update(processors="cpu") if device == "cpu" else opts.update(gpu_budget=64 << 10)
    return functools.partial(ChunkedIndex, **opts)


def _build(info, kind: str, key_type: str, seed: int, *, parts=None):
    from torch_rtindex.distributed import ShardedIndex

    if parts is None:
        parts = [make_keys(key_type, SIZES[r % len(SIZES)], seed * 100 + r) for r in range(info.world)]
    ref = Multiset(np.concatenate(parts), key_type)
    idx = ShardedIndex(to_torch(parts[info.rank]).to(info.device), key_type=key_type, group=info.group,
                       sample_size=32, updatable=kind != "default", index_factory=_factory(kind, str(info.device)))
    offset = sum(len(p) for p in parts[: info.rank])
    contributed = list(range(offset, offset + len(parts[info.rank])))
    return idx, ref, contributed


def _queries(info, ref: Multiset, key_type: str, seed: int):
    n = N_QUERIES[info.rank % len(N_QUERIES)]
    s = seed * 10 + info.rank
    q = point_queries(ref.keys, key_type, n, s)[: max(n, 0)] if n else ref.keys[:0]
    lo, hi = range_queries(ref.keys, key_type, n, s) if n else (ref.keys[:0], ref.keys[:0])
    return q, lo, hi


def _on(info, a: np.ndarray) -> torch.Tensor:
    return to_torch(a).to(info.device)


def _answers(info, idx, ref: Multiset, key_type: str, soft: Soft, seed: int = 1, what: str = "") -> None:
    """len, lookup, range_lookup, range_count, lookup_all and range against the reference (collective)."""
    q, lo, hi = _queries(info, ref, key_type, seed)
    n = len(idx)
    lk = idx.lookup(_on(info, q))
    rl = idx.range_lookup(_on(info, lo), _on(info, hi))
    rc = idx.range_count(_on(info, lo), _on(info, hi))
    la = idx.lookup_all(_on(info, q))
    rg = idx.range(_on(info, lo), _on(info, hi))
    soft(f"{what} len", lambda: (_ for _ in ()).throw(AssertionError(f"{n} != {len(ref)}")) if n != len(ref) else None)
    soft(f"{what} lookup", check_lookup, lk, ref, q)
    soft(f"{what} range_lookup", check_lookup, rl, ref, lo, hi, "range_lookup")
    soft(f"{what} range_count", np.testing.assert_array_equal, arr(rc), [len(r) for r in ref.range_rows(lo, hi, "row")])
    soft(f"{what} lookup_all", check_matches, la, ref.point_rows(q), "lookup_all")
    soft(f"{what} range", check_matches, rg, ref.range_rows(lo, hi, "key"), "range")


def rank_protocol(info, device, kind, key_type):
    from torch_rtindex import Index, UpdatableIndex

    idx, _, _ = _build(info, kind, key_type, 0)
    assert isinstance(idx, Index)
    if kind != "default":
        assert isinstance(idx, UpdatableIndex)
    assert idx.key_type == key_type and idx.device == info.device


def rank_lookups(info, device, kind, key_type):
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, key_type, 0)
    _answers(info, idx, ref, key_type, soft, 0)
    soft.done()


def rank_lookup_rows(info, device, kind, key_type):
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, key_type, 0)
    q, _, _ = _queries(info, ref, key_type, 3)
    first, count = Multiset.first_count(ref.point_rows(q))
    got, got7 = idx.lookup_rows(_on(info, q)), idx.lookup_rows(_on(info, q), miss_row=7)
    soft("lookup_rows", np.testing.assert_array_equal, arr(got), np.where(count > 0, first, -1))
    soft("lookup_rows miss_row", np.testing.assert_array_equal, arr(got7), np.where(count > 0, first, 7))
    soft.done()


def rank_capped(info, device, kind, key_type):
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, key_type, 0)
    q, lo, hi = _queries(info, ref, key_type, 4)
    # The capacity is one for the whole call (every rank passes the same): chosen from every rank's totals (each
    # rank knows every rank's queries) so that it is exact for one, cuts another's answer, or fits nothing.
    queries = [_queries(type(info)(r, info.world, None, info.device, info.backend), ref, key_type, 4)
               for r in range(info.world)]
    for what, call, rows_of in (
        ("lookup_all_capped", lambda c: idx.lookup_all_capped(_on(info, q), c), lambda qs: ref.point_rows(qs[0])),
        ("range_capped", lambda c: idx.range_capped(_on(info, lo), _on(info, hi), c),
         lambda qs: ref.range_rows(qs[1], qs[2], "key")),
    ):
        rows = rows_of(queries[info.rank])
        totals = [sum(len(r) for r in rows_of(qs)) for qs in queries]
        for cap in sorted({max(totals), max(totals) + 5, max(totals) // 2, min(totals), 0}):
            got = call(cap)
            soft(f"{what} capacity {cap} of {totals}", check_capped, got, rows, cap, True, what)
    soft.done()


def rank_aggregate(info, device, kind, key_type):
    soft = Soft(info.rank)
    idx, ref, contributed = _build(info, kind, key_type, 0)
    q, lo, hi = _queries(info, ref, key_type, 5)
    for vk in ("int64", "float64", "int32"):
        v = values_for(len(ref), vk, 6)
        mine = torch.from_numpy(v[contributed]).to(info.device)  # each rank passes the values of its rows
        a = idx.aggregate(_on(info, q), mine)
        ra = idx.range_aggregate(_on(info, lo), _on(info, hi), mine)
        soft(f"aggregate {vk}", check_aggregate, a, ref.point_rows(q), v, "aggregate")
        soft(f"range_aggregate {vk}", check_aggregate, ra, ref.range_rows(lo, hi, "row"), v, "range_aggregate")
    soft.done()


def rank_memory(info, device, kind, key_type):
    idx, _, _ = _build(info, kind, key_type, 0)
    mem = idx.memory()
    assert isinstance(mem, dict) and mem
    assert all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in mem.items()), mem


def rank_capturable(info, device, kind, key_type):
    idx, _, _ = _build(info, kind, key_type, 0)
    assert type(idx.capturable) is bool


def rank_state_dict(info, device, kind, key_type):
    from torch_rtindex.distributed import ShardedIndex

    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, key_type, 0)
    state = idx.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    for s in (state, torch.load(buf)):
        _answers(info, ShardedIndex.from_state_dict(s, group=info.group), ref, key_type, soft, what="from_state_dict")
    other, _, _ = _build(info, kind, key_type, 5)
    other.load_state_dict(state)
    _answers(info, other, ref, key_type, soft, what="load_state_dict")
    gathered = idx.gathered_state_dict()
    again = ShardedIndex.from_gathered_state(gathered, group=info.group, device=info.device,
                                             updatable=kind != "default", index_factory=_factory(kind, str(info.device)))
    _answers(info, again, ref, key_type, soft, what="from_gathered_state")
    soft.done()


def rank_pickle(info, device, kind, key_type):
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, key_type, 0)
    _answers(info, pickle.loads(pickle.dumps(idx)), ref, key_type, soft, what="pickle")
    _answers(info, copy.deepcopy(idx), ref, key_type, soft, what="deepcopy")
    buf = io.BytesIO()
    torch.save(idx, buf)
    buf.seek(0)
    _answers(info, torch.load(buf), ref, key_type, soft, what="torch.save")
    soft.done()


def rank_not_implemented(info, device, kind, key_type):
    idx, _, _ = _build(info, kind, key_type, 0)
    for form in ("to", "cpu", "cuda"):
        alternative = NOT_IMPLEMENTED[("ShardedIndex", form)]
        call = {"to": lambda: idx.to("cpu"), "cpu": lambda: idx.cpu(), "cuda": lambda: idx.cuda()}[form]
        try:
            call()
        except NotImplementedError as e:
            assert alternative.split(" / ")[0] in str(e), f"{form}: {e}"
        else:
            raise AssertionError(f"ShardedIndex.{form} did not raise NotImplementedError")


def _split_batch(batch: dict, world: int, rank: int) -> dict:
    """Rank ``rank``'s part of a global batch: a contiguous slice of the insertions (fresh rows are numbered
    rank by rank, so the global batch is the ranks' parts in rank order) and every world-th deletion."""
    out = {}
    if "insert_keys" in batch:
        cut = np.array_split(np.arange(len(batch["insert_keys"])), world)[rank]
        out["insert_keys"] = batch["insert_keys"][cut]
        if batch.get("insert_rows") is not None:
            out["insert_rows"] = batch["insert_rows"][cut]
    if "delete_keys" in batch:
        out["delete_keys"] = batch["delete_keys"][rank::world]
        if batch.get("delete_rows") is not None:
            out["delete_rows"] = batch["delete_rows"][rank::world]
    return out


def _updates(info, kind, key_type, seed, soft, *, explicit_rows: bool, cancel_rows: bool, batches: int = 7):
    idx, ref, contributed = _build(info, kind, key_type, seed)
    for i, batch in enumerate(update_batches(ref, key_type, seed=200 + seed, batches=batches,
                                             explicit_rows=explicit_rows, cancel_rows=cancel_rows,
                                             ascending_rows=True)):
        mine = _split_batch(batch, info.world, info.rank)
        args = {k: (_on(info, v) if k.endswith("keys") else torch.from_numpy(v).to(info.device))
                for k, v in mine.items() if v is not None}
        if "delete_rows" in batch and "delete_keys" in args and "delete_rows" not in args:
            args["delete_rows"] = torch.zeros(0, dtype=torch.int64, device=info.device)
        want = ref.update(**{k: v for k, v in batch.items()})
        got = idx.update(**args)
        n_mine = len(mine.get("insert_keys", ()))
        before = sum(len(c) for c in np.array_split(np.arange(len(batch.get("insert_keys", ()))), info.world)[: info.rank])
        soft(f"batch {i} counts", lambda: _eq((got.inserted, got.deleted, got.absent), want[:3]))
        soft(f"batch {i} rows", np.testing.assert_array_equal, arr(got.rows), want[3][before: before + n_mine])
        contributed += arr(got.rows).tolist()
        _answers(info, idx, ref, key_type, soft, seed=i, what=f"after batch {i}")
        v = values_for(ref.next_row, "int64", i)
        q, _, _ = _queries(info, ref, key_type, i)
        a = idx.aggregate(_on(info, q), torch.from_numpy(v[contributed]).to(info.device))
        soft(f"aggregate after batch {i}", check_aggregate, a, ref.point_rows(q), v, "aggregate")
    return idx, ref


def _eq(got, want):
    assert tuple(got) == tuple(want), f"got {got}, want {want}"


def rank_updates(info, device, kind, key_type):
    soft = Soft(info.rank)
    _updates(info, kind, key_type, 0 if key_type == "int64" else 1, soft, explicit_rows=False, cancel_rows=False)
    soft.done()


def rank_same_batch_delete(info, device, kind, key_type):
    """Issue 41's case: rank 0 inserts 40 and deletes (40, the row the batch gives it) in one batch; then random
    batches with such cancellations, the pair inserted by one rank and deleted by another included."""
    soft = Soft(info.rank)
    # Keys 10, 20, 30 over the ranks (rank 0 holding 10 and 20), so the batch's new pair gets global row 3 always.
    parts = [np.array([10, 20]), np.array([30])] if info.world > 1 else [np.array([10, 20, 30])]
    parts += [np.zeros(0, dtype=np.int64)] * (info.world - len(parts))
    parts = [p.astype(np.int64) for p in parts]
    idx, ref, _ = _build(info, kind, "int64", 0, parts=parts)
    if info.rank == 0:
        d = info.device
        got = idx.update(insert_keys=torch.tensor([40], device=d), delete_keys=torch.tensor([40], device=d),
                         delete_rows=torch.tensor([3], device=d))
    else:
        empty = torch.zeros(0, dtype=torch.int64, device=info.device)
        got = idx.update(delete_keys=empty, delete_rows=empty)
    soft("issue 41 counts", lambda: _eq(got[:3], (1, 1, 0)))
    soft("issue 41 lookup", lambda: _eq(arr(idx.lookup(torch.tensor([40], device=info.device)).count).tolist(), [0]))
    _updates(info, kind, key_type, 3, soft, explicit_rows=False, cancel_rows=True)
    soft.done()


def rank_insert_rows(info, device, kind, key_type):
    soft = Soft(info.rank)
    _updates(info, kind, key_type, 4, soft, explicit_rows=True, cancel_rows=False)
    idx, ref, _ = _build(info, kind, key_type, 1)
    k = make_keys(key_type, 4, 60 + info.rank)
    rows = np.arange(1000 + 10 * info.rank, 1004 + 10 * info.rank, dtype=np.int64)
    got = idx.insert(_on(info, k), torch.from_numpy(rows).to(info.device))  # insert(keys, rows) everywhere
    soft("insert rows", np.testing.assert_array_equal, arr(got.rows), rows)
    got = idx.update(_on(info, k[:1]), torch.from_numpy(rows[:1] + 100).to(info.device))  # positional order
    soft("update positional insert_rows", np.testing.assert_array_equal, arr(got.rows), rows[:1] + 100)
    soft.done()


def rank_dtype_policy(info, device, kind, key_type):
    """Lossless conversions answered as the converted batch; a lossy batch on one rank refused on every rank
    (naming both dtypes), the index unchanged."""
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, "int64", 0)
    fit = np.array([x for x in ref.keys if -(2**31) <= int(x) < 2**31] + [0, 1, -1], dtype=np.int64)
    got = idx.lookup(torch.from_numpy(fit).to(torch.int32).to(info.device))
    soft("int32 queries", check_lookup, got, ref, fit)
    for bad_rank in range(info.world):
        q = torch.zeros(3, dtype=torch.float64 if info.rank == bad_rank else torch.int64, device=info.device)
        try:
            idx.lookup(q)
        except (TypeError, RuntimeError) as e:
            if info.rank == bad_rank:
                soft("float64 queries message", lambda: _eq(("float64" in str(e), "int64" in str(e)), (True, True)))
        else:
            soft(f"float64 queries on rank {bad_rank}", lambda: _eq("raised", "nothing raised"))
    _answers(info, idx, ref, "int64", soft, what="after refusals")
    soft.done()


def rank_bad_input(info, device, kind, key_type):
    """Bad input on one rank: every rank raises, nothing changes, the index answers as before."""
    soft = Soft(info.rank)
    idx, ref, _ = _build(info, kind, "int64", 0)
    good = torch.tensor([1, 2, 3, 4], dtype=torch.int64, device=info.device)
    bads = [
        ("2-D", lambda q: idx.lookup(q), lambda: good.reshape(2, 2)),
        ("non-contiguous", lambda q: idx.lookup(q), lambda: good[::2]),
        ("lo/hi lengths", lambda q: idx.range_lookup(good, q), lambda: good[:3]),
        ("negative capacity", lambda c: idx.lookup_all_capped(good, c), lambda: -1),
    ]
    if kind != "default":
        bads.append(("insert dtype", lambda k: idx.update(insert_keys=k),
                     lambda: torch.zeros(2, dtype=torch.float64, device=info.device)))
    for what, call, make_bad in bads:
        for bad_rank in range(info.world):
            arg = make_bad() if info.rank == bad_rank else (
                good if what not in ("negative capacity", "insert dtype") else
                4 if what == "negative capacity" else good)
            try:
                call(arg)
            except (TypeError, ValueError, RuntimeError):
                pass
            else:
                soft(f"{what} on rank {bad_rank}", lambda: _eq("raised", "nothing raised"))
    _answers(info, idx, ref, "int64", soft, what="after refusals")
    soft.done()


# ------------------------------------------------------------------------------------------ the test cases

CASES = (
    cases("protocol", groups=API_GROUPS)
    + cases("lookups", kinds=("default",), key_types=("int64", "int32", "uint64", "float32", "float64"),
            groups=API_GROUPS)
    + cases("lookups", kinds=("default",), key_types=("int64", "float32"),
            groups=[g for g in GROUPS if g not in API_GROUPS])
    + cases("lookups", kinds=UPDATABLE_KINDS)
    + cases("lookup_rows")
    + cases("capped") + cases("capped", kinds=("default",), key_types=("uint64",), groups=API_GROUPS)
    + cases("aggregate", key_types=("float32",))
    + cases("memory", groups=API_GROUPS)
    + cases("capturable", groups=API_GROUPS)
    + cases("state_dict", key_types=("uint64",))
    + cases("pickle", groups=API_GROUPS)
    + cases("not_implemented", groups=API_GROUPS)
    + cases("updates", kinds=UPDATABLE_KINDS)
    + cases("updates", kinds=UPDATABLE_KINDS, key_types=("float64",), groups=API_GROUPS)
    + cases("same_batch_delete", kinds=UPDATABLE_KINDS)
    + cases("insert_rows", kinds=UPDATABLE_KINDS)
    + cases("dtype_policy", groups=API_GROUPS)
    + cases("bad_input", groups=API_GROUPS)
)


@pytest.mark.parametrize("check,backend,world,device,kind,key_type", CASES)
def test_conformance(check, backend, world, device, kind, key_type):
    """rank_<check> on every rank of a group: a test case per check, group, local index kind and key type, so that
    one failure hides no other."""
    run(check, backend, world, device, kind, key_type)
