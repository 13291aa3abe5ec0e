"""The out-of-core index's cost model through its own API: the fit of a fixed time and a rate (CostFit), the
rates learned from calibrations and batches and when they are due again (CostModel), calibration slices, and the
stats that keep calibrations."""

from __future__ import annotations

import math
import random

import pytest
import torch

from torch_rtindex.chunked.cost import CPU_GROUP_QUERIES, CostFit, CostModel, Rates, calibration_slices
from torch_rtindex.chunked.executor import Batch
from torch_rtindex.chunked.planner import Task, plan
from torch_rtindex.chunked.store import Chunk


def _task(size, resident=False, fits=True, nbytes=256):
    return Task(Chunk(0, 1, 0, 0, 0, [], nbytes, None), 0, size, resident, fits)


def test_rates_are_fitted_with_a_fixed_time_per_queue():
    """A queue's or call's time is a fixed part plus its lookups at the rate: lookups over seconds of a batch of
    tiny queues is mostly the fixed part (such a rate, 45 M/s from queues of 2.7 k, once priced in-place reads out
    of every later batch; 7.5 M/s from a 21.7 k-query CPU batch starved the CPU). The fit keeps the two apart."""
    from types import SimpleNamespace

    cost = CostModel(cuda=False)
    learn = lambda b: cost.learn_batch(b, {"cpu": True, "in_place": False, "gpu": True})  # noqa: E731

    def batch(in_place=(), gpu=(), cpu=(), points=True):
        return SimpleNamespace(points=points, cpu_calls=list(cpu), cpu_copy_bytes=0, cpu_copy_time=0.0, copies=[],
                               in_place_lookups=[(None, s, n, 1.0) for n, s in in_place],
                               gpu_lookups=[(None, s, n, 1.0) for n, s in gpu])

    def queues(n, rate, fixed, k=55, spread=0.1):  # k queues around n lookups: fixed + n / rate seconds each
        sizes = [int(n * (1 + spread * (2 * i / (k - 1) - 1))) for i in range(k)]
        return [(m, fixed + m / rate) for m in sizes]

    # The chunked_hot history: big in-place queues, then a batch of tiny ones, then big ones again.
    learn(batch(in_place=queues(250_000, 1.6e8, 40e-6)))
    assert cost.rate["in_place"] == pytest.approx(1.6e8, rel=0.05)  # the fixed part is under 3% of these queues
    learn(batch(in_place=queues(2_700, 1.6e8, 40e-6)))
    assert cost.rate["in_place"] == pytest.approx(1.6e8, rel=0.05)  # not 2.7 k / 57 us = 47 M/s
    assert cost.fixed_s["in_place"] == pytest.approx(40e-6, rel=0.1)
    for _ in range(20):  # tiny queues only, for long: the sizes no longer vary, the rate stays
        learn(batch(in_place=queues(2_700, 1.6e8, 40e-6)))
    assert cost.rate["in_place"] == pytest.approx(1.6e8, rel=0.1)
    r = cost.rates(in_place=True)
    assert r.in_place_queue_s == pytest.approx(40e-6, rel=0.15) and cost.summary()["in_place_rate"] == cost.rate["in_place"]
    # The CPU's calls likewise: big calls, then a batch of small ones, 0.7 ms each.
    learn(batch(cpu=queues(2_400_000, 4.5e7, 7e-4, k=4)))
    for _ in range(30):  # calls whose time is 94% the fixed part, for long
        learn(batch(cpu=queues(2_700, 4.5e7, 7e-4, k=3, spread=0.5)))
    assert cost.rate["cpu"] == pytest.approx(4.5e7, rel=0.02) and cost.fixed_s["cpu"] == pytest.approx(7e-4, rel=0.02)
    # Batches without a way's samples leave its history as it is: one slow queue later moves it, not resets it.
    learn(batch(gpu=queues(100_000, 1e9, 4e-5, spread=0.5)))
    for _ in range(12):
        learn(batch())
    learn(batch(gpu=[(100_000, 2 * (4e-5 + 1e-4))]))
    assert cost.rate["gpu"] > 0.8e9
    # A clock too coarse for a sample (0 s) changes nothing, rather than setting a rate of 0.
    rates = cost.rates(in_place=False)
    learn(batch(cpu=[(4096, 0.0)], gpu=[(4096, 0.0)], in_place=[(4096, 0.0)]))
    assert cost.rates(in_place=False) == rates
    # A pessimistic rate with only small calls to learn from rises to what they show (the old rule learned from
    # 2^14+ queries alone and kept it).
    cost.rate["cpu"], cost.fixed_s["cpu"], cost.measured["cpu"] = 2e6, 0.0, False
    for _ in range(3):
        learn(batch(cpu=[(4000, 4000 / 7.8e6)] * 4))
    assert cost.rate["cpu"] == pytest.approx(7.8e6, rel=0.01)
    # Rates are for point lookups: a CSR or range batch (like warm()'s row fetch) sets one only until a point
    # batch has measured it; the first point batch starts the fit over.
    learn(batch(cpu=[(40000, 40000 / 1e6)], points=False))
    assert cost.rate["cpu"] == pytest.approx(7.8e6, rel=0.01)
    cost.measured["cpu"] = False
    learn(batch(cpu=[(40000, 40000 / 1e6)], points=False))
    assert cost.rate["cpu"] == pytest.approx(1e6) and cost.measured["cpu"] == "other"
    assert cost.uncalibrated("cpu", True) and not cost.uncalibrated("cpu", False)
    learn(batch(cpu=[(40000, 40000 / 5e7)]))
    assert cost.rate["cpu"] == pytest.approx(5e7) and not cost.uncalibrated("cpu", True)
    # The plan prices the fixed parts: a queue of 10 lookups in place costs 1 ms, so the CPU (1 us a query) takes
    # it; a big one still goes in place; grouped CPU queues share a call's fixed time.
    rates = Rates(cpu=1e6, copy=1e3, gpu=1e9, in_place=1e8, in_place_queue_s=1e-3, cpu_call_s=1e-3)
    tiny, big = _task(10, nbytes=1 << 20), _task(1 << 20, nbytes=1 << 20)
    assert rates.gpu_s(tiny) == pytest.approx(1e-3 + 1e-7) and rates.reads_in_place(tiny)  # a copy costs more
    assert rates.gpu_s(big) == pytest.approx(1e-3 + (1 << 20) / 1e8)
    tiny.grouped = True
    assert rates.cpu_s(tiny) == pytest.approx(1e-5 + 1e-3 * 10 / CPU_GROUP_QUERIES)
    g, c = plan([tiny, big], rates)
    assert g == [big] and c == [tiny]
    assert Rates(cpu=1e6, copy=1e3, gpu=1e9, gpu_queue_s=1e-3).gpu_s(_task(10, resident=True)) == pytest.approx(1e-3 + 1e-8)


