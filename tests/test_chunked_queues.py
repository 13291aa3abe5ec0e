"""How ChunkedIndex serves a batch's queues: a batch sorted by key cut into each chunk's run of it, queues read in
place (on a CPU index, the GPU's stand-in) next to cached ones, the rates' calibration and when it is done again,
point queues answered in groups, and the rtindex_internal.cgrx_lookup_queues operator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from chunked_support import DUP_BUDGET, check_all_forms, chunk_number, chunk_of, chunked, fixed_rates
from keysets import I64_MAX, I64_MIN, int64_keys, point_queries
from reference import Reference, check_lookup

from torch_rtindex import CgRXIndex
from torch_rtindex.chunked.calibration import Calibrator
from torch_rtindex.chunked.cost import CostModel
from torch_rtindex.chunked.executor import Executor
from torch_rtindex.chunked.store import TOP, ChunkStore, align


def _key_ordered(index, q, device):
    """q as the index's ordered keys sorted into the chunks' order, as the tier's misses come to the chunks."""
    lo = torch.ops.rtindex.map_keys(q.to(device), 0)  # int64 keys
    return torch.sort(lo ^ TOP).values ^ TOP


def _tier_of_one_key(index, keys):
    """Gives ``index`` a hot tier of one key of ``keys`` (its rarest, not an edge the tests ask), learning nothing;
    returns the key. A point batch without it is all misses of the tier, which reach the chunks as one batch sorted
    by key."""
    distinct, counts = torch.unique(keys.cpu(), return_counts=True)
    counts[torch.isin(distinct, torch.tensor([I64_MIN, I64_MAX, 0, -1]))] = keys.numel() + 1
    key = distinct[counts.argmin()].reshape(1)
    index.hot_learn = False
    assert index.warm(key.to(index.device)) == 1
    return int(key)


def _misses_of_the_tier(q, held, device):
    """q without the tier's key ``held``: its point lookups reach the chunks as the tier's misses."""
    return q[q != held].to(device)


def _lookup_key_ordered(index, q, ref):
    """q's point lookups (no query on the tier's key) checked against the reference; every query is a miss of the
    tier, so the chunks serve them as one batch sorted by key (key_order)."""
    got = index.lookup(q)
    want_first, want_count, _ = ref.points(q.cpu())
    np.testing.assert_array_equal(got.first_row.cpu().numpy(), want_first)
    np.testing.assert_array_equal(got.count.cpu().numpy(), want_count)
    s = index.stats()
    assert s["hot_keys"] == 1 and s["last_batch"]["hot_hits"] == 0


def _recorded_groups(monkeypatch, what):
    """Executor.answer_group wrapped: what(tasks, S) of each call appended to the list returned."""
    calls, plain = [], Executor.answer_group

    def recorded(self, views, tasks, batch, S):
        calls.append(what(tasks, S))
        return plain(self, views, tasks, batch, S)

    monkeypatch.setattr(Executor, "answer_group", recorded)
    return calls


