"""cgRX radix point lookups next to the hash-table baseline, small enough to run under Nsight Compute: 2^26
uniform 64-bit keys, 2^25 lookups, each lookup run twice (the second is the warm one to read).

    ncu --clock-control none -k regex:'search_kernel|lookup_kernel' --launch-skip 2 --launch-count 2 \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \\
        python3 benchmarks/lab/profile_cgrx.py --layout aligned_row
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rx_bench, _common
import _common  # noqa: F401,E402  (this checkout first on sys.path)
from baselines.hash_table import HashTable  # noqa: E402
from rx_bench import make_keys  # noqa: E402  (same folder)

from torch_rtindex import CgRXIndex  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=25)
    ap.add_argument("--bucket-size", type=int, default=16)
    ap.add_argument("--layout", default="auto", help="as CgRXIndex's layout (auto: aligned_row with the radix table)")
    ap.add_argument("--l2-fetch-bytes", type=int, default=0,
                    help="diagnostic: cudaLimitMaxL2FetchGranularity for this process (0: leave the driver's default)")
    args = ap.parse_args()
    if args.l2_fetch_bytes:
        cudart = ctypes.CDLL("libcudart.so.13")
        torch.cuda.init()
        assert cudart.cudaDeviceSetLimit(0x05, ctypes.c_size_t(args.l2_fetch_bytes)) == 0
    gen = torch.Generator(device="cuda").manual_seed(1)
    keys = make_keys("uniform64", 1 << args.log_keys, gen, "cuda")
    queries = keys[torch.randint(0, keys.numel(), (1 << args.log_lookups,), generator=gen, device="cuda")]
    index = CgRXIndex(keys, bucket_size=args.bucket_size, layout=args.layout, backend="radix")
    index.sort_queries = False
    table = HashTable(keys)
    for _ in range(2):
        index.lookup(queries)
        table.lookup(queries)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
