"""UpdatableCgRXIndex under random update sequences, compared after every batch with a multiset reference."""

import os
import random
from collections import Counter

import numpy as np
import pytest
import torch
from keysets import I64_MAX, I64_MIN

from torch_rtindex import UpdatableCgRXIndex

BATCHES = int(os.environ.get("RTINDEX_UPDATE_BATCHES", "3000"))


class MultisetReference:
    def __init__(self, keys, rows):
        self.pairs = Counter(zip(keys, rows))

    def delete(self, keys, rows):
        found, removed = 0, 0
        present_keys = {k for k, _ in self.pairs}  # by key: an entry finds its key if present when deleting starts
        for k, r in zip(keys, rows if rows is not None else [None] * len(keys)):
            if r is None:
                hits = [p for p in self.pairs if p[0] == k]
                n = sum(self.pairs[p] for p in hits)
                for p in hits:
                    del self.pairs[p]
                found += k in present_keys
                removed += n
                continue
            n = 1 if self.pairs[(k, r)] > 0 else 0
            self.pairs[(k, r)] -= n
            if self.pairs[(k, r)] <= 0:
                del self.pairs[(k, r)]
            found += n > 0
            removed += n
        return removed, len(keys) - found

    def insert(self, keys, rows):
        for k, r in zip(keys, rows):
            self.pairs[(k, r)] += 1

    def lookup(self, k):
        rows = sorted(r for (kk, r), c in self.pairs.items() if kk == k for _ in range(c))
        return (rows[0] if rows else -1), len(rows)

    def range_rows(self, lo, hi):
        return sorted(((kk, r) for (kk, r), c in self.pairs.items() if lo <= kk <= hi for _ in range(c)))


def check_full(index, ref, device, rng):
    keys = sorted({k for k, _ in ref.pairs})
    probe = rng.sample(keys, min(40, len(keys))) + [rng.randint(I64_MIN, I64_MAX) for _ in range(10)]
    got = index.lookup(torch.tensor(probe, device=device))
    exp = [ref.lookup(k) for k in probe]
    assert got.first_row.cpu().tolist() == [e[0] for e in exp]
    assert got.count.cpu().tolist() == [e[1] for e in exp]
    lo = rng.choice(keys) if keys else 0
    hi = min(I64_MAX, lo + rng.choice([0, 10, 2**40, 2**62]))
    m = index.range(torch.tensor([lo], device=device), torch.tensor([hi], device=device))
    expected = ref.range_rows(lo, hi)
    assert m.rows.cpu().tolist() == [r for _, r in expected]  # (key, row ID) order
    assert index.range_count(torch.tensor([lo], device=device), torch.tensor([hi], device=device)).tolist() == [len(expected)]
    assert len(index) == sum(ref.pairs.values())


def chains(index):
    """Every bucket's chain as a list of node sizes, read from the node region (layout: cgrx_nodes.h)."""
    n = index.node_size
    nodes = index._pairs.cpu().view(-1, 3 * n + 2)
    out = []
    for b in range(index.num_buckets):
        sizes, node = [], b
        while node != 0xFFFFFFFF:
            sizes.append(int(nodes[node, 3 * n]))
            node = int(nodes[node, 3 * n + 1]) & 0xFFFFFFFF
        out.append(sizes)
    return out


def check_pairs(index, ref, what):
    """Nothing lost, nothing invented: the index's (key, row ID) pairs are the reference multiset, every node
    holds at most node_size pairs, and only a representative node is ever empty in a chain."""
    k, r = index._export()
    got = Counter(zip((k.cpu() ^ (-(2**63))).tolist(), r.cpu().tolist()))
    assert got == +ref.pairs, what
    for sizes in chains(index):
        assert all(0 <= s <= index.node_size for s in sizes) and all(s > 0 for s in sizes[1:]), (what, sizes)


