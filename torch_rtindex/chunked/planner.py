"""The planner: which processor serves each of a batch's queues (:func:`plan`, a greedy makespan balance over
the cost model's :class:`~torch_rtindex.chunked.cost.Rates`), and the :class:`Scheduler` that hands the plan out
on demand (the paper's scheme): a processor that runs out of its own queues takes over the other's last one if it
would finish it before the other got through its backlog."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .cost import Rates
from .store import Chunk


@dataclass
class Task:
    """One chunk's queue of a batch: where it lies in the partitioned batch, whether its chunk is cached
    (``resident``) and fits the cache, who serves it and its answer."""

    chunk: Chunk
    start: int  # the queue is entries start .. start + size of the partitioned batch
    size: int
    resident: bool
    fits: bool
    proc: str = ""
    result: tuple = ()
    grouped: bool = False  # the CPU answers it in one call with others (the executor's grouping)


def balance(forced: list[Task], free: list[Task], rates: Rates) -> tuple[list[Task], list[Task]]:
    """The greedy makespan balance of :func:`plan`, then single moves from the processor that ends last to the
    other while a move ends the batch earlier (the greedy order can leave one)."""
    # The CPU's load as (seconds, grouped queries): its finish counts whole calls of grouped queries (Rates).
    on_gpu: list[Task] = []
    on_cpu = list(forced)
    g_end, (c_sec, c_grp) = 0.0, rates.cpu_load(forced)
    c_end = rates.cpu_finish(c_sec, c_grp)

    def cpu_with(t: Task, sign: int) -> tuple[float, int, float]:
        sec, grp = rates.cpu_part(t)
        sec, grp = c_sec + sign * sec, c_grp + sign * grp
        return sec, grp, rates.cpu_finish(sec, grp)

    def edge(t: Task) -> float:
        g = rates.gpu_s(t)
        return rates.cpu_s(t) / g if g > 0 else float("inf")

    for t in sorted(free, key=lambda t: (-edge(t), -t.size)):
        g, (sec, grp, c) = g_end + rates.gpu_s(t), cpu_with(t, 1)
        if c < g:
            on_cpu.append(t)
            c_sec, c_grp, c_end = sec, grp, c
        else:
            on_gpu.append(t)
            g_end = g
    for _ in range(len(free)):
        if c_end > g_end:
            moves = [(max(g_end + rates.gpu_s(t), cpu_with(t, -1)[2]), i) for i, t in enumerate(on_cpu) if t.fits]
        else:
            moves = [(max(g_end - rates.gpu_s(t), cpu_with(t, 1)[2]), i) for i, t in enumerate(on_gpu)]
        if not moves or min(moves)[0] >= max(g_end, c_end):
            break
        _, i = min(moves)
        if c_end > g_end:
            t = on_cpu.pop(i)
            on_gpu.append(t)
            g_end = g_end + rates.gpu_s(t)
            c_sec, c_grp, c_end = cpu_with(t, -1)
        else:
            t = on_gpu.pop(i)
            on_cpu.append(t)
            g_end = g_end - rates.gpu_s(t)
            c_sec, c_grp, c_end = cpu_with(t, 1)
    return on_gpu, on_cpu


def plan(tasks: list[Task], rates: Rates, *, gpu: bool = True, cpu: bool = True,
         critical_mass: int | None = None) -> tuple[list[Task], list[Task]]:
    """Which processor serves each queue: (the GPU's queues in serving order, the CPU's).

    A queue whose chunk does not fit the cache is the CPU's. With ``critical_mass`` set, the GPU takes the
    resident queues and the others of at least that size. Otherwise a greedy makespan balance: queues in order of
    how much more the CPU would spend on them than the GPU (CPU seconds / GPU seconds, largest first), each to the
    processor whose projected finish, with the queue added, is earlier (the GPU on a tie); then single queues
    move from the processor that ends last while that ends the batch earlier. So the CPU keeps no queue whose
    move to the GPU would end the batch sooner."""
    forced = [t for t in tasks if not t.fits]
    free = [t for t in tasks if t.fits]
    if not gpu:
        on_gpu, on_cpu = [], forced + free
    elif not cpu:
        on_gpu, on_cpu = free, forced
    elif critical_mass is not None:
        on_gpu = [t for t in free if t.resident or t.size >= critical_mass]
        on_cpu = forced + [t for t in free if not (t.resident or t.size >= critical_mass)]
    else:
        on_gpu, on_cpu = balance(forced, free, rates)
    # The GPU serves its resident queues first (no copy to wait for), then the largest; the CPU the smallest first
    # (its last queues are the ones the GPU may take over when it runs out of work).
    on_gpu.sort(key=lambda t: (not t.resident, -t.size))
    on_cpu.sort(key=lambda t: (t.fits, t.size))
    return on_gpu, on_cpu


class Scheduler:
    """One batch's queues, planned (:func:`plan`) and then handed out on demand: each processor, when ready,
    takes the next queue of its own list; one that has run out takes the last queue of the other's list if it
    would finish it before the other would have got through its remaining list (the measured rates can be
    off)."""

    def __init__(self, tasks: list[Task], gpu: bool, cpu: bool, rates: Rates, critical_mass: int | None = None):
        self.gpu, self.cpu, self.rates = gpu, cpu, rates
        self.own = dict(zip(("gpu", "cpu"), plan(tasks, rates, gpu=gpu, cpu=cpu, critical_mass=critical_mass)))
        self.planned = {p: sum(t.size for t in q) for p, q in self.own.items()}
        self.lock = threading.Lock()
        self.abort = False

    @property
    def tasks(self) -> list[Task]:
        return self.own["gpu"] + self.own["cpu"]

    def demand(self) -> dict[Chunk, int]:
        with self.lock:
            return {t.chunk: t.size for t in self.tasks}

    def _cost(self, proc: str, tasks: list[Task]) -> float:
        # A queue the CPU takes over is answered alone: a whole call (cpu_end), not a grouped share.
        return sum(self.rates.gpu_s(t) for t in tasks) if proc == "gpu" else self.rates.cpu_end(tasks)

    def claim(self, proc: str) -> Task | None:
        with self.lock:
            if self.abort:
                return None
            mine = self.own[proc]
            best = mine.pop(0) if mine else None  # the GPU's list holds only queues whose chunk fits the cache
            if best is None and self.gpu and self.cpu:
                other_name = "cpu" if proc == "gpu" else "gpu"
                other = self.own[other_name]
                cand = next((t for t in reversed(other) if proc == "cpu" or t.fits), None)
                if cand is not None:
                    if self._cost(proc, [cand]) < self._cost(other_name, other):
                        other.remove(cand)
                        best = cand
            if best is not None:
                best.proc = proc
            return best

    def claim_more(self, proc: str, fits_group, limit: int | None = None, needs=None) -> list[Task]:
        """More of ``proc``'s own queues to serve with one it has claimed, in one call: those ``fits_group``
        accepts, in list order, until their sizes reach ``limit`` (None: all); with ``needs``, none unless one of
        them is a queue ``needs`` accepts."""
        with self.lock:
            if self.abort:
                return []
            taken, kept, size = [], [], 0
            for t in self.own[proc]:
                if (limit is None or size < limit) and fits_group(t):
                    taken.append(t)
                    size += t.size
                else:
                    kept.append(t)
            if needs is not None and not any(needs(t) for t in taken):
                return []
            for t in taken:
                t.proc = proc
            self.own[proc] = kept
            return taken
