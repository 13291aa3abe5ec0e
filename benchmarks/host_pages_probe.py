"""GPU random reads of pinned host memory (zero copy) by the host pages behind it: cudaHostAlloc's pages against
2 MiB pages (transparent huge pages madvised before cudaHostRegister, or hugetlbfs where the host has a pool), over
regions of 256 MiB to 12 GiB. The issue measured about 0.7 G random reads/s within 256 MB and 0.04 G/s over 8-16 GB
with the default pages; if larger host pages keep the rate over the whole region, out-of-core misses could be read
in place without grouping them by chunk first.

    python3 benchmarks/host_pages_probe.py [--gib 12] [--log-reads 24] [--kinds hostalloc thp hugetlb]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baselines import load_baseline  # noqa: E402
from rx_bench import git_commit, timed, write_json  # noqa: E402


def meminfo(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=12.0, help="size of each kind's region")
    ap.add_argument("--log-reads", type=int, default=24)
    ap.add_argument("--kinds", nargs="+", default=["hostalloc", "small", "thp", "hugetlb"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_pages_probe.py measures a GPU: no CUDA device here")
    for f in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag",
              "/proc/sys/vm/nr_hugepages"):
        print(f"{f}: {Path(f).read_text().strip() if Path(f).exists() else 'absent'}")
    print(f"iommu groups: {len(list(Path('/sys/kernel/iommu_groups').glob('*')))}")
    ext = load_baseline("rtindex_host_pages", Path(__file__).parent / "baselines" / "host_pages.cu")
    size = int(a.gib * (1 << 30)) & ~((2 << 20) - 1)
    regions = [r for r in (256 << 20, 2 << 30, 8 << 30, size) if r <= size]
    gen = torch.Generator(device="cuda").manual_seed(1)
    n = 1 << a.log_reads
    rows = []
    for kind in a.kinds:
        if kind == "hugetlb" and meminfo("HugePages_Total") < size >> 21:
            try:  # a pool of 2 MiB pages, if this host lets us make one
                Path("/proc/sys/vm/nr_hugepages").write_text(str((size >> 21) + 16))
            except OSError as e:
                print(f"{kind}: no hugetlbfs pool ({e}); skipped")
                continue
        before = meminfo("AnonHugePages")
        try:
            addr = ext.host_alloc(kind, size)
        except RuntimeError as e:
            print(f"{kind}: allocation failed: {str(e).splitlines()[0]}")
            continue
        huge = meminfo("AnonHugePages") - before
        print(f"{kind}: {size / 2**30:.1f} GiB at {addr:#x}, AnonHugePages +{huge / 2**30:.2f} GiB, "
              f"HugePages_Free {meminfo('HugePages_Free')}")
        for region in regions:
            for sectors in (1, 4):
                idx = torch.randint(0, region // (32 * sectors), (n,), generator=gen, device="cuda")
                ms = timed(lambda: ext.host_gather(addr, idx, sectors), a.repeats)[0]
                rows.append({"kind": kind, "region_bytes": region, "sectors": sectors, "ms": ms,
                             "g_reads_per_s": n / ms / 1e6})
                print(f"  {kind:9s} region {region / 2**30:6.2f} GiB  {32 * sectors:3d} B reads: {ms:8.2f} ms "
                      f"= {n / ms / 1e6:6.3f} G reads/s", flush=True)
    write_json({"device": torch.cuda.get_device_name(), "commit": git_commit(), "reads": n, "rows": rows},
               f"host_pages_{git_commit()}", a.out)


if __name__ == "__main__":
    main()
