"""How the GPU should launch the queues it reads in place (chunks in pinned host memory, over PCIe): a launch per
queue, or all of them in one cgrx_lookup_queues launch with at most a window of lookups in flight (swept queue by
queue); the CPU's threads. One index of 2^--log-keys uniform keys, gpu_budget a quarter of its bytes, a tier given the 2^26 hottest
keys, Zipf batches (their misses, sorted by key, are the small queues read in place); the same fresh batches for every variant,
answers compared across variants.

    python benchmarks/in_place_group_probe.py [--log-keys 30] [--log-lookups 27] [--variants queue 16384 queue+t15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import add_tier_probe_args, tier_probe  # noqa: E402
from rx_bench import git_commit, write_json  # noqa: E402

import torch_rtindex.chunked as chunked  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3)
    ap.add_argument("--variants", nargs="+", default=["queue", "16384", "32768", "65536", "0"],
                    help="IN_PLACE_WINDOW per variant ('queue': a launch per queue), each optionally with '+tN' "
                         "(N CPU threads), e.g. queue+t15")
    ap.add_argument("--layout", default="packed_row", help="ChunkedIndex(layout=...)")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    index, batches = tier_probe(a, dev, layout=a.layout)
    index.lookup(batches[0])  # calibration and the in-place views (search parts copied) before any timing
    mem = index.memory()
    print(f"{torch.cuda.get_device_name()}: 2^{a.log_keys} keys, {a.layout}, {index.num_chunks} chunks, tier {mem['hot'] / 2**30:.2f} "
          f"GiB, search parts {mem['search'] / 2**30:.2f} GiB, cache {mem['cache'] / 2**30:.2f} GiB", flush=True)
    rows, ref = [], None
    threads = torch.get_num_threads()
    for variant in a.variants:
        parts = variant.split("+")
        w = -1 if parts[0] == "queue" else int(parts[0])
        chunked.IN_PLACE_WINDOW = None if w < 0 else w
        torch.set_num_threads(next((int(p[1:]) for p in parts if p.startswith("t")), threads))
        index.lookup(batches[0])
        for i, q in enumerate(batches):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = index.lookup(q)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            last = index.stats()["last_batch"]
            same = True
            if ref is None or len(ref) <= i:
                ref = (ref or []) + [got]
            else:
                same = bool(torch.equal(got.first_row, ref[i].first_row) and torch.equal(got.count, ref[i].count))
            t = last["time_s"]
            row = {"variant": variant, "window": w, "threads": torch.get_num_threads(), "batch": i, "ms": ms, "in_place": last["queries_in_place"], "cpu": last["queries_cpu"],
                   "gpu_wait_ms": t["gpu_wait"] * 1e3, "cpu_ms": t["cpu"] * 1e3, "hot_ms": t["hot"] * 1e3,
                   "in_place_rate": index.stats()["in_place_rate"], "cpu_rate": index.stats()["cpu_rate"], "same": same}
            rows.append(row)
            print(f"{variant:>20}  batch {i}: {ms:7.2f} ms  in place {row['in_place']:8d} "
                  f"(wait {row['gpu_wait_ms']:6.2f} ms, {row['in_place_rate'] / 1e6:6.1f} M/s)  cpu {row['cpu']:7d} "
                  f"({row['cpu_ms']:6.2f} ms, {row['cpu_rate'] / 1e6:5.1f} M/s)  tier {row['hot_ms']:5.2f} ms  same {same}",
                  flush=True)
    write_json({"device": torch.cuda.get_device_name(), "commit": git_commit(), "layout": a.layout, "rows": rows},
               f"in_place_group_{a.layout}_{git_commit()}", a.out_dir)


if __name__ == "__main__":
    main()