def test_sorted_batch_queues_are_runs(device, gen, monkeypatch):
    """A batch sorted by key (key_order) is cut into each chunk's run of it instead of partitioned: every queue
    holds exactly its chunk's keys, in key order, and the answers are the reference's; keys at every chunk's first
    key and below it, below the first chunk and above the last, duplicates, chunks with no query; both processors
    serve."""
    import torch_rtindex.chunked.executor as executor_module

    keys = torch.cat([int64_keys("duplicates", 2500, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, hot_keys=8)
    assert index.num_chunks > 5
    index.read_in_place = True
    fixed_rates(index, monkeypatch, cpu=1e8, copy=1.0, gpu=1e8, in_place=1e8)  # both serve
    held = _tier_of_one_key(index, keys)
    first = torch.tensor([c["lo"] for c in index.chunk_info()[1:]], dtype=torch.int64) ^ I64_MIN
    seen = []
    merge = executor_module.merge
    monkeypatch.setattr(executor_module, "merge", lambda form, tasks, q, P, sq, *a: seen.append(
        [(t.chunk, sq[t.start : t.start + t.size].cpu()) for t in tasks]) or merge(form, tasks, q, P, sq, *a))
    ref = Reference(keys, "int64")
    for n in (0, 1, 700):
        q = torch.cat([point_queries(keys, n, gen), first[: n // 100], first[: n // 100] - 1,
                       torch.tensor([I64_MIN, I64_MAX] if n else [], dtype=torch.int64)])
        q = _misses_of_the_tier(q, held, device)
        lo = _key_ordered(index, q, device)
        seen.clear()
        _lookup_key_ordered(index, q, ref)
        (queues,) = seen
        assert sum(x.numel() for _, x in queues) == lo.numel()
        chunk_ids = chunk_of(index, lo)
        for chunk, x in queues:
            assert bool((chunk_ids[x] == chunk_number(index, chunk)).all())  # each queue its chunk's keys only
            assert torch.equal(x, torch.arange(int(x[0]), int(x[0]) + x.numel()))  # a run, in key order
    s = index.stats()
    assert s["queries_cpu"] > 0 and s["queries_in_place"] > 0


@pytest.mark.parametrize("updatable", [False, True])
def test_queues_read_in_place_match_the_reference(gen, monkeypatch, updatable):
    """read_in_place on a CPU index (the GPU's reads of pinned host chunks, as the tests can run them): copies
    priced out, every uncached queue is read in place; the answers are those of the other ways."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys, "cpu", gpu_budget=DUP_BUDGET, updatable=updatable, hot_keys=0)
    assert index.read_in_place is None and index.rates().in_place == 0  # automatic: off on a CPU index
    index.read_in_place = True
    fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    assert index.rates().in_place == 1e9
    check_all_forms(index, keys, "int64", gen, "cpu", n_q=300)
    s = index.stats()
    assert s["queries_in_place"] > 0 and s["chunk_misses"] == 0 and s["queries_in_place"] == s["queries_gpu"]
    index.read_in_place = False
    assert index.rates().in_place == 0
    with pytest.raises(TypeError, match="read_in_place must be None"):
        index.read_in_place = "yes"


def test_in_place_rate_is_calibrated_then_learned(gen):
    keys = int64_keys("uniform", 4000, gen)
    index = chunked(keys, "cpu", hot_keys=0)
    assert index.stats()["rates_measured"] == {"cpu": None, "copy": None, "gpu": None, "in_place": None}  # guesses
    index.read_in_place = True
    q = keys[torch.randint(0, keys.numel(), (20000,), generator=gen)]  # queues of over 256: calibrated
    ref = CgRXIndex(keys).lookup(q)
    for _ in range(3):
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["rates_measured"]["in_place"] and index.rates().in_place > 0
    assert index.stats()["in_place_rate"] is not None
    index.processors = "gpu"  # GPU-only serving copies chunks in: the baseline in-place reads are measured against
    assert index.rates().in_place == 0


def test_point_lookups_calibrate_after_a_warm_tier(gen):
    """warm() fetches its keys' rows in one CSR batch, which calibrates the rates if nothing had; the first point
    batch after it calibrates them again on point lookups, and later CSR batches leave them alone."""
    keys = int64_keys("uniform", 20000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=2000)
    index.read_in_place = True
    index.warm(keys[:2000])
    assert index.stats()["rates_measured"]["cpu"] == index.stats()["rates_measured"]["in_place"] == "other"
    q = keys[torch.randint(0, keys.numel(), (40000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    got = index.lookup(q)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["rates_measured"]["cpu"] == index.stats()["rates_measured"]["in_place"] == "points"
    rates = index.rates()
    index.lookup_all(q)
    assert (index.rates().cpu, index.rates().in_place) == (rates.cpu, rates.in_place)


def test_a_rate_that_priced_its_way_out_is_calibrated_again(gen, monkeypatch):
    """A rate so low that no plan uses its way is never measured by the batches: after RATE_STALE point batches
    without a measurement, a point batch with a queue big enough to time lookups rather than a call calibrates it
    again."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys = int64_keys("uniform", 20000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=0)
    index.read_in_place = True
    q = keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    index.lookup(q)
    assert index.stats()["rates_measured"]["in_place"] == "points"
    index._cost.rate["in_place"] = 1.0  # one lookup a second: never worth a plan
    for i in range(RATE_STALE - 1):  # the batch above counts as one: its calibration came before its count
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
        assert index.stats()["last_batch"]["queries_in_place"] == 0 and index.rates().in_place == 1.0, i
    index.lookup(q)  # stale, but its queues (about 800) are too small to replace a point batch's rate
    assert index.rates().in_place == 1.0
    big = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]  # queues of about 24 k
    ways, calibrate_way = [], Calibrator.calibrate_way
    monkeypatch.setattr(Calibrator, "calibrate_way", lambda self, name, *a: (
        ways.append(name), calibrate_way(self, name, *a))[1])
    got, ref = index.lookup(big), CgRXIndex(keys).lookup(big)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert "in_place" in ways and index.rates().in_place > 1.0  # calibrated by this batch, on its point lookups
    last = [c for c in index.stats()["calibrations"] if c["way"] == "in_place"][-1]
    assert last["points"] and last["set"]


def test_a_calibration_gone_wrong_is_mended_after_rate_stale_batches(gen):
    """A fresh index's calibration once priced an H100 host's CPU at a tenth of its rate (4.8 against 42-50 M/s in
    other runs): the CPU then got only take-overs of a few queries, which never move a rate. RATE_STALE point
    batches later a calibration measures it again, and the CPU serves its share."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys = int64_keys("uniform", 200000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 19, gpu_budget=1 << 21, hot_keys=0)
    q = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]  # queues of about 24 k: big enough to time
    ref = CgRXIndex(keys).lookup(q)
    # The cache's stand-in (CPU lookups too) starts from a guess a loaded host's calibrated CPU can fall below,
    # which would hand the stand-in the whole first batch: a pessimistic guess keeps the CPU in the plan.
    index._cost.rate["gpu"] = 1e5
    index.lookup(q)
    assert index.stats()["rates_measured"]["cpu"] == "points" and index.stats()["last_batch"]["queries_cpu"] > 0
    index._cost.rate["cpu"] /= 1e4  # as if the calibration had been timed on a busy host
    for i in range(RATE_STALE + 1):  # the last one calibrates
        got = index.lookup(q)
        assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert index.stats()["last_batch"]["queries_cpu"] > 1000 and index._cost.stale_after["cpu"] == RATE_STALE


def test_calibrations_time_queries_their_warm_up_did_not_read(gen, monkeypatch):
    """Every way's calibration (here the CPU's and in place; the cache's shares the code) warms up on some of a
    queue's queries and times two slices of others: a timed slice the warm-up had read would come from the caches (on
    the H100 the CPU's rate was calibrated at 64-76 M/s that way, against 41-52 M/s in the batches after). The CPU's
    warm-up is wide enough to start its threads, whose start a timed slice would pay."""
    keys = int64_keys("uniform", 200000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 19, gpu_budget=1 << 21, hot_keys=0)
    index.read_in_place = True
    seen, way = {}, []
    calibrate_way, timed = Calibrator.calibrate_way, Calibrator.timed
    monkeypatch.setattr(Calibrator, "calibrate_way", lambda self, name, *a: (
        way.append(name), calibrate_way(self, name, *a))[1])
    monkeypatch.setattr(Calibrator, "timed", lambda self, view, batch, S, t, slices: (
        seen.setdefault(way[-1], []).extend((t.size, a, n) for a, n in slices),
        timed(self, view, batch, S, t, slices))[1])
    q = keys[torch.randint(0, keys.numel(), (120000,), generator=gen)]
    ref = CgRXIndex(keys).lookup(q)
    got = index.lookup(q)
    assert torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count)
    assert {"cpu", "in_place"} <= set(seen), seen
    for name, slices in seen.items():
        # the warm-up, then two timed sizes; two more where the CPU's threads started slowly (a busy host)
        assert len(slices) in (3, 5), (name, slices)
        (size, a0, n0), (_, a1, n1), (_, a2, n2) = slices[:3]
        assert 0 == a0 < n0 <= a1 and a1 + n1 <= a2 and a2 + n2 <= size and n1 > n2 > 0, (name, slices)
        if len(slices) == 5:
            (_, a3, n3), (_, a4, n4) = slices[3:]
            assert a2 + n2 <= a3 and a3 + n3 <= a4 and a4 + n4 <= size and n3 > n4 > 0, (name, slices)
    # the CPU's warm-up starts every thread of a parallel region (256 queries per task), or takes a quarter queue
    size, _, n0 = seen["cpu"][0]
    assert n0 >= min(size // 4, 256 * torch.get_num_threads())
    # stats() shows what each calibration timed and what it set
    shown = {c["way"]: c for c in index.stats()["calibrations"]}
    for name, slices in seen.items():
        c = shown[name]
        assert c["points"] and c["set"] and [n for n, _ in c["slices"]] == [n for _, _, n in slices]
        assert all(sec > 0 for _, sec in c["slices"]) and c["rate"] > 0 and c["fixed_s"] >= 0  # (the batch refits them)


def test_a_cpu_calibration_where_threads_start_slowly_prices_the_cpu_right(gen, monkeypatch):
    """On a host where every call that starts the CPU's threads pays milliseconds, more the more threads it wakes (GPU
    machines for minutes at a time), the two first slices' difference is mostly start-up: their fit priced the CPU
    at a tenth of its rate, out of every plan. The calibration finds the fixed time too large, times two slices wide
    enough to wake every thread and long enough for their lookups to count, and keeps that fit. Calibrations time
    that law (0.4 ms a thread woken, up to 32, and 5e7 lookups/s); the batch is real."""
    true_rate = 5e7

    def law(self, view, batch, S, t, slices):
        return [(n, 4e-4 * min(32, -(-n // 256)) + n / true_rate) for _, n in slices]

    monkeypatch.setattr(Calibrator, "timed", law)
    keys = int64_keys("uniform", 400000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 22, gpu_budget=1 << 23, hot_keys=0)
    q = keys[torch.randint(0, keys.numel(), (300000,), generator=gen)]
    got, want = index.lookup(q), CgRXIndex(keys).lookup(q)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    cpu = [c for c in index.stats()["calibrations"] if c["way"] == "cpu"][-1]
    assert len(cpu["slices"]) == 5 and all(n >= 256 * torch.get_num_threads() for n, _ in cpu["slices"][3:])
    assert 0.8 * true_rate <= cpu["rate"] <= 1.25 * true_rate, cpu
    assert cpu["fixed_s"] == pytest.approx(4e-4 * 32, rel=0.1), cpu


def test_a_cpu_calibration_on_a_quiet_host_times_two_slices(gen, monkeypatch):
    """Where the CPU's calls start quickly (the fit's fixed time under a millisecond), a calibration times its two
    slices only."""
    monkeypatch.setattr(Calibrator, "timed", _timed_at(5e7))
    keys = int64_keys("uniform", 400000, gen)
    index = chunked(keys, "cpu", chunk_bytes=1 << 22, gpu_budget=1 << 23, hot_keys=0)
    q = keys[torch.randint(0, keys.numel(), (300000,), generator=gen)]
    index.lookup(q)
    cpu = [c for c in index.stats()["calibrations"] if c["way"] == "cpu"][-1]
    assert len(cpu["slices"]) == 3 and cpu["rate"] == pytest.approx(5e7, rel=0.01)


def _timed_at(rate):
    """A stand-in for Calibrator.timed: every slice timed by a fixed law (10 us plus its lookups at ``rate``)."""
    return lambda self, view, batch, S, t, slices: [(n, 1e-5 + n / rate) for _, n in slices]


def _hot_chunk_and_calibrations(gen, monkeypatch):
    """(keys, a CPU index of small chunks, 50 keys of one chunk, the names of the rates each calibration sets)."""
    keys = torch.unique(torch.randint(-2**62, 2**62, (200000,), generator=gen))
    index = chunked(keys, "cpu", chunk_bytes=1 << 16, gpu_budget=1 << 18, hot_keys=0)
    hot = keys[1000:1050]
    assert chunk_of(index, hot ^ TOP).unique().numel() == 1
    calibrations, learn = [], CostModel.learn
    monkeypatch.setattr(CostModel, "learn", lambda self, name, samples, points, reset=False: (
        calibrations.append(name) if reset else None, learn(self, name, samples, points, reset))[1])
    return keys, index, hot, calibrations


def test_a_stale_rate_is_calibrated_after_its_wait_not_every_batch(gen, monkeypatch):
    """A calibration is a measurement: it makes the rate fresh even where its slices (at most 2^15, eight ninths of
    the queue) stay under RATE_QUEUE, else a stale rate with a largest queue of 16.9-18.7 k lookups was calibrated
    again, its fit thrown away, on every batch. Calibrations here time a fixed law (a shared 2-core host's timings
    vary 70x); the batches are real."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys, index, hot, calibrations = _hot_chunk_and_calibrations(gen, monkeypatch)
    index.read_in_place = True
    monkeypatch.setattr(Calibrator, "timed", _timed_at(2e7))

    def batch():
        return torch.cat([hot[torch.randint(0, hot.numel(), (17000,), generator=gen)],
                          keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]])

    index.lookup(batch())
    index.processors = "gpu"  # the hot chunk cached (on a GPU: its queue served from the cache, not in place)
    index.lookup(hot)
    index.processors = "auto"
    index._cost.age["in_place"], index._cost.rate["in_place"] = RATE_STALE, 1.0  # stale and priced out of every plan
    calibrations.clear()
    ref = CgRXIndex(keys)
    for _ in range(12):
        q = batch()
        got, want = index.lookup(q), ref.lookup(q)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    # Stale at the first batch; after it, again at most every RATE_STALE batches while the way stays out of the plans.
    assert 1 <= calibrations.count("in_place") <= 1 + (12 - 1) // RATE_STALE


