"""What every rank of the sharded-index tests runs (tests/test_sharded.py calls the entries below through
tests/dist_harness.py, one pytest case each).

Every rank generates every rank's keys from one seed, so each can compute the answers of an independent
reference (tests/reference.py: numpy over the concatenated original keys) for its own queries. Checks record
failures instead of raising, so that every rank makes the same collective calls to the end; the failures are
raised at the end, naming the rank. With RTINDEX_WORKER_TRACE=1 every rank prints each error check before it
runs it and what it raised (to stderr, flushed), so that a rank that stops in a collective shows where.
"""

from __future__ import annotations

import collections
import functools
import io
import os
import sys
import traceback

import numpy as np
import torch
from keysets import I64_MAX, I64_MIN, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference

from torch_rtindex import CgRXIndex, ChunkedIndex, IdToRow
from torch_rtindex.distributed import PointRouting, ShardedIndex, ShardedIndexError
from torch_rtindex.distributed.points import own_in_place


def routing(world: int) -> PointRouting:
    """The point routing of the checks: chunks of any size (the test batches are small: pipelined calls split
    them anyway); the own queries in place (a GPU's choice at two ranks) also on gloo in groups of two, so that
    the 2-rank groups check that path, the larger ones the own pieces and the exchange."""
    return PointRouting(min_chunk_queries=1, own_queries="in_place" if world <= 2 else "routed")


class Checker:
    def __init__(self, rank: int):
        self.rank, self.failures, self.scope = rank, [], ""

    def ok(self, cond: bool, what: str) -> None:
        if not cond:
            self.failures.append(f"rank {self.rank} [{self.scope}] {what}")

    def eq(self, got, want, what: str) -> None:
        got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        want = want.cpu().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
        if not (got.shape == want.shape and np.array_equal(got, want)):
            self.ok(False, f"{what}: got {got.reshape(-1)[:8]}.. want {want.reshape(-1)[:8]}..")

    def close(self, got, want, what: str) -> None:
        got, want = got.cpu().numpy(), np.asarray(want)
        if not (got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-6)):
            self.ok(False, f"{what}: got {got.reshape(-1)[:8]} want {want.reshape(-1)[:8]}")

    def raises(self, fn, what: str, must_name: str | None = None) -> None:
        trace = os.environ.get("RTINDEX_WORKER_TRACE") == "1"
        if trace:
            print(f"[rank {self.rank}] {self.scope}: {what}", file=sys.stderr, flush=True)
        try:
            fn()
        except ShardedIndexError as e:
            if trace:  # what was raised: a rank one collective call behind the others shows here
                print(f"[rank {self.rank}]   -> ShardedIndexError: {str(e)[:200]}", file=sys.stderr, flush=True)
            self.ok(must_name is None or must_name in str(e), f"{what}: message {str(e)!r} lacks {must_name!r}")
            return
        except Exception as e:  # noqa: BLE001
            if trace:
                print(f"[rank {self.rank}]   -> {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
            self.failures.append(f"rank {self.rank} [{self.scope}] {what}: raised {type(e).__name__}: {e}")
            return
        self.failures.append(f"rank {self.rank} [{self.scope}] {what}: did not raise")


def split(keys: torch.Tensor, world: int, gen: torch.Generator, sizes: list[int] | None = None) -> list[torch.Tensor]:
    if sizes is None:
        cuts = torch.sort(torch.randint(0, keys.numel() + 1, (world - 1,), generator=gen)).values.tolist()
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [keys.numel()])]
    return list(torch.split(keys, sizes))


