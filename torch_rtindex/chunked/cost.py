"""The cost model the planner prices queues with: :class:`Rates` (what one batch is planned with), the fit of a
fixed time plus a rate per lookup way (:class:`CostFit`) and :class:`CostModel`, which keeps each way's rate and
learns it from calibrations and from every batch's measured queues.

Ways: ``cpu`` (lookups from the host copies), ``copy`` (bytes/s into the cache), ``gpu`` (lookups from the cache)
and ``in_place`` (the GPU reading a chunk in pinned host memory). A queue (a CPU call) costs a fixed time plus its
lookups at a rate, both fitted to the measured queues of recent batches: lookups over seconds of tiny queues is
mostly their fixed time, not a rate. The copy rate is an exponential average. Rates are those of point lookups:
a batch of another form sets one only until a point batch has measured it, and a point batch calibrates the
CPU's, the in-place or the cache's rate again when RATE_STALE point batches have not measured it (a rate that
priced its way out of every plan), a wait that doubles, up to RATE_STALE_MAX batches, while such recalibrations
confirm the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from .store import align

if TYPE_CHECKING:
    from .planner import Task

Way = Literal["cpu", "copy", "gpu", "in_place"]
LOOKUP_WAYS = ("cpu", "in_place", "gpu")

# The CPU worker answers small point queues in groups of about this many queries, one call over all cores (a
# queue alone would pay its call and a parallel region); the rest stay claimable, by the GPU too.
CPU_GROUP_QUERIES = 1 << 16
# A stale rate (below) is calibrated again only on a slice of at least this many lookups: a smaller one's time is
# mostly its fixed cost. The cache's rate is learned only from queues this large: a smaller cached queue's time is
# mostly the host issuing it while the GPU waits, which varies with the batch around it, so no fixed time fitted
# on one batch takes it out of another's (small cached queues of tiered batches once priced the cache below the
# in-place reads, and a uniform batch then read every chunk in place instead of copying).
RATE_QUEUE = 1 << 14
# A point batch calibrates a lookup way's rate again once RATE_STALE point batches have not timed it on a queue or
# call of RATE_QUEUE+ lookups: a rate that prices its way out of every plan is never measured by the batches, right
# or wrong (a calibration timed while the host was busy once priced the CPU at a tenth of its rate). A
# recalibration within RATE_CONFIRM of the way's last calibration doubles its wait for the next, up to
# RATE_STALE_MAX batches (a way rightly out of the plans, or one whose queues are all small, pays rarely); one that
# differs more, or a batch that times the rate, starts the wait over.
RATE_STALE, RATE_STALE_MAX, RATE_CONFIRM = 4, 64, 1.5
# A lookup way's rate that no calibration has set for a kind of batch (its queues too small to time one) is learned
# from the batches' samples of at least this many lookups (a calibration's smallest queue).
RATE_MIN_SAMPLE = 256
# A calibration on the CPU whose fit finds a fixed time above CPU_SLOW_START_S timed slices too short for the host:
# on some GPU machines a call that starts the CPU's threads takes milliseconds for minutes at a time (likely idle
# virtual CPUs waking), more the more threads it wakes, so the two default slices priced the CPU far below its rate,
# out of every plan (benchmarks/results/). It then times two more slices, up to CPU_SLOW_START_SLICE lookups and an
# eighth of that, each waking every thread (:func:`slow_start_slices`), and keeps their fit.
CPU_SLOW_START_S, CPU_SLOW_START_SLICE = 1e-3, 1 << 20


@dataclass(frozen=True)
class Rates:
    """What the planner assumes of the machine: CPU lookups/s (from the host copies), bytes/s copied into the
    cache, GPU lookups/s (from the cache) and GPU lookups/s reading a chunk in place in pinned host memory
    (``in_place``; 0: not an option for this batch); and the fixed seconds of a CPU call (``cpu_call_s``), a GPU
    queue served from the cache (``gpu_queue_s``) and one read in place (``in_place_queue_s``): a queue costs its
    fixed time plus its lookups at the rate; the CPU's grouped queues pay a call per CPU_GROUP_QUERIES of them,
    whole calls (:meth:`cpu_end`)."""

    cpu: float
    copy: float
    gpu: float
    in_place: float = 0.0
    cpu_call_s: float = 0.0
    gpu_queue_s: float = 0.0
    in_place_queue_s: float = 0.0
    cpu_group_queries: int = CPU_GROUP_QUERIES

    def cpu_s(self, t: "Task") -> float:
        """``t``'s CPU seconds alone (a grouped queue: its share of a call's fixed time)."""
        seconds, grouped = self.cpu_part(t)
        return seconds + self.cpu_call_s * grouped / self.cpu_group_queries

    def cpu_part(self, t: "Task") -> tuple[float, int]:
        """``t``'s CPU seconds but a grouped queue's call, and its queries that join a group (for cpu_finish). A
        queue of cpu_group_queries or more is answered alone, in one call."""
        grouped = t.grouped and t.size < self.cpu_group_queries
        return t.size / self.cpu + (0.0 if grouped else self.cpu_call_s), t.size if grouped else 0

    def cpu_finish(self, seconds: float, grouped: int) -> float:
        """The CPU's finish with ``seconds`` of cpu_part and ``grouped`` queries in groups: whole calls each (an
        upper bound: the CPU fills a call up to twice that, see the executor's CPU worker)."""
        return seconds + self.cpu_call_s * math.ceil(grouped / self.cpu_group_queries)

    def cpu_load(self, tasks: list["Task"]) -> tuple[float, int]:
        """``tasks``' cpu_part summed."""
        parts = [self.cpu_part(t) for t in tasks]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def cpu_end(self, tasks: list["Task"]) -> float:
        return self.cpu_finish(*self.cpu_load(tasks))

    def _copied_s(self, t: "Task") -> float:
        # Copies overlap the previous queue's lookups (copy stream, double buffering): a queue costs the GPU the
        # slower of its two stages.
        copy = 0.0 if t.resident else align(t.chunk.nbytes) / self.copy
        return max(copy, self.gpu_queue_s + t.size / self.gpu)

    def _in_place_s(self, t: "Task") -> float:
        return self.in_place_queue_s + t.size / self.in_place

    def reads_in_place(self, t: "Task") -> bool:
        """Whether the GPU answers ``t`` reading its chunk where it is rather than copying it in: a queue too small
        to pay for its chunk's copy (never a cached chunk's; on a tie, in place: a copy would evict)."""
        return self.in_place > 0 and not t.resident and self._in_place_s(t) <= self._copied_s(t)

    def gpu_s(self, t: "Task") -> float:
        return self._in_place_s(t) if self.reads_in_place(t) else self._copied_s(t)