def test_cost_fit_stays_finite_and_positive():
    """CostFit over random sample streams (sizes from 1 to 2^27, noisy times, repeats, lone samples, some without
    time): every solve gives a finite positive rate and a finite fixed time of at least 0."""

    rng = random.Random(11)
    for trial in range(300):
        fit, fixed, rate = CostFit(), 0.0, 0.0
        true_fixed, true_rate = rng.choice([0.0, 1e-5, 7e-4]), rng.choice([1e6, 1.6e8, 1e10])
        for _ in range(rng.randint(1, 12)):
            fit.decay()
            same = rng.random() < 0.3
            base = rng.choice([1, 100, 2700, 250_000, 1 << 27])
            for _ in range(rng.randint(1, 6)):
                n = base if same else max(1, int(base * rng.uniform(0.5, 1.5)))
                t = 0.0 if rng.random() < 0.05 else (true_fixed + n / true_rate) * rng.uniform(0.7, 1.3)
                fit.add(n, t)
            fixed, rate, _ = fit.solve(fixed, rate)
            if fit.w > 0:
                assert math.isfinite(rate) and rate > 0 and math.isfinite(fixed) and fixed >= 0, trial


@pytest.mark.parametrize("size", [256, 512, 16640, 16896, 32768, 10**6])
@pytest.mark.parametrize("threads", [1, 2, 16])
def test_calibration_slices_are_disjoint_and_in_the_queue(size, threads):
    """Every queue a calibration may take (256 lookups and up), with the warm-up of either device: three non-empty
    slices one after the other within the queue, the timed ones of two sizes."""
    for warm in (min(size // 8, 256), min(size // 4, 256 * threads)):
        (a0, n0), [(a1, n1), (a2, n2)] = calibration_slices(size, warm)
        assert a0 == 0 and n0 == warm > 0 and a1 == n0 and a2 == a1 + n1 and a2 + n2 <= size
        assert n1 > n2 > 0 and n1 <= 1 << 15


def test_stats_keep_the_last_calibrations_as_copies():
    """Stats keep the latest CALIBRATIONS_KEPT calibrations, hand out copies, and reset empties them."""
    from torch_rtindex.chunked.stats import CALIBRATIONS_KEPT, Stats

    stats = Stats()
    for i in range(CALIBRATIONS_KEPT + 3):
        stats.calibration({"way": "cpu", "points": True, "slices": [[256, 1e-4], [4096, 1e-3], [512, 2e-4]],
                           "rate": 1e6 + i, "fixed_s": 1e-5, "set": True})
    kept = stats.copy()["calibrations"]
    assert len(kept) == CALIBRATIONS_KEPT and kept[-1]["rate"] == 1e6 + CALIBRATIONS_KEPT + 2
    assert kept[0]["rate"] == 1e6 + 3  # the oldest dropped
    kept[-1]["slices"].append([1, 1.0])
    kept[-1]["rate"] = -1
    again = stats.copy()["calibrations"][-1]
    assert len(again["slices"]) == 3 and again["rate"] > 0
    stats.reset()
    assert stats.copy()["calibrations"] == []


def _calibration(rate, fixed=1e-4):
    """A calibration's two timed slices (2^15 and 2^12 lookups) of a way with this rate and fixed time."""
    return [(n, fixed + n / rate) for n in (1 << 15, 1 << 12)]


def test_tiny_samples_do_not_keep_a_rate_fresh(gen):
    """A way priced out of every plan still gets the idle CPU's take-overs of a few leftover queries (an H100 run:
    the CPU at 3 M/s, 2-4 queries per uniform 2^27 batch). Such calls time their fixed cost, not lookups: they
    must not reset the rate's age, or its recalibration after RATE_STALE point batches never comes."""
    from torch_rtindex.chunked.cost import RATE_QUEUE, RATE_STALE
    cost = CostModel(cuda=False)
    cost.learn("cpu", _calibration(5e6), True, reset=True)
    cost.age["cpu"] = RATE_STALE - 1
    cost.learn("cpu", [(4, 0.8e-3), (2, 0.7e-3)], True)
    assert cost.age["cpu"] == RATE_STALE - 1
    cost.age["cpu"] += 1  # the next point batch's count (_learn_rates)
    assert cost.uncalibrated("cpu", True)
    cost.learn("cpu", [(5000, 1e-4 + 5000 / 5e6)], True)  # a mid-size call may time its call as much: not fresh
    assert cost.age["cpu"] == RATE_STALE
    cost.learn("cpu", [(RATE_QUEUE, 1e-4 + RATE_QUEUE / 5e6)], True)  # a big call's lookups: the CPU is in the plans
    assert cost.age["cpu"] == 0 and not cost.uncalibrated("cpu", True)


@pytest.mark.parametrize("calibrated, call", [(4.8e6, 1500), (4.8e6, 12000), (4.5e8, 1 << 14)])
def test_a_wrong_rate_is_not_kept_fresh_by_samples_that_do_not_time_it(gen, calibrated, call):
    """A review's cases, the true CPU rate 45 M/s: a rate calibrated ten times too low or too high, then every batch
    the idle CPU's take-overs (their calls' fixed cost) and one more call. A mid-size call escapes the fixed-only
    filter at a low rate; a big one at a high rate is explained by the fixed time the take-overs set, so the fit
    keeps the rate. Neither times it: the rate goes stale and is calibrated again."""
    from torch_rtindex.chunked.cost import RATE_STALE
    cost = CostModel(cuda=False)
    cost.learn("cpu", _calibration(calibrated), True, reset=True)
    stale = []
    for _ in range(2 * RATE_STALE):  # the first batch's fit, with the calibration's samples, may still time it
        cost.age["cpu"] += 1  # the point batch's count (_learn_rates)
        cost.learn("cpu", [(3, 0.8e-3), (7, 0.7e-3), (call, 0.75e-3 + call / 45e6)], True)
        stale.append(cost.uncalibrated("cpu", True))
    assert any(stale)


def test_a_point_rate_does_not_start_from_take_overs(gen):
    """Where a point batch calibrates nothing (every queue under a calibration's smallest slice), its take-overs of a
    few queries would start the rate from their call's cost (a few thousand lookups/s) and count as measured: the
    next big batch would not calibrate. Such samples are left out until a calibration or a big enough sample."""
    from torch_rtindex.chunked.cost import RATE_MIN_SAMPLE
    cost = CostModel(cuda=False)
    guess = cost.rate["cpu"]
    cost.learn("cpu", [(3, 0.8e-3), (2, 0.7e-3)], True)
    assert cost.rate["cpu"] == guess and not cost.measured["cpu"] and cost.uncalibrated("cpu", True)
    cost.learn("cpu", [(RATE_MIN_SAMPLE, 1e-4 + RATE_MIN_SAMPLE / 4.5e7)], True)
    assert cost.measured["cpu"] == "points"


def test_take_overs_of_a_few_queries_do_not_drag_a_rate_down(gen):
    """The idle CPU's take-overs of 2-4 leftover queries pay a whole call (0.7-0.8 ms); fed to the fit as lookups
    they pulled a measured CPU rate towards a few M/s within RATE_STALE batches. They refine the fixed time only."""
    cost = CostModel(cuda=False)
    cost.learn("cpu", _calibration(5e7), True, reset=True)
    assert cost.rate["cpu"] == pytest.approx(5e7, rel=0.01)
    for _ in range(40):
        cost.learn("cpu", [(4, 0.8e-3), (2, 0.7e-3)], True)
    assert cost.rate["cpu"] == pytest.approx(5e7, rel=0.01) and cost.fixed_s["cpu"] == pytest.approx(0.75e-3, rel=0.01)
    cost.learn("cpu", [(1 << 16, 0.75e-3 + (1 << 16) / 2e7), (1 << 13, 0.75e-3 + (1 << 13) / 2e7)], True)
    assert cost.rate["cpu"] < 4e7  # calls big enough to time lookups still move it


def test_the_wait_for_a_recalibration_backs_off_while_it_confirms_the_rate(gen):
    """A recalibration of a stale rate that finds it within RATE_CONFIRM doubles the wait for the next (up to
    RATE_STALE_MAX point batches: a way rightly out of the plans pays rarely); one that moves the rate, or a batch
    that measures it, starts the wait over."""
    from torch_rtindex.chunked.cost import RATE_CONFIRM, RATE_STALE, RATE_STALE_MAX
    cost = CostModel(cuda=False)

    def calibrate(rate):
        cost.age["cpu"] = cost.stale_after["cpu"]  # stale
        assert cost.uncalibrated("cpu", True)
        cost.learn("cpu", _calibration(rate), True, reset=True)
        assert cost.age["cpu"] == 0 and cost.rate["cpu"] == pytest.approx(rate)
        return cost.stale_after["cpu"]

    cost.learn("cpu", _calibration(5e7), True, reset=True)
    assert cost.stale_after["cpu"] == RATE_STALE  # a first calibration sets no wait
    waits = [calibrate(5e7 * RATE_CONFIRM ** (i % 2 * 0.9)) for i in range(6)]  # each within RATE_CONFIRM
    assert waits == [min(RATE_STALE << i, RATE_STALE_MAX) for i in range(1, 7)]
    assert calibrate(5e6) == RATE_STALE  # moved tenfold
    calibrate(5e6)
    assert cost.stale_after["cpu"] == 2 * RATE_STALE
    cost.learn("cpu", [(1 << 16, 1e-4 + (1 << 16) / 5e6)], True)  # a batch measured it
    assert cost.stale_after["cpu"] == RATE_STALE and cost.age["cpu"] == 0


def test_the_cache_rate_is_learned_from_big_queues_only():
    """Cached queues of a few thousand lookups (a tiered batch's only cached ones), timed mostly by the host issuing
    them, once priced the cache below the in-place reads, and the next uniform batch read every chunk in place
    instead of copying. Queues under RATE_QUEUE leave the cache's rate alone; big ones set it."""
    cost = CostModel(cuda=False)
    on = {"cpu": True, "in_place": False, "gpu": True}
    before = cost.rates(in_place=False).gpu
    small = Batch("lookup", torch.arange(10), None, None, torch.device("cpu"), None)
    small.gpu_lookups = [(None, 280e-6, 15000, 1.0), (None, 200e-6, 3700, 1.0)]  # what the H100 run timed: 53-80 M/s
    cost.learn_batch(small, on)
    assert cost.rates(in_place=False).gpu == before
    big = Batch("lookup", torch.arange(10), None, None, torch.device("cpu"), None)
    big.gpu_lookups = [(None, 1e-3, 1 << 21, 1.0), (None, 0.3e-3, 1 << 18, 1.0)]
    cost.learn_batch(big, on)
    assert cost.rates(in_place=False).gpu != before and cost.rates(in_place=False).gpu > 1e9
