"""Calibration: the rates a batch needs and lacks measured before it is planned (guesses would misplace a whole
batch). A lookup way is timed on the batch's largest queue: a warm-up, then two slices of other queries, of two
sizes, so that the cost model's fit starts with a fixed time and a rate; the copy rate on a slice of a chunk copied
into the (still empty) cache."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from .cost import CPU_SLOW_START_S, RATE_QUEUE, calibration_slices, slow_start_slices
from .planner import Task
from .store import ChunkView, align

if TYPE_CHECKING:
    from .executor import Batch, Executor


def seconds(fn, device: torch.device) -> float:
    """Seconds ``fn`` takes on ``device``: CUDA events around it on the current stream (waited for), else the
    host clock."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    stream = torch.cuda.current_stream(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    fn()
    b.record(stream)
    b.synchronize()
    return a.elapsed_time(b) / 1e3


class Calibrator:
    """Calibrates the executor's cost model on a batch (:meth:`calibrate`)."""

    def __init__(self, executor: "Executor") -> None:
        self.ex = executor

    def calibrate(self, batch: "Batch", tasks: list[Task]) -> None:
        """Measures the rates a batch needs and lacks (:meth:`CostModel.uncalibrated`) before it is planned (guesses would
        misplace a whole batch): slices of two sizes of the largest queue answered from its host copy and, where the
        GPU may read chunks in place, answered so; a slice of its chunk copied into the (still empty) cache; and,
        for a stale cache rate, slices of the largest queue of a cached chunk answered from the cache."""
        t = max(tasks, key=lambda t: t.size)
        points = batch.points
        ex = self.ex
        cache, cost, device = ex.cache, ex.cost, ex.config.device
        if ex.in_place_on() and cost.uncalibrated("in_place", points) and t.size >= cost.slice_min("in_place", 512):
            self.calibrate_way("in_place", ex.store.in_place_view(t.chunk), batch, t, device)
            for r in tasks:  # the in-place view's search part may have evicted a cached chunk: the plan must know
                r.resident = r.resident and r.chunk in cache
        resident = [r for r in tasks if r.resident]
        if cache is not None and resident and cost.uncalibrated("gpu", points):
            r = max(resident, key=lambda r: r.size)
            if r.size >= cost.slice_min("gpu", RATE_QUEUE):  # smaller cached queues time the host's issue
                entry = cache.entries[r.chunk]
                if device.type == "cuda" and entry.ready is not None:
                    torch.cuda.current_stream(device).wait_event(entry.ready)
                self.calibrate_way("gpu", entry.view, batch, r, device)
        if cost.uncalibrated("cpu", points) and t.size >= cost.slice_min("cpu", 256):
            self.calibrate_way("cpu", ex.store.host_view(t.chunk), batch, t, torch.device("cpu"))
        if cost.uncalibrated("copy", points) and cache is not None and not cache.entries:
            host = ex.store.host(t.chunk)
            size = min(host.numel(), cache.budget, 64 << 20)
            buf = cache.slab(cache.arena)
            if device.type == "cuda":
                stream = torch.cuda.current_stream(device)
                for ev in cache.arena.events_over(0, align(size)):
                    stream.wait_event(ev)
                buf[:size].copy_(host[:size], non_blocking=True)  # warm
            elapsed = seconds(lambda: buf[:size].copy_(host[:size], non_blocking=True), device)
            ex.stats.count("bytes_calibration", size * (2 if device.type == "cuda" else 1))
            cost.mark_calibrated("copy", True)  # once: a chunk under 1 MiB times too short to trust; batches measure it
            if size >= 1 << 20:
                cost.learn("copy", [(size, elapsed)], True)

    def calibrate_way(self, name: str, view: ChunkView, batch: "Batch", t: Task, S: torch.device) -> None:
        """Calibrates way ``name`` on queue ``t`` answered with ``view`` on S: a warm-up (first calls pay one-time
        costs), then two timed slices of other queries (a slice the warm-up had read would come from the caches,
        the CPU's or the GPU's, not from where the chunk lies), of two sizes, so that the fit starts with a fixed
        time and a rate (module doc)."""
        if S.type == "cuda":
            warm = min(t.size // 8, 256)
        else:  # wide enough to start every thread of a parallel region (the CPU kernels take 256 queries per task,
            # csrc/core/results_cpu.h), which the timed slices would otherwise pay
            warm = min(t.size // 4, 256 * torch.get_num_threads())
        warm, timed = calibration_slices(t.size, warm)
        slices = self.timed(view, batch, S, t, [warm])
        samples = self.timed(view, batch, S, t, timed)
        cost = self.ex.cost
        before = (cost.rate[name], cost.fixed_s[name])
        cost.learn(name, samples, batch.points, reset=True)
        if S.type == "cpu" and cost.fixed_s[name] > CPU_SLOW_START_S:  # the CPU's threads start slowly here
            more = slow_start_slices(t.size, timed[1][0] + timed[1][1], torch.get_num_threads())
            if more:
                slices += samples
                samples = self.timed(view, batch, S, t, more)
                cost.learn(name, samples, batch.points, reset=True)
        after = (cost.rate[name], cost.fixed_s[name])
        self.ex.stats.calibration({"way": name, "points": batch.points, "slices": [list(x) for x in slices + samples],
                                   "rate": after[0], "fixed_s": after[1], "set": after != before})

    def timed(self, view: ChunkView, batch: "Batch", S: torch.device, t: Task, slices: list) -> list:
        """(queries, seconds) of answering each (offset, size) slice of queue ``t`` on S with ``view``."""
        out = []
        for offset, size in slices:
            qlo, qhi = batch.queue(Task(t.chunk, t.start + offset, size, False, t.fits), S)
            out.append((size, seconds(lambda: self.ex.answer(view, batch, qlo, qhi, S), S)))
        return out