class CostFit:
    """One way's time per queue or call, t = fixed + n / rate, fitted to (n lookups, t seconds) samples by least
    squares; the sums halve with every batch that brings the way samples (decay), so recent batches count most
    while sizes seen earlier still anchor the slope. Where the sizes barely vary the two cannot be told apart:
    samples whose time is mostly the fixed time (under twice it) then refine only the fixed time, the others only
    the rate. Calibrations time two sizes, so a fit starts with both."""

    SPREAD = 0.25  # a two-parameter fit needs sizes whose deviation is at least this share of their mean

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.w = self.sn = self.st = self.snn = self.snt = 0.0

    def decay(self) -> None:
        self.w, self.sn, self.st, self.snn, self.snt = (0.5 * x for x in (self.w, self.sn, self.st, self.snn, self.snt))

    def add(self, n: float, t: float) -> None:
        """Adds a sample (one without lookups or time is ignored)."""
        if n > 0 and t > 0 and math.isfinite(t):
            self.w, self.sn, self.st = self.w + 1, self.sn + n, self.st + t
            self.snn, self.snt = self.snn + n * n, self.snt + n * t

    def solve(self, fixed: float, rate: float) -> tuple[float, float, bool]:
        """(fixed seconds, lookups/s, whether the samples set the rate) from the samples, given the current ones
        (rate 0: none yet); False: they refined the fixed time only, the rate kept."""
        if self.w <= 0 or self.st <= 0:
            return fixed, rate, False
        mn, mt = self.sn / self.w, self.st / self.w
        var, cov = max(self.snn / self.w - mn * mn, 0.0), self.snt / self.w - mn * mt
        if var > (self.SPREAD * mn) ** 2 and cov > 0:
            slope = cov / var  # > 0, so mt - slope * mn < mt
            fixed = mt - slope * mn
            return (fixed, 1 / slope, True) if fixed >= 0 else (0.0, mn / mt, True)
        if mt >= 2 * fixed or rate <= 0:
            return fixed, mn / (mt - fixed), True  # mt - fixed >= mt / 2 > 0
        return max(mt - mn / rate, 0.0), rate, False


