"""How fast a given tier's batch can be with the host's work around the misses cut to the least (issue 12's Zipf
1.2 target): the library's planner, worker thread and merge cost the batch milliseconds of host time between the
tier pass and the in-place launch and after it (``sorted_misses_probe.py --trace``), while the GPU's one in-place
launch and the CPU's one call over all chunks, each alone or side by side, serve the misses at about their sum
of rates. A probe of a design, not a feature: built on the index's internals.

The lean path, for the batch in k slices (k = 1: the tier pass, then the misses): every slice's tier pass is queued
at once on a low-priority stream; per slice, on a high-priority stream, its misses are selected and sorted by key,
cut into each chunk's run by one search, and split at a run boundary: the GPU reads the runs below it in place in
one launch, a persistent CPU thread answers the runs above it in one call (their queries cross to pinned host
memory in one copy), the CPU's share by the planner's fitted rates or as given (``--cpu-shares``). Answers are
compared with the library's batch, which runs beside it batch by batch.

    python benchmarks/lean_miss_probe.py [--log-keys 30] [--log-lookups 27] [--slices 1,2,4] [--cpu-shares auto,0.25]
    python benchmarks/lean_miss_probe.py --device cpu --log-keys 16 --log-lookups 14 --hot-keys 4096 --chunk-mib 0.0625
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import (GcTimer, add_tier_probe_args, run_tasks, switched, tier_passes,  # noqa: E402
                          tier_probe_on_device)

from torch_rtindex import ChunkedIndex, chunked  # noqa: E402
from torch_rtindex.chunked import _Batch, _key_sorted, _Task  # noqa: E402


class Lean:
    """The lean path over one index: its streams and the persistent CPU thread."""

    def __init__(self, index: ChunkedIndex, dev: torch.device, cpu_share: float | None) -> None:
        self.index, self.dev = index, dev
        self.cuda = dev.type == "cuda"
        self.pool = ThreadPoolExecutor(max_workers=1)
        if cpu_share is None:
            r = index.rates()
            gpu = r.in_place if r.in_place > 0 else r.gpu
            cpu_share = r.cpu / (r.cpu + gpu)
            self.rates = f"cpu {r.cpu / 1e6:.1f} M/s, {'in place' if r.in_place > 0 else 'cache'} {gpu / 1e6:.1f} M/s"
        self.cpu_share = cpu_share
        self.threads = torch.get_num_threads()  # the CPU thread's (OpenMP keeps a count per calling thread)
        self.low = self.high = self.sel = self.io = None
        if self.cuda:
            low, high = torch.cuda.Stream.priority_range()
            self.low = torch.cuda.Stream(dev, priority=low)  # the tier passes
            self.high = torch.cuda.Stream(dev, priority=high)  # the in-place launches and the answers' placing
            self.sel = torch.cuda.Stream(dev, priority=high)  # a slice's selection: its host waits see only this
            self.io = torch.cuda.Stream(dev)
        self.marks: list[tuple[str, float]] = []
        self.spans: list[tuple[str, object, object]] = []  # (what, start event, end event) on the GPU

    def mark(self, what: str) -> None:
        self.marks.append((what, time.perf_counter()))

    def span(self, what: str, stream):
        """Times what the caller queues on ``stream`` until the returned function is called (CUDA only)."""
        if not self.cuda:
            return lambda: None
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        return lambda: (b.record(stream), self.spans.append((what, a, b)))

    def gpu_timeline(self) -> str:
        """The GPU spans of the last lookup, in ms from its first, after a synchronize."""
        if not self.spans:
            return ""
        t0 = self.spans[0][1]
        return " ".join(f"{w} {t0.elapsed_time(a):.2f}-{t0.elapsed_time(b):.2f}" for w, a, b in
                        sorted(self.spans, key=lambda x: t0.elapsed_time(x[1])))

    def lookup(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        index, dev = self.index, self.dev
        self.marks.clear()
        self.spans.clear()
        self.mark("start")
        qlo, _ = index._check_queries(q, None)
        n = qlo.numel()
        if not self.cuda:
            return self._slices(qlo, k)
        caller = torch.cuda.current_stream(dev)
        self.high.wait_stream(caller)
        for s in (self.high, self.low, self.sel):
            qlo.record_stream(s)
        with torch.cuda.stream(self.high):
            out = self._slices(qlo, k)
        caller.wait_stream(self.high)
        for t in out:
            t.record_stream(caller)
        assert out[0].numel() == n
        return out

    def _slices(self, qlo: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        passes = tier_passes(self.index, qlo, k, self.low, lambda i: self.span(f"pass{i}", self.low))
        self.mark("tier passes queued")
        pending = []
        for a, b, f, c, ev in passes:
            if self.cuda:
                self.sel.wait_event(ev)
                for t in (f, c):
                    t.record_stream(self.high)
                    t.record_stream(self.sel)
            pending.append(self._misses(qlo[a:b], f, c))
        done = [p() for p in pending]
        if k == 1:
            return done[0]
        return torch.cat([d[0] for d in done]), torch.cat([d[1] for d in done])

    def _misses(self, qlo: torch.Tensor, f: torch.Tensor, c: torch.Tensor):
        """Starts serving one slice's misses; returns what finishes it (the answers placed, (first, count))."""
        index, D = self.index, qlo.device
        with torch.cuda.stream(self.sel) if self.cuda else nullcontext():
            end = self.span("select", self.sel)
            miss = torch.nonzero(c == 0).reshape(-1)  # waits for this slice's pass (and the selection stream only)
            self.mark("misses known")
            m = miss.numel()
            if m == 0:
                if self.cuda:
                    self.high.wait_stream(self.sel)  # the answers are the pass's: the end waits for it
                return lambda: (f, c)
            lo, order = _key_sorted(qlo.index_select(0, miss))
            miss = miss.index_select(0, order)
            end()
            runs = run_tasks(index, lo)
        self.mark("runs cut")
        if self.cuda:
            self.high.wait_stream(self.sel)
            miss.record_stream(self.high)
            lo.record_stream(self.high)
        # The split: the GPU the runs below it, the CPU those above, at the run boundary nearest the CPU's share.
        want = m - int(m * self.cpu_share)
        split = min([t.start for t in runs] + [m], key=lambda a: abs(a - want))
        gpu_tasks = [t for t in runs if t.start + t.size <= split]
        cpu_tasks = [_Task(t.chunk, t.start - split, t.size, False, True) for t in runs if t.start >= split]
        job = None
        if cpu_tasks:
            host = lo[split:]
            ready = None
            if self.cuda:
                with torch.cuda.stream(self.io):
                    self.io.wait_stream(self.sel)
                    lo.record_stream(self.io)  # made on the selection stream, read here
                    end = self.span("stage", self.io)
                    staged = torch.empty(m - split, dtype=lo.dtype, pin_memory=True)
                    staged.copy_(host, non_blocking=True)
                    end()
                    ready = torch.cuda.Event()
                    ready.record(self.io)
                host = staged
            job = self.pool.submit(self._cpu_call, host, ready, cpu_tasks)
        if gpu_tasks:
            end = self.span("in_place", self.high)
            gb = _Batch("lookup", lo, None, None, D, None, key_order=True)
            index._answer_group([index._in_place_view(t.chunk) for t in gpu_tasks], gpu_tasks, gb, D)
            gf = torch.cat([t.result[1] for t in gpu_tasks]) if len(gpu_tasks) > 1 else gpu_tasks[0].result[1]
            gc_ = torch.cat([t.result[2] for t in gpu_tasks]) if len(gpu_tasks) > 1 else gpu_tasks[0].result[2]
            f.index_copy_(0, miss[:split], gf)
            c.index_copy_(0, miss[:split], gc_)
            end()
        self.mark("gpu launched")

        def finish():
            if job is not None:
                cf, cc = job.result()
                self.mark("cpu done")
                end = self.span("place", self.high)
                f.index_copy_(0, miss[split:], cf.to(D, non_blocking=True))
                c.index_copy_(0, miss[split:], cc.to(D, non_blocking=True))
                end()
            return f, c
        return finish

    def _cpu_call(self, host: torch.Tensor, ready, tasks: list[_Task]):
        """The CPU's runs in one call over all cores; answers in pinned memory (for the copy back)."""
        index, cpu = self.index, torch.device("cpu")
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if ready is not None:
            ready.synchronize()
        batch = _Batch("lookup", host, None, None, cpu, None, key_order=True)
        index._answer_group([index._host_view(t.chunk) for t in tasks], tasks, batch, cpu)
        parts = []
        for k in (1, 2):
            xs = [t.result[k] for t in tasks]
            out = torch.empty(sum(x.numel() for x in xs), dtype=xs[0].dtype, pin_memory=self.cuda)
            torch.cat(xs, out=out)
            parts.append(out)
        return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3, device=True)
    ap.add_argument("--slices", default="1,2,4", help="slice counts, comma separated")
    ap.add_argument("--threads", default="", help="torch thread counts to try, comma separated (default: as set); "
                    "the host thread waiting on the GPU spins on a core the CPU's call would use")
    ap.add_argument("--cpu-shares", default="auto", help="the CPU's shares of each slice's misses to try, comma "
                    "separated (auto: from the planner's fitted rates)")
    ap.add_argument("--library-cpu-off", action="store_true", help="also the library's batch with the CPU priced "
                    "out of the plan (its rate set to 1 lookup/s for that batch): the GPU serves every queue")
    ap.add_argument("--library-switch", default="", help="a boolean of torch_rtindex.chunked (e.g. GROUP_CACHED): "
                    "the library's batch with it off and on, alternating with the lean path")
    a = ap.parse_args()
    switch = a.library_switch
    if switch and not isinstance(getattr(chunked, switch, None), bool):
        ap.error(f"--library-switch: torch_rtindex.chunked has no boolean {switch!r}")
    index, batches, dev, sync = tier_probe_on_device(a)
    for b in batches:  # the planner's rates fitted to these batches before the lean path reads them
        index.lookup(b)
    lean = Lean(index, dev, None)
    auto = lean.cpu_share
    print(f"the CPU's share by the planner's rates ({lean.rates}): {auto:.3f}", flush=True)
    shares = [auto if x == "auto" else float(x) for x in a.cpu_shares.split(",")]
    gc_timer = GcTimer()
    for i, q in enumerate(batches):
        with switched(SORTED_RUNS=False):  # the reference: the misses partitioned, not cut into runs as here
            ref = index.lookup(q)
        threads = [int(t) for t in a.threads.split(",")] if a.threads else [torch.get_num_threads()]
        library = [("library", None, threads[0])]
        if switch:
            library = [(f"library {switch}={on:d}", on, threads[0]) for on in ((False, True), (True, False))[i % 2]]
        if a.library_cpu_off:
            library.append(("library, cpu off", None, threads[0]))
        variants = library + [(int(k), x, t) for t in threads for x in shares for k in a.slices.split(",")]
        for variant, share, nt in variants:
            torch.set_num_threads(nt)
            if isinstance(variant, str):
                cpu_rate = index._cpu_rate
                if variant.endswith("cpu off"):
                    index._cpu_rate = 1.0
                with switched(**({switch: share} if share is not None else {})):
                    got, ms = gc_timer.timed(lambda: index.lookup(q), sync)
                index._cpu_rate = cpu_rate
                share = None
                first, count = got.first_row, got.count
                extra = ""
            else:
                lean.cpu_share, lean.threads = share, nt
                (first, count), ms = gc_timer.timed(lambda: lean.lookup(q, variant), sync)
                t0 = lean.marks[0][1]
                extra = "  host: " + " ".join(f"{w} {(t - t0) * 1e3:.2f}" for w, t in lean.marks[1:])
                if dev.type == "cuda":
                    extra += "  gpu: " + lean.gpu_timeline()
            same = bool(torch.equal(first, ref.first_row) and torch.equal(count, ref.count))
            label = str(variant) if share is None else f"{variant} cpu {share:.2f}" + (f" t{nt}" if a.threads else "")
            print(f"batch {i} {label:>12}: {ms:8.2f} ms  same {same}  gc {gc_timer.take()['gc_ms']:.1f} ms"
                  f"{extra}", flush=True)
    lean.pool.shutdown()


if __name__ == "__main__":
    main()