def test_a_full_node_splits_in_half(device):
    index = UpdatableCgRXIndex(torch.arange(4, device=device), node_size=8, max_node_reads=None)  # one bucket, its node half full
    assert chains(index) == [[4]]
    index.insert(torch.arange(4, 8, device=device))
    assert chains(index) == [[8]]  # full, not split yet
    index.insert(torch.tensor([8], device=device))
    assert chains(index) == [[4, 5]]  # the upper half moved to a new node, 8 went after it
    index.insert(torch.tensor([-1, -2, -3, -4, -5], device=device))  # fills the first node, then splits it
    assert chains(index) == [[4, 5, 5]]
    index.delete(torch.arange(-5, 4, device=device))  # the representative node empties, the others stay
    assert chains(index) == [[0, 5]] and index.lookup(torch.tensor([5, 0], device=device)).count.tolist() == [1, 0]
    index.delete(torch.arange(4, 9, device=device))  # a linked node left empty is unlinked
    assert chains(index) == [[0]] and len(index) == 0
    index.insert(torch.tensor([7, 1], device=device))
    assert chains(index) == [[2]] and index.lookup_all(torch.tensor([1, 7], device=device)).rows.tolist() == [15, 14]


@pytest.mark.parametrize("node_size", [2, 8, 32])
def test_random_update_sequences(device, node_size):
    rng = random.Random(node_size)
    pool = [rng.randint(I64_MIN, I64_MAX) for _ in range(300)] + list(range(-50, 50)) + [I64_MIN, I64_MAX, 0, -1]
    keys = [rng.choice(pool) for _ in range(rng.choice([1, 3, 400]))]
    index = UpdatableCgRXIndex(torch.tensor(keys, device=device), node_size=node_size)
    ref = MultisetReference(keys, list(range(len(keys))))
    next_row = len(keys)
    batches = max(1, BATCHES // 3)
    for step in range(batches):
        present = list(ref.pairs)
        kind = rng.random()
        n_ins = rng.choice([0, 1, 5, 40])
        ins = [rng.choice(pool) if rng.random() < 0.8 else rng.randint(I64_MIN, I64_MAX) for _ in range(n_ins)]
        if kind < 0.15:  # delete by key (every pair of each key)
            dk = [rng.choice(present)[0] if present and rng.random() < 0.7 else rng.choice(pool) for _ in range(rng.randint(0, 5))]
            dr = None
        else:  # delete (key, row) pairs: present ones, absent ones, repeats, and pairs this batch inserts
            chosen = [rng.choice(present) for _ in range(rng.randint(0, 30))] if present else []
            chosen += [(rng.choice(pool), rng.randint(0, 10**6)) for _ in range(rng.randint(0, 3))]
            chosen += [(ins[j], next_row + j) for j in range(n_ins) if rng.random() < 0.3]  # cancel out
            dk, dr = [c[0] for c in chosen], [c[1] for c in chosen]
        # A batch inserts first and deletes second: (index + insertions) - deletions.
        ref.insert(ins, list(range(next_row, next_row + n_ins)))
        exp_removed, exp_absent = ref.delete(dk, dr)
        res = index.update(
            insert_keys=torch.tensor(ins, dtype=torch.int64, device=device),
            delete_keys=torch.tensor(dk, dtype=torch.int64, device=device),
            delete_rows=None if dr is None else torch.tensor(dr, dtype=torch.int64, device=device),
        )
        assert res.rows.cpu().tolist() == list(range(next_row, next_row + n_ins))
        next_row += n_ins
        assert (res.inserted, res.deleted, res.absent) == (n_ins, exp_removed, exp_absent), f"batch {step}"
        check_pairs(index, ref, f"batch {step}")
        if step % 25 == 0 or step == batches - 1:
            check_full(index, ref, device, rng)
    index.rebuild()  # compaction keeps every pair and its row ID
    check_full(index, ref, device, rng)
    assert index.memory()["free_node_space"] >= 0


def test_failed_batch_changes_nothing(device):
    index = UpdatableCgRXIndex(torch.tensor([3.0, 1.0, 2.0], device=device), node_size=4)
    before = index.range(torch.tensor([0.0], device=device), torch.tensor([9.0], device=device)).rows.tolist()
    with pytest.raises(ValueError, match="NaN"):
        index.update(insert_keys=torch.tensor([5.0], device=device), delete_keys=torch.tensor([float("nan")], device=device))
    with pytest.raises(TypeError, match="dtype"):
        index.insert(torch.tensor([5], device=device))
    with pytest.raises(ValueError, match="rows"):
        index.insert(torch.tensor([5.0], device=device), rows=torch.tensor([-1], device=device))
    after = index.range(torch.tensor([0.0], device=device), torch.tensor([9.0], device=device)).rows.tolist()
    assert before == after and len(index) == 3


def test_growth_empty_start_and_aggregates(device):
    index = UpdatableCgRXIndex(torch.empty(0, dtype=torch.int64, device=device), node_size=4, growth=1.0)
    keys = torch.randint(-1000, 1000, (5000,), generator=torch.Generator().manual_seed(1))
    for chunk in keys.split(500):
        index.insert(chunk.to(device))
    ref = MultisetReference(keys.tolist(), list(range(keys.numel())))
    q = torch.arange(-1000, 1000)
    got = index.lookup(q.to(device))
    assert got.count.cpu().tolist() == [ref.lookup(k)[1] for k in q.tolist()]
    values = torch.arange(keys.numel(), dtype=torch.float64, device=device)
    agg = index.aggregate(q.to(device), values)
    expected = [float(sum(r for (kk, r), c in ref.pairs.items() if kk == k for _ in range(c))) for k in q.tolist()]
    np.testing.assert_allclose(agg.sum.cpu().numpy(), expected)
    assert index.memory()["nodes"] > 0 and "UpdatableCgRXIndex" in repr(index)


def test_insert_and_delete_of_one_pair_cancel(device):
    index = UpdatableCgRXIndex(torch.tensor([5, 7], device=device), node_size=4)
    before = index.memory()["nodes"]
    res = index.update(insert_keys=torch.tensor([9, 5], device=device), insert_rows=torch.tensor([10, 11], device=device),
                       delete_keys=torch.tensor([9, 5], device=device), delete_rows=torch.tensor([10, 0], device=device))
    # (9, 10) is inserted and deleted by the same batch: it cancels; (5, 0) is deleted; (5, 11) stays.
    assert (res.inserted, res.deleted, res.absent) == (2, 2, 0)
    assert index.lookup_all(torch.tensor([5, 9], device=device)).rows.cpu().tolist() == [11]
    assert index.memory()["nodes"] == before and len(index) == 2
    # Deleting a key by key also removes the pairs the same batch inserts with that key.
    res = index.update(insert_keys=torch.tensor([7, 8], device=device), delete_keys=torch.tensor([7, 100], device=device))
    assert (res.inserted, res.deleted, res.absent) == (2, 2, 1)
    assert index.lookup(torch.tensor([7, 8], device=device)).count.cpu().tolist() == [0, 1]


@pytest.mark.parametrize("node_size", [2, 4, 32])
def test_delete_by_key_counts_repeated_and_absent_keys(device, node_size):
    """A batch of deletions by key only: the plan counts what it found. A key named twice is found twice
    (absent counts entries whose key is absent), also where the repeats come after the bucket's last pair."""
    keys = torch.tensor([3, 3, 5, 9, 9, 9, 12, 20, 20, 31], device=device)
    index = UpdatableCgRXIndex(keys, node_size=node_size)
    res = index.delete(torch.tensor([9, 9, 4, 31, 31, 31, 3, 40, 40], device=device))
    assert (res.inserted, res.deleted, res.absent) == (0, 6, 3)
    assert index.lookup(torch.tensor([3, 5, 9, 12, 20, 31], device=device)).count.cpu().tolist() == [0, 1, 0, 1, 2, 0]
    res = index.delete(torch.tensor([20, 20, 5, 5, 7], device=device))
    assert (res.deleted, res.absent) == (3, 1) and len(index) == 1
    res = index.delete(torch.tensor([12, 12], device=device))
    assert (res.deleted, res.absent) == (1, 0) and len(index) == 0


def test_row_ids_above_2_31_keep_their_order_through_a_rebuild(device):
    """Row IDs go up to 2^32 - 2 in int32 storage: the bulk load sorts them as unsigned, like every update."""
    index = UpdatableCgRXIndex(torch.tensor([5], device=device), node_size=4)
    index.insert(torch.tensor([5, 5], device=device), rows=torch.tensor([2**32 - 2, 3], device=device))
    index.rebuild()
    res = index.delete(torch.tensor([5], device=device), rows=torch.tensor([3], device=device))
    assert (res.deleted, res.absent) == (1, 0)
    assert index.lookup_all(torch.tensor([5], device=device)).rows.cpu().tolist() == [0, 2**32 - 2]


def test_update_keys_follow_the_dtype_policy(device):
    """Keys of an update convert as queries do: int32 keys into an int64 index are the same keys; int64 keys into
    an int32 index, or floats into an integer one, are refused naming both dtypes, and change nothing."""
    index = UpdatableCgRXIndex(torch.tensor([5, 7], device=device), node_size=4)
    res = index.update(insert_keys=torch.tensor([9, -(2**31)], dtype=torch.int32, device=device),
                       delete_keys=torch.tensor([5], dtype=torch.int16, device=device))
    assert (res.inserted, res.deleted, res.absent) == (2, 1, 0) and res.rows.tolist() == [2, 3]
    q = torch.tensor([5, 7, 9, -(2**31)], device=device)
    assert index.lookup(q).first_row.tolist() == [-1, 1, 2, 3]
    assert index.delete(torch.tensor([9], dtype=torch.int32, device=device), rows=torch.tensor([2], device=device)).deleted == 1
    small = UpdatableCgRXIndex(torch.tensor([5, 7], dtype=torch.int32, device=device), node_size=4)
    for bad, side in ((torch.tensor([9], device=device), "insert"), (torch.tensor([5.0], device=device), "delete")):
        with pytest.raises(TypeError, match=f"{side} keys has dtype {bad.dtype} but the index holds int32 keys"):
            small.update(**{f"{side}_keys": bad})
    assert small.lookup(torch.tensor([5, 7, 9], dtype=torch.int32, device=device)).first_row.tolist() == [0, 1, -1]
    assert len(small) == 2


def test_row_ids_past_32_bits_are_refused(device):
    """Row IDs are 32-bit inside the index: an explicit insert row past 2^32 - 2 is refused (it would make
    aggregate ask for that many values and the next fresh row jump past it), as is a state that says so."""
    index = UpdatableCgRXIndex(torch.tensor([5, 7], device=device), node_size=4)
    for bad in (2**62, 2**32 - 1, -1):
        with pytest.raises(ValueError, match=r"row IDs in 0 .. 2\^32 - 2"):
            index.insert(torch.tensor([9], device=device), rows=torch.tensor([bad], device=device))
    assert len(index) == 2 and index.insert(torch.tensor([9], device=device)).rows.tolist() == [2]
    values = torch.tensor([1.0, 2.0, 4.0], device=device)
    assert index.aggregate(torch.tensor([5, 9], device=device), values).sum.tolist() == [1.0, 4.0]
    state = index.state_dict()
    for bad in (2**62, -1, "3"):
        with pytest.raises(ValueError, match="next_row"):
            UpdatableCgRXIndex.from_state_dict({**state, "next_row": bad})
    assert UpdatableCgRXIndex.from_state_dict(state).insert(torch.tensor([1], device=device)).rows.tolist() == [3]


def test_settings_are_checked_where_they_are_changed(device):
    index = UpdatableCgRXIndex(torch.tensor([5, 7], device=device), node_size=4)
    for name, bad, error in (("growth", 0.5, ValueError), ("growth", "x", TypeError),
                             ("max_node_reads", 0.9, ValueError), ("max_node_reads", float("nan"), ValueError)):
        with pytest.raises(error, match=name):
            setattr(index, name, bad)
    index.growth, index.max_node_reads = 2.0, None
    assert (index.growth, index.max_node_reads) == (2.0, None)
    index.insert(torch.arange(100, device=device))
    assert len(index) == 102 and index.stats()["auto_rebuilds"] == 0


def bulk_load_reference(keys, rows, node_size):
    """The bulk load by its definition, in numpy: pairs in (unsigned key, unsigned row) order; a bucket ends where
    the run of the key at every (node_size / 2)-th pair ends, and at the last pair; each bucket fills its own node,
    then extra nodes numbered after all buckets' own, in bucket order."""
    ordered = keys.view(np.uint64) ^ np.uint64(1 << 63)  # map_keys: int64 keys in unsigned order
    order = np.lexsort((rows.view(np.uint32), ordered))
    sk, sr = ordered[order], rows.view(np.uint32)[order]
    n, per = len(keys), node_size // 2
    if n == 0:
        return sk, sr, np.array([-1]), np.array([0]), np.array([0]), np.array([1]), 1
    ends = np.unique(np.searchsorted(sk, sk[np.append(np.arange(per - 1, n, per), n - 1)], side="right") - 1)
    starts = np.concatenate([[0], ends[:-1] + 1])
    counts = ends - starts + 1
    extra = np.maximum(1, -(-counts // node_size)) - 1
    first_extra = np.cumsum(extra) - extra + len(ends)
    return sk, sr, sk[ends].view(np.int64), starts, counts, first_extra, len(ends) + int(extra.sum())


@pytest.mark.parametrize("node_size", [2, 6, 32, 4096])
def test_bulk_load_buckets_fill_half_nodes_and_never_split_a_key(device, node_size):
    """The bulk load (the ``cgrx_nodes_load`` operator) against its definition in numpy: the representatives,
    ``used``, and every bucket's chain in the node region (node IDs, keys, row IDs as unsigned, sizes, links; the
    layout of cgrx_nodes.h); unused nodes stay zero. Full-range keys with the edges, the edges alone, runs of
    copies, one key repeated; row IDs over the whole unsigned 32-bit range."""
    rng = np.random.default_rng(node_size)
    edges = np.array([I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX], dtype=np.int64)
    N, words = node_size, 3 * node_size + 2
    for n in sorted({0, 1, 2, 3, N // 2, N // 2 + 1, N, 2 * N + 3, 1000, 5000}):
        for kind in ("full", "edges", "runs", "one key"):
            if kind == "full":
                keys = np.concatenate([edges, rng.integers(I64_MIN, I64_MAX, n, dtype=np.int64, endpoint=True)])[:n]
                rng.shuffle(keys)
            elif kind == "edges":
                keys = rng.choice(edges, n)
            elif kind == "runs":
                keys = np.repeat(rng.integers(I64_MIN, I64_MAX, n // 7 + 1, dtype=np.int64), 7)[:n]
                rng.shuffle(keys)
            else:
                keys = np.full(n, I64_MIN if n % 2 else I64_MAX, dtype=np.int64)
            rows = rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int64).astype(np.int32)  # as uint32: to 2^32 - 2
            sk, sr, reps, starts, counts, first_extra, used = bulk_load_reference(keys, rows, N)
            k = torch.ops.rtindex.map_keys(torch.from_numpy(keys).to(device), 0)
            nodes, got_reps, _, got_used = torch.ops.rtindex.cgrx_nodes_load(k, torch.from_numpy(rows).to(device), N, 1.25)
            assert got_reps.cpu().numpy().tolist() == reps.tolist(), (n, kind)
            assert int(got_used) == used, (n, kind)
            region = nodes.cpu().numpy().view(np.uint32).reshape(-1, words)
            assert region.shape[0] == max(used, int(used * 1.25) + 1)
            seen = np.zeros(region.shape[0], dtype=bool)
            for b in range(len(reps)):
                s, c = int(starts[b]), int(counts[b])
                want_chain = [b] + [int(first_extra[b]) + i for i in range(max(1, -(-c // N)) - 1)]
                chain, got_k, got_r, node = [], [], [], b
                while node != 0xFFFFFFFF:
                    chain.append(node)
                    seen[node] = True
                    size = int(region[node, 3 * N])
                    got_k += region[node, : 2 * N].copy().view(np.uint64)[:size].tolist()
                    got_r += region[node, 2 * N : 2 * N + size].tolist()
                    node = int(region[node, 3 * N + 1])
                assert chain == want_chain, (n, kind, b)
                assert got_k == sk[s : s + c].tolist() and got_r == sr[s : s + c].tolist(), (n, kind, b)
            assert seen.sum() == used and not region[~seen].any(), (n, kind)
