"""Where a ChunkedIndex's GPU build of 2^20 keys spends its time (issue 43: the tree after the phase built slower
than the tree before it, 15-21 against 8.7-9.1 ms for the second build on an H200).

One fresh process per tree (RTINDEX_TREE): four builds from CPU keys with ``device="cuda"`` (the first_call.py
case), each timed, a lookup after the first; then torch.profiler over two more builds, its busiest operations
printed. Public API only.

    RTINDEX_TREE=.ab/before TORCH_RTINDEX_BUILD_DIR=.build/ab/before python3 benchmarks/lab/chunked_build_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common  # noqa: E402,F401  (the tree measured first on sys.path)

import torch  # noqa: E402
import torch_rtindex as ti  # noqa: E402


def main() -> None:
    n = 1 << 20
    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)
    queries = keys[torch.randint(0, n, (1 << 16,), generator=gen)].cuda()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    times = []
    index = None
    for i in range(4):
        t = time.perf_counter()
        index = ti.ChunkedIndex(keys, device="cuda")
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
        if i == 0:
            assert int(index.lookup(queries).count.min()) >= 1
    print("builds (ms): " + " ".join(f"{x:.1f}" for x in times))
    print(f"chunks {len(index.chunk_info()) if hasattr(index, 'chunk_info') else '?'}; gpu_budget {index.gpu_budget}")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            index = ti.ChunkedIndex(keys, device="cuda")
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=48))


if __name__ == "__main__":
    main()
