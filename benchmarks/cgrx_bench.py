"""cgRX at scale on one GPU: every representative-search backend and bucket size, next to the sorted array
(torch.sort + torch.searchsorted) and RX, in the same run, on the same keys and lookups.

Checks every answer against the sorted array before reporting a time. Prints a table, writes JSON under
benchmarks/results/<device>/.

    python benchmarks/cgrx_bench.py --log-keys 26 --log-lookups 27
"""

from __future__ import annotations

import argparse

import torch

from rx_bench import build_timed, git_commit, make_keys, timed as timed_on, write_json  # noqa: E402  (same folder)

import torch_rtindex  # noqa: E402
from torch_rtindex import CgRXIndex  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--log-range-lookups", type=int, default=24)
    ap.add_argument("--dist", default="uniform64", choices=["uniform64", "uniform32", "dense", "clustered"])
    ap.add_argument("--bucket-sizes", default="4,16,64,256")
    ap.add_argument("--backends", default="radix,optix,binary_search")
    ap.add_argument("--hash-table", action="store_true", help="also run the project's own GPU hash-table baseline")
    ap.add_argument("--reserve-l2", action="store_true",
                    help="also measure each radix run's point lookups with its radix table in L2 set aside, as the "
                    "README recommends: torch_rtindex.reserve_l2 sized to index.memory()['radix_table'], given back "
                    "after the run")
    ap.add_argument("--layout", default="auto", help="layout of the main runs (every backend and bucket size; auto: "
                    "what the index picks for the backend)")
    ap.add_argument("--variants", default="", help="extra radix runs at B=16, e.g. 'column/binary,packed_row/linear'")
    ap.add_argument("--range-hits", default="4,64", help="hits per range lookup (ranges over dense keys); '' for none")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (the median is reported)")
    ap.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results/<device>/)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    timed = lambda fn: timed_on(fn, repeats=args.repeats, device=dev)  # noqa: E731
    gen = torch.Generator(device=dev).manual_seed(42)
    n, q, qr = 1 << args.log_keys, 1 << args.log_lookups, 1 << args.log_range_lookups
    info = torch_rtindex.optix_info() if cuda else {"abi": None, "has_rt_cores": None}
    keys = make_keys(args.dist, n, gen, dev)
    queries = keys[torch.randint(0, n, (q,), generator=gen, device=dev)]
    rows = []
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "commit": git_commit(), "torch": torch.__version__,
              "optix": info, "params": vars(args), "runs": []}

    (sk, perm), sa_build_ms, _ = build_timed(lambda: torch.sort(keys), dev)
    sa_bytes = sk.nbytes + perm.nbytes

    def sa_lookup():
        pos = torch.searchsorted(sk, queries).clamp(max=n - 1)
        return torch.where(sk[pos] == queries, perm[pos], -1)

    sa_ms, sa_rows = timed(sa_lookup)
    # ranges of h hits on dense keys: [k, k + h - 1] (fewer hits at the top end)
    hits = [int(h) for h in args.range_hits.split(",") if h]
    dense = make_keys("dense", n, gen, dev)
    lo = dense[torch.randint(0, n, (qr,), generator=gen, device=dev)]
    his = {h: lo + (h - 1) for h in hits}
    expected = {h: torch.clamp(his[h], max=n - 1) - lo + 1 for h in hits}
    dsk = torch.sort(dense).values
    sar_ms = {}
    for h in hits:
        sar_ms[h], sar = timed(lambda: torch.searchsorted(dsk, his[h], right=True) - torch.searchsorted(dsk, lo))
        assert torch.equal(sar, expected[h])
    nan = float("nan")
    rows.append(("SA", "-", sa_build_ms, sa_bytes / 1e9, sa_ms, sar_ms, nan, {h: nan for h in hits}))
    result["sa"] = {"build_ms": sa_build_ms, "bytes": sa_bytes, "lookup_ms": sa_ms,
                    **{f"range{h}_ms": sar_ms[h] for h in hits}}
    if args.hash_table:
        from baselines.hash_table import HashTable

        HashTable(keys[:1024])  # compile and warm up outside the timing
        ht, ht_build_ms, _ = build_timed(lambda: HashTable(keys))
        ht_ms, ht_rows = timed(lambda: ht.lookup(queries))
        assert torch.equal(ht_rows, sa_rows), "hash table disagrees with the sorted array"
        rows.append(("hash table (own baseline, no ranges)", "-", ht_build_ms, ht.nbytes() / 1e9, ht_ms,
                     {h: nan for h in hits}, nan, {h: nan for h in hits}))
        result["hash_table"] = {"build_ms": ht_build_ms, "bytes": ht.nbytes(), "lookup_ms": ht_ms}
        del ht

    configs = [(backend, b, args.layout, "binary") for backend in args.backends.split(",")
               for b in [int(x) for x in args.bucket_sizes.split(",")]]
    configs += [("radix", 16, *v.split("/")) for v in args.variants.split(",") if v]
    for backend, b, layout, search in configs:

        def make(ks, b=b, backend=backend, layout=layout, search=search):
            return CgRXIndex(ks, bucket_size=b, backend=backend, layout=layout, bucket_search=search)

        index, build_ms, peak = build_timed(lambda: make(keys), dev)
        mem = index.memory()
        dindex = make(dense) if hits else None
        point, ranges, counts = {}, {False: {}, True: {}}, {}
        for sort in (False, True):  # queries as given, and sorted inside the lookup (counted)
            index.sort_queries = sort
            if dindex is not None:
                dindex.sort_queries = sort
            point[sort], res = timed(lambda: index.lookup(queries))
            wrong = int((res.first_row != sa_rows).sum())
            assert wrong == 0, f"cgRX {backend} B={b} (sort_queries={sort}): {wrong} wrong answers"
            for h in hits:
                ranges[sort][h], rres = timed(lambda: dindex.range_lookup(lo, his[h]))
                assert torch.equal(rres.count, expected[h]), f"cgRX {backend} B={b} (sort_queries={sort}): {h}-hit ranges wrong"
                if not sort:  # the count alone (range_count: two position searches), what SA's time is of
                    counts[h], cres = timed(lambda: dindex.range_count(lo, his[h]))
                    assert torch.equal(cres, expected[h]), f"cgRX {backend} B={b}: {h}-hit range counts wrong"
        total = sum(mem.values())
        label = f"cgRX {backend} {index.layout}" + ("" if search == "binary" else f"/{search}")
        rows.append((label, b, build_ms, total / 1e9, point[False], ranges[False], point[True], ranges[True], counts))
        reserved = {}
        if args.reserve_l2 and cuda and backend == "radix":
            # The README's recommendation: a set-aside sized to the index's table, for the lookups only.
            index.sort_queries = False
            granted = torch_rtindex.reserve_l2(mem["radix_table"])
            try:
                reserved["lookup_ms"], res = timed(lambda: index.lookup(queries))
            finally:
                torch_rtindex.reserve_l2(0)
            wrong = int((res.first_row != sa_rows).sum())
            assert wrong == 0, f"cgRX {backend} B={b} with L2 set aside: {wrong} wrong answers"
            reserved["granted_bytes"] = granted
            rows.append((f"  table in L2 set-aside ({granted / 2**20:.1f} MiB)", b, nan, total / 1e9,
                         reserved["lookup_ms"], {h: nan for h in hits}, nan, {h: nan for h in hits}))
        result["runs"].append({"backend": backend, "bucket_size": b, "layout": index.layout, "bucket_search": search,
                               "build_ms": build_ms, "build_peak_gb": peak, "memory": mem,
                               "lookup_ms": point[False], "lookup_query_sort_ms": point[True],
                               **{f"range{h}_ms": ranges[False][h] for h in hits},
                               **{f"range{h}_query_sort_ms": ranges[True][h] for h in hits},
                               **{f"range{h}_count_ms": counts[h] for h in hits},
                               **({"l2_reserved": reserved} if reserved else {})})
        index = dindex = res = rres = None  # the closures above hold the name: released, not deleted
        if cuda:
            torch.cuda.empty_cache()

    print(f"\n{result['device']}  commit {result['commit']}  OptiX ABI {info['abi']}  RT cores: {info['has_rt_cores']}")
    print(f"keys 2^{args.log_keys} ({args.dist}), point lookups 2^{args.log_lookups} (all hits), "
          f"range lookups 2^{args.log_range_lookups} of {args.range_hits} hits (dense keys)")
    print("queries as given; +qsort: sorted inside the lookup (index.sort_queries=True, sort counted); rN: N-hit ranges"
          " (range_lookup: first row and count; SA: the count); cN: N-hit range_count (the count alone)")
    head = "".join(f" {f'r{h} ms':>9s} {'vs SA':>6s}" for h in hits) + f" {'+qsort pt':>10s}"
    head += "".join(f" {f'+qsort r{h}':>10s}" for h in hits)
    head += "".join(f" {f'c{h} ms':>9s} {'vs SA':>6s}" for h in hits)
    print(f"{'method':36s} {'B':>4s} {'build ms':>9s} {'GB':>7s} {'point ms':>9s} {'vs SA':>6s}" + head)
    for name, b, bms, gb, ms, rms, qms, qrms, cms in [r if len(r) == 9 else (*r, {}) for r in rows]:
        line = f"{name:36s} {b!s:>4s} {bms:9.1f} {gb:7.3f} {ms:9.2f} {sa_ms / ms:5.2f}x"
        line += "".join(f" {rms[h]:9.2f} {sar_ms[h] / rms[h]:5.2f}x" for h in hits) + f" {qms:10.2f}"
        line += "".join(f" {qrms[h]:10.2f}" for h in hits)
        print(line + "".join(f" {cms[h]:9.2f} {sar_ms[h] / cms[h]:5.2f}x" if h in cms else f" {'-':>9s} {'':6s}"
                             for h in hits))
    if cuda:
        write_json(result, f"cgrx_{args.dist}_k{args.log_keys}_q{args.log_lookups}_{result['commit']}", args.out)


if __name__ == "__main__":
    main()