def calibration_slices(size: int, warm: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """A calibration's slices (offset, queries) of a queue of ``size`` queries: the warm-up's ``warm`` queries, then
    two timed slices (up to 2^15 lookups and an eighth of that), no query in two of them."""
    big = min((size - warm) * 8 // 9, 1 << 15)
    return (0, warm), [(warm, big), (warm + big, max(1, big // 8))]


def slow_start_slices(size: int, used: int, threads: int) -> list[tuple[int, int]]:
    """The CPU calibration's two further slices (offset, queries) of a queue of ``size`` queries whose first ``used``
    the calibration has read (CPU_SLOW_START_S): up to CPU_SLOW_START_SLICE lookups and an eighth of that, both wide
    enough to start all ``threads`` (256 queries a task), so that they pay the same start-up and their difference is
    lookups; none where the queue has too few queries left."""
    big = min((size - used) * 8 // 9, CPU_SLOW_START_SLICE)
    small = big // 8
    if small < 256 * threads:
        return []
    return [(used, big), (used + big, small)]


class CostModel:
    """Each way's rate and fixed time, how it was measured, and when it is due for a calibration.

    Starts from guesses (``cuda``: whether the cache is on a GPU); :meth:`learn` takes measurements, from a
    calibration (``reset=True``) or a batch; :meth:`uncalibrated` says which rates a batch should calibrate
    before it is planned; :meth:`rates` is what a batch is planned with."""

    def __init__(self, cuda: bool, threads: int | None = None) -> None:
        cpu = 4e6 * (threads or torch.get_num_threads())  # queries/s: a guess until the first measurement
        self.rate: dict[str, float] = {
            "cpu": cpu,
            "copy": 25e9 if cuda else 5e9,  # bytes/s: likewise
            "gpu": 1e9 if cuda else cpu,  # lookups/s from the cache: likewise
            "in_place": 0.0,  # lookups/s reading a chunk in place: measured before it is ever planned with
        }
        # Each lookup way's fixed seconds per call or queue, fitted beside its rate (CostFit; Rates' *_s fields).
        self.fixed_s = {"cpu": 0.0, "gpu": 0.0, "in_place": 0.0}
        self.fits = {name: CostFit() for name in self.fixed_s}
        # Per rate: False (a guess), "other" (measured on CSR, range or aggregate batches) or "points" (on point
        # lookups, the workload the rates are for: a CSR or range query's rows cost more, so a rate from such a
        # batch, like warm()'s row fetch, serves only until a point batch measures it).
        self.measured: dict[str, str | bool] = {"cpu": False, "copy": False, "gpu": False, "in_place": False}
        self.calibrated: set = set()  # (rate, points) calibrated (each once; batches measure them after)
        self.age = dict.fromkeys(LOOKUP_WAYS, 0)  # point batches since a point batch measured the rate
        self.stale_after = dict.fromkeys(LOOKUP_WAYS, RATE_STALE)  # the age that calibrates it again
        self.calibrated_rate: dict[str, float] = {}  # each lookup way's rate as its last point calibration set it

    def rates(self, in_place: bool, cpu_group_queries: int = CPU_GROUP_QUERIES) -> Rates:
        """The rates a batch is planned with; ``in_place``: whether the GPU may read queues' chunks in place (the
        in-place rate is 0 otherwise, and until it is measured)."""
        r = self.rate
        return Rates(r["cpu"], r["copy"], r["gpu"], r["in_place"] if in_place and self.measured["in_place"] else 0.0,
                     self.fixed_s["cpu"], self.fixed_s["gpu"], self.fixed_s["in_place"], cpu_group_queries)

    def by_points(self, name: str) -> bool:
        """Whether a point batch measured rate ``name``."""
        return self.measured[name] == "points"

    def stale(self, name: str) -> bool:
        return name in self.age and self.age[name] >= self.stale_after[name]

    def uncalibrated(self, name: str, points: bool) -> bool:
        """Whether a batch (of point lookups or not) calibrates rate ``name``: not yet measured on such a batch
        (a point batch: on one like it; the copy rate: on any) and not yet calibrated on one; or, on a point batch,
        a rate no point batch has measured for its wait (RATE_STALE). The cache's rate (``gpu``) only so: the
        batches' cached queues measure it first."""
        if points and self.stale(name):
            return True
        if name == "gpu":  # the batches' big cached queues measure it; calibrated only when stale
            return False
        points = points or name == "copy"
        have = self.by_points(name) if points else bool(self.measured[name])
        return not have and (name, points) not in self.calibrated

    def slice_min(self, name: str, least: int) -> int:
        """The smallest queue a calibration of ``name`` takes: ``least`` for a rate still a guess or not measured on
        point lookups; a stale point rate is replaced only from RATE_QUEUE more, so that the larger timed slice
        (most of the queue beyond the warm-up: calibration_slices) is timed by its lookups, not its call."""
        return least + RATE_QUEUE if self.by_points(name) else least

    def mark_calibrated(self, name: str, points: bool) -> None:
        """Records a calibration of ``name`` that set nothing (its sample too small to trust)."""
        self.calibrated.add((name, points))

    def point_batch(self, on: dict[str, bool]) -> None:
        """A point batch went by: each way that is on (``on``) ages towards its recalibration."""
        for name in self.age:
            if on[name]:  # a way that is off has no calibration to trigger
                self.age[name] += 1

    def learn(self, name: str, samples: list, points: bool, reset: bool = False) -> None:
        """Measurements of way ``name``, (lookups or bytes, seconds) per queue or call, from a point batch or
        another. The copy rate is an average (half weight per batch) of bytes over seconds; a lookup way's rate and
        fixed time are fitted to its samples with those of earlier batches (:class:`CostFit`), which start over
        where the rate came from the other kind of batch, or with ``reset`` (a calibration, which also makes the rate
        fresh and marks it calibrated for this kind of batch, though its slices may be under RATE_QUEUE). Other
        batches never change a point batch's rate (see ``measured``); the copy rate counts as a point one. Samples
        without time (a clock too coarse) change nothing. A recalibration of a stale point rate sets the way's next
        wait (RATE_STALE); a batch that times the rate makes it fresh."""
        recal = reset and points and self.stale(name) and self.by_points(name)
        timed = False  # whether a batch's (not a calibration's) big samples set the rate, not only the fixed time
        if reset:
            self.calibrated.add((name, points))
            if points and name in self.age:
                self.age[name] = 0
        points = points or name == "copy"
        if self.by_points(name) and not points:
            return
        samples = [(n, t) for n, t in samples if n > 0 and t > 0 and math.isfinite(t)]
        if not samples:
            return
        same = not reset and (self.by_points(name) if points else self.measured[name] == "other")
        if name == "copy":
            rate = sum(n for n, _ in samples) / sum(t for _, t in samples)
            self.rate[name] = 0.5 * self.rate[name] + 0.5 * rate if same else rate
        else:
            rate0 = self.rate[name]
            # A small call or queue whose lookups, at the rate the way has, explain under half its time is timed by
            # its fixed cost (the idle CPU's take-over of a few leftover queries pays a call): it refines the fixed
            # time only: fed to the fit, a run of them drags the rate down towards their call's cost.
            if same and rate0 > 0:
                fixed_only = [(n, t) for n, t in samples if n < RATE_QUEUE and n / rate0 < t / 2]
                if fixed_only:
                    self.fixed_s[name] = sum(t - n / rate0 for n, t in fixed_only) / len(fixed_only)
                    samples = [x for x in samples if x not in fixed_only]
            elif not reset:
                # A rate no calibration has set for this kind of batch (its queues were too small to time one)
                # starts only from samples a calibration could have taken: a take-over of a few queries times
                # its call, and a rate from it would price the way out of every plan.
                samples = [(n, t) for n, t in samples if n >= RATE_MIN_SAMPLE]
                if not samples:
                    return
            if samples:
                fit = self.fits[name]
                if same:
                    fit.decay()
                else:
                    fit.reset()
                for n, t in samples:
                    fit.add(n, t)
                fixed, rate, set_rate = fit.solve(self.fixed_s[name] if same else 0.0, rate0 if same else 0.0)
                self.rate[name] = rate
                self.fixed_s[name] = fixed
                timed = not reset and set_rate and any(n >= RATE_QUEUE for n, _ in samples)
        self.measured[name] = "points" if points else "other"
        if reset and points and name in self.age:
            # Confirmed: within RATE_CONFIRM of the last calibration (same method, same slices; the batches may
            # have moved the rate in between, by samples too small to keep it fresh).
            new_rate, last = self.rate[name], self.calibrated_rate.get(name, 0.0)
            if recal:
                confirmed = last > 0 and max(new_rate / last, last / new_rate) <= RATE_CONFIRM
                wait = self.stale_after[name]
                self.stale_after[name] = min(2 * wait, RATE_STALE_MAX) if confirmed else RATE_STALE
            self.calibrated_rate[name] = new_rate
        # Only a batch whose big queues or calls (RATE_QUEUE+) set the rate makes it fresh and starts its wait over (a
        # way that falls out of the plans after that is checked soon). Smaller samples may time a call more than
        # lookups, and a rate the fit kept was not measured: a way priced out of every plan still gets the idle CPU's
        # take-overs and an occasional queue, which would otherwise hold off its recalibration forever.
        if points and name in self.age and timed:
            self.age[name] = 0
            self.stale_after[name] = RATE_STALE

    def learn_batch(self, batch, on: dict[str, bool], zero_copy: bool = False) -> float:
        """Learns from what a served batch measured (its CPU calls, copies, GPU queues and in-place reads, as the
        executor's Batch records them); ``on``: the lookup ways the batch could use (a point batch ages those);
        ``zero_copy``: a batch that read every queue in place, of every size, not the small queues the in-place
        rate is for. Returns the seconds its copies took."""
        if batch.points:
            self.point_batch(on)
        # Lookups over seconds of small calls or queues is mostly their fixed cost: a rate taken so from a batch of
        # tiny queues once priced in-place reads (and the CPU) out of every later batch. Hence the fit of a fixed
        # time per call or queue beside each rate.
        if batch.cpu_calls:
            self.learn("cpu", batch.cpu_calls, batch.points)
        copied, seconds = batch.cpu_copy_bytes, batch.cpu_copy_time
        for start, end, nbytes in batch.copies:
            end.synchronize()
            copied += nbytes
            seconds += start.elapsed_time(end) / 1e3
        if copied >= 1 << 20 and seconds > 0:
            self.learn("copy", [(copied, seconds)], True)
        learned = [(batch.gpu_lookups, "gpu")] + ([] if zero_copy else [(batch.in_place_lookups, "in_place")])
        for timed, name in learned:
            samples = [(n, (b if a is None else a.elapsed_time(b) / 1e3) * share) for a, b, n, share in timed]
            if name == "gpu":  # see RATE_QUEUE
                samples = [(n, t) for n, t in samples if n >= RATE_QUEUE]
            if samples:
                self.learn(name, samples, batch.points)
        return seconds

    def summary(self) -> dict:
        """The rates as stats() shows them (a rate not measured yet: None where it has no guess)."""
        return {"cpu_rate": self.rate["cpu"], "copy_rate": self.rate["copy"], "gpu_rate": self.rate["gpu"],
                "in_place_rate": self.rate["in_place"] if self.measured["in_place"] else None,
                "fixed_s": {k: v if self.measured[k] else None for k, v in self.fixed_s.items()}}