def test_a_stale_cache_rate_is_calibrated_again(gen, monkeypatch):
    """The cache's rate, like the others, can price its way out of every plan (a wrong big-queue sample): then no
    batch measures it again. After RATE_STALE point batches a point batch with a big queue of a cached chunk
    calibrates it (once), and the cache serves again."""
    from torch_rtindex.chunked.cost import RATE_STALE
    keys, index, hot, calibrations = _hot_chunk_and_calibrations(gen, monkeypatch)

    def batch():  # a big queue for the hot (cached) chunk
        return torch.cat([hot[torch.randint(0, hot.numel(), (40000,), generator=gen)],
                          keys[torch.randint(0, keys.numel(), (4000,), generator=gen)]])

    index.processors = "gpu"  # the hot chunk cached, the cache's rate measured on its queue
    index.lookup(hot[torch.randint(0, hot.numel(), (40000,), generator=gen)])
    index.processors = "auto"
    index.lookup(batch())
    assert index.stats()["rates_measured"]["gpu"] == "points"
    index._cost.rate["gpu"] = 1.0  # one lookup a second: the plan gives the cache nothing
    ref = CgRXIndex(keys)
    calibrations.clear()
    # The calibration times a fixed law: the cache at 1e9 lookups/s (on this CPU index its reads are the CPU's own).
    monkeypatch.setattr(Calibrator, "timed", _timed_at(1e9))
    for i in range(RATE_STALE + 2):
        q = batch()
        priced_out = index.rates().gpu == 1.0
        got, want = index.lookup(q), ref.lookup(q)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
        served = index.stats()["last_batch"]["queries_gpu"]
        if priced_out and index.rates().gpu == 1.0:
            assert served == 0, i
        elif priced_out:  # this batch calibrated the cache's rate, then planned with it
            assert i <= RATE_STALE and served > 0
    assert calibrations.count("gpu") == 1


