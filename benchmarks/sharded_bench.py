"""The sharded index across GPUs (NCCL) against one GPU holding everything, in the same run.

Weak scaling: 2^26 keys and 2^27 point lookups per rank; strong scaling: 2^27 keys and 2^27 lookups in all.
The single-GPU baseline is a plain CgRXIndex over all keys on rank 0's GPU answering every rank's lookups.
Per form (point lookups, pipelined point lookups, the fixed-capacity form, ranges of 4 and 64 hits): time (the
slowest rank, median of --repeats), throughput, speedup over one GPU, then one profiled run per form for the
stages (check: the call header's round trip; partition, exchange, local lookup, return, scatter; the device is
synchronized between stages, so they add up to more than the unprofiled time; pipelined calls count their
overlapped exchanges, local lookups and returns as "local") and the bytes this rank sent to other ranks next to
the NVLink floor (bytes / 370 GB/s, NCCL's all-to-all rate on NVLink 4), and plain all-to-alls of the same
bytes in the same run (what NCCL itself reaches for them). Rank 0 checks its sharded answers against the
single-GPU index.

    torchrun --nproc-per-node=2 benchmarks/sharded_bench.py          # or: python benchmarks/sharded_bench.py --world 2
    python benchmarks/sharded_bench.py --device cpu --world 2 --log-keys 12 --log-lookups 12   # gloo smoke test

Prints a table and writes JSON to benchmarks/results/<GPU name>/sharded_<commit>.json (or --out-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _common import launch_ranks  # noqa: E402
from rx_bench import git_commit, write_json  # noqa: E402

from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex.distributed import PointRouting, ShardedIndex, no_multicast_env  # noqa: E402

NVLINK_BYTES_PER_S = 370e9
STAGES = ("check", "partition", "exchange", "local", "return", "scatter")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: gloo on CPU processes (smoke test)")
    ap.add_argument("--world", type=int, default=None, help="processes to start when not under torchrun "
                    "(default: the CUDA device count, 2 on the CPU)")
    ap.add_argument("--log-keys", type=int, default=26, help="weak scaling: keys per rank (log2)")
    ap.add_argument("--log-lookups", type=int, default=27, help="weak scaling: point lookups per rank (log2)")
    ap.add_argument("--strong-log-keys", type=int, default=None, help="strong scaling: keys in all (default log-keys + 1)")
    ap.add_argument("--strong-log-lookups", type=int, default=None, help="strong scaling: lookups in all (default log-lookups)")
    ap.add_argument("--log-range-lookups", type=int, default=None, help="range lookups per rank (default log-lookups - 5)")
    ap.add_argument("--range-hits", default="4,64", help='hits per range form ("": no range forms)')
    ap.add_argument("--modes", default="weak,strong")
    ap.add_argument("--slack", type=float, default=1.1, help="fixed form: query_capacity = slack * lookups / world + 64")
    ap.add_argument("--pipeline", type=int, default=4, help="chunks of the pipelined point lookups (lookup_pipelined)")
    ap.add_argument("--nccl-high-priority", action="store_true",
                    help="under torchrun: NCCL's streams at high priority, so its kernels get SMs ahead of lookups")
    ap.add_argument("--nccl-max-ctas", type=int, default=None,
                    help="under torchrun: NCCL's CTAs per collective at most (fewer SMs taken from the lookups)")
    ap.add_argument("--min-chunk-queries", type=int, default=None,
                    help="PointRouting.min_chunk_queries (e.g. 1: small runs exercise the pipelined path too)")
    ap.add_argument("--own-queries", default=None, choices=["auto", "in_place", "routed"],
                    help="PointRouting.own_queries (default: the library's): where a rank's own queries are answered")
    ap.add_argument("--trace", action="store_true",
                    help="rank 0: the CUDA kernels of one pipelined lookup (torch.profiler), summed by name")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reserve-l2", action="store_true",
                    help="set the most L2 the GPU allows aside for the radix tables (torch_rtindex.reserve_l2) on every "
                         "rank, so the one-GPU baseline and the shards both have it")
    ap.add_argument("--backend", default="radix", help="the cgRX backend of the local and the single-GPU index")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    a.strong_log_keys = a.log_keys + 1 if a.strong_log_keys is None else a.strong_log_keys
    a.strong_log_lookups = a.log_lookups if a.strong_log_lookups is None else a.strong_log_lookups
    a.log_range_lookups = max(0, a.log_lookups - 5) if a.log_range_lookups is None else a.log_range_lookups
    return a


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def slowest(seconds: float, dev) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def time_collective(fn, dev, repeats: int) -> float:
    """Median over repeats of the slowest rank's seconds (ranks start together after a barrier)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync(dev)
        dist.barrier()
        t = time.perf_counter()
        fn()
        sync(dev)
        times.append(slowest(time.perf_counter() - t, dev))
    return statistics.median(times)


