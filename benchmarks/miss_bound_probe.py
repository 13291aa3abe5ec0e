"""The floor of a given tier's Zipf batch, stage by stage, in one run on one GPU (issue 12's Zipf 1.2 target: 1.5x
the in-core time). Each stage alone at its best, with no host work between them:

- in core: ``CgRXIndex`` over the same keys in GPU memory, the same batches;
- the tier's pass over the whole batch, and the selection of its misses (which, sorted by key);
- the misses read in place by the GPU (one ``cgrx_lookup_queues`` launch over their chunks' runs, as the library's
  sorted batches do) over subsets that tell what its time follows: every k-th miss (the same host memory, 1/k of
  the lookups) against the misses of the first 1/k of the chunks (1/k of the memory and of the lookups);
- the CPU alone (one call over all cores) over the same chunk subsets;
- the two ways split by chunks (the CPU the last share of the runs), each timed alone and then side by side;
- the tier's pass with the in-place launch of the misses beside it on another stream (does overlap pay?).

The floor is tier pass + selection + the best split's side-by-side time; printed against 1.5x in core. Answers of
every way are checked against the library's.

    python benchmarks/miss_bound_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 1.2] [--repeats 3]
    python benchmarks/miss_bound_probe.py --device cpu --log-keys 16 --log-lookups 14 --hot-keys 4096 --chunk-mib 0.0625
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import (add_tier_probe_args, make_keys, run_tasks, run_timed, switched,  # noqa: E402
                          tier_probe_on_device)
from rx_bench import timed  # noqa: E402

from torch_rtindex import CgRXIndex, chunked  # noqa: E402
from torch_rtindex.chunked import _Batch, _key_sorted, _Task  # noqa: E402


def ms(fn, repeats: int, dev: torch.device, host: bool = False, warmup: int = 0) -> tuple[list[float], object]:
    """fn's milliseconds per run and its last output: CUDA events around it on the GPU (rx_bench.timed), the host's
    clock around a synchronized call for work on the host or on both (chunked_bench.run_timed)."""
    times: list[float] = []
    if host or dev.type != "cuda":
        _, out = run_timed(fn, dev, repeats, warmup, keep=times)
    else:
        _, out = timed(fn, repeats, warmup, dev, keep=times)
    return times, out


def fmt(times: list[float], n: int | None = None) -> str:
    med = statistics.median(times)
    rate = f" ({n / med / 1e3:7.1f} M/s)" if n else ""
    return f"median {med:7.3f} ms{rate}, all " + " ".join(f"{t:.3f}" for t in times)


class Misses:
    """A batch's tier misses sorted by key (``lo``, and ``pos``: each one's place in the batch), cut into the
    chunks' runs, answered by either way over any subset of the runs, answers checked against the library's."""

    def __init__(self, index, lo: torch.Tensor, pos: torch.Tensor, want) -> None:
        self.index, self.lo, self.pos, self.want = index, lo, pos, want
        self.D = lo.device
        cpu = torch.device("cpu")
        self.cuda = self.D.type == "cuda"
        self.on = {"gpu": self.D, "cpu": cpu}
        self.view = {"gpu": index._in_place_view if self.cuda else index._host_view, "cpu": index._host_view}
        self.batch = {w: _Batch("lookup", lo.to(d), None, None, d, None, key_order=True) for w, d in self.on.items()}
        self.tasks = run_tasks(index, lo)
        self.bad = 0

    def every(self, k: int) -> "Misses":
        """Every k-th miss: the same chunks' memory, 1/k of the lookups."""
        return Misses(self.index, self.lo[::k].contiguous(), self.pos[::k].contiguous(), self.want)

    def run(self, way: str, tasks: list[_Task]) -> list[_Task]:
        self.index._answer_group([self.view[way](t.chunk) for t in tasks], tasks, self.batch[way], self.on[way])
        return tasks

    def check(self, tasks: list[_Task]) -> None:
        for t in tasks:
            where = self.pos[t.start : t.start + t.size]
            f, c = (x.to(self.D) for x in t.result[1:])
            if not (torch.equal(f, self.want.first_row[where]) and torch.equal(c, self.want.count[where])):
                self.bad += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=2, device=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu-shares", default="0.1,0.2,0.3,0.4", help="the CPU's shares of the runs (by chunks), "
                    "comma separated")
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    R = a.repeats

    keys = make_keys(1 << a.log_keys, dev)  # the index's keys (the same seed)
    core = CgRXIndex(keys.to(dev), layout=index.layout, backend=index.backend, bucket_size=index.bucket_size)
    del keys
    in_core = []
    for i, q in enumerate(batches):
        times, _ = ms(lambda: core.lookup(q), R, dev, warmup=1)
        in_core += times
        print(f"batch {i} in core: {fmt(times, q.numel())}", flush=True)
    core = None  # its memory back before the chunked batches
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    core_ms = statistics.median(in_core)
    print(f"in core median {core_ms:.3f} ms; 1.5x in core = {1.5 * core_ms:.3f} ms", flush=True)
    shares = [float(x) for x in a.cpu_shares.split(",")]
    ways = ("gpu", "cpu") if dev.type == "cuda" else ("cpu",)
    names = {"gpu": "in place", "cpu": "cpu"}

    for i, q in enumerate(batches):
        want = index.lookup(q)
        with switched(GROUP_CACHED=not chunked.GROUP_CACHED):
            other = index.lookup(q)
        agree = torch.equal(want.first_row, other.first_row) and torch.equal(want.count, other.count)
        print(f"batch {i}: the library's answers with GROUP_CACHED on and off equal: {agree}", flush=True)
        qlo, _ = index._check_queries(q, None)
        D = qlo.device
        view = index._tier_view(D)
        tb = _Batch("lookup", qlo, None, None, D, None)
        t_tier, (_, _, count) = ms(lambda: index._answer(view, tb, qlo, None, D), R, dev)

        def select():
            miss = torch.nonzero(count == 0).reshape(-1)
            lo, order = _key_sorted(qlo.index_select(0, miss))
            return lo, miss.index_select(0, order)

        t_sel, (lo, pos) = ms(select, R, dev)
        tier_ms, sel_ms = statistics.median(t_tier), statistics.median(t_sel)
        print(f"batch {i}: tier pass {fmt(t_tier, qlo.numel())}; selection of the {lo.numel()} misses "
              f"{fmt(t_sel)}", flush=True)
        m = Misses(index, lo, pos, want)
        # What the in-place time follows: every k-th miss (the same memory) against the first 1/k of the chunks.
        for k in (1, 2, 4, 8):
            e = m.every(k)
            part = m.tasks[: max(1, len(m.tasks) // k)]
            n_part = sum(t.size for t in part)
            for way in ways:
                t_e, done = ms(lambda: e.run(way, e.tasks), R, dev, host=way == "cpu")
                e.check(done)
                t_p, done = ms(lambda: m.run(way, part), R, dev, host=way == "cpu")
                m.check(done)
                print(f"batch {i} {names[way]:8s} 1 in {k} misses ({e.lo.numel()} in {len(e.tasks)} chunks): "
                      f"{fmt(t_e, e.lo.numel())} | the first 1/{k} of the chunks ({n_part} in {len(part)}): "
                      f"{fmt(t_p, n_part)}", flush=True)
            m.bad += e.bad
        # The two ways split by chunks: each alone, then side by side (the CPU in a thread).
        best = None
        for share in shares if dev.type == "cuda" else []:
            cut = round(len(m.tasks) * (1 - share))
            g, c = m.tasks[:cut], m.tasks[cut:]
            t_g, _ = ms(lambda: m.run("gpu", g), R, dev)
            t_c, _ = ms(lambda: m.run("cpu", c), R, dev, host=True)

            own: dict[str, list[float]] = {"gpu": [], "cpu": []}

            def cpu_part():
                t0 = time.perf_counter()
                m.run("cpu", c)
                own["cpu"].append((time.perf_counter() - t0) * 1e3)

            def both():
                th = threading.Thread(target=cpu_part)
                th.start()
                ea, eb = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ea.record()
                m.run("gpu", g)
                eb.record()
                th.join()
                eb.synchronize()
                own["gpu"].append(ea.elapsed_time(eb))
                return g + c

            t_b, done = ms(both, R, dev, host=True)
            m.check(done)
            n_c = sum(t.size for t in c)
            print(f"batch {i} split, the CPU {len(c)} of {len(m.tasks)} chunks ({n_c} misses): in place alone "
                  f"{fmt(t_g)} | cpu alone {fmt(t_c)} | side by side {fmt(t_b, lo.numel())}; in it the GPU's "
                  f"launch {fmt(own['gpu'])}, the CPU's call {fmt(own['cpu'])}", flush=True)
            med = statistics.median(t_b)
            best = med if best is None else min(best, med)
        if dev.type == "cuda":
            # Overlap: the tier's pass and the misses' in-place launch on two streams at once.
            s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

            def overlapped():
                start = torch.cuda.Event()
                start.record()
                s1.wait_event(start)
                s2.wait_event(start)
                with torch.cuda.stream(s1):
                    index._answer(view, tb, qlo, None, D)
                with torch.cuda.stream(s2):
                    m.run("gpu", m.tasks)
                torch.cuda.current_stream().wait_stream(s1)
                torch.cuda.current_stream().wait_stream(s2)

            t_o, _ = ms(overlapped, R, dev)
            t_i, _ = ms(lambda: m.run("gpu", m.tasks), R, dev)
            print(f"batch {i} the tier pass and all misses in place at once on two streams: {fmt(t_o)}; one after "
                  f"the other: {tier_ms + statistics.median(t_i):.3f} ms", flush=True)
            floor = tier_ms + sel_ms + best
            print(f"batch {i} floor: tier pass {tier_ms:.3f} + selection {sel_ms:.3f} + misses side by side at the "
                  f"best split {best:.3f} = {floor:.3f} ms = {floor / core_ms:.2f}x in core ({core_ms:.3f} ms)",
                  flush=True)
        print(f"batch {i} answers differing from the library's: {m.bad} queues", flush=True)


if __name__ == "__main__":
    main()
