"""The collective sequences of the sharded index under faults, on every rank (tests/test_sharded.py calls the
entry below through tests/dist_harness.py): each rank records every collective it posts while a fault is injected
on one rank, and the ranks compare their sequences, so that a failure is reported instead of waited for."""

from __future__ import annotations

import collections

import torch
from sharded_worker import routing

from torch_rtindex.distributed import ShardedIndex, ShardedIndexError


def sequences(g, tag: str) -> None:
    """The collective sequences under faults (collective_sequences) on the default group; ``tag`` keeps this
    call's store keys apart from any earlier call's."""
    collective_sequences(g.rank, g.world, g.device, tag)


_COLLECTIVES = ("all_gather", "all_gather_object", "all_gather_into_tensor", "all_reduce", "all_to_all",
                "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
                "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv",
                "isend", "irecv", "batch_isend_irecv")
_SAME_SHAPE = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "reduce")  # shapes must match


class CollectiveRecorder:
    """While entered, wraps the collectives of ``torch.distributed`` (what the sharded index's modules call)
    and records every collective posted (function, group, dtype and device type of its tensors, their shape
    where the ranks' shapes must match, async or not), so that the ranks can compare their sequences. Like NCCL,
    which refuses a CPU tensor on that rank alone (the others' collective stays posted), it refuses a tensor on a
    device type the group's backend does not serve (on the CPU: e.g. ``meta``, which gloo would silently skip).
    The object collectives call torch's own functions directly, so they are recorded once, as themselves."""

    def __init__(self, served: set[str]):
        import torch.distributed as dist

        self._dist, self.served, self.log, self._real = dist, served, [], {}

    def __enter__(self):
        for name in _COLLECTIVES:
            real = getattr(self._dist, name, None)
            if real is not None:
                self._real[name] = real
                setattr(self._dist, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc):
        for name, real in self._real.items():
            setattr(self._dist, name, real)
        self._real = {}

    def _wrap(self, name, real):
        def collective(*args, **kwargs):
            group = kwargs.get("group")
            ranks = self._dist.get_process_group_ranks(group if group is not None else self._dist.group.WORLD)
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
            entry = [name, ranks, bool(kwargs.get("async_op", False))]
            for t in tensors[:2]:
                entry.append([str(t.dtype), t.device.type, list(t.shape) if name in _SAME_SHAPE else list(t.shape[1:])])
            refused = sorted({t.device.type for t in tensors} - self.served)
            if refused:
                self.log.append(["REFUSED (not posted on this rank)"] + entry)
                raise RuntimeError(f"No backend type associated with device type {refused[0]} (refused by the "
                                   "test's CollectiveRecorder, as NCCL refuses a CPU tensor)")
            self.log.append(entry)
            return real(*args, **kwargs)

        return collective