def plain_all_to_all(q: int, dev, repeats: int) -> float:
    """Seconds of what a point call moves, as plain all-to-alls with even splits: q int64 queries out, q answers
    (2 int64 each) back; the same bytes to other ranks as the call when its queries spread evenly (each rank's
    own 1/W stays home in both)."""
    queries, answers = torch.empty(q, dtype=torch.int64, device=dev), torch.empty(2 * q, dtype=torch.int64, device=dev)
    got_q, got_a = torch.empty_like(queries), torch.empty_like(answers)

    def run():
        dist.all_to_all_single(got_q, queries)
        dist.all_to_all_single(got_a, answers)

    return time_collective(run, dev, repeats)


def time_local(fn, dev, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        sync(dev)
        t = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profiled(idx: ShardedIndex, fn, dev) -> dict:
    """One profiled run: per-stage seconds (slowest rank each) and bytes sent to other ranks (largest rank)."""
    idx.profile = True
    try:
        fn()
        s = idx.stats()
    finally:
        idx.profile = False
    out = {f"{k}_s": slowest(s[f"{k}_s"], dev) for k in STAGES}
    b = torch.tensor([s["bytes_sent_remote"], s["bytes_sent"]], dtype=torch.float64, device=dev)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    out["bytes_sent_remote"], out["bytes_sent"] = int(b[0]), int(b[1])
    out["nvlink_floor_s"] = out["bytes_sent_remote"] / NVLINK_BYTES_PER_S
    moved = out["exchange_s"] + out["return_s"]
    out["exchange_over_floor"] = moved / out["nvlink_floor_s"] if out["nvlink_floor_s"] else float("nan")
    return out


def kernel_trace(fn, rank: int) -> None:
    """Rank 0 prints the device time of one call's kernels and copies, summed by name (every rank runs the call)."""
    from torch.profiler import ProfilerActivity, profile

    if rank != 0:
        fn()
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=60))
    print_timeline(prof)


