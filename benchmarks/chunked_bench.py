"""ChunkedIndex out of core: an index four times its GPU cache budget, lookups uniform and Zipf-skewed, next to
the same keys in GPU memory (CgRXIndex, the in-core time), CPU-only serving, GPU-only serving, the GPU's kernels
reading the pinned host chunks directly (zero-copy, up to 2^--zero-copy-max-log-lookups lookups), the planned
serving without in-place reads of small queues (no_in_place), and the copy floor (the chunk bytes that must cross PCIe, at --pcie-gbs, for the batch's chunks that the cache cannot hold).

Every answer is checked (against the in-core index where it was built, else against the keys themselves and
across serving modes) before its time is reported. Prints a table, writes JSON to
benchmarks/results/<GPU name>/chunked_k<log keys>_<commit>.json (or the folder --out).

    python benchmarks/chunked_bench.py                       # 2^30 keys, gpu_budget = index bytes / 4
    python benchmarks/chunked_bench.py --log-keys 31         # on an H200
    python benchmarks/chunked_bench.py --device cpu --log-keys 16 --log-lookups 12 --chunk-mib 0.0625  # smoke
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)

from rx_bench import git_commit, write_json  # noqa: E402  (same folder)

from torch_rtindex import CgRXIndex, ChunkedIndex  # noqa: E402

# The index's own seconds per batch each batch line shows (stats()["last_batch"]["time_s"], where nonzero): which of
# the GPU's issue and waits, the CPU worker, the copies, the calibration and the hot tier a slow batch spent on.
BATCH_TIMES = ("partition", "gpu_issue", "gpu_wait", "cpu", "copy", "calibrate", "hot", "hot_rebuild")
ODD = 0x9E3779B97F4A7C15 | 1  # multiplier of the position shuffle (odd: a bijection modulo 2^k)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_timed(fn, dev: torch.device, repeats: int, warmup: int = 1, keep: list | None = None):
    """Median milliseconds of `repeats` runs after `warmup` (host clock around a synchronized call: a batch
    synchronizes with the host anyway), and the last result; `keep` receives every run's milliseconds."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        out = fn()
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    if keep is not None:
        keep.extend(times)
    times.sort()
    return times[len(times) // 2], out


class GcTimer:
    """Python's garbage collections while it is installed (gc.callbacks): how many of each generation and their
    milliseconds, read and zeroed by take(). A full collection walks every object of the process (torch's alone are
    over 10^5), so one that lands in a timed batch adds tens of milliseconds to it."""

    def __init__(self) -> None:
        self.counts, self.ms, self._t0 = [0, 0, 0], 0.0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3

    def take(self) -> dict:
        out = {"gc_collections": list(self.counts), "gc_ms": self.ms}
        self.counts, self.ms = [0, 0, 0], 0.0
        return out


class PinTimer:
    """Pinned host blocks torch's caching host allocator created (cudaHostAlloc) and their milliseconds, read and
    zeroed by take(): a batch that pins fresh memory pays tens of milliseconds for it. None where this torch does not
    report them."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.last = self._read()

    def _read(self):
        if self.dev.type != "cuda":
            return None
        s = torch.cuda.host_memory_stats()
        if "num_host_alloc" not in s or "host_alloc_time.total" not in s:
            return None
        return s["num_host_alloc"], s["host_alloc_time.total"] / 1e3

    def take(self) -> dict:
        now = self._read()
        out = {"pinned_new": None, "pinned_ms": None}
        if now is not None and self.last is not None:
            out = {"pinned_new": now[0] - self.last[0], "pinned_ms": now[1] - self.last[1]}
        self.last = now
        return out

def zipf_positions(n: int, m: int, s: float, gen: torch.Generator) -> torch.Tensor:
    """m positions in [0, n): rank r drawn with probability ~ r^-s (s = 0: uniform; inverse CDF of the continuous
    law on [1, n + 1]), ranks spread over the key positions by a fixed shuffle, so hot keys are random keys (the
    keys are uniform and unsorted) in every chunk, as hashed IDs are."""
    if s == 0:
        return torch.randint(0, n, (m,), generator=gen)
    u = torch.rand(m, dtype=torch.float64, generator=gen)
    if abs(s - 1) < 1e-9:
        r = torch.exp(u * math.log(n + 1))
    else:
        a = 1 - s
        r = (((n + 1) ** a - 1) * u + 1) ** (1 / a)
    return rank_positions((r.floor().to(torch.int64) - 1).clamp(0, n - 1), n)


def rank_positions(rank: torch.Tensor, n: int) -> torch.Tensor:
    """The key position of each Zipf rank (0: the hottest): the fixed shuffle of zipf_positions."""
    if n & (n - 1) == 0:
        return (rank * (ODD % n if n > 1 else 1) + 12345) & (n - 1)
    return (rank * 2654435761 + 12345) % n


def chunk_bounds(info: list[dict]) -> torch.Tensor:
    """The int64 keys where chunks 1.. start, from ``chunk_info()``: a chunk's ``lo`` is its first ordered key, which
    for int64 keys is the key with its sign bit flipped (the 64-bit pattern, in an int64)."""
    return torch.tensor([c["lo"] for c in info[1:]], dtype=torch.int64) ^ -(2**63)


def chunk_of(keys: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """The chunk holding each int64 key (chunks are consecutive key ranges)."""
    return torch.searchsorted(bounds, keys, right=True)


def make_keys(n: int, dev: torch.device) -> torch.Tensor:
    """n uniform 64-bit keys in host memory, generated on the GPU in pieces when there is one."""
    keys = torch.empty(n, dtype=torch.int64)
    gen = torch.Generator(device=dev).manual_seed(42)
    piece = 1 << 26
    for a in range(0, n, piece):
        b = min(n, a + piece)
        keys[a:b] = torch.randint(-(2**63), 2**63 - 1, (b - a,), generator=gen, device=dev, dtype=torch.int64).cpu()
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-keys", type=int, default=30)
    ap.add_argument("--log-lookups", default="20,24,27", help="batch sizes, log2, comma separated")
    ap.add_argument("--zipf", default="0.5,0.99,1.2", help="Zipf exponents besides uniform (0)")
    ap.add_argument("--chunk-mib", type=float, default=256.0, help="chunk_bytes in MiB")
    ap.add_argument("--budget-fraction", type=float, default=0.25, help="gpu_budget = this x the index's bytes")
    ap.add_argument("--repeats", type=int, default=3, help="timed batches (each a fresh one) per mode")
    ap.add_argument("--train-batches", type=int, default=2,
                    help="fresh batches per mode before the timed ones (the cache and the hot tier learn)")
    ap.add_argument("--cpu-max-log-lookups", type=int, default=24,
                    help="CPU-only serving runs for batches up to 2^this (it is the slow one)")
    ap.add_argument("--zero-copy-max-log-lookups", type=int, default=24,
                    help="largest batch (log2) timed with the GPU reading host memory directly (slow)")
    ap.add_argument("--pcie-gbs", type=float, default=55.0, help="copy rate of the copy floor, GB/s (H100: 55)")
    ap.add_argument("--modes", default="", help="comma-separated serving modes to run (default: all), e.g. "
                    "chunked,gpu_only")
    ap.add_argument("--hot-keys", type=int, default=None,
                    help="the hot tier's capacity in keys (ChunkedIndex(hot_keys=...); default: automatic)")
    ap.add_argument("--hot-given", action="store_true",
                    help="skewed batches also in mode hot_given: the tier warmed once with the hottest keys of the "
                    "law (ChunkedIndex.warm, what a caller who knows its hot IDs does), not learned")
    ap.add_argument("--layout", default="packed_row", help="ChunkedIndex(layout=...): packed_row (12-byte pairs) or "
                    "aligned_row (16 bytes: a lookup reads one 64-byte line, one PCIe read where a chunk is read in place)")
    ap.add_argument("--skip-in-core", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (the cache is a CPU copy)")
    ap.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results/<GPU>/)")
    args = ap.parse_args()
    gc_timer = GcTimer()
    dev = torch.device(args.device)
    pin_timer = PinTimer(dev)
    cuda = dev.type == "cuda"
    n = 1 << args.log_keys
    batches = [int(x) for x in args.log_lookups.split(",") if x]
    skews = [0.0] + [float(x) for x in args.zipf.split(",") if x]
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    result = {"device": name, "commit": git_commit(), "torch": torch.__version__, "params": vars(args),
              "unix_time": int(time.time()), "threads": torch.get_num_threads(), "runs": []}
    rows = []

    t0 = time.perf_counter()
    keys = make_keys(n, dev)
    pkg = Path(sys.modules["torch_rtindex"].__file__).resolve().parent.parent  # the tree measured (A/Bs)
    print(f"keys: 2^{args.log_keys} uniform int64 in host memory ({time.perf_counter() - t0:.1f} s), package from {pkg}",
          flush=True)

    # ---- the budget: a quarter of the index's bytes (known after a build; estimated first, then checked)
    chunk_bytes = max(1024, int(args.chunk_mib * 2**20))
    probe = ChunkedIndex(keys[: 1 << 16], device=dev, chunk_bytes=chunk_bytes, gpu_budget=0)
    per_key = sum(c["bytes"] for c in probe.chunk_info()) / (1 << 16)
    del probe
    budget = max(int(n * per_key * args.budget_fraction), 4 * chunk_bytes)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base_mem = torch.cuda.memory_allocated(dev)
    t0 = time.perf_counter()
    index = ChunkedIndex(keys, device=dev, chunk_bytes=chunk_bytes, gpu_budget=budget, hot_keys=args.hot_keys,
                         layout=args.layout, progress=True)
    sync(dev)
    build_s = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(dev) - base_mem) if cuda else None
    index_bytes = index.memory()["chunks"]
    result["build"] = {"seconds": build_s, "peak_gpu_bytes": peak, "gpu_budget": budget, "index_bytes": index_bytes,
                       "chunks": index.num_chunks, "budget_over_index": budget / index_bytes,
                       "hot_capacity": index.hot_capacity, "hot_capacity_given": index.hot_capacity_given}
    print(f"build: {build_s:.1f} s, {index.num_chunks} chunks, index {index_bytes / 2**30:.2f} GiB, budget "
          f"{budget / 2**30:.2f} GiB ({budget / index_bytes:.2f}x), peak GPU memory of the build "
          f"{'-' if peak is None else f'{peak / 2**30:.2f} GiB'}", flush=True)

    # ---- in-core reference: the same keys in GPU memory (skipped when it does not fit)
    in_core, in_core_reason = None, None
    if args.skip_in_core:
        in_core_reason = "--skip-in-core"
    else:
        try:
            t0 = time.perf_counter()
            in_core = CgRXIndex(keys.to(dev), layout=index.layout, backend=index.backend, bucket_size=index.bucket_size)
            sync(dev)
            result["in_core_build_s"] = time.perf_counter() - t0
        except (torch.OutOfMemoryError, RuntimeError, ValueError) as e:
            in_core_reason = f"{type(e).__name__}: {str(e)[:200]}"
            in_core = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    if in_core is None:
        print(f"in-core CgRXIndex skipped: {in_core_reason}", flush=True)
    result["in_core_skipped"] = in_core_reason

    gen = torch.Generator().manual_seed(7)
    floor_rate = args.pcie_gbs * 1e9
    info = index.chunk_info()
    sizes = [c["bytes"] for c in info]
    bounds = chunk_bounds(info)
    result["zipf_floor"] = []
    for log_m in batches:
        m = 1 << log_m
        for s in skews:
            dist = "uniform" if s == 0 else f"zipf{s}"
            # Fresh batches of one distribution: the first train_batches let the cache and the hot tier learn, the
            # timed ones are new queries (a repeated batch would be answered by a tier that memorised it).
            nb = args.train_batches + args.repeats
            pos_all = [zipf_positions(n, m, s, gen) for _ in range(nb)]
            sample = torch.randint(0, m, (min(m, 1 << 16),), generator=gen)

            def check(res, pos, q, ref=None):
                if ref is not None:
                    return bool(torch.equal(res.first_row, ref.first_row) and torch.equal(res.count, ref.count))
                fr = res.first_row.cpu().index_select(0, sample)
                ok = (fr >= 0).all() and (fr <= pos.index_select(0, sample)).all()
                return bool(ok and torch.equal(keys.index_select(0, fr.clamp(min=0)), q.cpu().index_select(0, sample)))

            refs, in_ms = [None] * nb, None
            if in_core is not None:
                times = []
                for i, pos in enumerate(pos_all):
                    q = keys.index_select(0, pos).to(dev)
                    ms, refs[i] = run_timed(lambda: in_core.lookup(q), dev, 1, warmup=1 if i == 0 else 0)
                    times.append(ms)
                    if i < args.train_batches:
                        refs[i] = None  # only the timed batches are compared
                in_ms = sorted(times[args.train_batches:])[len(times[args.train_batches:]) // 2]
                run = {"mode": "in_core", "dist": dist, "log_lookups": m.bit_length() - 1, "ms": in_ms,
                       "checked": all(check(refs[i], pos_all[i], keys.index_select(0, pos_all[i]))
                                      for i in range(args.train_batches, nb))}
                result["runs"].append(run)
                rows.append(run)
            # chunked: GPU and CPU with the hot tier; no_hot: the chunks alone (skewed batches only);
            # gpu_only / cpu_only: one side serving (cpu_only without the hot tier)
            modes = [("chunked", "auto", True)] + ([("no_hot", "auto", False)] if s else [])
            modes += [("hot_given", "auto", True)] if s and args.hot_given and index.hot_capacity else []
            # no_in_place: chunked with every GPU queue served from the cache (copied in), the plan before the GPU
            # could read a small queue's chunk in place
            modes += [("no_in_place", "auto", True)] if cuda else []
            # zero_copy: the GPU's kernels read the pinned host chunks directly (no cache, no copies)
            modes += [("gpu_only", "gpu", True), ("cpu_only", "cpu", False)]
            modes += [("zero_copy", "zero_copy", False)] if cuda else []
            if args.modes:
                modes = [m for m in modes if m[0] in args.modes.split(",")]
            for mode, procs, hot in modes:
                limit = {"cpu_only": args.cpu_max_log_lookups, "zero_copy": args.zero_copy_max_log_lookups}.get(mode)
                if limit is not None and log_m > limit:
                    run = {"mode": mode, "dist": dist, "log_lookups": log_m, "skipped": f"batch > 2^{limit}"}
                    result["runs"].append(run)
                    continue
                index.processors = procs
                index.read_in_place = False if mode == "no_in_place" else None
                index.hot_tier = hot
                index.clear_hot()  # every mode learns its hot keys from its own training batches
                if mode == "hot_given":  # but this one is given the law's hottest keys, and keeps them
                    t0 = time.perf_counter()
                    top = rank_positions(torch.arange(index.hot_capacity_given), n)
                    given = index.warm(keys.index_select(0, top).to(dev))
                    print(f"hot_given {dist}: tier warmed with {given} of the {index.hot_capacity_given} hottest keys "
                          f"in {time.perf_counter() - t0:.1f} s", flush=True)
                index.reset_stats()
                per_batch, ok = [], True
                for i, pos in enumerate(pos_all):
                    if mode in ("cpu_only", "zero_copy") and i > args.train_batches:
                        break  # the slow ones: one timed batch
                    q = keys.index_select(0, pos).to(dev)
                    gc_timer.take()
                    pin_timer.take()
                    ms, res = run_timed(lambda: index.lookup(q), dev, 1, warmup=0)
                    collected = {**gc_timer.take(), **pin_timer.take()}
                    last = index.stats()["last_batch"]
                    if i < args.train_batches:
                        continue
                    ok = ok and check(res, pos, q, refs[i])
                    copied_floor = last["bytes_copied"] / floor_rate * 1e3
                    per_batch.append({
                        "ms": ms, "bytes_copied": last["bytes_copied"], "copied_floor_ms": copied_floor,
                        "time_covers_copies": ms >= copied_floor, "queries_gpu": last["queries_gpu"],
                        "queries_cpu": last["queries_cpu"], "queries_in_place": last["queries_in_place"],
                        "hot_hits": last["hot_hits"],
                        "hot_rebuilds": last["hot_rebuilds"], "chunk_misses": last["chunk_misses"],
                        "plan": last["plan"], "time_s": last["time_s"], **collected,
                    })
                st = index.stats()
                mid = sorted(per_batch, key=lambda r: r["ms"])[len(per_batch) // 2]
                ms = mid["ms"]
                served = max(1, mid["queries_gpu"] + mid["queries_cpu"])
                # the lower bound of the copies: bytes of the chunks the batch needs beyond what the cache can hold
                touched = torch.bincount(chunk_of(keys.index_select(0, pos_all[-1]), bounds), minlength=len(sizes))
                floor_ms = max(0, sum(b for b, t in zip(sizes, touched.tolist()) if t) - budget) / floor_rate * 1e3
                run = {
                    "mode": mode, "dist": dist, "log_lookups": log_m, "ms": ms, "glookups_s": m / ms / 1e6,
                    "copy_floor_ms": floor_ms, "x_floor": ms / floor_ms if floor_ms else None,
                    "x_in_core": ms / in_ms if in_ms else None, "checked": ok,
                    "gpu_share": mid["queries_gpu"] / served, "hot_share": mid["hot_hits"] / m,
                    "bytes_copied": mid["bytes_copied"], "copied_floor_ms": mid["copied_floor_ms"],
                    "all_times_cover_copies": all(r["time_covers_copies"] for r in per_batch),
                    "hot_keys": st["hot_keys"], "hot_pairs": st["hot_pairs"], "hot_rebuilds_total": st["hot_rebuilds"],
                    "cpu_rate": st["cpu_rate"], "copy_rate": st["copy_rate"], "gpu_rate": st["gpu_rate"],
                    "in_place_rate": st["in_place_rate"], "fixed_s": st["fixed_s"], "gpu_memory": index.memory(),
                    "calibrations": st["calibrations"],
                    "per_batch": per_batch,
                }
                result["runs"].append(run)
                rows.append(run)
                for j, r in enumerate(per_batch):
                    print(f"{mode:9s} {dist:9s} 2^{log_m} batch {j}: {r['ms']:9.2f} ms  copied "
                          f"{r['bytes_copied'] / 2**30:6.2f} GiB (floor {r['copied_floor_ms']:8.2f} ms, "
                          f"{'ok' if r['time_covers_copies'] else 'TIME < COPIES'})  gpu {r['queries_gpu']} (in place "
                          f"{r['queries_in_place']})  cpu "
                          f"{r['queries_cpu']}  hot {r['hot_hits']}  rebuilds {r['hot_rebuilds']}  merge "
                          f"{r['time_s']['merge'] * 1e3:.1f} ms  gc {r['gc_collections']} {r['gc_ms']:.1f} ms  pinned "
                          + ("?" if r["pinned_new"] is None else f"{r['pinned_new']} ({r['pinned_ms']:.1f} ms)")
                          + "  ms: " + " ".join(f"{k} {r['time_s'][k] * 1e3:.1f}" for k in BATCH_TIMES
                                                if r["time_s"].get(k)), flush=True)
                mem = index.memory()
                print(f"{mode:9s} {dist:9s} 2^{log_m} GPU memory: cache {mem['cache'] / 2**30:.2f} GiB, tier "
                      f"{mem['hot'] / 2**30:.2f} GiB, search parts {mem['search'] / 2**30:.2f} GiB; rates: in place "
                      f"{(st['in_place_rate'] or 0) / 1e6:.0f} M/s, CPU {(st['cpu_rate'] or 0) / 1e6:.0f} M/s", flush=True)
                for c in st["calibrations"]:  # warm-up first, then the two timed slices
                    print(f"{mode:9s} {dist:9s} 2^{log_m} calibration of {c['way']}: " + ", ".join(
                        f"{n} in {sec * 1e3:.3f} ms" for n, sec in c["slices"]) +
                        f" -> {c['rate'] / 1e6:.1f} M/s, fixed {c['fixed_s'] * 1e3:.3f} ms", flush=True)
                if s and hot and mode in ("chunked", "hot_given"):
                    # The floor for the tier's misses: rank r is drawn with P(rank < K) from the continuous law the
                    # queries come from; every miss needs host memory (the CPU's rate, its chunk copied in, or the
                    # GPU reading the chunk in place).
                    K = st["hot_keys"]
                    a1 = 1 - s
                    hit = (math.log(K + 1) / math.log(n + 1) if abs(a1) < 1e-9
                           else ((K + 1) ** a1 - 1) / ((n + 1) ** a1 - 1))
                    misses = m * (1 - hit)
                    resident = index.stats()["resident_bytes"]
                    host_bytes = max(0, index_bytes - resident)
                    cpu_ms = misses / st["cpu_rate"] * 1e3
                    copy_ms = host_bytes / floor_rate * 1e3
                    # both at once, queues split between them (every chunk holds misses when they outnumber chunks)
                    both_ms = 1e3 / (st["cpu_rate"] / max(misses, 1) + floor_rate / max(host_bytes, 1))
                    # all three: the GPU also reading chunks in place, at the fastest in-place rate this run
                    # learned (any mode, any batch: a generous rate keeps the floor a lower bound)
                    in_place = max((r.get("in_place_rate") or 0.0) for r in result["runs"] + [st])
                    all_ms = 1e3 / ((st["cpu_rate"] + in_place) / max(misses, 1) + floor_rate / max(host_bytes, 1))
                    z = {"mode": mode, "dist": dist, "log_lookups": log_m, "tier_keys": K, "tier_miss_fraction": 1 - hit,
                         "misses": misses, "cpu_ms": cpu_ms, "copy_ms": copy_ms, "both_ms": both_ms,
                         "in_place_rate": in_place, "all_three_ms": all_ms,
                         "in_core_ms": in_ms, "floor_x_in_core": all_ms / in_ms if in_ms else None}
                    result["zipf_floor"].append(z)
                    print(f"zipf floor {mode} {dist} 2^{log_m}: tier of {K} keys misses {100 * (1 - hit):.2f}% = "
                          f"{misses:.0f} queries; CPU alone {cpu_ms:.2f} ms, copies alone {copy_ms:.2f} ms, both "
                          f"{both_ms:.2f} ms, with in-place reads at {in_place / 1e6:.0f} M/s too {all_ms:.2f} ms; "
                          f"in-core {in_ms if in_ms is None else f'{in_ms:.2f} ms'}", flush=True)
            index.processors, index.hot_tier, index.hot_learn = "auto", True, True
            del pos_all
    # ---- table
    print()
    print(f"{'mode':9s} {'dist':9s} {'lookups':>8s} {'ms':>10s} {'G/s':>8s} {'floor / copied ms':>18s} {'x floor':>8s} "
          f"{'x in-core':>9s} {'hot':>5s} {'gpu share':>9s} ok")
    for r in rows:
        xf = f"{r['x_floor']:.2f}" if r.get("x_floor") else "-"
        xi = f"{r['x_in_core']:.2f}" if r.get("x_in_core") else "-"
        gs = f"{r['gpu_share']:.2f}" if "gpu_share" in r else "-"
        hs = f"{r['hot_share']:.2f}" if "hot_share" in r else "-"
        fl = f"{r['copy_floor_ms']:.2f}" if "copy_floor_ms" in r else "-"
        gl = f"{(1 << r['log_lookups']) / r['ms'] / 1e6:.3f}"
        if "copied_floor_ms" in r:
            fl += f" / {r['copied_floor_ms']:.1f}"
        print(f"{r['mode']:9s} {r['dist']:9s} {'2^' + str(r['log_lookups']):>8s} {r['ms']:10.2f} {gl:>8s} {fl:>18s} "
              f"{xf:>8s} {xi:>9s} {hs:>5s} {gs:>9s} {r['checked']}")
    write_json(result, f"chunked_k{args.log_keys}_{result['commit']}", args.out)
    if not all(r["checked"] for r in result["runs"] if "checked" in r):
        print("SOME ANSWERS WERE WRONG", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
