"""The out-of-core index's planner (plan, Scheduler) and the rates it prices queues with (Rates), through their
own APIs: assignments against brute-force makespans, hand-outs and take-overs."""

from __future__ import annotations

import random

import pytest

from torch_rtindex.chunked.cost import CPU_GROUP_QUERIES, Rates
from torch_rtindex.chunked.planner import Scheduler, Task, plan
from torch_rtindex.chunked.store import Chunk


def _task(size, resident=False, fits=True, nbytes=256):
    return Task(Chunk(0, 1, 0, 0, 0, [], nbytes, None), 0, size, resident, fits)


def _makespan(gpu_tasks, cpu_tasks, rates):
    return max(sum(rates.gpu_s(t) for t in gpu_tasks), rates.cpu_end(cpu_tasks))


def test_plan_assigns_by_projected_finish():
    rates = Rates(cpu=1.0, copy=256.0, gpu=1e9)  # a chunk of 256 * k bytes takes k s to copy; a query 1 s on the CPU
    d, a, b, c = _task(5, True), _task(10, nbytes=1024), _task(3, nbytes=1024), _task(2, nbytes=1024)
    huge = _task(1, fits=False)
    g, p = plan([a, b, c, d, huge], rates)
    # by CPU/GPU cost ratio: d (resident) and a to the GPU (finish 4 s); huge (forced), then b and c to the CPU
    # (1 + 3 + 2 = 6 s) since the GPU would finish each later (8 s)
    assert g == [d, a] and p == [huge, c, b]
    assert plan([a, b, c, d, huge], rates, cpu=False) == ([d, a, b, c], [huge])  # GPU only: all that fits
    assert plan([a, b, c, d], rates, gpu=False) == ([], [c, b, d, a])
    assert plan([a, b, c, d], rates, critical_mass=4) == ([d, a], [c, b])  # manual: resident or >= 4 queries
    # a slow CPU gets nothing it could avoid; a fast one takes the queues it finishes first
    assert plan([a, b, c, d], Rates(cpu=1e-3, copy=256.0, gpu=1e9))[1] == []
    assert plan([a, b, c], Rates(cpu=1e9, copy=256.0, gpu=1e9))[0] == []


def test_plan_is_a_near_optimal_makespan_and_never_gives_the_cpu_a_later_finish():
    rng = random.Random(3)
    for trial in range(300):
        # every other trial with the GPU's third way, reading a queue's chunk in place; every third with fixed
        # times per queue, and then queues the CPU groups in calls (whole calls count)
        fixed = [rng.uniform(0, 2) if trial % 3 == 0 else 0.0 for _ in range(3)]
        rates = Rates(cpu=rng.uniform(0.5, 5), copy=256.0 * rng.uniform(0.5, 5), gpu=rng.uniform(5, 100),
                      in_place=rng.uniform(0.5, 20) if trial % 2 else 0.0, cpu_call_s=fixed[0],
                      gpu_queue_s=fixed[1], in_place_queue_s=fixed[2], cpu_group_queries=48)  # a few queues a call
        tasks = [_task(rng.randint(1, 40), rng.random() < 0.3, True, 256 * rng.randint(1, 8)) for _ in range(7)]
        for t in tasks:
            t.grouped = trial % 3 == 0 and rng.random() < 0.7
        g, p = plan(tasks, rates)
        assert sorted(map(id, g + p)) == sorted(map(id, tasks))
        best = min(_makespan([t for i, t in enumerate(tasks) if m >> i & 1], [t for i, t in enumerate(tasks) if not m >> i & 1], rates)
                   for m in range(1 << len(tasks)))
        got = _makespan(g, p, rates)
        # Not a theorem (a greedy balance can be further off): a regression guard over these seeded cases.
        slack = max(min(rates.gpu_s(t), rates.cpu_s(t)) for t in tasks) + rates.cpu_call_s  # a call's step
        assert got <= best + slack + 1e-9, trial
        assert got <= min(_makespan(tasks, [], rates), _makespan([], tasks, rates)) + 1e-9
        # the CPU keeps no queue whose move to the GPU would end the batch sooner
        g_end = sum(rates.gpu_s(t) for t in g)
        c_end = rates.cpu_end(p)
        for t in p:
            rest = rates.cpu_end([u for u in p if u is not t])
            assert max(g_end + rates.gpu_s(t), rest) >= max(g_end, c_end) - 1e-9, trial


