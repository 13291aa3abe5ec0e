"""Whether the two serving threads of a ChunkedIndex batch slow each other on the host (issue 12's Zipf 1.2
target): the thread issuing the GPU's queues and the CPU worker share the GIL and the cores (the worker's CPU
calls run on all of them). The library's batch over a given hot tier with variants interleaved batch by batch:
Python's GIL switch interval shortened, and the CPU worker's calls on fewer threads than there are cores. Stage
times per batch; answers compared with the first variant's.

    python benchmarks/contention_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 1.2]
    python benchmarks/contention_probe.py --device cpu --log-keys 16 --log-lookups 14 --hot-keys 4096 --chunk-mib 0.0625
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, tier_probe_on_device  # noqa: E402


def with_worker_threads(index, threads: int | None):
    """Has the index's CPU worker run its calls on ``threads`` threads (None: as the library does)."""
    loop = type(index)._cpu_loop

    def run(sched, batch, error):
        if threads is None or error is None:  # error None: the calling thread serves alone
            return loop(index, sched, batch, error)
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return loop(index, sched, batch, error)
        finally:
            torch.set_num_threads(old)

    index._cpu_loop = run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3, device=True)
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    cores = torch.get_num_threads()
    default_switch = sys.getswitchinterval()
    variants = [("library", default_switch, None), ("switch 0.5 ms", 5e-4, None), ("switch 0.1 ms", 1e-4, None),
                (f"worker {cores - 1} threads", default_switch, cores - 1),
                (f"worker {max(1, cores - 2)} threads", default_switch, max(1, cores - 2)),
                (f"switch 0.5 ms, worker {cores - 1}", 5e-4, cores - 1)]
    gc_timer = GcTimer()
    for i, q in enumerate(batches):
        ref = None
        for label, switch, threads in variants:
            with_worker_threads(index, threads)
            sys.setswitchinterval(switch)
            got, ms = gc_timer.timed(lambda: index.lookup(q), sync)
            sys.setswitchinterval(default_switch)
            ref = got if ref is None else ref
            same = bool(torch.equal(got.first_row, ref.first_row) and torch.equal(got.count, ref.count))
            last = index.stats()["last_batch"]
            t = {k: round(v * 1e3, 2) for k, v in last["time_s"].items() if v}
            fixed = {k: None if v is None else round(v * 1e6) for k, v in (index.stats()["fixed_s"] or {}).items()}
            print(f"batch {i} {label:>26}: {ms:7.2f} ms  same {same}  cpu {last['queries_cpu']:>8}  in place "
                  f"{last['queries_in_place']:>8}  stages ms {t}  fixed us {fixed}  gc {gc_timer.take()['gc_ms']:.1f} ms",
                  flush=True)
        del index._cpu_loop


if __name__ == "__main__":
    main()