def collective_sequences(rank: int, world: int, device: torch.device, tag: str = "") -> None:
    """Rank entry: bad input or a fault on ONE rank (each rank in turn), at every stage that can fail locally
    between two collectives; every rank must post exactly the same collectives (compared through the store, so
    that a mismatch is reported instead of waited for) and raise ShardedIndexError (a failed local lookup: its
    rank and the ranks it owed answers). The index still answers afterwards. gloo is synchronous; the recorder
    makes the sequence visible as NCCL would see it (under NCCL, "a state without tensors" is the case that
    left the ranks one call apart before the header went on the group's device). Runs on the default group."""
    import json
    from datetime import timedelta

    import torch.distributed as dist


    served = {d.type for d in dist.group.WORLD._device_types}
    store = dist.distributed_c10d._get_default_store()
    rec = CollectiveRecorder(served)
    keys = torch.arange(rank * 100, rank * 100 + 100, dtype=torch.int64, device=device)
    idx = ShardedIndex(keys, point_routing=routing(world))
    upd = ShardedIndex(keys, updatable=True, point_routing=routing(world))
    q = torch.arange(0, 100 * world, 7, device=device)
    want = idx.lookup(q)
    vals = torch.ones(100, dtype=torch.float64, device=device)

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    def fault(index, stage: str, calls=None):
        """index._fault raising at ``stage`` on its ``calls``-th times there (1-based; None: every time)."""
        seen = collections.Counter()

        def hook(s):
            if s == stage:
                seen[s] += 1
                if calls is None or seen[s] in calls:
                    oom()

        index._fault = hook

    def at_pipeline(p, fn):
        idx.pipeline = p
        try:
            return fn()
        finally:
            idx.pipeline = 1

    def meta_state(state):
        return {k: meta_state(v) if isinstance(v, dict) else v.to("meta") if isinstance(v, torch.Tensor) else v
                for k, v in state.items()}

    no_rows = {k: v for k, v in idx.state_dict().items() if k != "num_rows"}
    gathered = idx.gathered_state_dict()  # collective: made here by every rank, not by some in a scenario

    # (name, what the bad rank does differently or where it faults, the call every rank makes)
    scenarios = [
        ("lookup: query dtype refused", None, lambda b: idx.lookup(q.to(torch.float64) if b else q)),
        ("aggregate: short value column", None, lambda b: idx.aggregate(q, vals[:5] if b else vals)),
        ("pipeline differs", None, lambda b: at_pipeline(2 if b else 1, lambda: idx.lookup(q))),
        ("lookup_fixed: query_capacity beyond int64", None, lambda b: idx.lookup_fixed(q, 2**70 if b else 64)),
        ("from_state_dict: a state without tensors", None,
         lambda b: ShardedIndex.from_state_dict({"format": "x"} if b else idx.state_dict())),
        ("from_state_dict: a state on a device the backend does not serve", None,
         lambda b: ShardedIndex.from_state_dict(meta_state(idx.state_dict()) if b else idx.state_dict())),
        ("from_state_dict: a state without num_rows", None,
         lambda b: ShardedIndex.from_state_dict(no_rows if b else idx.state_dict())),
        ("build: keys on a device the backend does not serve", None,
         lambda b: ShardedIndex(keys.to("meta") if b else keys)),
        ("build: sample_size differs", None, lambda b: ShardedIndex(keys, sample_size=32 if b else 64)),
        ("build: bad pipeline", None, lambda b: ShardedIndex(keys, pipeline=0 if b else 1)),
        ("from_gathered_state: not a gathered state", None,
         lambda b: ShardedIndex.from_gathered_state({} if b else gathered)),
        ("build: the local index fails", None, lambda b: ShardedIndex(keys, index_factory=oom if b else None)),
        ("pipelined lookup: routing fails", (idx, "partition", None), lambda b: at_pipeline(2, lambda: idx.lookup(q))),
        ("pipelined lookup: the first local lookup (own) fails", (idx, "local", {1}), lambda b: at_pipeline(2, lambda: idx.lookup(q))),
        ("pipelined lookup: the second local lookup fails", (idx, "local", {2}), lambda b: at_pipeline(2, lambda: idx.lookup(q))),
        ("pipelined lookup: every local lookup fails", (idx, "local", None), lambda b: at_pipeline(3, lambda: idx.lookup(q))),
        ("pipelined aggregate: the second local lookup fails", (idx, "local", {2}),
         lambda b: at_pipeline(2, lambda: idx.aggregate(q, vals))),
        ("lookup: routing fails", (idx, "partition", None), lambda b: idx.lookup(q)),
        ("lookup: local lookup fails", (idx, "local", None), lambda b: idx.lookup(q)),
        ("range_lookup: local lookup fails", (idx, "local", None), lambda b: idx.range_lookup(q, q + 3)),
        ("range_lookup: routing fails", (idx, "partition", None), lambda b: idx.range_lookup(q, q + 3)),
        ("lookup_all: routing fails", (idx, "partition", None), lambda b: idx.lookup_all(q)),
        ("range: routing fails", (idx, "partition", None), lambda b: idx.range(q, q + 3)),
        ("range_capped: routing fails", (idx, "partition", None), lambda b: idx.range_capped(q, q + 3, 5)),
        ("update: routing fails", (upd, "partition", None),
         lambda b: upd.update(insert_keys=keys[:3] + 1000 * world, delete_keys=keys[10:12])),
        ("range: local lookup fails", (idx, "local", None), lambda b: idx.range(q, q + 3)),
        ("range_capped: local lookup fails", (idx, "local", None), lambda b: idx.range_capped(q, q + 3, 5)),
        ("lookup_fixed: local lookup fails", (idx, "local", None), lambda b: idx.lookup_fixed(q, 64)),
        ("lookup_fixed: routing fails", (idx, "partition", None), lambda b: idx.lookup_fixed(q, 64)),
        ("aggregate_fixed: routing fails", (idx, "partition", None), lambda b: idx.aggregate_fixed(q, vals, 64)),
        ("range_lookup_fixed: routing fails", (idx, "partition", None), lambda b: idx.range_lookup_fixed(q, q + 3, 64)),
        ("range_capped_fixed: routing fails", (idx, "partition", None),
         lambda b: idx.range_capped_fixed(q, q + 3, 5, 64)),
        ("range_capped_fixed: local lookup fails", (idx, "local", None),
         lambda b: idx.range_capped_fixed(q, q + 3, 5, 64)),
        ("gathered_state_dict: export fails", (idx, "export", None), lambda b: idx.gathered_state_dict()),
        ("update: applying fails", (upd, "update_apply", None),
         lambda b: upd.update(insert_keys=keys[:3] + 1000 * world, delete_keys=keys[10:12])),
        ("update: recording the applied update fails", (upd, "update_record", None),
         lambda b: upd.update(insert_keys=keys[:3] + 1000 * world, delete_keys=keys[10:12])),
    ]
    n_before = len(upd)
    for bad in range(world):
        for name, where, call in scenarios:
            b = rank == bad
            if b and where is not None:
                fault(*where)
            rec.log = []
            try:
                with rec:
                    call(b)
                outcome = "returned"
            except ShardedIndexError:
                outcome = "ShardedIndexError"
            except Exception as e:  # noqa: BLE001
                outcome = f"{type(e).__name__}: {str(e)[:160]}"
            finally:
                idx._fault = upd._fault = None
            key = f"collective_sequences/{tag}/{bad}/{name}"
            store.set(f"{key}/{rank}", json.dumps({"log": rec.log, "outcome": outcome}))
            store.wait([f"{key}/{r}" for r in range(world)], timedelta(seconds=120))
            got = [json.loads(store.get(f"{key}/{r}")) for r in range(world)]
            what = f"[{name}, on rank {bad}]"
            if any(g["log"] != got[0]["log"] for g in got):
                table = "\n".join(f"  rank {r}: " + "\n          ".join(map(str, g["log"])) for r, g in enumerate(got))
                raise AssertionError(f"{what} the ranks posted different collectives:\n{table}")
            # A failed local lookup raises on its rank and on the ranks it owed answers (the others get theirs);
            # any other failure raises on every rank.
            owed_only = where is not None and where[1] == "local"
            ok = ("ShardedIndexError", "returned") if owed_only else ("ShardedIndexError",)
            if got[bad]["outcome"] != "ShardedIndexError" or any(g["outcome"] not in ok for g in got):
                raise AssertionError(f"{what} outcomes {[g['outcome'] for g in got]}, wanted {' or '.join(ok)} "
                                     "(ShardedIndexError on the failing rank)")
        r = idx.lookup(q)
        assert torch.equal(r.first_row, want.first_row) and torch.equal(r.count, want.count), "index changed"
        assert len(upd) == n_before, f"updatable index changed: {len(upd)} vs {n_before}"
    # Every fault was undone: the updatable index still takes an update.
    res = upd.update(insert_keys=keys[:2] + 1000 * world)
    assert res.inserted == 2 * world and len(upd) == n_before + 2 * world, res