def print_timeline(prof) -> None:
    """The call's kernels and copies in start order: stream, start and end (ms from the first), name. Shows what
    overlapped and where a stream waited."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name)).get("traceEvents", [])
    dev = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not dev:
        return
    t0 = min(e["ts"] for e in dev)
    print("timeline (stream  start ms  end ms  name):")
    for e in sorted(dev, key=lambda e: e["ts"]):
        name = re.split(r"[(<]", e["name"].replace("(anonymous namespace)::", "").replace("void ", ""))[0]
        name = name.split("::")[-1][:48]
        print(f"  {str(e.get('tid')):>6s} {(e['ts'] - t0) / 1e3:8.3f} {(e['ts'] + e['dur'] - t0) / 1e3:8.3f}  {name}")


def keys_for(rank: int, n: int, dev, seed: int) -> torch.Tensor:
    g = torch.Generator(device=dev).manual_seed(seed * 1000 + rank)
    return torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, device=dev, dtype=torch.int64)


def run_mode(mode: str, a, rank: int, world: int, dev) -> list[dict]:
    if mode == "weak":
        n, q = 1 << a.log_keys, 1 << a.log_lookups
    else:
        n, q = (1 << a.strong_log_keys) // world, (1 << a.strong_log_lookups) // world
    qr = 1 << a.log_range_lookups if mode == "weak" else max(1, (1 << (a.log_range_lookups + 1)) // world)
    hits = [int(h) for h in a.range_hits.split(",") if h]
    factory = lambda k, key_type: CgRXIndex(k, key_type=key_type, backend=a.backend)  # noqa: E731
    out = []

    # Point lookups over uniform 64-bit keys; queries: keys of any rank (hits).
    parts = [keys_for(r, n, dev, 1) for r in range(world)] if rank == 0 else None
    mine = parts[rank] if parts is not None else keys_for(rank, n, dev, 1)
    t = time.perf_counter()
    routing_opts = {k: v for k, v in (("min_chunk_queries", a.min_chunk_queries), ("own_queries", a.own_queries))
                    if v is not None}
    routing = PointRouting(**routing_opts) if routing_opts else None
    idx = ShardedIndex(mine, index_factory=factory, pipeline=1, point_routing=routing)  # "lookup": stages one by one
    sync(dev)
    build_s = slowest(time.perf_counter() - t, dev)
    gq = torch.Generator(device=dev).manual_seed(77 + rank)
    owner = torch.randint(0, world, (q,), generator=gq, device=dev)
    pos = torch.randint(0, n, (q,), generator=gq, device=dev)
    queries = keys_for(0, n, dev, 1)[pos]  # rank 0's keys...
    for r in range(1, world):  # ...and every other rank's, one query in `world` each
        sel = owner == r
        queries[sel] = keys_for(r, n, dev, 1)[pos[sel]]
    single = None
    if rank == 0:
        allk = torch.cat(parts)
        del parts
        t = time.perf_counter()
        single = CgRXIndex(allk, backend=a.backend)
        sync(dev)
        single_build_s = time.perf_counter() - t
        del allk
    # Every rank's queries, for the single GPU (rank 0 regenerates them from their seeds).
    all_queries = None
    if rank == 0:
        qs = []
        for r in range(world):
            g = torch.Generator(device=dev).manual_seed(77 + r)
            o = torch.randint(0, world, (q,), generator=g, device=dev)
            p = torch.randint(0, n, (q,), generator=g, device=dev)
            qq = keys_for(0, n, dev, 1)[p]
            for s in range(1, world):
                qq[o == s] = keys_for(s, n, dev, 1)[p[o == s]]
            qs.append(qq)
        all_queries = torch.cat(qs)
        del qs

    def record(form, sharded_s, single_s, prof, extra=None):
        total = q * world if form.startswith("lookup") else qr * world
        row = {"mode": mode, "form": form, "world": world, "keys_total": n * world, "lookups_total": total,
               "sharded_s": sharded_s, "single_gpu_s": single_s,
               "speedup": single_s / sharded_s if sharded_s and single_s == single_s else float("nan"),
               "sharded_lookups_per_s": total / sharded_s, **prof, **(extra or {})}
        out.append(row)

    def single_time(fn):
        s = time_local(fn, dev, a.repeats) if rank == 0 else 0.0
        t = torch.tensor([s], dtype=torch.float64, device=dev)
        dist.broadcast(t, 0)
        return float(t)

    sharded_s = time_collective(lambda: idx.lookup(queries), dev, a.repeats)
    if rank == 0:
        got = idx.lookup(queries)
        want = single.lookup(queries)
        assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count), "sharded != single"
    else:
        idx.lookup(queries)
    single_s = single_time(lambda: single.lookup(all_queries))
    record("lookup", sharded_s, single_s, profiled(idx, lambda: idx.lookup(queries), dev), {"build_s": build_s,
           "single_build_s": single_build_s if rank == 0 else None,
           "a2a_alone_s": plain_all_to_all(q // world * world, dev, a.repeats) if world > 1 else None})

    idx.pipeline = a.pipeline
    piped = lambda: idx.lookup(queries)  # noqa: E731
    got = piped()
    if rank == 0:
        assert torch.equal(got.first_row, single.lookup(queries).first_row), "pipelined != single"
    del got
    piped_s = time_collective(piped, dev, a.repeats)
    if a.trace and dev.type == "cuda":
        kernel_trace(piped, rank)
    record("lookup_pipelined", piped_s, single_s, profiled(idx, piped, dev), {"pipeline": a.pipeline})
    idx.pipeline = 1

    qcap = int(a.slack * q / world) + 64
    fixed = lambda: idx.lookup_fixed(queries, qcap, check=False)  # noqa: E731
    f = fixed()
    overflowed = bool(f.overflowed)
    if rank == 0 and not overflowed:
        assert torch.equal(f.answer.first_row, single.lookup(queries).first_row), "fixed form != single"
    fixed_s = time_collective(fixed, dev, a.repeats)
    record("lookup_fixed", fixed_s, single_s, profiled(idx, fixed, dev), {"query_capacity": qcap, "overflowed": overflowed})
    idx = single = queries = all_queries = None  # freed before the range indexes are built (closures hold the names)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if not hits:  # --range-hits "": point lookups only
        return out

    # Ranges of h hits over dense keys: the keys 0 .. N-1 dealt out at random; ranges [k, k + h - 1].
    N = n * world
    perm = torch.randperm(N, generator=torch.Generator(device=dev).manual_seed(5), device=dev)
    idx = ShardedIndex(perm[rank * n:(rank + 1) * n].contiguous(), index_factory=factory, point_routing=routing)
    single = CgRXIndex(perm, backend=a.backend) if rank == 0 else None
    del perm
    gr = [torch.Generator(device=dev).manual_seed(99 + r) for r in range(world)]
    los = [torch.randint(0, N, (qr,), generator=gr[r], device=dev) for r in range(world)]
    lo = los[rank]
    all_lo = torch.cat(los) if rank == 0 else None
    del los
    for h in hits:
        hi = lo + (h - 1)
        s = time_collective(lambda: idx.range(lo, hi), dev, a.repeats)
        if rank == 0:
            got, want = idx.range(lo, hi), single.range(lo, hi)
            assert torch.equal(got.offsets, want.offsets) and torch.equal(got.rows, want.rows), "sharded range != single"
        else:
            idx.range(lo, hi)
        all_hi = all_lo + (h - 1) if rank == 0 else None
        s1 = single_time(lambda: single.range(all_lo, all_hi))
        record(f"range{h}", s, s1, profiled(idx, lambda: idx.range(lo, hi), dev), {"hits": h})
        s = time_collective(lambda: idx.range_lookup(lo, hi), dev, a.repeats)
        s1 = single_time(lambda: single.range_lookup(all_lo, all_hi))
        record(f"range_lookup{h}", s, s1, profiled(idx, lambda: idx.range_lookup(lo, hi), dev), {"hits": h})
    idx = single = None  # closures above hold the names
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def model(rows: list[dict]) -> list[dict]:
    """What 4, 8 and 16 GPUs would give for weak-scaling point lookups, from this run: the pipelined call's time
    (every rank's own work, with the exchanges beside it, stays the same per rank) plus the bytes each rank sends to
    other ranks beyond this run's ((W - 1) / W of the payload instead of (W0 - 1) / W0), at the rate the profiled
    call's exchange and return moved them (as if they added to the time: from two H200s this came within 6% of
    the call measured on four, results README). Without a pipelined row the profiled call's stage sum stands in
    for its time. The one-GPU baseline is taken to grow linearly with W; a one-GPU index W/W0 times larger is
    slower per lookup, so the speedups are a lower bound."""
    base = next((r for r in rows if r["mode"] == "weak" and r["form"] == "lookup"), None)
    if base is None or not base["bytes_sent_remote"]:
        return []
    piped = next((r for r in rows if r["mode"] == "weak" and r["form"] == "lookup_pipelined"), None)
    W0 = base["world"]
    moved = base["exchange_s"] + base["return_s"]
    own = (piped["sharded_s"] if piped else
           base["check_s"] + base["partition_s"] + base["local_s"] + base["scatter_s"] + moved)
    payload = base["bytes_sent_remote"] * W0 / (W0 - 1)
    rate = base["bytes_sent_remote"] / moved if moved else float("inf")
    out = []
    for W in (4, 8, 16):
        remote = payload * (W - 1) / W
        t = own + (remote - base["bytes_sent_remote"]) / rate
        single_s = base["single_gpu_s"] * W / W0
        out.append({"world": W, "modeled_s": t, "lookups_per_s": base["lookups_total"] / W0 * W / t,
                    "speedup_vs_one_gpu": single_s / t, "remote_bytes_per_rank": remote})
    return out


def fmt(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(rows: list[dict]) -> str:
    head = (f"{'mode':6} {'form':16} {'W':>2} {'keys':>11} {'lookups':>11} {'sharded ms':>10} {'1-GPU ms':>9} "
            f"{'speedup':>7} {'Glk/s':>6} | " + " ".join(f"{s[:9]:>9}" for s in STAGES)
            + f" | {'MB remote':>9} {'floor ms':>8} {'xfer/floor':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['mode']:6} {r['form']:16} {r['world']:>2} {r['keys_total']:>11} {r['lookups_total']:>11} "
            f"{fmt(r['sharded_s'] * 1e3):>10} {fmt(r['single_gpu_s'] * 1e3):>9} {fmt(r['speedup']):>7} "
            f"{fmt(r['sharded_lookups_per_s'] / 1e9, '.3f'):>6} | "
            + " ".join(f"{fmt(r[f'{s}_s'] * 1e3):>9}" for s in STAGES)
            + f" | {fmt(r['bytes_sent_remote'] / 1e6, '.1f'):>9} {fmt(r['nvlink_floor_s'] * 1e3, '.3f'):>8} "
              f"{fmt(r['exchange_over_floor']):>10}"
        )
    return "\n".join(lines)


def bench(rank: int, world: int, argv: list[str]) -> None:
    a = parse(argv)
    dev = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    l2 = 0
    if a.reserve_l2 and dev.type == "cuda":
        from torch_rtindex import reserve_l2

        l2 = reserve_l2(device=dev)
    rows = []
    for mode in [m for m in a.modes.split(",") if m]:
        rows += run_mode(mode, a, rank, world, dev)
    if rank == 0:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        pkg = str(Path(sys.modules["torch_rtindex"].__file__).resolve().parent.parent)  # the tree measured (A/Bs)
        result = {"device": name, "world": world, "backend": dist.get_backend(), "commit": git_commit(), "l2_set_aside": l2,
                  "package": pkg,
                  "torch": torch.__version__, "params": vars(a), "nvlink_bytes_per_s": NVLINK_BYTES_PER_S,
                  "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
                  "runs": rows, "model": model(rows)}
        print(f"{name} x{world} ({dist.get_backend()}), commit {result['commit']}, torch {torch.__version__}, "
              f"L2 set aside {l2 / 2**20:.1f} MiB, package from {pkg}")
        print(table(rows))
        for r in rows:
            if r.get("a2a_alone_s"):
                moved = r["exchange_s"] + r["return_s"]
                print(f"{r['mode']} {r['form']}: plain all-to-alls of the same bytes {r['a2a_alone_s'] * 1e3:.2f} ms "
                      f"({r['bytes_sent_remote'] / r['a2a_alone_s'] / 1e9:.0f} GB/s, {r['a2a_alone_s'] / r['nvlink_floor_s']:.2f}x "
                      f"the floor); the call's exchange + return {moved * 1e3:.2f} ms")
        for m in result["model"]:
            print(f"model W={m['world']:>2}: {m['modeled_s'] * 1e3:.2f} ms, {m['lookups_per_s'] / 1e9:.3f} G lookups/s, "
                  f"{m['speedup_vs_one_gpu']:.2f}x one GPU")
        write_json(result, f"sharded_{result['commit']}", a.out_dir)
    dist.barrier()


def main() -> None:
    no_multicast_env()  # before any NCCL communicator exists, here and in every process started below
    a = parse()
    opts = None
    if a.device == "cuda" and (a.nccl_high_priority or a.nccl_max_ctas):
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = a.nccl_high_priority
        if a.nccl_max_ctas:
            opts.config.max_ctas = a.nccl_max_ctas
    launch_ranks(bench, a, timeout_s=600, pg_options=opts)


if __name__ == "__main__":
    main()