def test_queues_read_in_place_next_to_cached_ones(device, gen, monkeypatch):
    """One batch with queues served from the cache and queues read in place (on CUDA: the pinned host chunks
    through their mapped views), next to the CPU's."""
    keys = int64_keys("duplicates", 3000, gen)
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=0)
    index.lookup(keys[:1500].to(device))  # fills the cache
    assert index.stats()["resident_chunks"] > 0
    index.processors, index.read_in_place = "auto", True
    fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    index.reset_stats()
    check_all_forms(index, keys, "int64", gen, device, n_q=300)
    s = index.stats()
    assert s["queries_in_place"] > 0 and s["chunk_hits"] > 0 and s["chunk_misses"] == 0


@pytest.mark.parametrize("processors", ["auto", "cpu"])
def test_point_queues_answered_in_groups(device, gen, monkeypatch, processors):
    """Point queues of chunks holding row offsets go in groups, one operator call each: every queue the GPU reads
    in place (on a CPU index, its stand-in) of a batch in key order (the tier's misses), and the CPU worker's small
    queues; the answers are the reference's (duplicates, misses, the 64-bit edges)."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: (S.type, len(tasks)))
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([-(2**63), 2**63 - 1, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors=processors,
                    hot_keys=64 if processors == "auto" else 0,
                    cpu_group_queries=64,  # several CPU groups per batch
                    in_place_window=1 << 15)
    if processors == "auto":
        index.read_in_place = True
        index.hot_learn = False
        index.warm(keys[:8].to(device))  # the misses of a tier go to the chunks in key order
        fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
        calls.clear()
    ref = Reference(keys, "int64")
    for _ in range(3):
        q = torch.cat([point_queries(keys, 600, gen), torch.tensor([-(2**63), 2**63 - 1, 0, -1, 1, -2])])
        first, count, _ = ref.points(q)
        check_lookup(index.lookup(q.to(device)), first, count)
    if processors == "auto":  # every queue read in place: one group per batch, on the GPU's device
        assert [c[0] for c in calls] == [index.device.type] * 3 and all(n > 5 for _, n in calls)
        s = index.stats()
        assert s["hot_hits"] > 0 and s["queries_in_place"] == s["queries"] - s["hot_hits"]
        # a batch not sorted by key (the tier off): a launch per queue, whatever the window
        index.hot_tier = False
        calls.clear()
        check_lookup(index.lookup(q.to(device)), first, count)
        assert calls == [] and index.stats()["queries_in_place"] == s["queries_in_place"] + q.numel()
    else:
        assert calls and all(c[0] == "cpu" for c in calls) and max(n for _, n in calls) > 1


def test_cached_queues_join_the_in_place_launch(device, gen, monkeypatch):
    """In a batch sorted by key (the tier's misses), the cached chunks' queues go in the in-place queues' one launch,
    each read from its cache slot. The answers are the reference's (the 64-bit edges, duplicates); the stats count
    the cached chunks as hits and only the other queues' queries as read in place."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: sorted(t.resident for t in tasks))
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys[:1500].to(device))  # fills the cache
    index.processors, index.read_in_place = "auto", True
    fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)  # the GPU serves; no copies
    held = _tier_of_one_key(index, keys)
    samples = []
    monkeypatch.setattr(Executor, "learn_rates", lambda self, batch: samples.append(batch.in_place_lookups))
    cached = {i for i, c in enumerate(index.chunk_info()) if c["cached"]}
    assert 0 < len(cached) < index.num_chunks
    ref = Reference(keys, "int64")
    for n in (1, 700):
        q = torch.cat([point_queries(keys, n, gen), torch.tensor([I64_MIN, I64_MAX] * (n > 1), dtype=torch.int64)])
        q = _misses_of_the_tier(q, held, device)
        lo = _key_ordered(index, q, device)
        ids = chunk_of(index, lo)
        in_cached = sum(int((ids == c).sum()) for c in cached)
        hit_chunks = sum(int((ids == c).any()) for c in cached)
        calls.clear()
        samples.clear()
        index.reset_stats()
        _lookup_key_ordered(index, q, ref)
        s = index.stats()
        assert s["queries_gpu"] == lo.numel() and s["queries_in_place"] == lo.numel() - in_cached
        # the in-place rate's samples: the one launch's in-place queries, and their share of its time by the planned
        # rates (equal here: by count)
        if n > 1:
            ((_, _, m, share),) = samples[0]
            assert m == lo.numel() - in_cached and share == pytest.approx(m / lo.numel())
        assert s["chunk_hits"] == hit_chunks and s["chunk_misses"] == 0
        queues = hit_chunks + len(set(ids.tolist()) - cached)
        if n > 1:
            assert hit_chunks > 0 and queues > hit_chunks + 1
            assert calls == [[False] * (queues - hit_chunks) + [True] * hit_chunks]  # one launch for every queue
        else:
            assert calls == []  # one queue: a launch of its own