def test_plan_on_a_batch_like_the_2_20_case():
    """71 chunks of 239 MB, a quarter resident, 2^20 uniform queries: the CPU (6.5 M/s) and the copies (50 GB/s)
    share the batch; neither alone, and the CPU's share is well under the old 91%."""
    rates = Rates(cpu=6.5e6, copy=50e9, gpu=2e9)
    tasks = [_task(14768, i < 17, True, 239 << 20) for i in range(71)]
    g, p = plan(tasks, rates)
    share = sum(t.size for t in p) / sum(t.size for t in tasks)
    assert 0.2 < share < 0.8 and all(t.resident for t in tasks if t in g[:17])
    assert _makespan(g, p, rates) < 0.6 * min(_makespan(tasks, [], rates), _makespan([], tasks, rates))


def test_plan_reads_queues_in_place_that_cannot_pay_for_a_copy():
    rates = Rates(cpu=1.0, copy=256.0, gpu=1e9, in_place=2.0)  # a 1024-byte chunk copies in 4 s; in place 0.5 s/query
    small, big, cached = _task(3, nbytes=1024), _task(20, nbytes=1024), _task(3, True, nbytes=1024)
    assert rates.reads_in_place(small) and rates.gpu_s(small) == 1.5
    assert not rates.reads_in_place(big) and rates.gpu_s(big) == 4.0  # 10 s in place against a 4 s copy
    assert not rates.reads_in_place(cached)  # a cached chunk is read from the cache
    assert not Rates(cpu=1.0, copy=256.0, gpu=1e9).reads_in_place(small)  # 0: not an option
    # the 2^20-batch case: 71 chunks of 239 MB, 14768 queries each. In place at 50 M lookups/s a queue takes
    # 0.3 ms against a 5 ms copy: the GPU reads the uncached chunks in place and takes most of the batch
    tasks = [_task(14768, i < 17, True, 239 << 20) for i in range(71)]
    with_, without = Rates(6.5e6, 50e9, 2e9, in_place=5e7), Rates(6.5e6, 50e9, 2e9)
    g, p = plan(tasks, with_)
    assert sum(t.size for t in g) > 0.8 * sum(t.size for t in tasks)
    assert _makespan(g, p, with_) < 0.25 * _makespan(*plan(tasks, without), without)


def test_scheduler_hands_out_plans_and_lets_an_idle_processor_take_over():
    rates = Rates(cpu=1.0, copy=256.0, gpu=1e9)
    d, a, b, c = _task(5, True), _task(10, nbytes=1024), _task(3, nbytes=1024), _task(2, nbytes=1024)
    s = Scheduler([a, b, c, d], gpu=True, cpu=True, rates=rates)
    assert s.claim("gpu") is d and s.claim("gpu") is a
    # the GPU has run out: it takes the CPU's last queue (b: 4 s on the GPU < the CPU's 5 s backlog)
    assert s.claim("gpu") is b and b.proc == "gpu"
    assert s.claim("gpu") is None  # c: 4 s on the GPU, the CPU's backlog is 2 s: the CPU keeps it
    assert s.claim("cpu") is c and s.claim("cpu") is None and s.tasks == []
    only = Scheduler([_task(1), _task(5, fits=False)], gpu=True, cpu=False, rates=rates)
    assert only.claim("gpu").size == 1 and only.claim("gpu") is None and only.claim("cpu").size == 5


def test_cpu_calls_are_priced_as_the_cpu_makes_them():
    """Grouped CPU queues pay whole calls; a queue of CPU_GROUP_QUERIES or more is one call of its own; a queue the
    idle CPU takes over is answered alone, a whole call (a share priced it at almost nothing)."""
    G = CPU_GROUP_QUERIES
    rates = Rates(cpu=1e8, copy=1e9, gpu=1e9, in_place=1.6e8, cpu_call_s=7e-4, in_place_queue_s=4e-5)
    big = _task(26 * G)
    big.grouped = True
    assert rates.cpu_end([big]) == pytest.approx(26 * G / 1e8 + 7e-4)  # one call, not 26
    small = [_task(300, nbytes=1 << 30) for _ in range(12)]
    for t in small:
        t.grouped = True
    assert rates.cpu_end(small) == pytest.approx(3600 / 1e8 + 7e-4)  # one call for all twelve
    g, c = plan(small, rates)
    assert c == [] and len(g) == 12  # in place: 12 x 42 us, against a 0.7 ms call
    s = Scheduler(small, gpu=True, cpu=True, rates=rates)
    assert s.claim("cpu") is None  # one queue alone costs the CPU a call, more than the GPU's whole backlog
    assert [s.claim("gpu") for _ in range(12)] == small
