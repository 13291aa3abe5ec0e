"""Where a ChunkedIndex batch's merge spends its time: 2^--log-keys uniform keys, gpu_budget a quarter of the
index, a tier given the 2^26 hottest keys, Zipf batches; the last batches run under torch.profiler (CPU and CUDA),
its top entries by host time printed, with the batch's stage times.

    python benchmarks/merge_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 0.99]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, tier_probe  # noqa: E402


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
        if ctx:
            print(ctx.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


if __name__ == "__main__":
    main()