def test_cached_queues_join_no_launch_without_in_place_reads(device, gen, monkeypatch):
    """With the GPU reading nothing in place (read_in_place off), a batch sorted by key keeps a launch per cached
    queue: cached queues join only a launch that reads some queue in place."""
    calls = _recorded_groups(monkeypatch, lambda tasks, S: len(tasks))
    keys = int64_keys("uniform", 3000, gen)
    index = chunked(keys.to(device), device, gpu_budget=1 << 20, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys.to(device))  # every chunk cached
    assert all(c["cached"] for c in index.chunk_info())
    index.processors, index.read_in_place = "auto", False
    fixed_rates(index, monkeypatch, cpu=1e3, copy=1e12, gpu=1e9, in_place=1e9)
    q = _misses_of_the_tier(point_queries(keys, 500, gen), _tier_of_one_key(index, keys), device)
    lo = _key_ordered(index, q, device)
    index.reset_stats()
    _lookup_key_ordered(index, q, Reference(keys, "int64"))
    s = index.stats()
    assert calls == [] and s["chunk_hits"] > 1 and s["queries_in_place"] == 0 and s["queries_gpu"] == lo.numel()


def test_cached_queue_evicted_by_an_in_place_view_is_read_in_place(device, gen, monkeypatch):
    """Making a chunk's in-place view can carve its search part out of the cache's shared slab and evict the cached
    chunks there (on CUDA), the one launch's own among them: such a queue is read in place instead of from its old
    slot. Forced here on both devices: every cached chunk evicted and its slot overwritten as a view is made; the
    answers stay the reference's and no evicted chunk counts as a hit."""
    keys = torch.cat([int64_keys("duplicates", 3000, gen), torch.tensor([I64_MIN, I64_MAX, 0, -1])])
    index = chunked(keys.to(device), device, gpu_budget=DUP_BUDGET, processors="gpu", hot_keys=8)
    index.hot_learn = False
    index.lookup(keys[:1500].to(device))  # fills the cache
    index.processors, index.read_in_place = "auto", True
    fixed_rates(index, monkeypatch, cpu=1e3, copy=1.0, gpu=1e9, in_place=1e9)
    held = _tier_of_one_key(index, keys)
    plain, evicted = ChunkStore.in_place_view, []

    def evicting(store, chunk):  # the store's cache is the index's
        if device == "cuda":
            torch.cuda.synchronize()  # the earlier lookups are done with the slots overwritten here
        for c, e in list(store.cache.entries.items()):
            e.arena.storage()[e.off : e.off + align(c.nbytes)].fill_(0xFF)
            store.cache.evict(c)
            evicted.append(c)
        return plain(store, chunk)

    monkeypatch.setattr(ChunkStore, "in_place_view", evicting)
    q = _misses_of_the_tier(torch.cat([point_queries(keys, 700, gen), torch.tensor([I64_MIN, I64_MAX])]),
                            held, device)
    lo = _key_ordered(index, q, device)
    index.reset_stats()
    _lookup_key_ordered(index, q, Reference(keys, "int64"))
    s = index.stats()
    assert evicted and s["chunk_hits"] == 0 and s["queries_in_place"] == lo.numel()


