"""What the ChunkedIndex hot tier learns from batches larger than its learning sample (hot_sample): per batch, the
time, the tier's hits and its rebuilds, for uniform and Zipf-skewed IDs over shuffled keys. On the CPU:

    PYTHONPATH=<tree> python3 benchmarks/hot_tier_probe.py --log-keys 22 --log-batch 20 --log-sample 16
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_rtindex as tr  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=22)
    ap.add_argument("--log-batch", type=int, default=20)
    ap.add_argument("--log-sample", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--zipf", default="0,0.99,1.2", help="exponents; 0 is uniform")
    args = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, m = 1 << args.log_keys, 1 << args.log_batch
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), dtype=torch.int64)
    perm = torch.randperm(n)
    for s in (float(x) for x in args.zipf.split(",")):
        index = tr.ChunkedIndex(keys, chunk_bytes=4 << 20, gpu_budget=(n * 16) // 4, hot_sample=1 << args.log_sample)
        cdf = None
        if s > 0:
            w = 1.0 / np.arange(1, n + 1) ** s
            cdf = np.cumsum(w / w.sum())
        for b in range(args.batches):
            if cdf is None:
                q = keys[torch.randint(0, n, (m,))]
            else:
                q = keys[perm[torch.from_numpy(np.minimum(np.searchsorted(cdf, rng.random(m)), n - 1))]]
            t0 = time.perf_counter()
            index.lookup(q)
            ms = (time.perf_counter() - t0) * 1e3
            last = index.stats()["last_batch"]
            print(f"zipf {s:4.2f} batch {b}: {ms:7.1f} ms  tier hits {last['hot_hits']:8d} of {m}  "
                  f"rebuilds {last['hot_rebuilds']}  tier keys {index.stats()['hot_keys']}", flush=True)


if __name__ == "__main__":
    main()
