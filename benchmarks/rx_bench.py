"""RX at scale on one GPU, next to a sorted array (torch.sort + torch.searchsorted) in the same run.

Checks every answer against the sorted array before it reports a time. Prints a table and writes JSON under
benchmarks/results/<device>/.

    python benchmarks/rx_bench.py --log-keys 26 --log-lookups 27
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import NamedTuple

import torch

# this checkout first on sys.path; the other benches import these helpers from here too
from _common import cpu_name, git_commit, results_dir, write_json  # noqa: F401
import torch_rtindex  # noqa: E402
from torch_rtindex import RXIndex  # noqa: E402


def build_timed(fn, device="cuda"):
    """(fn(), wall milliseconds, peak GB allocated during the call above what was allocated before it). On the
    CPU the peak is None: torch keeps no allocation statistics there."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return out, ms, (torch.cuda.max_memory_allocated() - base) / 1e9 if cuda else None


def timed(fn, repeats=5, warmup=1, device="cuda", keep=None):
    """Median milliseconds of `repeats` runs after `warmup`: timed with CUDA events on the current stream on a
    CUDA device, with time.perf_counter around each run on the CPU (whose operators return with the work done);
    `keep` (a list) receives every run's milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.device(device).type == "cuda"
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    if keep is not None:
        keep.extend(times)
    return statistics.median(times), out


def make_keys(dist: str, n: int, gen: torch.Generator, device) -> torch.Tensor:
    if dist == "uniform64":
        return torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, device=device, dtype=torch.int64)
    if dist == "uniform32":
        return torch.randint(0, 2**32, (n,), generator=gen, device=device, dtype=torch.int64)
    if dist == "dense":
        return torch.randperm(n, generator=gen, device=device).to(torch.int64)
    if dist == "clustered":  # a dense run of 7/8 of the keys plus a sparse tail: one wide slice of cgRX's radix table
        sparse = torch.randint(-(2**63), 2**63 - 1, (n // 8,), generator=gen, device=device, dtype=torch.int64)
        keys = torch.cat([torch.arange(n - n // 8, device=device, dtype=torch.int64), sparse])
        return keys[torch.randperm(n, generator=gen, device=device)]
    raise ValueError(dist)


class SortedArray(NamedTuple):
    """The sorted-array baseline (and the benchmarks' reference answers): the keys sorted, and their row IDs in
    that order, equal keys in ascending row order (a stable sort), so a run's first row is its smallest."""

    keys: torch.Tensor
    rows: torch.Tensor
    unique: bool


def sorted_array(keys: torch.Tensor) -> SortedArray:
    sk, rows = torch.sort(keys, stable=True)
    return SortedArray(sk, rows, sk.numel() < 2 or not bool((sk[1:] == sk[:-1]).any()))


def sa_lookup(sa: SortedArray, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Point lookups on a sorted array: (smallest matching row ID or -1, match count) per query, as Lookup."""
    pos = torch.searchsorted(sa.keys, queries)
    at = pos.clamp(max=sa.keys.numel() - 1)
    hit = sa.keys[at] == queries
    first = torch.where(hit, sa.rows[at], -1)
    count = hit.to(torch.int64) if sa.unique else torch.searchsorted(sa.keys, queries, right=True) - pos
    return first, count


def sa_range(sa: SortedArray, lo: torch.Tensor, hi: torch.Tensor, chunk: int = 1 << 26):
    """Range lookups [lo, hi] on a sorted array: (smallest matching row ID or -1, match count) per range, as
    range_lookup; the smallest row ID is a minimum over the range's rows (gathered `chunk` at a time)."""
    a = torch.searchsorted(sa.keys, lo)
    count = (torch.searchsorted(sa.keys, hi, right=True) - a).clamp(min=0)
    first = torch.full_like(a, -1)
    width = int(count.max()) if count.numel() else 0
    step = max(1, chunk // max(width, 1))
    for i in range(0, a.numel() if width else 0, step):
        idx = a[i : i + step, None] + torch.arange(width, device=a.device)
        inside = idx < (a[i : i + step] + count[i : i + step])[:, None]
        rows = torch.where(inside, sa.rows[idx.clamp(max=sa.keys.numel() - 1)], torch.iinfo(torch.int64).max)
        first[i : i + step] = torch.where(count[i : i + step] > 0, rows.min(dim=1).values, -1)
    return first, count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--dist", default="uniform64", choices=["uniform64", "uniform32", "dense", "clustered"])
    ap.add_argument("--range-hits", type=int, default=4, help="range width on dense keys (hits per range)")
    ap.add_argument("--log-range-lookups", type=int, default=24)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(42)
    n, q = 1 << args.log_keys, 1 << args.log_lookups
    info = torch_rtindex.optix_info()
    result = {
        "device": torch.cuda.get_device_name(),
        "commit": git_commit(),
        "torch": torch.__version__,
        "optix": info,
        "params": vars(args),
        "unix_time": int(time.time()),
    }
    rows = []

    keys = make_keys(args.dist, n, gen, dev)
    queries = keys[torch.randint(0, n, (q,), generator=gen, device=dev)]

    # ---- sorted array baseline: build = sort, lookup = searchsorted + gather
    def sa_build():
        return torch.sort(keys)

    sa_build_ms, (sk, perm) = timed(sa_build, repeats=3)

    def sa_lookup():
        pos = torch.searchsorted(sk, queries)
        pos_c = pos.clamp(max=n - 1)
        hit = sk[pos_c] == queries
        return torch.where(hit, perm[pos_c], -1)

    sa_ms, sa_rows = timed(sa_lookup)
    rows.append(("SA point lookups", sa_build_ms, (sk.nbytes + perm.nbytes) / 1e9, sa_ms, q / sa_ms / 1e3))

    # ---- RX
    index, rx_build_ms, peak = build_timed(lambda: RXIndex(keys))
    mem = index.memory()
    # Both query orders: as given, and sorted inside the lookup (index.sort_queries; the sort is counted).
    times = {}
    for sort in (False, True):
        index.sort_queries = sort
        times[sort], res = timed(lambda: index.lookup(queries))
        wrong = int((res.first_row != sa_rows).sum()) if index.unique_keys else -1
        if index.unique_keys:
            assert wrong == 0, f"RX point lookups (sort_queries={sort}) disagree with the sorted array on {wrong} queries"
    rx_ms, rx_qsort_ms = times[False], times[True]
    rows.append(("RX point lookups", rx_build_ms, mem["bvh"] / 1e9, rx_ms, q / rx_ms / 1e3))
    rows.append(("RX point lookups, query sort inside", float("nan"), float("nan"), rx_qsort_ms, q / rx_qsort_ms / 1e3))
    result.update(
        sa_build_ms=sa_build_ms, sa_lookup_ms=sa_ms, rx_build_ms=rx_build_ms, rx_lookup_ms=rx_ms,
        rx_lookup_query_sort_ms=rx_qsort_ms, rx_bvh_bytes=mem["bvh"], rx_keys_bytes=mem["keys"],
        rx_build_peak_gb=peak, rx_unique=index.unique_keys, rx_point_wrong=wrong,
    )

    # sorted probe keys: the paper's "sorted lookups" (sorted by the caller, not counted)
    sq = torch.sort(queries).values
    index.sort_queries = False
    rx_sorted_ms, _ = timed(lambda: index.lookup(sq))
    sa_sorted_ms, _ = timed(lambda: torch.searchsorted(sk, sq))
    rows.append(("SA point lookups, sorted probes", float("nan"), float("nan"), sa_sorted_ms, q / sa_sorted_ms / 1e3))
    rows.append(("RX point lookups, sorted probes", float("nan"), float("nan"), rx_sorted_ms, q / rx_sorted_ms / 1e3))
    result.update(sa_sorted_lookup_ms=sa_sorted_ms, rx_sorted_lookup_ms=rx_sorted_ms)
    index = res = None  # the closures above hold the name: released, not deleted
    torch.cuda.empty_cache()

    # ---- range lookups on dense keys: each range [k, k + hits - 1] holds `hits` keys (fewer at the top)
    dense = make_keys("dense", n, gen, dev)
    qr = 1 << args.log_range_lookups
    lo = dense[torch.randint(0, n, (qr,), generator=gen, device=dev)]
    hi = lo + (args.range_hits - 1)
    dindex = RXIndex(dense)
    expected = torch.clamp(hi, max=n - 1) - lo + 1
    range_times = {}
    for sort in (False, True):
        dindex.sort_queries = sort
        range_times[sort], rres = timed(lambda: dindex.range_lookup(lo, hi))
        assert torch.equal(rres.count, expected), f"RX range counts (sort_queries={sort}) disagree with the dense reference"
    rr_ms, rr_qsort_ms = range_times[False], range_times[True]
    dsk = torch.sort(dense).values

    def sa_range():
        a = torch.searchsorted(dsk, lo)
        b = torch.searchsorted(dsk, hi, right=True)
        return b - a

    sar_ms, sar = timed(sa_range)
    assert torch.equal(sar, expected)
    rows.append((f"SA range lookups ({args.range_hits} hits), count", float("nan"), float("nan"), sar_ms, qr / sar_ms / 1e3))
    rows.append((f"RX range lookups ({args.range_hits} hits), count", float("nan"), float("nan"), rr_ms, qr / rr_ms / 1e3))
    rows.append((f"RX range lookups ({args.range_hits} hits), count, query sort", float("nan"), float("nan"), rr_qsort_ms,
                 qr / rr_qsort_ms / 1e3))
    csr_ms, csr = timed(lambda: dindex.range(lo, hi), repeats=3)
    assert torch.equal(csr.offsets[1:] - csr.offsets[:-1], expected)
    rows.append((f"RX range lookups ({args.range_hits} hits), CSR rows", float("nan"), float("nan"), csr_ms, qr / csr_ms / 1e3))
    result.update(range_lookups=qr, sa_range_ms=sar_ms, rx_range_ms=rr_ms, rx_range_query_sort_ms=rr_qsort_ms,
                  rx_range_csr_ms=csr_ms)

    print(f"\n{result['device']}  commit {result['commit']}  OptiX ABI {info['abi']}  RT cores: {info['has_rt_cores']}")
    print(f"keys 2^{args.log_keys} ({args.dist}), point lookups 2^{args.log_lookups}, range lookups 2^{args.log_range_lookups}")
    print(f"{'method':44s} {'build ms':>9s} {'size GB':>8s} {'lookup ms':>10s} {'M/s':>8s}")
    for name, b, s, ms, tput in rows:
        print(f"{name:44s} {b:9.1f} {s:8.3f} {ms:10.2f} {tput:8.0f}")
    print(f"RX / SA point lookup time: {rx_ms / sa_ms:.2f}x (query sort inside: {rx_qsort_ms / sa_ms:.2f}x);  "
          f"RX build peak {peak:.2f} GB")
    write_json(result, f"rx_{args.dist}_k{args.log_keys}_q{args.log_lookups}_{result['commit']}", args.out)


if __name__ == "__main__":
    main()
