"""What a cgRX lookup costs for keys outside the index's key range (the misses a sharded rank's in-place pass
over the caller's whole batch answers for the other ranks' keys), against hits, on one GPU.

    python3 benchmarks/miss_cost_probe.py --log-keys 26
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rx_bench import git_commit, timed  # noqa: E402  (also puts the repository on sys.path, after PYTHONPATH)

from torch_rtindex import CgRXIndex  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    a = ap.parse_args()
    n = 1 << a.log_keys
    g = torch.Generator(device="cuda").manual_seed(0)
    keys = torch.randint(0, 2**62, (n,), device="cuda", generator=g)  # this "shard" holds [0, 2^62)
    index = CgRXIndex(keys)
    hits = keys[torch.randint(0, n, (2 * n,), device="cuda", generator=g)]
    above = torch.randint(2**62, 2**63 - 1, (2 * n,), device="cuda", generator=g)
    below = torch.randint(-(2**63), 0, (2 * n,), device="cuda", generator=g)
    print(f"{torch.cuda.get_device_name()}, commit {git_commit()}, {n} keys in [0, 2^62), queries of {2 * n}")
    rows = {
        "hits": hits,
        "misses above the largest key": above,
        "misses below the smallest key": below,
        "half hits, half above (a first rank's pass)": torch.where(torch.arange(2 * n, device="cuda") % 2 == 0, hits, above),
        "half hits, half below (a last rank's pass)": torch.where(torch.arange(2 * n, device="cuda") % 2 == 0, hits, below),
    }
    base = None
    for name, q in rows.items():
        ms, _ = timed(lambda: index.lookup(q), repeats=7)
        base = base or ms
        print(f"{name:45s} {ms:8.3f} ms  ({ms / base:.2f}x hits)")
    half, _ = timed(lambda: index.lookup(hits[:n]), repeats=7)
    print(f"{'hits, half the queries':45s} {half:8.3f} ms")


if __name__ == "__main__":
    main()