def test_lookup_queues_operator(device, gen):
    """rtindex_internal.cgrx_lookup_queues over separate cgRX indexes: each queue's answers equal its own index's
    lookup with the base added; empty queues; clear errors for mismatched lists and queues out of bounds."""
    ops = torch.ops.rtindex_internal
    parts = [int64_keys("duplicates", 500, gen), int64_keys("uniform", 300, gen), torch.tensor([5, 5, 7])]
    indexes = [CgRXIndex(k.to(device)) for k in parts]
    queries = torch.cat([k[torch.randint(0, k.numel(), (50,), generator=gen)] for k in parts] + [torch.tensor([9, -9])])
    queries = queries.to(device)
    ordered = torch.ops.rtindex.map_keys(queries, 0)
    starts, sizes, bases = [0, 50, 100, 100, 150], [50, 50, 0, 50, 2], [0, 2**40, 7, 3, 0]
    use = [0, 1, 2, 2, 2]
    lead = [indexes[j]._lead for j in use]
    cfg = indexes[0]._cfg_ordered
    first, count = ops.cgrx_lookup_queues([x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], cfg,
                                          ordered, starts, sizes, bases)
    at = 0
    for j, a, n, b in zip(use, starts, sizes, bases):
        want = indexes[j].lookup(queries[a : a + n])
        got_first, got_count = first[at : at + n], count[at : at + n]
        assert torch.equal(got_count, want.count)
        assert torch.equal(got_first, torch.where(want.count > 0, want.first_row + b, -1))
        at += n
    assert at == first.numel() == 152
    torch.library.opcheck(ops.cgrx_lookup_queues.default, ([x[0] for x in lead], [x[1] for x in lead],
                                                           [x[2] for x in lead], cfg, ordered, starts, sizes, bases, 64))
    for window in (1, 64, 0):  # any window, the same answers
        again = ops.cgrx_lookup_queues([x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], cfg, ordered,
                                       starts, sizes, bases, window)
        assert torch.equal(again[0], first) and torch.equal(again[1], count)
    empty = ops.cgrx_lookup_queues([], [], [], cfg, ordered, [], [], [])
    assert empty[0].numel() == 0 and empty[1].numel() == 0
    x = lead[0]
    with pytest.raises(RuntimeError, match="one pairs, reps, table, start, size and base per queue"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0, 1], [1], [0])
    with pytest.raises(RuntimeError, match="is not within the 152 queries"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [150], [3], [0])
    with pytest.raises(RuntimeError, match="bases must be >= 0"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0], [3], [-1])
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        ops.cgrx_lookup_queues([x[0]], [x[1]], [x[2]], cfg, ordered, [0], [3], [0], -5)
