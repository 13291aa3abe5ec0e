"""The CPU engine against the sorted array on the same threads: builds against torch.sort, point lookups against
torch.searchsorted (left and right: what a (first row, count) answer needs), range counts and aggregates, at one
thread and at every thread count given, with every answer checked against the sorted array first.

The one-thread runs look up a slice of the batch (--one-thread-lookups) and report per-lookup rates, so that a
10^8-lookup grid fits in minutes; the speedup column compares rates on the same index.

    python benchmarks/cpu_bench.py --keys 100000000 --lookups 100000000 --threads 1 16
    python benchmarks/cpu_bench.py --keys 100000 --lookups 100000 --threads 1 2     # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
import torch_rtindex  # noqa: E402
from rx_bench import cpu_name, git_commit, write_json  # noqa: E402


def wall(fn, repeats: int):
    """(last result, median seconds) of `repeats` runs after one warm-up (CPU operators return when done)."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10**8)
    ap.add_argument("--lookups", type=int, default=10**8)
    ap.add_argument("--one-thread-lookups", type=int, default=10**7, help="batch size of the one-thread runs")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results/cpu_<model>/)")
    args = ap.parse_args()

    gen = torch.Generator().manual_seed(42)
    n, m = args.keys, args.lookups
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen)
    # Half hits, half uniform misses, shuffled.
    q = torch.cat([keys[torch.randint(0, n, (m // 2,), generator=gen)], torch.randint(-(2**63), 2**63 - 1, (m - m // 2,), generator=gen)])
    q = q[torch.randperm(m, generator=gen)]
    values = torch.randint(-1000, 1000, (n,), generator=gen)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        batch = q if threads > 1 else q[: min(m, args.one_thread_lookups)]
        b = batch.numel()
        reps = args.repeats if threads > 1 else 1  # one-thread runs of 10^8 keys take tens of seconds each
        log = lambda what, t: print(f"  {threads:>3} threads: {what:<28} {t:8.3f} s", flush=True)  # noqa: E731
        (sorted_keys, order), t_sort = wall(lambda: torch.sort(keys, stable=True), reps)
        log("torch.sort", t_sort)
        index, t_build = wall(lambda: torch_rtindex.CgRXIndex(keys), reps)
        log("CgRXIndex build", t_build)
        rx, t_rx_build = wall(lambda: torch_rtindex.RXIndex(keys), 1)
        log("RXIndex build", t_rx_build)

        def sa_lookup():
            a = torch.searchsorted(sorted_keys, batch)
            z = torch.searchsorted(sorted_keys, batch, right=True)
            return a, z

        (a, z), t_sa = wall(sa_lookup, reps)
        log(f"searchsorted x2, {b} q", t_sa)
        got, t_cgrx = wall(lambda: index.lookup(batch), reps)
        log(f"CgRX lookup, {b} q", t_cgrx)
        got_rx, t_rx = wall(lambda: rx.lookup(batch), 1)
        log(f"RX lookup, {b} q", t_rx)
        count = z - a
        first = torch.where(count > 0, order[a.clamp(max=n - 1)], -1)
        for name, r in (("cgrx", got), ("rx", got_rx)):
            if not (torch.equal(r.count, count) and torch.equal(r.first_row, first)):
                raise SystemExit(f"{name} point lookups disagree with the sorted array at {threads} threads")
        rec = {"threads": threads, "keys": n, "lookups": b, "sort_s": t_sort, "cgrx_build_s": t_build,
               "rx_build_s": t_rx_build, "searchsorted_s": t_sa, "cgrx_lookup_s": t_cgrx, "rx_lookup_s": t_rx}
        # Ranges of about 4 and 64 hits (uniform keys: width = hits * 2^64 / n), counts and sums.
        for hits in (4, 64):
            lo = batch
            hi = lo + (hits * (2**64 // n))
            hi = torch.where(hi < lo, torch.iinfo(torch.int64).max, hi)  # no wrap-around
            (ra, rz), t_sa_r = wall(lambda: (torch.searchsorted(sorted_keys, lo), torch.searchsorted(sorted_keys, hi, right=True)), reps)
            rl, t_rl = wall(lambda: index.range_lookup(lo, hi), reps)
            log(f"range{hits} SA / CgRX", t_sa_r)
            log(f"range{hits} CgRX range_lookup", t_rl)
            if not torch.equal(rl.count, rz - ra):
                raise SystemExit(f"range counts disagree at {threads} threads")
            agg, t_agg = wall(lambda: index.range_aggregate(lo, hi, values), 1)
            csum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(values[order], 0)])
            sa_sum, t_sa_sum = wall(lambda: csum[rz] - csum[ra], 1)
            if not torch.equal(agg.sum, sa_sum):
                raise SystemExit(f"range sums disagree at {threads} threads")
            rec[f"range{hits}_searchsorted_s"] = t_sa_r
            rec[f"range{hits}_cgrx_s"] = t_rl
            rec[f"range{hits}_aggregate_cgrx_s"] = t_agg
            rec[f"range{hits}_aggregate_sa_s"] = t_sa_r + t_sa_sum  # the prefix sums over sorted values are extra
        rows.append(rec)
        index = rx = None  # the closures above hold the name: released, not deleted

    one = next((r for r in rows if r["threads"] == 1), None)
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, commit {git_commit()}, "
          f"{n} uniform int64 keys, half-hit point lookups")
    print(f"{'thr':>4} {'lookups':>11} {'sort s':>7} {'build s':>8} {'x sort':>6} {'SA Mq/s':>8} {'cgRX Mq/s':>9} "
          f"{'x SA':>5} {'RX Mq/s':>8} {'x1thr':>6} {'r4 x SA':>8} {'r64 x SA':>9}")
    for r in rows:
        rate = lambda t: r["lookups"] / t / 1e6  # noqa: E731
        speedup = (rate(r["cgrx_lookup_s"]) / (one["lookups"] / one["cgrx_lookup_s"] / 1e6)) if one else float("nan")
        print(f"{r['threads']:>4} {r['lookups']:>11} {r['sort_s']:>7.2f} {r['cgrx_build_s']:>8.2f} "
              f"{r['cgrx_build_s'] / r['sort_s']:>6.2f} {rate(r['searchsorted_s']):>8.1f} {rate(r['cgrx_lookup_s']):>9.1f} "
              f"{r['searchsorted_s'] / r['cgrx_lookup_s']:>5.2f} {rate(r['rx_lookup_s']):>8.1f} {speedup:>6.1f} "
              f"{r['range4_searchsorted_s'] / r['range4_cgrx_s']:>8.2f} {r['range64_searchsorted_s'] / r['range64_cgrx_s']:>9.2f}")
    result = {"device": f"cpu {cpu_name()}", "cores": os.cpu_count(), "torch": torch.__version__,
              "commit": git_commit(), "argv": sys.argv[1:], "runs": rows}
    write_json(result, f"cpu_{git_commit()}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
