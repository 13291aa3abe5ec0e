"""CPU probe: ``index.range`` (CSR) over 2^16 ranges of 4 / 64 / 1024 hits on 2^20 keys, median of 5 runs. Run it
with each tree on PYTHONPATH to compare two commits:

    PYTHONPATH=<tree> python3 benchmarks/csr_range_probe.py <label>
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import torch_rtindex as tr


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    torch.manual_seed(0)
    n = 1 << 20
    keys = torch.arange(n) * 3  # a range of width 3 (h - 1) around a key holds h keys
    index = tr.CgRXIndex(keys[torch.randperm(n)])
    out = {}
    for hits in (4, 64, 1024):
        lo = keys[torch.randint(0, n - hits, (1 << 16,))]
        hi = lo + 3 * (hits - 1)
        index.range(lo, hi)  # warm-up
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = index.range(lo, hi)
            times.append((time.perf_counter() - t0) * 1e3)
        assert int(r.offsets[-1]) == hits * (1 << 16), "wrong number of matches"
        out[hits] = statistics.median(times)
    print(label, " ".join(f"range {h} hits: {v:.1f} ms" for h, v in out.items()))


if __name__ == "__main__":
    main()
