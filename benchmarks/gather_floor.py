"""The random-read floor of point lookups on this GPU, next to cgRX radix and the hash-table baseline in the same
run: 2^--log-lookups threads each read one random line of a table as large as the radix index over 2^--log-keys
uniform 64-bit keys, touching 1, 2 or 4 of its 32-byte sectors (baselines/gather_floor.cu), then write 8 bytes;
the radix lookups also with their table in L2's persisting set-aside (torch_rtindex.reserve_l2).
An index whose lookup reads S random sectors cannot beat the S-sector row; the ratio between rows says what a
layout with fewer sectors per lookup could gain.

    python3 benchmarks/gather_floor.py                   # 2^26 keys, 2^27 lookups
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from baselines import load_baseline  # noqa: E402
from baselines.hash_table import HashTable  # noqa: E402
from rx_bench import git_commit, make_keys, timed, write_json  # noqa: E402

from torch_rtindex import CgRXIndex, reserve_l2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results/<GPU>/)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gather_floor.py measures a GPU: no CUDA device here")
    floor = load_baseline("rtindex_gather_floor", Path(__file__).parent / "baselines" / "gather_floor.cu")
    gen = torch.Generator(device="cuda").manual_seed(1)
    keys = make_keys("uniform64", 1 << args.log_keys, gen, "cuda")
    m = 1 << args.log_lookups
    queries = keys[torch.randint(0, keys.numel(), (m,), generator=gen, device="cuda")]
    index = CgRXIndex(keys, backend="radix")
    table_bytes = sum(t.nbytes for t in index._index_tensors())

    def gather_ms(sectors: int) -> float:
        table = torch.zeros(table_bytes // 8, dtype=torch.int64, device="cuda")
        idx = torch.randint(0, table_bytes // (32 * sectors), (m,), generator=gen, device="cuda")
        return timed(lambda: floor.gather(table, idx, sectors), args.repeats)[0]

    rows = [{"method": f"random gather, {s} sector{'s' if s > 1 else ''} ({32 * s} B) per lookup", "ms": gather_ms(s)}
            for s in (1, 2, 4)]
    ht = HashTable(keys)
    for method, fn in (("cgRX radix lookup (first row and count)", lambda: index.lookup(queries)),
                       ("cgRX radix lookup_rows (first row)", lambda: index.lookup_rows(queries)),
                       ("hash table lookup (128 B window per probe)", lambda: ht.lookup(queries))):
        rows.append({"method": method, "ms": timed(fn, args.repeats)[0]})
    # The same lookups with the radix table in L2's persisting set-aside (torch_rtindex.reserve_l2).
    granted = reserve_l2(index.memory()["radix_table"])
    try:
        for method, fn in ((f"cgRX radix lookup, table in {granted >> 20} MiB of L2 set aside", lambda: index.lookup(queries)),
                           (f"cgRX radix lookup_rows, table in {granted >> 20} MiB of L2", lambda: index.lookup_rows(queries))):
            rows.append({"method": method, "ms": timed(fn, args.repeats)[0]})
    finally:
        reserve_l2(0)
    name = torch.cuda.get_device_name()
    print(f"{name}  commit {git_commit()}  2^{args.log_keys} keys, 2^{args.log_lookups} lookups, table "
          f"{table_bytes / 1e9:.3f} GB (the radix index's bytes)")
    one = rows[0]["ms"]
    for r in rows:
        r["x_one_sector"] = r["ms"] / one
        rate = m / r["ms"] / 1e6
        print(f"{r['method']:58s} {r['ms']:8.2f} ms  {rate:7.2f} G lookups/s  {r['x_one_sector']:5.2f}x one sector")
    write_json({"device": name, "commit": git_commit(), "log_keys": args.log_keys, "log_lookups": args.log_lookups,
                "table_bytes": table_bytes, "rows": rows}, f"gather_floor_k{args.log_keys}_{git_commit()}", args.out)


if __name__ == "__main__":
    main()
