"""Where a ChunkedIndex batch's merge spends its time: 2^--log-keys uniform keys, gpu_budget a quarter of the
index, a tier given the 2^26 hottest keys, Zipf batches; the last batches run under torch.profiler (CPU and CUDA),
its top entries by host time printed, with the batch's stage times.

    python benchmarks/merge_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 0.99]
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, tier_probe  # noqa: E402


class MergeSampler(threading.Thread):
    """Samples the calling thread's Python stack every ``period_s`` while it runs ChunkedIndex._merge: where a stalled
    merge waits (torch operators release the GIL, so a sample lands during a blocking call; a gap between samples
    longer than the period is time a call held the GIL)."""

    def __init__(self, index, period_s: float = 5e-4) -> None:
        super().__init__(daemon=True)
        self.target_id, self.period_s, self.active = threading.get_ident(), period_s, False
        self.samples: collections.Counter = collections.Counter()
        self.longest_gap_s = 0.0
        merge = index._merge

        def sampled(*args, **kw):
            self.active = True
            try:
                return merge(*args, **kw)
            finally:
                self.active = False

        index._merge = sampled
        self.start()

    def run(self) -> None:
        last = None
        while True:
            time.sleep(self.period_s)
            now = time.perf_counter()
            if not self.active:
                last = None
                continue
            if last is not None:
                self.longest_gap_s = max(self.longest_gap_s, now - last)
            last = now
            frame = sys._current_frames().get(self.target_id)
            where = []
            while frame is not None and len(where) < 3:  # the innermost lines of the package
                if "torch_rtindex" in frame.f_code.co_filename:
                    where.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            self.samples[" < ".join(where)] += 1

    def take(self) -> tuple[list, float]:
        out = (self.samples.most_common(8), self.longest_gap_s)
        self.samples, self.longest_gap_s = collections.Counter(), 0.0
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=0.99, batches=4)
    ap.add_argument("--profiled", type=int, default=1)
    a = ap.parse_args()
    dev = torch.device("cuda")
    index, batches = tier_probe(a, dev)
    print(f"after warm: {index.rates()}", flush=True)

    def allocs():
        d = torch.cuda.memory_stats()
        h = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
        return {"device_allocs": d.get("num_device_alloc", 0), "alloc_retries": d.get("num_alloc_retries", 0),
                "device_frees": d.get("num_device_free", 0), "host_allocs": h.get("num_host_alloc", 0),
                "host_alloc_ms": h.get("host_alloc_time.total", 0) / 1e3}

    gc_timer = GcTimer()
    sampler = MergeSampler(index)
    for i, q in enumerate(batches):
        prof = i >= a.batches - a.profiled
        before = allocs()
        gc_timer.take()
        ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                 torch.profiler.ProfilerActivity.CUDA]) if prof else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if ctx:
            with ctx:
                index.lookup(q)
                torch.cuda.synchronize()
        else:
            index.lookup(q)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        last = index.stats()["last_batch"]
        t = {k: round(v * 1e3, 1) for k, v in last["time_s"].items() if v}
        print(f"batch {i}{' (profiled)' if prof else ''}: {ms:.1f} ms, in place {last['queries_in_place']}, "
              f"cpu {last['queries_cpu']}, stages ms {t}\n  rates {index.rates()}\n  allocations "
              f"{ {k: round(v - before[k], 1) for k, v in allocs().items()} }, garbage collections {gc_timer.take()}",
              flush=True)
        samples, gap = sampler.take()
        print(f"  merge samples (every 0.5 ms; longest gap {gap * 1e3:.1f} ms): {samples}", flush=True)
        if ctx:
            print(ctx.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


if __name__ == "__main__":
    main()
