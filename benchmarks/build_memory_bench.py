"""Peak GPU memory of an index build against the size of the index it builds. For each index and key count:
the caller's keys (made before the build), the peak the caching allocator saw during the build above those
keys (torch.cuda.max_memory_allocated), the index's own bytes once built (index.memory()), and the ratio
peak / index, next to the build time. Answers are spot-checked against the keys. Writes
benchmarks/results/<device>/build_memory_<commit>.json.

    python benchmarks/build_memory_bench.py --builds cgrx:int64:26 rx:int64:26 cgrx:int64:30 cgrx:int32:2147549184

A build is `index:dtype:count`, the count given as log2 (up to 64) or as the number of keys (2147549184 = 2^31 + 2^16).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
import torch_rtindex  # noqa: E402
from rx_bench import git_commit, write_json  # noqa: E402

GiB = float(1 << 30)


def parse_count(text: str) -> int:
    return int(text) if int(text) > 64 else 1 << int(text)


def one_build(kind: str, dtype: torch.dtype, n: int) -> dict:
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    gen = torch.Generator(device=dev).manual_seed(n)
    info = torch.iinfo(dtype)
    keys = torch.randint(info.min, info.max, (n,), device=dev, dtype=dtype, generator=gen)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    cls = {"cgrx": torch_rtindex.CgRXIndex, "rx": torch_rtindex.RXIndex}[kind]
    t0 = time.perf_counter()
    ix = cls(keys)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - before
    index_bytes = sum(ix.memory().values())
    probe = keys[torch.randint(0, n, (1 << 16,), device=dev, generator=gen)]
    got = ix.lookup(probe)
    if not bool((got.count > 0).all()) or not bool((keys[got.first_row] == probe).all()):
        raise SystemExit(f"{kind} over {n} {dtype} keys: a key it holds was not found")
    entry = {"index": kind, "dtype": str(dtype).replace("torch.", ""), "keys": n, "caller_keys_bytes": keys.numel() * keys.element_size(),
             "index_bytes": index_bytes, "build_peak_bytes": peak, "peak_over_index": peak / index_bytes,
             "build_s": seconds, "memory": ix.memory()}
    print(f"{kind:>5} {entry['dtype']:>6} n={n:>11}: caller keys {entry['caller_keys_bytes'] / GiB:6.2f} GiB, index "
          f"{index_bytes / GiB:6.2f} GiB, build peak above the keys {peak / GiB:6.2f} GiB = {peak / index_bytes:.2f}x the "
          f"index (target <= 2x), build {seconds:.2f} s", flush=True)
    del ix, got, keys, probe
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", default=["cgrx:int64:26", "rx:int64:26", "cgrx:int64:30", "cgrx:int32:2147549184"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtypes = {"int64": torch.int64, "int32": torch.int32}
    entries = []
    for spec in args.builds:
        kind, dt, count = spec.split(":")
        try:
            entries.append(one_build(kind, dtypes[dt], parse_count(count)))
        except torch.cuda.OutOfMemoryError as e:
            print(f"{spec}: out of memory: {str(e).splitlines()[0]}", flush=True)
            entries.append({"index": kind, "dtype": dt, "keys": parse_count(count), "error": "out of memory"})
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    write_json({"device": name, "torch": torch.__version__, "commit": git_commit(), "argv": sys.argv[1:],
                "total_gpu_bytes": torch.cuda.get_device_properties(0).total_memory, "builds": entries},
               f"build_memory_{git_commit()}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
