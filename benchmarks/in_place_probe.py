"""How fast the GPU answers a chunk's queue by reading the chunk in place (zero copy over PCIe), by which of the
chunk's parts stay in host memory: everything, the pairs and row map only (the representatives and radix table in
GPU memory: the shipped path), the pairs only. Chunks whose pairs hold row offsets (every chunk of an index under
2^32 keys, since 99d1c90) have no row map, so there the last two variants are one. ChunkedIndex with
processors="zero_copy" (every queue read in place), uniform hits, batches of 2^20 and 2^24.

    python benchmarks/in_place_probe.py [--log-keys 28] [--log-lookups 20 24] [--layouts packed_row aligned_row]

A layout whose radix unit is one line (aligned_row: 4 pairs in 64 bytes) answers a lookup from one read of the pairs,
where packed_row bisects a 16-pair unit (192 bytes): up to four dependent reads, each a PCIe round trip in place.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # rx_bench (same folder)

import torch  # noqa: E402

from rx_bench import git_commit, write_json  # noqa: E402

import torch_rtindex.chunked as chunked  # noqa: E402
from torch_rtindex import ChunkedIndex  # noqa: E402

VARIANTS = {"all in host memory": (), "search on the GPU": ("reps", "table"), "pairs only in host": ("reps", "table", "l2g")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log-keys", type=int, default=28)
    ap.add_argument("--log-lookups", type=int, nargs="+", default=[20, 24])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", nargs="+", default=["packed_row"], help="ChunkedIndex(layout=...) to compare")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    keys = torch.randint(-(2**63), 2**63 - 1, (1 << a.log_keys,), generator=gen)
    rows = []
    plain = chunked._views
    for layout in a.layouts:
        chunked._views = plain
        t0 = time.perf_counter()
        index = ChunkedIndex(keys, device=dev, gpu_budget=1 << 30, hot_keys=0, progress=False, layout=layout)
        print(f"{layout}: 2^{a.log_keys} keys, {len(index.chunk_info())} chunks, built in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        index.processors = "zero_copy"
        index._search_budget = 0  # the variants below choose what stays in host memory, not the index's reservation
        for log_m in a.log_lookups:
            pos = torch.randint(0, keys.numel(), (1 << log_m,), generator=gen)
            q = keys.index_select(0, pos).to(dev)
            ref = None
            for name, resident in VARIANTS.items():
                def views(buf, specs, resident=resident):
                    out = plain(buf, specs)
                    return {k: (v.clone() if k in resident else v) for k, v in out.items()}
                chunked._views = views
                for c in index._chunks:
                    c.mapped_view = None
                index.lookup(q)  # makes the views
                torch.cuda.synchronize()
                ts = []
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    res = index.lookup(q)
                    torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t0) * 1e3)
                ms = sorted(ts)[len(ts) // 2]
                if ref is None:
                    ref = res
                same = bool(torch.equal(res.first_row, ref.first_row) and torch.equal(res.count, ref.count))
                rows.append({"layout": layout, "variant": name, "log_lookups": log_m, "ms": ms,
                             "M_per_s": (1 << log_m) / ms / 1e3, "same_answers": same})
                print(f"{layout:11s} 2^{log_m:2d} lookups  {name:22s} {ms:9.2f} ms  "
                      f"{(1 << log_m) / ms / 1e3:8.1f} M lookups/s  answers {'equal' if same else 'DIFFER'}", flush=True)
        del index
    chunked._views = plain
    write_json({"device": torch.cuda.get_device_name(), "commit": git_commit(), "log_keys": a.log_keys, "rows": rows},
               f"in_place_probe_{git_commit()}", a.out_dir)


if __name__ == "__main__":
    main()