def key_sets(world: int, gen: torch.Generator, n: int = 150):
    """(name, key_type, parts, max range width)."""
    N = n * world
    yield "uniform", "int64", split(int64_keys("uniform", N, gen), world, gen), 2**61
    allk = int64_keys("uniform", N, gen)
    yield "all_on_rank0", "int64", [allk] + [allk[:0]] * (world - 1), 2**62
    dense = int64_keys("dense", N, gen)
    if world > 1:
        sizes = [N // (world - 1)] * (world - 2) + [N - N // (world - 1) * (world - 2), 0]
        yield "last_rank_empty", "int64", split(dense, world, gen, sizes), 40
    heavy = torch.cat([torch.full((N // 2,), 5), torch.randint(-20, 20, (N // 2,), generator=gen), torch.tensor([I64_MIN, I64_MAX, -1, 0])])
    yield "duplicates", "int64", split(heavy[torch.randperm(heavy.numel(), generator=gen)], world, gen), 6
    yield "dup_runs", "int64", split(int64_keys("duplicates", N, gen), world, gen), 2**60
    for kt in ("int32", "float32", "float64", "uint64"):
        yield kt, kt, split(keys_of_type(kt, N, gen), world, gen), {"int32": 2**28, "uint64": 2**62}.get(kt, 1e6)


def ref_ranges(ref: Reference, lo, hi, key_type):
    """(first, count, rows in (key, row) order) per range."""
    from reference import to_numpy

    a, b = ref._bounds(to_numpy(lo, key_type), to_numpy(hi, key_type))
    rows = [ref.rows[x:y] for x, y in zip(a, b)]
    first = np.array([r.min() if len(r) else -1 for r in rows], dtype=np.int64)
    return first, (b - a).astype(np.int64), rows


def csr(rows) -> tuple[torch.Tensor, torch.Tensor]:
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    flat = torch.from_numpy(np.concatenate(rows).astype(np.int64)) if rows else torch.zeros(0, dtype=torch.int64)
    return offsets, flat


def check_capped(ck: Checker, capped, full, capacity: int, what: str) -> None:
    offsets, rows, total = (t.cpu() for t in capped)
    f_off, f_rows = full
    ck.eq(offsets, f_off, f"{what} offsets")
    ck.ok(int(total) == f_rows.numel(), f"{what} total {int(total)} != {f_rows.numel()}")
    m = min(capacity, f_rows.numel())
    want = torch.cat([f_rows[:m], torch.full((capacity - m,), -1, dtype=torch.int64)])
    ck.eq(rows, want, f"{what} rows")


def check_key_set(ck: Checker, rank: int, world: int, device, name, key_type, parts, width, gen, group=None) -> None:
    ck.scope = f"{world} ranks, {name}"
    allk = torch.cat(parts)
    mine = parts[rank].to(device)
    kt = key_type if key_type == "uint64" else None
    idx = ShardedIndex(mine, key_type=kt, sample_size=64, group=group, point_routing=routing(world))
    ck.ok(len(idx) == allk.numel(), "len")
    # The default shard (cgRX over aligned pairs where the radix table searches) answers in global rows itself.
    spare = idx.local_index.layout == "aligned_row"
    ck.ok(idx._spare_rows == spare, f"global rows in the shard's spare words: {idx._spare_rows}, want {spare}")
    # Shards: nearly equal wherever the keys allow it (in the duplicate sets one key is a large part of all).
    import torch.distributed as dist

    sizes: list = [None] * world
    dist.all_gather_object(sizes, idx.local_len, group=group)
    ck.ok(sum(sizes) == allk.numel(), f"shard sizes {sizes} do not add up to {allk.numel()}")
    if "dup" not in name:
        ck.ok(max(sizes) <= 1.5 * allk.numel() / world + 8, f"unbalanced shards {sizes}")
    ref = Reference(allk, key_type)
    nq = [50, 0, 77, 13][rank % 4]
    qgen = torch.Generator().manual_seed(1000 * rank + len(name))
    q = point_queries(allk, nq, qgen)
    lo, hi = range_queries(allk, nq, qgen, width)
    qd, lod, hid = q.to(device), lo.to(device), hi.to(device)

    first, count, rows = ref.points(q)
    r = idx.lookup(qd)
    ck.ok(r.first_row.is_contiguous() and r.count.is_contiguous(), "lookup answers not contiguous")
    ck.eq(r.first_row, first, "lookup first_row")
    ck.eq(r.count, count, "lookup count")
    idx.pipeline = 3  # chunks exchanged asynchronously, overlapping the local lookups
    r = idx.lookup(qd)
    ck.eq(r.first_row, first, "pipelined lookup first_row")
    ck.eq(r.count, count, "pipelined lookup count")
    ck.ok(idx.stats()["pipelined"] == 3, "pipelined lookup ran in 3 chunks")  # routing() lowered the threshold
    idx.pipeline = 1
    default = ShardedIndex(mine, key_type=kt, sample_size=64, group=group, pipeline=3)
    r = default.lookup(qd)  # the default threshold: a batch this small is not split, whatever the setting
    ck.ok(default.stats()["pipelined"] == 1, "a small batch ran in one chunk at the default threshold")
    ck.eq(r.first_row, first, "small batch at the default threshold first_row")
    m = idx.lookup_all(qd)
    o, f = csr(rows)
    ck.eq(m.offsets, o, "lookup_all offsets")
    ck.eq(m.rows, f, "lookup_all rows")
    for cap in (0, 5, 10_000):
        check_capped(ck, idx.lookup_all_capped(qd, cap), (o, f), cap, f"lookup_all_capped({cap})")
        fx = idx.lookup_all_capped_fixed(qd, cap, 128)
        ck.ok(not bool(fx.overflowed), "fixed lookup_all_capped overflowed")
        check_capped(ck, fx.answer, (o, f), cap, f"lookup_all_capped({cap}, query_capacity)")
    fx = idx.lookup_fixed(qd, 128)
    ck.ok(not bool(fx.overflowed), "lookup_fixed overflowed")
    ck.eq(fx.answer.first_row, first, "lookup_fixed first_row")
    ck.eq(fx.answer.count, count, "lookup_fixed count")
    fx = idx.lookup_fixed(qd, 1)  # too small: some rank sends two queries to one owner
    ck.ok(bool(fx.overflowed), "lookup_fixed(1) did not overflow")
    kept = fx.answer.count.cpu() >= 0
    ck.eq(fx.answer.first_row.cpu()[kept], first[kept.numpy()], "lookup_fixed(1) kept answers")

    rfirst, rcount, rrows = ref_ranges(ref, lo, hi, key_type)
    r = idx.range_lookup(lod, hid)
    ck.eq(r.first_row, rfirst, "range_lookup first_row")
    ck.eq(r.count, rcount, "range_lookup count")
    ck.eq(idx.range_count(lod, hid), rcount, "range_count")
    m = idx.range(lod, hid)
    o, f = csr(rrows)
    ck.eq(m.offsets, o, "range offsets")
    ck.eq(m.rows, f, "range rows (key, row) order")
    for cap in (0, 7, 100_000):
        check_capped(ck, idx.range_capped(lod, hid, cap), (o, f), cap, f"range_capped({cap})")
        fx = idx.range_capped_fixed(lod, hid, cap, 128)
        ck.ok(not bool(fx.overflowed), "fixed range_capped overflowed")
        check_capped(ck, fx.answer, (o, f), cap, f"range_capped({cap}, query_capacity)")
    fx = idx.range_lookup_fixed(lod, hid, 128)
    ck.eq(fx.answer.first_row, rfirst, "range_lookup_fixed first_row")
    ck.eq(fx.answer.count, rcount, "range_lookup_fixed count")

    for vdtype in ((torch.int64, torch.float32) if len(name) % 2 else (torch.float64, torch.int32)):
        col = (torch.arange(allk.numel(), dtype=torch.float64) * 1.5 - 7).to(vdtype)
        off = sum(p.numel() for p in parts[:rank])
        vals = col[off:off + parts[rank].numel()].to(device)
        for form, (a, b), rws in (("aggregate", (qd, None), rows), ("range_aggregate", (lod, hid), rrows)):
            res = idx.aggregate(a, vals) if b is None else idx.range_aggregate(a, b, vals)
            want = Reference.sums(rws, col)
            ck.eq(res.count, [len(x) for x in rws], f"{form} count {vdtype}")
            ck.close(res.sum, want, f"{form} sum {vdtype}")
            fx = idx.aggregate_fixed(a, vals, 128) if b is None else idx.range_aggregate_fixed(a, b, vals, 128)
            ck.close(fx.answer.sum, want, f"{form}_fixed sum {vdtype}")
            if b is None:
                idx.pipeline = 2
                ck.close(idx.aggregate(a, vals).sum, want, f"pipelined aggregate sum {vdtype}")
                idx.pipeline = 1

    # Shards from a gathered state and from per-rank states answer the same.
    st = idx.gathered_state_dict()
    ck.eq(st["rows"], torch.arange(allk.numel()), "gathered rows")
    again = ShardedIndex.from_gathered_state(st, device=device, group=group, point_routing=routing(world))
    ck.eq(again.range(lod, hid).rows, f, "from_gathered_state range")
    ck.eq(again.lookup(qd).first_row, first, "from_gathered_state lookup")
    ck.ok(again._spare_rows == spare, "from_gathered_state: global rows in the shard")
    buf = io.BytesIO()
    torch.save(idx.state_dict(), buf)
    buf.seek(0)
    loaded = ShardedIndex.from_state_dict(torch.load(buf, weights_only=True), group=group, point_routing=routing(world))
    ck.eq(loaded.lookup(qd).first_row, first, "from_state_dict lookup")
    ck.ok(loaded._spare_rows == spare, "from_state_dict: global rows in the shard")
    other = ShardedIndex(torch.zeros(3, dtype=mine.dtype, device=device), key_type=kt, group=group,
                         point_routing=routing(world))
    other.load_state_dict(idx.state_dict())
    ck.eq(other.lookup_all(qd).rows, csr(rows)[1], "load_state_dict lookup_all")
    ck.eq(other.lookup(qd).first_row, first, "load_state_dict lookup")
    ck.ok(other._spare_rows == spare, "load_state_dict: global rows in the shard")


def check_updates(ck: Checker, rank: int, world: int, device, seed: int, group=None) -> None:
    """Random insert/delete batches against a multiset of (key, global row) pairs that every rank keeps."""
    ck.scope = f"{world} ranks, updates"
    gen = torch.Generator().manual_seed(seed)
    key_space = torch.tensor(sorted({I64_MIN, I64_MAX, 0, -1, *range(-30, 30), *(2**40 + i for i in range(10))}))

    def draw(n):
        return key_space[torch.randint(0, key_space.numel(), (n,), generator=gen)]

    parts = [draw(int(torch.randint(0, 60, (1,), generator=gen))) for _ in range(world)]
    pairs = collections.Counter()
    row = 0
    for p in parts:
        for k in p.tolist():
            pairs[(k, row)] += 1
            row += 1
    idx = ShardedIndex(parts[rank].to(device), updatable=True, sample_size=32, group=group, point_routing=routing(world))
    for step in range(6):
        by_rows = step % 2 == 1
        ins = [draw(int(torch.randint(0, 25, (1,), generator=gen))) for _ in range(world)]
        dels, drows = [], []
        live = sorted(pairs)
        for r in range(world):
            nd = int(torch.randint(0, 6, (1,), generator=gen))
            if by_rows and live:
                pick = [live[i] for i in torch.randint(0, len(live), (nd,), generator=gen).tolist()]
                pick.append((12345, 0))  # absent pair
                dels.append(torch.tensor([k for k, _ in pick], dtype=torch.int64))
                drows.append(torch.tensor([x for _, x in pick], dtype=torch.int64))
            else:
                dels.append(draw(nd))
                drows.append(None)
        # The reference: insert first (fresh rows rank by rank), then delete.
        before = sum(pairs.values())
        new_rows = []
        for r in range(world):
            new_rows.append(torch.arange(row, row + ins[r].numel()))
            for k, x in zip(ins[r].tolist(), new_rows[r].tolist()):
                pairs[(k, x)] += 1
            row += ins[r].numel()
        for r in range(world):
            if by_rows:
                for k, x in set(zip(dels[r].tolist(), drows[r].tolist())):
                    pairs.pop((k, x), None)
            else:
                for k in set(dels[r].tolist()):
                    for pk in [p for p in pairs if p[0] == k]:
                        del pairs[pk]
        res = idx.update(insert_keys=ins[rank].to(device), delete_keys=dels[rank].to(device),
                         delete_rows=drows[rank].to(device) if by_rows else None)
        ck.eq(res.rows, new_rows[rank], f"step {step} inserted rows")
        ck.ok(res.inserted == sum(i.numel() for i in ins), f"step {step} inserted count")
        ck.ok(before + res.inserted - res.deleted == sum(pairs.values()), f"step {step} deleted {res.deleted}")
        ck.ok(len(idx) == sum(pairs.values()), f"step {step} len {len(idx)} != {sum(pairs.values())}")
        # Every key of the key space, from this rank's part of it: every (key, row) pair, as the multiset.
        qs = key_space[rank::world].contiguous()
        m = idx.lookup_all(qs.to(device))
        got = collections.Counter()
        offs, rws = m.offsets.cpu().tolist(), m.rows.cpu().tolist()
        for i, k in enumerate(qs.tolist()):
            for x in rws[offs[i]:offs[i + 1]]:
                got[(k, x)] += 1
        want = collections.Counter({p: c for p, c in pairs.items() if p[0] in set(qs.tolist())})
        ck.ok(got == want, f"step {step} pairs differ: {sorted((got - want).items())[:4]} / {sorted((want - got).items())[:4]}")
    # Aggregates over the updated index: values of each rank's contributed rows (build keys, then insertions).
    contributed = idx.num_contributed()
    vals = torch.ones(contributed, dtype=torch.int64, device=device)
    qs = key_space[rank::world].contiguous().to(device)
    agg = idx.aggregate(qs, vals)
    ck.eq(agg.sum, idx.lookup(qs).count, "aggregate of ones = count after updates")
    # The per-rank state of an updated index loads back.
    back = ShardedIndex.from_state_dict(idx.state_dict(), group=group)
    ck.eq(back.lookup_all(qs).rows, idx.lookup_all(qs).rows, "updated state round trip")
    st = idx.gathered_state_dict()
    again = ShardedIndex.from_gathered_state(st, device=device, updatable=True, group=group)
    ck.eq(again.lookup_all(qs).rows, idx.lookup_all(qs).rows, "updated gathered state")


def check_errors(ck: Checker, rank: int, world: int, device, group=None) -> None:
    """Bad input on one rank only: every rank raises, naming that rank; the index still answers afterwards."""
    ck.scope = f"{world} ranks, errors"
    keys = torch.arange(rank * 100, rank * 100 + 100, dtype=torch.int64, device=device)
    idx = ShardedIndex(keys, group=group, point_routing=routing(world))
    q = torch.arange(0, 100 * world, 7, device=device)
    want = idx.lookup(q)
    bad = world - 1
    ck.raises(lambda: idx.lookup(q.to(torch.float64) if rank == bad else q), "wrong query dtype", f"rank {bad}")
    # A lossless dtype (int32 queries on an int64 index) is converted, on some ranks and not others alike.
    got = idx.lookup(q.to(torch.int32) if rank == bad else q)
    ck.eq(got.first_row, want.first_row, "int32 queries on one rank")
    ck.raises(lambda: idx.lookup(q.reshape(1, -1) if rank == bad else q), "2-D queries", f"rank {bad}")
    ck.raises(lambda: idx.range(q, q[:-1] if rank == bad else q), "lo/hi lengths", "same length")
    vals = torch.ones(100, device=device)
    ck.raises(lambda: idx.aggregate(q, vals[:5] if rank == bad else vals), "short value column", "contributed")
    ck.raises(lambda: idx.aggregate(q, vals.double() if rank == bad else vals), "value dtypes differ", "value dtype")
    ck.raises(lambda: idx.lookup_fixed(q, 64 + (rank == bad)), "query_capacity differs", "query_capacity")
    ck.raises(lambda: idx.lookup_all_capped(q, -1 if rank == bad else 4), "negative capacity", "capacity")
    ck.raises(lambda: idx.insert(q), "update without updatable", "updatable")
    idx.pipeline = 2 if rank == bad else 1
    ck.raises(lambda: idx.lookup(q), "pipeline differs", "pipeline")
    idx.pipeline = 1
    ck.raises(lambda: idx.lookup(q) if rank == bad else idx.range(q, q), "mismatched calls", "different collective calls")
    # Builds: another key type on one rank, NaN keys on one rank.
    ck.raises(lambda: ShardedIndex(keys.to(torch.int32) if rank == bad else keys, group=group), "key dtypes differ", "key")
    fk = torch.tensor([1.0, float("nan")] if rank == bad else [2.0], device=device)
    ck.raises(lambda: ShardedIndex(fk, group=group), "NaN keys", "NaN")
    ck.raises(lambda: ShardedIndex(keys, key_type="uint64" if rank == bad else None, group=group), "key types differ", "key type")
    ck.raises(lambda: ShardedIndex.from_state_dict({"format": "x"} if rank == bad else idx.state_dict(), group=group), "bad state", f"rank {bad}")
    # A local lookup failing after the exchange (an out-of-memory, simulated): the failing rank and every rank
    # with queries it owns raise (here all: q covers every shard); nobody hangs.
    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    for form, call in (("lookup", lambda: idx.lookup(q)), ("range", lambda: idx.range(q, q + 3)),
                       ("range_capped", lambda: idx.range_capped(q, q + 3, 5))):
        # A shard answering in global rows looks points up through _spare_lookup, and its own queries in place
        # through _point_call_as where it has no spare rows: all fail.
        names = {"lookup": ("lookup", "_spare_lookup", "_point_call_as"), "range": ("range",),
                 "range_capped": ("range_capped",)}[form]
        if rank == bad:
            for name in names:
                setattr(idx._local, name, oom)
        ck.raises(call, f"{form}: local out of memory on one rank", "rank")
        if rank == bad:
            for name in names:
                delattr(idx._local, name)
    idx.pipeline = 2
    names = ("lookup", "_spare_lookup", "_point_call_as")
    if rank == bad:
        for name in names:
            setattr(idx._local, name, oom)
    ck.raises(lambda: idx.lookup(q), "pipelined lookup: local out of memory on one rank", "rank")
    if rank == bad:
        for name in names:
            delattr(idx._local, name)
    idx.pipeline = 1
    if own_in_place(idx):  # only the pass over a rank's own queries fails: that rank raises, the others answer
        for pipeline in (1, 2):
            idx.pipeline = pipeline
            if rank == bad:  # the in-place pass calls these with the caller's key type, the exchange's lookup not
                idx._local._point_call_as = oom
                idx._local._spare_lookup = lambda lo, hi=None, key_type=None, f=idx._local._spare_lookup: (
                    oom() if key_type is not None else f(lo, hi))
            try:
                got = idx.lookup(q)
                ck.ok(rank != bad, f"own pass failing (pipeline {pipeline}): the failing rank raised")
                ck.eq(got.first_row, want.first_row, f"own pass failing elsewhere (pipeline {pipeline}): answers")
            except ShardedIndexError as e:
                ck.ok(rank == bad and f"rank {bad}" in str(e), f"own pass failing (pipeline {pipeline}): {e}")
            if rank == bad:
                del idx._local._point_call_as, idx._local._spare_lookup
        idx.pipeline = 1
    after = idx.lookup(q)
    ck.eq(after.first_row, want.first_row, "index still answers after the errors")
    upd = ShardedIndex(keys, updatable=True, group=group, point_routing=routing(world))
    ck.raises(lambda: upd.insert(torch.tensor([1.5], device=device) if rank == bad else keys[:3]), "bad insert dtype", "dtype")
    ck.ok(len(upd) == 100 * world, "failed update changed nothing")
    ck.eq(upd.lookup(q).first_row, want.first_row, "updatable index unchanged after a failed update")
    # Applying fails on one rank only (an out-of-memory, simulated) after the others applied their part: they
    # undo it, every rank raises, and the index answers as before, by key and by row, and takes updates again.
    before, before_all = upd.lookup(q), upd.lookup_all(q)
    n_before = len(upd)
    if rank == bad:
        upd._local.update = oom
    ck.raises(lambda: upd.update(insert_keys=keys[:7] + 1000 * world, delete_keys=keys[10:14]),
              "apply fails on one rank (by key)", "rank")
    ck.raises(lambda: upd.update(insert_keys=keys[:3], delete_keys=keys[20:23],
                                 delete_rows=torch.arange(20, 23, device=device) + 100 * rank),
              "apply fails on one rank (by row)", "rank")
    if rank == bad:
        del upd._local.update
    ck.ok(len(upd) == n_before, f"length unchanged after an update undone: {len(upd)} vs {n_before}")
    after, after_all = upd.lookup(q), upd.lookup_all(q)
    ck.eq(after.first_row, before.first_row, "undone update: first rows")
    ck.eq(after.count, before.count, "undone update: counts")
    ck.eq(after_all.rows, before_all.rows, "undone update: every row")
    res = upd.update(insert_keys=keys[:2] + 1000 * world, delete_keys=keys[30:31])
    ck.ok(res.inserted == 2 * world and res.deleted == world, f"an update after the undone one: {res}")
    ck.ok(len(upd) == n_before + world, "length after the update that followed")


def check_fixed_has_no_host_sync(ck: Checker, rank: int, world: int, device, group=None) -> None:
    """The fixed-capacity path (check=False) never turns a tensor into a Python number: any .item(), int(),
    bool() or data-dependent shape would dispatch aten._local_scalar_dense or nonzero; .tolist() (which
    bypasses the dispatcher) is watched by a wrapper."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ck.scope = f"{world} ranks, no host sync"
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if any(s in name for s in ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item")):
                seen.append(name)
            return func(*args, **(kwargs or {}))

    keys = torch.randint(-1000, 1000, (200,), generator=torch.Generator().manual_seed(rank)).to(device)
    idx = ShardedIndex(keys, group=group)
    q = torch.randint(-1100, 1100, (64,), generator=torch.Generator().manual_seed(9 + rank)).to(device)
    want = idx.lookup(q)
    wantr = idx.range_capped(q, q + 30, 500)
    vals = torch.ones(200, dtype=torch.float64, device=device)
    wanta = idx.range_aggregate(q, q + 30, vals)
    tolist = torch.Tensor.tolist

    def watched(self, *args, **kwargs):
        seen.append("Tensor.tolist")
        return tolist(self, *args, **kwargs)

    torch.Tensor.tolist = watched
    try:
        with Spy():
            a = idx.lookup_fixed(q, 64, check=False)
            c = idx.range_aggregate_fixed(q, q + 30, vals, 64, check=False)
            d = idx.range_lookup_fixed(q, q + 30, 64, check=False)
            e = idx.aggregate_fixed(q, vals, 64, check=False)
            b = idx.range_capped_fixed(q, q + 30, 500, 64, check=False)
    finally:
        torch.Tensor.tolist = tolist
    ck.ok(not seen, f"host synchronizations in the fixed path: {sorted(set(seen))}")
    for x, y, what in zip(b.answer, wantr, ("offsets", "rows", "total")):
        ck.eq(x, y, f"fixed range_capped {what} under the spy")
    ck.close(e.answer.sum, idx.aggregate(q, vals).sum.cpu().numpy(), "fixed aggregate under the spy")
    ck.eq(a.answer.first_row, want.first_row, "fixed lookup under the spy")
    ck.close(c.answer.sum, wanta.sum.cpu().numpy(), "fixed range_aggregate under the spy")
    ck.eq(d.answer.count, wanta.count, "fixed range_lookup under the spy")


def check_uint64_dtype(ck: Checker, rank: int, world: int, device, group=None) -> None:
    """torch.uint64 keys (not int64 storage): unsigned order across shards."""
    if not hasattr(torch, "uint64"):
        return
    ck.scope = f"{world} ranks, torch.uint64"
    parts = [[5, 2**64 - 1, 0, 7, 5], [3, 2**63], [2**63 + 1], []]
    parts = parts[:world - 1] + [sum(parts[world - 1:], [])]
    idx = ShardedIndex(torch.tensor(parts[rank], dtype=torch.uint64, device=device), group=group,
                       point_routing=routing(world))
    allk = sum(parts, [])
    q = [5, 2**64 - 1, 2**63, 4, 2**63 + 1]
    r = idx.lookup(torch.tensor(q, dtype=torch.uint64, device=device))
    ck.eq(r.count, [allk.count(v) for v in q], "uint64 lookup count")
    ck.eq(r.first_row, [allk.index(v) if v in allk else -1 for v in q], "uint64 lookup first_row")
    m = idx.range(torch.tensor([1], dtype=torch.uint64, device=device), torch.tensor([2**63], dtype=torch.uint64, device=device))
    want = [i for _, i in sorted((v, i) for i, v in enumerate(allk) if 1 <= v <= 2**63)]
    ck.eq(m.rows, want, "uint64 range in (key, row) order")


def check_local_factories(ck: Checker, rank: int, world: int, device, group=None) -> None:
    """Other local index classes answer the same (RX: range rows ascending per shard, shards in rank order)."""
    import functools

    from torch_rtindex import RXIndex

    ck.scope = f"{world} ranks, index_factory"
    gen = torch.Generator().manual_seed(77)
    parts = split(int64_keys("duplicates", 100 * world, gen), world, gen)
    allk = torch.cat(parts)
    ref = Reference(allk, "int64")
    q = point_queries(allk, 40 + rank, torch.Generator().manual_seed(rank))
    first, count, rows = ref.points(q)
    o, f = csr(rows)
    # The out-of-core index as the shard: tiny chunks and a small cache (the key set repeats one key often).
    chunked = functools.partial(ChunkedIndex, chunk_bytes=4096, gpu_budget=40000, device=device)
    lo = torch.sort(q).values[::2].contiguous()
    hi = lo + 50
    rfirst, rcount, rrows = ref.ranges(lo, hi)
    for name, kw in (("rx", {"index_factory": RXIndex}),
                     ("cgrx binary_search", {"index_factory": functools.partial(CgRXIndex, backend="binary_search", bucket_size=4)}),
                     ("cgrx binary_search aligned", {"index_factory": functools.partial(
                         CgRXIndex, backend="binary_search", bucket_size=4, layout="aligned_row")}),
                     ("updatable", {"updatable": True}),
                     ("chunked", {"index_factory": chunked}),
                     ("chunked updatable", {"index_factory": functools.partial(chunked, updatable=True), "updatable": True})):
        idx = ShardedIndex(parts[rank].to(device), group=group, point_routing=routing(world), **kw)
        ck.ok(idx._spare_rows == name.endswith("aligned"), f"{name}: global rows in the shard only where it has spare words")
        r = idx.lookup(q.to(device))
        ck.eq(r.first_row, first, f"{name} lookup first_row")
        ck.eq(r.count, count, f"{name} lookup count")
        ck.eq(idx.lookup_all(q.to(device)).rows, f, f"{name} lookup_all rows")
        if not name.startswith("chunked"):
            continue
        ck.eq(idx.range_lookup(lo.to(device), hi.to(device)).count, rcount, f"{name} range_lookup count")
        ck.eq(idx.range(lo.to(device), hi.to(device)).offsets, csr(rrows)[0], f"{name} range offsets")
        fx = idx.lookup_fixed(q.to(device), 40 + world)  # the same on every rank: the largest batch
        ck.eq(fx.answer.first_row, first, f"{name} lookup_fixed first_row")
        vals = torch.ones(idx.num_contributed(), dtype=torch.float64, device=device)
        ck.close(idx.aggregate(q.to(device), vals).sum, count.astype("float64"), f"{name} aggregate sum")
        # Per-rank and gathered states round-trip through the out-of-core shard.
        again = ShardedIndex.from_state_dict(idx.state_dict(), group=group, local_options={"gpu_budget": 50000})
        ck.ok(type(again.local_index).__name__ == "ChunkedIndex", f"{name} state reloads a ChunkedIndex shard")
        ck.ok(again.local_index.gpu_budget == 50000, f"{name} local_options reach the shard's from_state_dict")
        ck.eq(again.lookup_all(q.to(device)).rows, f, f"{name} from_state_dict lookup_all rows")
        st = idx.gathered_state_dict()
        ck.eq(st["rows"], torch.arange(allk.numel()), f"{name} gathered rows")
        if kw.get("updatable"):
            res = idx.insert(parts[rank][:5].to(device))
            ck.eq(idx.lookup(parts[rank][:5].to(device)).count.cpu() >= 2, torch.ones(5, dtype=torch.bool),
                  f"{name} insert counted")
            ck.ok(int(res.rows.min()) >= allk.numel(), f"{name} inserted rows are fresh")


def check_compiles(ck: Checker, rank: int, world: int, device, group=None) -> None:
    """lookup_fixed traces into one graph: torch.compile(fullgraph=True), collectives included."""
    ck.scope = f"{world} ranks, torch.compile"
    keys = torch.arange(rank * 100, rank * 100 + 100, device=device)
    idx = ShardedIndex(keys, group=group)
    q = torch.arange(0, 100 * world + 50, 3, device=device)
    want = idx.lookup(q)
    # One graph without breaks is what is checked; on the CPU aot_eager spares the test Inductor's C++ builds.
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    fn = torch.compile(lambda x: idx.lookup_fixed(x, q.numel(), check=False), fullgraph=True, backend=backend)
    got = fn(q)
    ck.ok(not bool(got.overflowed), "compiled lookup_fixed overflowed")
    ck.eq(got.answer.first_row, want.first_row, "compiled lookup_fixed first_row")
    ck.eq(got.answer.count, want.count, "compiled lookup_fixed count")


def cuda_graph(g) -> None:
    """Rank entry for the GPU test: lookup_fixed captured in a CUDA graph (NCCL all_to_all_single included)
    and replayed on new queries copied into the captured input."""
    device, rank = g.device, g.rank
    ck = Checker(rank)
    ck.scope = "CUDA graph"
    keys = torch.randint(-10**6, 10**6, (5000,), generator=torch.Generator().manual_seed(rank)).to(device)
    idx = ShardedIndex(keys, index_factory=functools.partial(CgRXIndex, backend="radix"), group=g.group)
    static = torch.zeros(4096, dtype=torch.int64, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up outside the capture
            idx.lookup_fixed(static, 4096, check=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = idx.lookup_fixed(static, 4096, check=False)
    for seed in range(3):
        q = torch.randint(-10**6, 10**6, (4096,), generator=torch.Generator().manual_seed(100 * seed + rank)).to(device)
        static.copy_(q)
        graph.replay()
        torch.cuda.synchronize()
        want = idx.lookup(q)
        ck.ok(not bool(out.overflowed), f"replay {seed} overflowed")
        ck.eq(out.answer.first_row, want.first_row, f"replay {seed} first_row")
        ck.eq(out.answer.count, want.count, f"replay {seed} count")
    if ck.failures:
        raise AssertionError("\n".join(ck.failures))


def check_id_to_row(ck: Checker, rank: int, world: int, device, group=None) -> None:
    ck.scope = "IdToRow"
    ids = (torch.arange(50, dtype=torch.int64) * world + rank) * 1000003  # rank r holds rows r*50 .. r*50+49
    m = IdToRow(ids.to(device), index="sharded", miss="minus_one")
    q = torch.tensor([0, 1000003 * (world + 1), 5, 1000003 * 3], dtype=torch.int64)
    got = m(q.to(device).reshape(2, 2))
    allids = torch.cat([(torch.arange(50) * world + r) * 1000003 for r in range(world)])
    want = [int((allids == v).nonzero()[0]) if bool((allids == v).any()) else -1 for v in q.tolist()]
    ck.eq(got.reshape(-1), want, "IdToRow over a sharded index")


def check_profile(ck: Checker, rank: int, world: int, device, group=None) -> None:
    ck.scope = f"{world} ranks, stats"
    idx = ShardedIndex(torch.arange(rank, 1000, world, device=device), profile=True, group=group)
    idx.lookup(torch.arange(0, 1000, 3, device=device))
    s = idx.stats()
    ck.ok(all(k in s for k in ("partition_s", "exchange_s", "local_s", "return_s", "scatter_s")), f"stats keys {s}")
    ck.ok(s["bytes_sent"] > 0 and s["bytes_sent_remote"] > 0 and s["bytes_received"] > 0, f"bytes {s}")
    ck.ok(s["exchange_s"] >= 0 and s["local_s"] > 0, f"times {s}")


# ----------------------------------------------------------------------------- entries (tests/dist_harness.py)
# Each is called on every rank of a pool as fn(group_info, *args) by tests/test_sharded.py, one pytest case
# each. The checks record failures instead of raising, so every rank makes the same collectives to the end;
# a rank's failures are raised at the end (the harness reports each failing rank's).


def _run_checks(g, check, *args) -> None:
    ck = Checker(g.rank)
    try:
        check(ck, g.rank, g.world, g.device, *args, group=g.group)
    except Exception:  # a bug that raised: report it with what was checked so far
        ck.failures.append(f"rank {g.rank} [{ck.scope}] raised:\n{traceback.format_exc()}")
    if ck.failures:
        raise AssertionError(f"{len(ck.failures)} failed checks:\n" + "\n".join(ck.failures[:40]))


KEY_SET_NAMES = ("uniform", "all_on_rank0", "last_rank_empty", "duplicates", "dup_runs", "int32", "float32",
                 "float64", "uint64")


def _key_set(ck, rank, world, device, name, seed, group=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    for set_name, kt, parts, width in key_sets(world, gen):  # drawn in order: the same parts on every rank
        if set_name == name:
            return check_key_set(ck, rank, world, device, name, kt, parts, width, gen, group)
    assert world == 1 and name == "last_rank_empty", f"no key set {name!r} for {world} ranks"


def key_set(g, name: str, seed: int = 0) -> None:
    """Every lookup form, the state round trips, against the reference, over one key set."""
    _run_checks(g, _key_set, name, seed)


def updates(g, seed: int = 1) -> None:
    _run_checks(g, check_updates, seed)


def errors(g) -> None:
    _run_checks(g, check_errors)


def fixed_has_no_host_sync(g) -> None:
    _run_checks(g, check_fixed_has_no_host_sync)


def profile(g) -> None:
    _run_checks(g, check_profile)


def local_factories(g) -> None:
    _run_checks(g, check_local_factories)


def id_to_row(g) -> None:
    """IdToRow(index="sharded") builds on the default group: the pool's ranks are all of it."""
    _run_checks(g, lambda ck, rank, world, device, group=None: check_id_to_row(ck, rank, world, device))


def compiles(g) -> None:
    _run_checks(g, check_compiles)


def uint64_dtype(g) -> None:
    _run_checks(g, check_uint64_dtype)


def subgroups(g, seed: int = 30) -> None:
    """Groups side by side on four ranks: two 2-rank groups, then a 3-rank group next to a 1-rank group, each
    checking a key set and updates in its own group at the same time."""
    import torch.distributed as dist

    assert g.world == 4
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    three, alone = dist.new_group([0, 1, 2]), dist.new_group([3])
    ck = Checker(g.rank)
    try:
        for group, name in ((pairs[g.rank // 2], "duplicates"), (three if g.rank < 3 else alone, "uniform")):
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            _key_set(ck, rank, world, g.device, name, seed, group)
            check_updates(ck, rank, world, g.device, seed + 1, group)
            dist.barrier(group=g.group)
    except Exception:
        ck.failures.append(f"rank {g.rank} [{ck.scope}] raised:\n{traceback.format_exc()}")
    if ck.failures:
        raise AssertionError(f"{len(ck.failures)} failed checks:\n" + "\n".join(ck.failures[:40]))
