"""Where a given-tier Zipf batch spends its time, kernel by kernel (torch.profiler over the library's batch), and
what the tier's own pass costs against the floor of its structure: the tier's cgRX lookups alone, and a GPU hash
table (benchmarks/baselines) over the same tier keys, on the same batch. Issue 12's Zipf 1.2 target: a probe of
where the time goes, not a feature.

    python benchmarks/tier_profile_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 1.2] [--heads 18,20,22]
        [--no-hash]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, stages_ms, tier_probe_on_device  # noqa: E402

from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex.chunked import _Batch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3, device=True)
    ap.add_argument("--no-hash", action="store_true", help="skip the hash table over the tier's keys")
    ap.add_argument("--heads", default="18,20,22", help="log2 sizes of a head tier (the hottest keys) tried first")
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    timer = GcTimer()
    q = batches[-1]
    for i, b in enumerate(batches):
        _, ms = timer.timed(lambda: index.lookup(b), sync)
        st = index.stats()["last_batch"]["time_s"]
        print(f"library batch {i}: {ms:7.2f} ms  stages {stages_ms(st)}", flush=True)
    qlo, _ = index._check_queries(q, None)
    view = index._tier_view(dev)
    for r in range(3):
        out, ms = timer.timed(lambda: index._answer(view, _Batch("lookup", qlo, None, None, dev, None), qlo, None, dev),
                              sync)
        _, ms2 = timer.timed(lambda: torch.nonzero(out[2] == 0).reshape(-1), sync)
        print(f"tier pass alone (cgRX lookup, first + count): {ms:7.2f} ms; miss selection {ms2:6.2f} ms", flush=True)
    # A head: the tier's hottest keys (its keys are kept in priority order) in a cgRX index of their own, whose
    # lookups may stay in L2; its misses then go to the whole tier, whose misses go to the chunks.
    hot = index._tier_keys()  # flipped ordered keys: the int64 keys themselves
    ref_miss = None
    for lh in (int(x) for x in a.heads.split(",") if x):
        head = CgRXIndex(hot[: 1 << lh].to(dev), bucket_size=a.bucket_size)
        for r in range(3):
            sync()
            t0 = time.perf_counter()
            _, c = head.lookup(q)
            sync()
            t1 = time.perf_counter()
            hm = torch.nonzero(c == 0).reshape(-1)
            qm = qlo.index_select(0, hm)
            sync()
            t2 = time.perf_counter()
            _, _, c2 = index._answer(view, _Batch("lookup", qm, None, None, dev, None), qm, None, dev)
            m2 = hm.index_select(0, torch.nonzero(c2 == 0).reshape(-1))
            sync()
            t3 = time.perf_counter()
            if ref_miss is None:
                _, _, cr = index._answer(view, _Batch("lookup", qlo, None, None, dev, None), qlo, None, dev)
                ref_miss = torch.nonzero(cr == 0).reshape(-1)
            same = bool(torch.equal(m2, ref_miss))
            print(f"head 2^{lh} keys: head pass {(t1 - t0) * 1e3:6.2f} ms, its misses {hm.numel()} selected in "
                  f"{(t2 - t1) * 1e3:5.2f} ms, the tier over them {(t3 - t2) * 1e3:5.2f} ms: total "
                  f"{(t3 - t0) * 1e3:6.2f} ms, misses {m2.numel()} (same as the tier alone: {same})", flush=True)
        del head
    if dev.type == "cuda" and not a.no_hash:
        from baselines.hash_table import HashTable
        tier_keys = index._tier_keys().to(dev)
        ht = HashTable(tier_keys[tier_keys != -1])  # the baseline reserves -1: its time, not its answers, counts
        print(f"hash table over the tier's {tier_keys.numel()} keys: {ht.nbytes() / 2**30:.2f} GiB", flush=True)
        for r in range(3):
            _, ms = timer.timed(lambda: ht.lookup(q), sync)
            print(f"hash table pass: {ms:7.2f} ms", flush=True)
        del ht
        torch.cuda.empty_cache()
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            index.lookup(q)
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
