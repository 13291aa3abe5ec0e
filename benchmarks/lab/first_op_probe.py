"""Where a first UpdatableCgRXIndex build's extra time goes on CUDA: in a fresh process, the first and second call
of each ATen operation its bulk load (``cgrx_nodes_load``, csrc/cgrx/cgrx_update.h) makes, in its order, then the
operator itself, then the whole build. A first call that costs milliseconds more than the second is the module
load of that kernel (CUDA's lazy loading) or a library's first-use set-up.

    python3 benchmarks/lab/first_op_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common  # noqa: E402,F401  (the checkout this file lives in)

import torch  # noqa: E402


def timed(label: str, fn, rows: list) -> None:
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    rows.append((label, *times))


def main() -> None:
    dev = torch.device("cuda")
    torch.empty(1, device=dev)
    torch.cuda.synchronize()
    import torch_rtindex as ti

    gen = torch.Generator().manual_seed(0)
    n = 1 << 20
    keys = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen).to(dev)
    rows_ = torch.arange(n, dtype=torch.int32, device=dev)
    top = torch.tensor(-2**63, device=dev)
    rows: list = []
    timed("sort int32 rows (stable, indices)", lambda: torch.sort(rows_, stable=True), rows)
    timed("index_select int64", lambda: keys.index_select(0, rows_.long()), rows)
    timed("index_select int32", lambda: rows_.index_select(0, rows_.long()), rows)
    timed("sort int64 keys (stable, indices)", lambda: torch.sort(keys, stable=True), rows)
    flipped = torch.sort(keys ^ top).values
    timed("bitwise_xor", lambda: flipped ^ top, rows)
    timed("arange int64", lambda: torch.arange(15, n, 16, device=dev), rows)
    cand = torch.cat([torch.arange(15, n, 16, device=dev), torch.full((1,), n - 1, device=dev)])
    timed("cat + full", lambda: torch.cat([cand, torch.full((1,), n - 1, device=dev)]), rows)
    timed("searchsorted right", lambda: torch.searchsorted(flipped, flipped.index_select(0, cand), right=True), rows)
    ends = torch.searchsorted(flipped, flipped.index_select(0, cand), right=True) - 1
    timed("unique_consecutive", lambda: torch.unique_consecutive(ends), rows)
    timed("floor_divide + clamp_min", lambda: torch.clamp_min(torch.floor_divide(ends + 31, 32), 1), rows)
    timed("cumsum", lambda: torch.cumsum(ends, 0), rows)
    timed("sum + item", lambda: ends.sum().item(), rows)
    timed("zeros int32", lambda: torch.zeros(n, dtype=torch.int32, device=dev), rows)
    ordered = torch.ops.rtindex.map_keys(keys, 0)
    timed("cgrx_nodes_load (the operator)", lambda: torch.ops.rtindex.cgrx_nodes_load(ordered, rows_, 32, 1.25), rows)
    timed("UpdatableCgRXIndex build", lambda: ti.UpdatableCgRXIndex(keys), rows)
    print(f"{'operation':40} {'first ms':>10} {'second ms':>10}")
    for label, first, second in rows:
        print(f"{label:40} {first:10.2f} {second:10.2f}")


if __name__ == "__main__":
    main()
