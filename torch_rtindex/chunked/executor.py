"""The executor: one batch through the chunks. The batch is partitioned by chunk on the queries' device (a point
batch in one operator, a range batch by its pieces' chunk ids; a point batch sorted by key, the hot tier's misses,
is already grouped, each queue a run of it): one queue per chunk. Two processors then serve the queues at the same
time, as the planner assigned them: the GPU (the calling thread: a chunk not in the cache is copied in on the
cache's copy stream, overlapping the lookups of the previous one; at most ``pipeline_depth`` queues in flight)
and the CPU (a worker thread answering from the host copies; torch operators release the GIL). The CPU worker
answers small point queues of chunks holding row offsets in groups of about ``cpu_group_queries`` queries, one
``cgrx_lookup_queues`` call over all cores. The GPU reads the queues of a key-sorted batch in place in one launch,
queue after queue in the planner's order with at most ``in_place_window`` lookups in flight, that batch's queues of
cached chunks in the same launch from their slots; those of any other batch each in a launch of its own (one launch
for them read every chunk's host memory at once and was slower). The answers are then merged back to the caller's
order (:mod:`.merge`) and the batch's measurements fed to the cost model.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .._base import _ops
from .._grouping import group_by, partition_points
from .._keys import KEY_TYPES
from .calibration import Calibrator
from .cost import CostModel, Rates
from .merge import merge, ship
from .planner import Scheduler, Task
from .stats import Stats
from .store import TOP, Chunk, ChunkStore, ChunkView, align

if TYPE_CHECKING:
    from .cache import ChunkCache, Entry
    from .config import ChunkedConfig

@dataclass
class Batch:
    """One batch's partitioned queries and what its processors measured."""

    form: str
    s_lo: torch.Tensor
    s_hi: torch.Tensor | None
    values: torch.Tensor | None
    D: torch.device
    part_event: Any
    key_order: bool = False  # the queries came sorted by key (Executor.serve's key_order)
    # A batch on a CUDA device: the stream its merge runs on (the caller's), the one its CPU worker's copies of
    # queries run on (waited for by the worker) and the one the CPU's answers go back on (waited for by the merge).
    merging: Any = None
    io_stream: Any = None
    ship_stream: Any = None
    copies: list = field(default_factory=list)
    # (start event, end event or seconds, queries, the share of the time that is theirs) per GPU queue or launch
    gpu_lookups: list = field(default_factory=list)
    in_place_lookups: list = field(default_factory=list)  # the same for queues the GPU read in place
    cpu_calls: list = field(default_factory=list)  # (queries, seconds) of each CPU call
    cpu_copy_bytes: int = 0
    cpu_copy_time: float = 0.0

    @property
    def points(self) -> bool:
        """Whether the batch is point lookups (first row and count), the workload the planner's rates are for."""
        return self.form == "lookup" and self.s_hi is None

    def queue(self, task: Task, S: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The task's queries on the serving device S."""
        a, b = task.start, task.start + task.size
        lo = self.s_lo[a:b]
        hi = None if self.s_hi is None else self.s_hi[a:b]
        if S == self.D:
            return lo, hi
        if self.D.type == "cuda":  # to the CPU worker
            out = self._to_host(lambda: [lo, hi])
            return out[0], out[1]
        return lo.to(S, non_blocking=True), None if hi is None else hi.to(S, non_blocking=True)

    def joined_queues(self, tasks: list[Task], S: torch.device) -> torch.Tensor:
        """The point queries of ``tasks`` one after the other on S (for :meth:`Executor.answer_group`)."""
        parts = lambda: [torch.cat([self.s_lo[t.start : t.start + t.size] for t in tasks])]  # noqa: E731
        if self.D.type == "cuda" and S.type == "cpu":
            return self._to_host(parts)[0]
        return parts()[0].to(S)

    def _to_host(self, make) -> list:
        """The tensors ``make()`` returns (made on the batch's I/O stream, after the partition), copied to pinned
        host memory and waited for: what the CPU worker reads."""
        io = self.io_stream
        with torch.cuda.stream(io):
            io.wait_event(self.part_event)
            out = [None if t is None else torch.empty(t.numel(), dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                   for t in make()]
            io.synchronize()
        return out


class Executor:
    """Serves batches of ordered queries through the chunks of ``store`` with ``cache`` (None: no cache tier),
    planned with ``cost``; counts into ``stats``."""

    def __init__(self, config: "ChunkedConfig", key_type: str, store: ChunkStore, cost: CostModel,
                 stats: Stats) -> None:
        self.config, self.key_type, self.store, self.cost, self.stats = config, key_type, store, cost, stats
        self.cache: ChunkCache | None = None  # set by the index once the chunk sizes are known
        # Per CUDA device a batch may come from (a CPU index may be asked from several): its batches' streams for the
        # CPU worker's copies of queries and for the CPU's answers going back (Batch.io_stream, Batch.ship_stream).
        self.streams: dict[torch.device, tuple] = {}

    def rates(self) -> Rates:
        """The rates and fixed times a batch is planned with now (``in_place`` 0 where the GPU does not read
        queues' chunks in place)."""
        return self.cost.rates(self.in_place_on(), self.config.cpu_group_queries)

    def processors(self) -> tuple[bool, bool]:
        """(whether the GPU serves, whether the CPU serves) by ``processors``; a choice this index cannot serve
        is a ValueError saying what to use instead."""
        if self.config.processors == "gpu" and self.cache is None:
            raise ValueError("processors='gpu' needs a chunk cache: build or open the index with gpu_budget > 0")
        if self.config.processors == "zero_copy":
            if self.config.device.type != "cuda" or not self.store.pin:
                raise ValueError("processors='zero_copy' needs a CUDA index (its kernels read the chunks' pinned "
                                 "host memory directly); use 'gpu', 'cpu' or 'auto' here")
            return True, False
        gpu = self.cache is not None and self.config.processors in ("auto", "gpu")
        return gpu, not gpu or self.config.processors == "auto"

    def in_place_on(self) -> bool:
        """Whether the planner may have the GPU read a queue's chunk in place (``read_in_place``): only for the
        planned ``processors="auto"`` with a cache; by default where the chunks are pinned host memory that a
        CUDA index's kernels can address."""
        if self.config.processors != "auto" or self.config.critical_mass is not None or self.cache is None:
            return False
        pinned = self.config.device.type == "cuda" and self.store.pin
        if self.config.read_in_place is None:
            return pinned
        if self.config.read_in_place and self.config.device.type == "cuda" and not pinned:
            raise ValueError("read_in_place=True needs the chunks in pinned host memory; set it to None or False")
        return self.config.read_in_place

    def break_even(self) -> int:
        """The queue size at which copying a mean-sized chunk in costs as long as answering the queue on the CPU."""
        mean = sum(c.nbytes for c in self.store.chunks) / len(self.store.chunks)
        return max(1, int(mean / self.cost.rate["copy"] * self.cost.rate["cpu"]))

    def serve(self, form: str, qlo: torch.Tensor, qhi: torch.Tensor | None, values: torch.Tensor | None,
               D: torch.device, key_order: bool = False):
        """One batch of ordered queries through the chunks: partition, serve (GPU and CPU), merge. ``key_order``:
        point queries sorted by key (the tier's misses; they must be, ascending in unsigned order: the queues are cut as
        runs of them), so that each queue is in key order and the GPU reads them in place in one launch (with at most
        ``in_place_window`` lookups in flight)."""
        t_start = time.perf_counter()
        st, tm = self.stats.data, self.stats.data["time_s"]
        q = qlo.numel()
        # ---- partition: one piece per (query, chunk it needs), in query-major order, then grouped by chunk
        piece_q, P = None, q
        if qhi is None and key_order:
            # Sorted by key: queue j is the run of keys below chunk j + 1's first key; one search, no scatter, and
            # every queue keeps the batch's key order.
            ends = self.store.run_ends(qlo)
            counts = [b - a for a, b in zip([0, *ends[:-1]], ends)]
            s_lo, s_hi = qlo, None
            order = sq = torch.arange(q, device=D)
        elif qhi is None and (grouped := partition_points(qlo, KEY_TYPES["uint64"], self.store.bounds(D) ^ TOP)) is not None:
            # Point queries in one pass where the operator takes this many chunks: chunk ids, counts, scatter.
            s_lo, order, counts = grouped
            counts = counts[0].tolist()
            sq, s_hi = order, None  # the query of each queue entry
        else:
            if qhi is None:
                pchunk = self.store.chunk_of(qlo)
            else:
                clo = self.store.chunk_of(qlo)
                chi = self.store.chunk_of(qhi)
                npieces = (chi - clo + 1).clamp(min=0)
                P = int(npieces.sum())
                piece_q = torch.repeat_interleave(torch.arange(q, device=D), npieces, output_size=P)
                first_piece = torch.cumsum(npieces, 0) - npieces
                pchunk = clo.index_select(0, piece_q) + torch.arange(P, device=D) - first_piece.index_select(0, piece_q)
            order, counts = group_by(pchunk, len(self.store.chunks))
            counts = counts.tolist()
            sq = order if piece_q is None else piece_q.index_select(0, order)  # the query of each queue entry
            s_lo = qlo.index_select(0, sq)
            s_hi = None if qhi is None else qhi.index_select(0, sq)
        gpu_on, cpu_on = self.processors()
        cache = self.cache
        tasks, start = [], 0
        mapped = self.config.processors == "zero_copy"  # every chunk "fits": the GPU reads it where it is
        for chunk, c in zip(self.store.chunks, counts):
            if c:
                tasks.append(Task(chunk, start, c, not mapped and cache is not None and chunk in cache,
                                   mapped or (cache is not None and align(chunk.nbytes) <= cache.budget)))
            start += c
        if D.type == "cuda" and D not in self.streams:  # made here, not racing in the worker
            self.streams[D] = (torch.cuda.Stream(D), torch.cuda.Stream(D))
        if D.type == "cpu" and gpu_on and self.config.device.type == "cuda" and P:
            s_lo = s_lo.pin_memory()
            s_hi = None if s_hi is None else s_hi.pin_memory()
        part_event = None
        if D.type == "cuda":
            part_event = torch.cuda.Event()
            part_event.record()
        tm["partition"] += time.perf_counter() - t_start
        # ---- serve: the GPU in this thread, the CPU in a worker, each claiming queues when ready
        io, back = self.streams.get(D, (None, None))
        batch = Batch(form, s_lo, s_hi, values, D, part_event, key_order=key_order and qhi is None,
                      merging=torch.cuda.current_stream(D) if D.type == "cuda" else None, io_stream=io,
                      ship_stream=back)
        for t in tasks:
            t.grouped = self.groups(batch, t)
        # The rates the calibration measures (the cache's lookup rate only when stale: the batches measure it).
        wanted = ("cpu", "copy", "gpu") + (("in_place",) if self.in_place_on() else ())
        if (tasks and gpu_on and cpu_on and self.config.critical_mass is None
                and any(self.cost.uncalibrated(k, batch.points) for k in wanted)):
            t0 = time.perf_counter()
            Calibrator(self).calibrate(batch, tasks)  # made per use: held, it would make a cycle with this executor
            tm["calibrate"] += time.perf_counter() - t0
        rates = self.rates()
        sched = Scheduler(list(tasks), gpu_on, cpu_on, rates, self.config.critical_mass)
        planned = dict(sched.planned)
        if tasks:
            if gpu_on and cpu_on:
                worker_error: list[BaseException] = []
                worker = threading.Thread(target=self.cpu_loop, args=(sched, batch, worker_error), daemon=True)
                worker.start()
                try:
                    self.gpu_loop(sched, batch)
                except BaseException:
                    sched.abort = True
                    raise
                finally:
                    worker.join()
                if worker_error:
                    raise worker_error[0]
            elif gpu_on:
                self.gpu_loop(sched, batch)
                if sched.tasks:  # chunks larger than the cache (a run of equal keys grown by updates): the CPU's
                    sched.gpu = False
                    self.cpu_loop(sched, batch, None)
            else:
                self.cpu_loop(sched, batch, None)
        # ---- merge, in chunk order
        t0 = time.perf_counter()
        if batch.merging is not None:
            batch.merging.wait_stream(batch.ship_stream)  # the CPU's answers (ship), on the GPU, not on the host
        out = merge(form, tasks, q, P, sq, order, piece_q, D, values)
        tm["merge"] += time.perf_counter() - t0
        for chunk, c in zip(self.store.chunks, counts):
            chunk.heat = 0.5 * chunk.heat + c
        st["batches"] += 1
        st["pieces"] += P
        st["critical_mass"], st["break_even_queue"] = self.config.critical_mass, self.break_even()
        st["plan"] = {"gpu_queries": planned["gpu"], "cpu_queries": planned["cpu"], "rates": vars(rates).copy()}
        self.learn_rates(batch)
        return out

    def cpu_loop(self, sched: Scheduler, batch: Batch, error: list | None) -> None:
        try:
            cpu = torch.device("cpu")
            while (task := sched.claim("cpu")) is not None:
                t0 = time.perf_counter()
                group = [task]
                if task.grouped:  # small point queues: several in one call over all cores
                    group += sched.claim_more("cpu", lambda t: t.grouped, sched.rates.cpu_group_queries - task.size)
                if len(group) > 1:
                    self.answer_group([self.store.host_view(t.chunk) for t in group], group, batch, cpu)
                else:
                    qlo, qhi = batch.queue(task, cpu)
                    task.result = self.answer(self.store.host_view(task.chunk), batch, qlo, qhi, cpu)
                if batch.points and batch.merging is not None:
                    ship(group, batch.D, batch.ship_stream, batch.merging)  # timed as the CPU's work: it lengthens it
                dt = time.perf_counter() - t0
                size = sum(t.size for t in group)
                with self.stats.lock:
                    self.stats.data["queries_cpu"] += size
                    self.stats.data["time_s"]["cpu"] += dt
                batch.cpu_calls.append((size, dt))
        except BaseException as e:  # handed to the calling thread, which raises it
            sched.abort = True
            if error is None:
                raise
            error.append(e)

    def gpu_loop(self, sched: Scheduler, batch: Batch) -> None:
        cache, dev = self.cache, self.config.device
        cuda = dev.type == "cuda"
        mapped = self.config.processors == "zero_copy"
        compute = torch.cuda.current_stream(dev) if cuda else None
        inflight: deque = deque()
        tm = self.stats.data["time_s"]
        try:
            while True:
                if len(inflight) >= self.config.pipeline_depth:
                    t0 = time.perf_counter()
                    inflight.popleft().synchronize()  # the GPU is ready for the next queue: pacing
                    tm["gpu_wait"] += time.perf_counter() - t0
                task = sched.claim("gpu")
                if task is None:
                    break
                t0 = time.perf_counter()
                in_place = mapped or sched.rates.reads_in_place(task)
                group, cached_size = [task], 0
                if not mapped and batch.key_order and task.grouped:
                    # One launch for the in-place queues and the cached chunks' (each from its slot; a cached chunk
                    # evicted since the plan is left to a launch of its own), so that the in-place reads start sooner;
                    # only a launch that reads some queue in place takes cached ones.
                    def joins(t: Task) -> bool:
                        return t.grouped and (sched.rates.reads_in_place(t) or (t.resident and t.chunk in cache))

                    if joins(task):
                        group += sched.claim_more("gpu", joins, needs=None if in_place else sched.rates.reads_in_place)
                if len(group) > 1:
                    view = None
                    views, cached = self.group_views(group, sched.rates)
                    used = list(cached.values())
                    # A group reads some queue in place (claim_more's needs): an in-place sample, its cached queues'
                    # lookups left out of its size and their share of its time (by the planned rates) out of its time.
                    cached_size = sum(t.size for t in group if t.chunk in cached)
                    in_place = True
                    self.stats.count("chunk_hits", len(used))
                elif in_place:
                    view, used = self.store.in_place_view(task.chunk), []
                else:
                    entry = cache.entries.get(task.chunk)
                    if entry is None:
                        entry = self._copy_in(task.chunk, sched.demand(), batch)
                        self.stats.count("chunk_misses", 1)
                    else:
                        self.stats.count("chunk_hits", 1)
                    view, used = entry.view, [entry]
                for e in used:  # the slots read: waited for, and kept until the lookups have read them
                    if cuda and e.ready is not None:
                        compute.wait_event(e.ready)
                size = sum(t.size for t in group)
                timed_size, share = size, 1.0
                if cached_size:  # a group's
                    timed_size = size - cached_size
                    r = sched.rates
                    ours, theirs = (timed_size / r.in_place, cached_size / r.gpu) if r.in_place > 0 and r.gpu > 0 \
                        else (timed_size, cached_size)
                    share = ours / (ours + theirs)

                def serve():
                    if view is None:
                        self.answer_group([views[t.chunk] for t in group], group, batch, dev)
                    else:
                        qlo, qhi = batch.queue(task, dev)
                        task.result = self.answer(view, batch, qlo, qhi, dev)

                timed = batch.in_place_lookups if in_place else batch.gpu_lookups
                if cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(compute)
                    serve()
                    b.record(compute)
                    timed.append((a, b, timed_size, share))
                else:
                    t1 = time.perf_counter()
                    serve()
                    timed.append((None, time.perf_counter() - t1, timed_size, share))
                for e in used:
                    cache.tick += 1
                    e.tick = cache.tick
                if cuda:
                    done = torch.cuda.Event()
                    done.record(compute)
                    inflight.append(done)
                    for e in used:
                        e.last_use = done
                self.stats.count("queries_gpu", size)
                if in_place:
                    self.stats.count("queries_in_place", size - cached_size)
                tm["gpu_issue"] += time.perf_counter() - t0
        finally:
            for ev in inflight:
                ev.synchronize()

    def group_views(self, group: list[Task], rates: Rates) -> tuple[dict[Chunk, ChunkView], dict[Chunk, Entry]]:
        """The views one launch reads its queues with (:meth:`_gpu_loop`): a cached chunk's slot, else the chunk in
        place; and the cache entries read. The in-place views are made first: making one may carve its search part
        out of the shared slab, evicting cached chunks there, the launch's own among them, which are then read in
        place too."""
        cache = self.cache
        cached = {t.chunk: cache.entries[t.chunk] for t in group if not rates.reads_in_place(t)}
        views: dict[Chunk, ChunkView] = {}
        while True:
            for t in group:
                if t.chunk not in cached and t.chunk not in views:
                    views[t.chunk] = self.store.in_place_view(t.chunk)
            gone = [c for c, e in cached.items() if cache.entries.get(c) is not e]
            if not gone:
                break
            for c in gone:
                del cached[c]
        views.update((c, e.view) for c, e in cached.items())
        return views, cached

    def _copy_in(self, chunk: Chunk, demand: dict, batch: Batch) -> Entry:
        """Places ``chunk`` in the cache (:meth:`ChunkCache.copy_in`), the copy timed for the batch's copy rate."""
        host = self.store.host(chunk)
        entry, evicted, (start, end, nbytes) = self.cache.copy_in(chunk, host, demand, self.store.view)
        self.stats.count("evictions", evicted)
        if start is not None:
            batch.copies.append((start, end, nbytes))
        else:
            batch.cpu_copy_time += end
            batch.cpu_copy_bytes += nbytes
        self.stats.count("bytes_copied", nbytes)
        return entry

    def answer(self, view: ChunkView, batch: Batch, qlo: torch.Tensor, qhi: torch.Tensor | None,
                S: torch.device) -> tuple:
        """One queue answered on device S with a chunk's structure there; row IDs are global."""
        ops = _ops()
        # The queues hold ordered keys already: the index's configuration for ordered queries (key type uint64).
        args = (*view.index._lead, view.index._cfg_ordered, qlo, qhi)
        if batch.form == "lookup":
            first, count = ops.cgrx_lookup(*args)
            return "first", view.global_first(first), count
        if batch.form == "count":
            return "count", ops.cgrx_range_count(*args)
        if batch.form == "aggregate" and batch.values.device == S and view.values_fit(batch.values):
            return ("agg", *ops.cgrx_aggregate(*args, view.local_values(batch.values)))
        offsets, rows = ops.cgrx_lookup_csr(*args)  # csr, and aggregates with the values on the other device
        return "csr", offsets, view.global_rows(rows) if rows.numel() else rows

    @staticmethod
    def groups(batch: Batch, task: Task) -> bool:
        """Whether ``task`` joins others in one call (:meth:`_answer_group`): a point lookup's queue of a chunk of
        sorted pairs holding row offsets (their configuration is the index's, alike for all such chunks)."""
        return batch.points and task.chunk.kind == "pairs" and task.chunk.rows_in_place()

    def answer_group(self, views: list[ChunkView], tasks: list[Task], batch: Batch, S: torch.device) -> None:
        """The point queues ``tasks`` (:meth:`_groups`), each with its chunk's view on S, answered in one operator
        call; each task's result is its slice of the answers, with global row IDs."""
        if S == batch.D:
            queries, starts = batch.s_lo, [t.start for t in tasks]
        else:
            queries = batch.joined_queues(tasks, S)
            starts = list(itertools.accumulate((t.size for t in tasks[:-1]), initial=0))
        lead = [v.index._lead for v in views]
        first, count = torch.ops.rtindex_internal.cgrx_lookup_queues(
            [x[0] for x in lead], [x[1] for x in lead], [x[2] for x in lead], views[0].index._cfg_ordered, queries,
            starts, [t.size for t in tasks], [v.base for v in views], self.config.in_place_window)
        at = 0
        for t in tasks:
            t.result = ("first", first[at : at + t.size], count[at : at + t.size])
            at += t.size

    def learn_rates(self, batch: Batch) -> None:
        """Updates the rates the planner uses from what the batch measured (:meth:`CostModel.learn_batch`)."""
        on = {"cpu": True, "in_place": self.in_place_on(), "gpu": self.cache is not None}
        seconds = self.cost.learn_batch(batch, on, zero_copy=self.config.processors == "zero_copy")
        self.stats.time("copy", seconds)
        self.stats.set(**self.cost.summary())
