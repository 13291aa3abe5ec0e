"""Where a first build's extra time goes on the CPU: in one fresh process, a few builds of each named index over
2^20 keys, each with its wall time, process CPU time (all threads) and minor page faults; with ``--plain``, the
same for torch's own ``torch.sort`` and ``torch.ones`` of 96 MiB (the first-use cost of fresh memory that any op
pays). Run it with ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` set to see glibc's dynamic mmap threshold
at work (first_call_*.log in benchmarks/results/cpu_AMD_EPYC_2cores/ quotes its output).

    python3 benchmarks/lab/first_build_faults.py UpdatableCgRXIndex,ChunkedIndex --plain
"""

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common
import _common  # noqa: F401,E402  (this checkout first on sys.path)
import torch_rtindex as ti  # noqa: E402


def usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def timed(fn) -> str:
    (c0, f0), t = usage(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    c1, f1 = usage()
    del out
    return f"{wall * 1e3:.0f}ms/cpu{(c1 - c0) * 1e3:.0f}/flt{f1 - f0}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("classes", help="comma-separated: RXIndex, CgRXIndex, UpdatableCgRXIndex, ChunkedIndex")
    parser.add_argument("--builds", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="also torch.sort and torch.ones(96 MiB), first")
    args = parser.parse_args()
    keys = torch.randint(-2**63, 2**63 - 1, (1 << 20,), generator=torch.Generator().manual_seed(0))
    if args.plain:
        print("torch.sort", " ".join(timed(lambda: torch.sort(keys, stable=True)) for _ in range(args.builds)))
        ones = " ".join(timed(lambda: torch.ones(12 << 20, dtype=torch.int64)) for _ in range(args.builds))
        print("torch.ones(96 MiB)", ones)
    for name in args.classes.split(","):
        cls = getattr(ti, name)
        print(name, " ".join(timed(lambda: cls(keys)) for _ in range(args.builds)))


if __name__ == "__main__":
    main()
