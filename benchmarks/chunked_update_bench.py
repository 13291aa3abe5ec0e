"""ChunkedIndex batch updates: read-only chunks (every touched chunk rebuilt) against node chunks
(``updatable=True``: a batch applied in place to the chunks it touches), random insert + delete batches that
touch every chunk, as a stream of new and expiring IDs does. After the batches, both indexes' point and range
answers are checked against a CgRXIndex built over the final pairs.

    python3 benchmarks/chunked_update_bench.py --device cpu --log-keys 22 --chunk-mib 4 --log-batch 12
    python3 benchmarks/chunked_update_bench.py --log-keys 28 --chunk-mib 256                      # on a GPU
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)

from chunked_bench import make_keys, sync  # noqa: E402  (same folder)
from rx_bench import cpu_name, git_commit, write_json  # noqa: E402

from torch_rtindex import CgRXIndex, ChunkedIndex  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--log-keys", type=int, default=28)
    ap.add_argument("--chunk-mib", type=float, default=256.0)
    ap.add_argument("--budget-fraction", type=float, default=0.25, help="gpu_budget = this x the index's bytes")
    ap.add_argument("--log-batch", type=int, default=16, help="insertions (and as many deletions) per batch, log2")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    n, b = 1 << args.log_keys, 1 << args.log_batch
    keys = make_keys(n, dev)
    gen = torch.Generator().manual_seed(11)
    chunk_bytes = max(1024, int(args.chunk_mib * 2**20))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    result = {"device": name, "commit": git_commit(), "torch": torch.__version__, "params": vars(args),
              "threads": torch.get_num_threads(), "runs": []}
    # The same batches for both: b new random keys in, b existing (key, row) pairs out, every batch.
    batches, live = [], torch.ones(n, dtype=torch.bool)
    for i in range(args.batches):
        ins = torch.randint(-(2**63), 2**63 - 1, (b,), generator=gen)
        pick = torch.randperm(n, generator=gen)[: 2 * b]
        pick = pick[live[pick]][:b]  # pairs still present
        live[pick] = False
        batches.append((ins, torch.arange(n + i * b, n + (i + 1) * b), keys[pick], pick))
    final_keys = torch.cat([keys[live]] + [x[0] for x in batches])
    final_rows = torch.cat([torch.nonzero(live)[:, 0]] + [x[1] for x in batches])
    ref = None
    for updatable in (False, True):
        t0 = time.perf_counter()
        index = ChunkedIndex(keys, device=dev, chunk_bytes=chunk_bytes, updatable=updatable, gpu_budget=0)
        budget = int(index.memory()["chunks"] * args.budget_fraction)
        del index
        index = ChunkedIndex(keys, device=dev, chunk_bytes=chunk_bytes, updatable=updatable, gpu_budget=budget)
        sync(dev)
        build_s = time.perf_counter() - t0
        times = []
        for ins, ins_rows, dk, dr in batches:
            sync(dev)
            t0 = time.perf_counter()
            index.update(insert_keys=ins, insert_rows=ins_rows, delete_keys=dk, delete_rows=dr)
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
        st = index.stats()
        # Check: point and range answers against a CgRXIndex over the final pairs (row IDs as given).
        if ref is None:
            order = torch.argsort(final_rows)
            ref_index = CgRXIndex(final_keys[order])  # rows 0.. in final-row order: map back through `order`
            ref = (ref_index, final_rows[order])
        ref_index, row_of = ref
        q = final_keys[torch.randint(0, final_keys.numel(), (1 << 14,), generator=gen)]
        want, got = ref_index.lookup(q), index.lookup(q.to(dev))
        ok = torch.equal(row_of[want.first_row], got.first_row.cpu()) and torch.equal(want.count, got.count.cpu())
        lo = q[:4096]
        hi = lo + (1 << 50)
        ok = ok and torch.equal(ref_index.range_count(lo, hi), index.range_count(lo.to(dev), hi.to(dev)).cpu())
        run = {"updatable": updatable, "build_s": build_s, "chunks": index.num_chunks, "batch_ms": times,
               "median_batch_ms": sorted(times)[len(times) // 2], "in_place": st["chunks_updated_in_place"],
               "rebuilt": st["chunks_rebuilt"], "checked": bool(ok)}
        result["runs"].append(run)
        print(f"{'node chunks' if updatable else 'read-only chunks':16s} build {build_s:7.2f} s, {index.num_chunks} "
              f"chunks; update batches of {b} in + {b} out: median {run['median_batch_ms']:9.1f} ms "
              f"({', '.join(f'{t:.0f}' for t in times)}); chunks updated in place {run['in_place']}, rebuilt "
              f"{run['rebuilt']}; answers {'ok' if ok else 'WRONG'}", flush=True)
        del index
    ro, nd = (r["median_batch_ms"] for r in result["runs"])
    print(f"node chunks: {ro / nd:.1f}x faster per batch")
    write_json(result, f"chunked_update_{result['commit']}", args.out)
    return 0 if all(r["checked"] for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
