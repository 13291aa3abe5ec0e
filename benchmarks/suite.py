"""The benchmark suite: every index over the paper-style dimensions, in one run, every answer checked.

    python3 benchmarks/suite.py --quick     # a small subset of every dimension: meant for a few minutes on an H100
    python3 benchmarks/suite.py --full      # the whole grid
    python3 benchmarks/suite.py --tiny --device cpu --out /tmp/suite   # seconds on a CPU (tests/test_benchmark_suite.py)

Methods: RX; cgRX with bucket sizes 4, 16, 64, 256 on the device's default backend, plus backend="optix" where
affordable (on a GPU without RT cores every ray is software: up to 2^--optix-max-log-lookups lookups); SA, the
sorted array (torch.sort + torch.searchsorted + a gather of the row IDs); the project's GPU hash table
(benchmarks/baselines: CUDA only, unique keys, point lookups, the key -1 reserved).

Dimensions: each varies one parameter around the base point (the mode's key and lookup counts; unique 64-bit
keys uniform over the key range (uniformity 100%) in random order; point lookups that all hit, uniformly
chosen, in random order): number of keys; number of lookups; hit rate (misses half inside the key range, half
outside it); Zipf skew of the lookups; key multiplicity; range selectivity (hits per range, on dense keys);
32- and 64-bit keys; uniformity (the cgRX paper's: the first (100 - u)% of the distinct keys dense 0..d-1, the
rest uniform over the key range, shuffled); sorted or unsorted keys and lookups; update waves of the
updatable cgRX (update_bench.run_waves). Each key set is built once per method and answers every workload on it.

Every answer (count and smallest row ID per lookup) is checked against the sorted array before its time is
reported; a failed check reports no time and makes the exit status 1. Build: median wall time of several builds
after a warm-up build, final memory (index.memory()), peak memory during the build (torch.cuda; null on the CPU).
Lookups: median of several runs after a warm-up, timed with CUDA events on CUDA and time.perf_counter on the CPU.
Writes results.json, table.txt and PNG plots to benchmarks/results/<device>/suite_<mode>_<commit>/ (or --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
from rx_bench import build_timed, cpu_name, git_commit, make_keys, results_dir, sa_lookup, sa_range, sorted_array, timed  # noqa: E402  (same folder)
import append_bench  # noqa: E402
import update_bench  # noqa: E402

import torch_rtindex  # noqa: E402
from torch_rtindex import CgRXIndex, RXIndex  # noqa: E402
from torch_rtindex.cgrx import default_backend  # noqa: E402

BUCKET_SIZES = (4, 16, 64, 256)
KEY_RANGE = {32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}


# ----------------------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class KeySet:
    log_keys: int
    key_bits: int = 64
    uniformity: int = 100  # percent of the distinct keys uniform over the key range, the rest dense 0..d-1
    multiplicity: int = 1  # rows per distinct key
    sorted_keys: bool = False


@dataclass(frozen=True)
class Workload:
    kind: str  # "point" or "range"
    log_lookups: int
    hit_rate: float = 1.0
    zipf: float = 0.0
    sorted_lookups: bool = False
    selectivity: int | None = None  # range lookups: distinct keys per range


@dataclass
class Mode:
    log_keys: int
    log_lookups: int
    log_range_lookups: int
    repeats: int  # timed lookup runs after the warm-up (median reported)
    build_repeats: int  # timed builds after the warm-up build (median reported)
    update_log_keys: int
    grid: dict[str, list] = field(default_factory=dict)


SORTED = {"none": (False, False), "keys": (True, False), "lookups": (False, True), "both": (True, True)}
MODES = {
    "tiny": Mode(10, 10, 8, 2, 1, 10, {
        "keys": [10], "lookups": [10], "hit_rate": [0.5], "zipf": [1.0], "multiplicity": [4],
        "range_selectivity": [16], "key_bits": [32], "uniformity": [50], "sorted": ["both"], "updates": [2],
    }),
    "quick": Mode(24, 24, 20, 5, 3, 22, {
        "keys": [16, 20, 24], "lookups": [10, 17, 24], "hit_rate": [0.0, 0.5, 1.0], "zipf": [0.0, 1.0, 2.0],
        "multiplicity": [1, 32, 1024], "range_selectivity": [1, 32, 1024], "key_bits": [32, 64],
        "uniformity": [0, 50, 100], "sorted": list(SORTED), "updates": [8],
    }),
    "full": Mode(26, 27, 20, 5, 3, 26, {
        "keys": list(range(16, 27)), "lookups": list(range(10, 28)), "hit_rate": [i / 10 for i in range(11)],
        "zipf": [i / 4 for i in range(9)], "multiplicity": [2**i for i in range(11)],
        "range_selectivity": [2**i for i in range(11)], "key_bits": [32, 64], "uniformity": [0, 50, 100],
        "sorted": list(SORTED), "updates": [8],
    }),
}


KEYSET_AXES = {"keys": "log_keys", "multiplicity": "multiplicity", "key_bits": "key_bits", "uniformity": "uniformity"}
WORKLOAD_AXES = {"lookups": "log_lookups", "hit_rate": "hit_rate", "zipf": "zipf"}


def grid_points(mode: Mode, dimensions: list[str]) -> list[tuple[str, Any, KeySet, Workload]]:
    """(dimension, value, key set, workload) for every point of the lookup dimensions (not "updates"); the
    value of "keys" and "lookups" is the count, the grid holds its log2."""
    base_ks, base_wl = KeySet(mode.log_keys), Workload("point", mode.log_lookups)
    points = []
    for dim in dimensions:
        for v in mode.grid[dim] if dim != "updates" else []:
            ks, wl = base_ks, base_wl
            if dim in KEYSET_AXES:
                ks = replace(ks, **{KEYSET_AXES[dim]: v})
            elif dim in WORKLOAD_AXES:
                wl = replace(wl, **{WORKLOAD_AXES[dim]: v})
            elif dim == "range_selectivity":
                ks, wl = replace(ks, uniformity=0), Workload("range", mode.log_range_lookups, selectivity=v)
            elif dim == "sorted":
                ks, wl = replace(ks, sorted_keys=SORTED[v][0]), replace(wl, sorted_lookups=SORTED[v][1])
            points.append((dim, 2**v if dim in ("keys", "lookups") else v, ks, wl))
    return points


# ------------------------------------------------------------------------------------- keys and lookups
def generator(dev: torch.device, *config) -> torch.Generator:
    """Seeded by the configuration: a key set or workload is the same in every mode and run."""
    return torch.Generator(device=dev).manual_seed(zlib.crc32(repr(config).encode()))


def uniform_values(bits: int, m: int, gen: torch.Generator, dev: torch.device) -> torch.Tensor:
    """m int64 values uniform over the key type's range (make_keys' 32-bit keys moved to the int32 range)."""
    return make_keys("uniform64", m, gen, dev) if bits == 64 else make_keys("uniform32", m, gen, dev) - 2**31


def distinct_values(ks: KeySet, gen: torch.Generator, dev: torch.device) -> torch.Tensor:
    """The key set's d distinct values, sorted, as int64: (100 - u)% dense 0..d'-1, the rest distinct and uniform
    over the key range. -1 is never drawn: the hash table reserves it."""
    d = (1 << ks.log_keys) // ks.multiplicity
    dense = d * (100 - ks.uniformity) // 100
    sparse = torch.empty(0, dtype=torch.int64, device=dev)
    while sparse.numel() < d - dense:
        need = d - dense - sparse.numel()
        cand = uniform_values(ks.key_bits, need + need // 16 + 16, gen, dev)
        sparse = torch.unique(torch.cat([sparse, cand[((cand < 0) | (cand >= dense)) & (cand != -1)]]))
    sparse = sparse[torch.randperm(sparse.numel(), generator=gen, device=dev)[: d - dense]]
    return torch.cat([make_keys("dense", dense, gen, dev), sparse]).sort().values


def make_keyset(ks: KeySet, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys as the index gets them, their distinct values sorted as int64); row ID = position in keys."""
    gen = generator(dev, ks)
    values = distinct_values(ks, gen, dev)
    keys = values.repeat_interleave(ks.multiplicity)
    if not ks.sorted_keys:
        keys = keys[torch.randperm(keys.numel(), generator=gen, device=dev)]
    return keys.to(torch.int32 if ks.key_bits == 32 else torch.int64).contiguous(), values


def uniform_between(lo: torch.Tensor, hi: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One value uniform in [lo[i], hi[i]] (int64, lo <= hi) per entry, without int64 overflow."""
    span = hi - lo
    span = torch.where(span < 0, 2**62, span)  # wrapped around: wider than 2^63 - 1
    u = torch.rand(lo.shape, dtype=torch.float64, generator=gen, device=lo.device)
    return lo + torch.minimum((u * (span.to(torch.float64) + 1)).clamp(max=9.2e18).to(torch.int64), span)


def zipf_hits(values: torch.Tensor, m: int, skew: float, gen: torch.Generator) -> torch.Tensor:
    """m lookups of existing keys; the rank-r key (a random one) is drawn with probability ~ r^-skew."""
    d, dev = values.numel(), values.device
    if skew == 0:
        return values[torch.randint(0, d, (m,), generator=gen, device=dev)]
    cdf = torch.arange(1, d + 1, dtype=torch.float64, device=dev).pow(-skew).cumsum(0)
    u = torch.rand(m, dtype=torch.float64, generator=gen, device=dev) * cdf[-1]
    rank = torch.searchsorted(cdf, u).clamp(max=d - 1)
    return values[torch.randperm(d, generator=gen, device=dev)[rank]]


def misses(values: torch.Tensor, m: int, bits: int, gen: torch.Generator) -> tuple[torch.Tensor, int, int]:
    """m values that are no key: half inside the key range (a random gap between consecutive distinct keys, a
    random value in it), half outside it (below the smallest or above the largest key); where one kind cannot
    exist (dense keys have no gaps) the other takes its share. Returns (misses, inside, outside)."""
    dev, (tmin, tmax) = values.device, KEY_RANGE[bits]
    lo_key, hi_key = int(values[0]), int(values[-1])
    sides = ([(tmin, lo_key - 1)] if lo_key > tmin else []) + ([(hi_key + 1, tmax)] if hi_key < tmax else [])
    a, b = values[:-1], values[1:]
    gaps = torch.nonzero(b > a + 1).squeeze(1)
    n_in = 0 if gaps.numel() == 0 else (m // 2 if sides else m)
    n_out = m - n_in
    if n_out and not sides:
        raise ValueError("the keys leave no value to miss")
    pick = gaps[torch.randint(0, max(gaps.numel(), 1), (n_in,), generator=gen, device=dev)]
    inside = uniform_between(a[pick] + 1, b[pick] - 1, gen)
    side = torch.randint(0, max(len(sides), 1), (n_out,), generator=gen, device=dev)
    ends = torch.tensor(sides or [(0, 0)], dtype=torch.int64, device=dev)[side]
    return torch.cat([inside, uniform_between(ends[:, 0], ends[:, 1], gen)]), n_in, n_out


def make_workload(ks: KeySet, wl: Workload, values: torch.Tensor, dtype: torch.dtype):
    """(lookup arguments: (queries,) or (lo, hi), what they hold)."""
    dev, q = values.device, 1 << wl.log_lookups
    gen = generator(dev, ks, wl)
    if wl.kind == "range":  # [lo, hi] spans `selectivity` consecutive distinct keys
        start = torch.randint(0, values.numel() - wl.selectivity + 1, (q,), generator=gen, device=dev)
        lo, hi = values[start], values[start + wl.selectivity - 1]
        return (lo.to(dtype), hi.to(dtype)), {"hits_per_lookup": wl.selectivity * ks.multiplicity}
    n_hit = round(q * wl.hit_rate)
    miss, n_in, n_out = misses(values, q - n_hit, ks.key_bits, gen)
    queries = torch.cat([zipf_hits(values, n_hit, wl.zipf, gen), miss])
    queries = queries.sort().values if wl.sorted_lookups else queries[torch.randperm(q, generator=gen, device=dev)]
    return (queries.to(dtype).contiguous(),), {"hits": n_hit, "inside_misses": n_in, "outside_misses": n_out}


# ------------------------------------------------------------------------------------------------ methods
@dataclass
class Method:
    name: str
    family: str
    build: Callable  # keys -> index
    point: Callable  # (index, queries) -> output
    range: Callable | None  # (index, lo, hi) -> output
    answer: Callable  # output -> (first_row, count)
    memory: Callable  # index -> bytes per part
    backend: str | None = None
    bucket_size: int | None = None
    skipped: str | None = None  # not run at all on this device, and why
    limit: Callable = lambda ks, wl: None  # (key set, workload or None) -> why this run is skipped, or None
    widen: bool = False  # takes int64 keys and queries only

    def why_not(self, ks: KeySet, wl: Workload | None) -> str | None:
        if self.skipped:
            return self.skipped
        if wl is not None and wl.kind == "range" and self.range is None:
            return "no range lookups"
        return self.limit(ks, wl)


def index_method(name, family, make, **kw) -> Method:
    return Method(name, family, make, lambda ix, q: ix.lookup(q), lambda ix, lo, hi: ix.range_lookup(lo, hi),
                  lambda out: (out.first_row, out.count), lambda ix: ix.memory(), **kw)


def hash_table_build(keys: torch.Tensor):
    from baselines.hash_table import HashTable  # compiled just in time (nvcc) on the first build

    return HashTable(keys.to(torch.int64))


def methods(dev: torch.device, info: dict | None, optix_note: str | None, optix_max_log_lookups: int) -> list[Method]:
    """Every method; on a CUDA device without a usable OptiX (info None) RX and cgRX's OptiX backend are skipped."""
    cuda = dev.type == "cuda"
    no_optix = f"OptiX unavailable ({optix_note})" if cuda and info is None else None
    default = default_backend(dev)
    backends = [default] + (["optix"] if default != "optix" else [])
    out = [index_method("RX", "RX", RXIndex, skipped=no_optix)]
    for backend in backends:
        skipped, limit = None, (lambda ks, wl: None)
        if backend == "optix" and not cuda:
            skipped = "OptiX only (on the CPU backend='optix' answers by binary search)"
        elif backend == "optix" and no_optix:
            skipped = no_optix
        elif backend == "optix" and not info["has_rt_cores"]:
            def limit(ks, wl, top=optix_max_log_lookups):
                if wl is not None and wl.log_lookups > top:
                    return (f"not affordable: without RT cores every OptiX ray is software; run up to 2^{top} "
                            "lookups (--optix-max-log-lookups)")
                return None
        for b in BUCKET_SIZES:
            out.append(index_method(
                f"cgRX-{backend}-B{b}", "cgRX", lambda k, b=b, backend=backend: CgRXIndex(k, bucket_size=b, backend=backend),
                backend=backend, bucket_size=b, skipped=skipped, limit=limit))
    out.append(Method("SA", "SA", sorted_array, sa_lookup, sa_range, lambda out: out,
                      lambda sa: {"sorted_keys": sa.keys.nbytes, "rows": sa.rows.nbytes}))
    out.append(Method(
        "hash_table", "hash_table", hash_table_build, lambda ht, q: ht.lookup(q), None,
        lambda rows: (rows, (rows >= 0).to(torch.int64)), lambda ht: {"table": ht.nbytes()},
        skipped=None if cuda else "CUDA only (benchmarks/baselines/hash_table.cu)",
        limit=lambda ks, wl: "unique keys only" if ks.multiplicity > 1 else None, widen=True))
    return out


# ---------------------------------------------------------------------------------------------- measuring
def measure(fn, dev: torch.device, repeats: int, budget_s: float):
    """(median ms, output, runs timed): the warm-up run is timed too; where it took longer than the budget, one
    more (warm) run is timed instead of `repeats`."""
    first_ms = timed(fn, repeats=1, warmup=0, device=dev)[0]
    runs = repeats if first_ms <= budget_s * 1e3 else 1
    ms, out = timed(fn, repeats=runs, warmup=0, device=dev)
    return ms, out, runs


def build_index(m: Method, keys: torch.Tensor, dev: torch.device, repeats: int):
    """(index, build record): median wall time of `repeats` builds after a warm-up build."""
    m.build(keys)  # warm-up: JIT compilation, allocator growth
    times, peaks, index = [], [], None
    for _ in range(repeats):
        index = None  # the previous build is freed first
        index, ms, peak = build_timed(lambda: m.build(keys), dev)
        times.append(ms)
        peaks.append(peak)
    memory = {k: int(v) for k, v in m.memory(index).items()}
    peak = None if peaks[0] is None else round(max(peaks) * 1e9)
    return index, {"build_ms": statistics.median(times), "build_repeats": repeats, "build_peak_bytes": peak,
                   "memory": memory, "memory_bytes": sum(memory.values())}


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_keyset(ks: KeySet, workloads: list[Workload], ms_: list[Method], dev: torch.device, mode: Mode,
               budget_s: float) -> dict[Workload, list[dict]]:
    """Builds every method once on the key set and runs every workload on it, each answer checked against SA."""
    keys, values = make_keyset(ks, dev)
    ref = sorted_array(keys)  # the reference answers
    built, failed = {}, {}
    for m in ms_:
        if all(m.why_not(ks, wl) for wl in workloads):
            continue
        try:
            built[m.name] = build_index(m, keys, dev, mode.build_repeats)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            failed[m.name] = f"out of memory at build: {str(e).splitlines()[0]}"
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    results = {}
    for wl in workloads:
        args, held = make_workload(ks, wl, values, keys.dtype)
        want = sa_lookup(ref, *args) if wl.kind == "point" else sa_range(ref, *args)
        records = []
        for m in ms_:
            rec = {"method": m.name, "family": m.family, "backend": m.backend, "bucket_size": m.bucket_size,
                   **asdict(ks), "keys": 1 << ks.log_keys, "key_dtype": str(keys.dtype).replace("torch.", ""),
                   **asdict(wl), "lookups": 1 << wl.log_lookups, **held, "build_ms": None, "build_peak_bytes": None,
                   "memory": None, "memory_bytes": None, "lookup_ms": None, "repeats": None, "throughput": None,
                   "throughput_per_byte": None, "check": "skipped", "skipped": m.why_not(ks, wl) or failed.get(m.name)}
            records.append(rec)
            if rec["skipped"]:
                continue
            index, build = built[m.name]
            margs = tuple(a.to(torch.int64) for a in args) if m.widen else args
            op = m.point if wl.kind == "point" else m.range
            try:
                ms, out, runs = measure(lambda: op(index, *margs), dev, mode.repeats, budget_s)
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                rec["skipped"] = f"out of memory: {str(e).splitlines()[0]}"
                continue
            first, count = m.answer(out)
            wrong_first = int((first.to(torch.int64) != want[0]).sum())
            wrong_count = int((count.to(torch.int64) != want[1]).sum())
            del out, first, count
            rec.update(build, repeats=runs)
            if wrong_first or wrong_count:
                rec["check"] = f"FAILED: {wrong_first} wrong first row IDs, {wrong_count} wrong counts"
                continue
            tput = rec["lookups"] / (ms / 1e3)
            rec.update(check="passed", lookup_ms=ms, throughput=tput, throughput_per_byte=tput / build["memory_bytes"])
        results[wl] = records
    del built, keys, values, ref
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return results


def run_updates(mode: Mode, waves: int, dev: torch.device) -> dict:
    """update_bench.run_waves at this mode's size: insert/delete waves against rebuilds, checked against SA."""
    rec = {"dimension": "updates", "value": waves, "waves": waves, "log_keys": mode.update_log_keys,
           "log_lookups": mode.log_lookups, "node_size": 32, "method": "UpdatableCgRXIndex", "check": "passed"}
    try:
        res = update_bench.run_waves(mode.update_log_keys, mode.log_lookups, waves, 32, dev)
    except AssertionError as e:
        return {**rec, "check": f"FAILED: {e}"}
    res["rows"] = [{"wave": n, "keys": k, "update_ms": u, "rebuild_ms": r} for n, k, u, r in res["rows"]]
    # The append workload next to the waves: 8 batches a wave of increasing keys, each 1/64 of the base keys,
    # with the rebuild policy on and off against a fresh index.
    days, log_batch = 8 * waves, max(0, mode.update_log_keys - 6)
    try:
        res["append"] = {"days": days, "log_batch": log_batch,
                         **append_bench.run_append(mode.update_log_keys, mode.log_lookups, days, log_batch, dev)}
    except AssertionError as e:
        return {**rec, **res, "check": f"FAILED: append workload: {e}"}
    return {**rec, **res}


# ------------------------------------------------------------------------------------------- environment
def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_name()


def driver_version() -> str:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return "n/a"


def optix(dev: torch.device) -> tuple[dict | None, str | None]:
    if dev.type != "cuda":
        return None, "no OptiX on the CPU"
    try:
        return torch_rtindex.optix_info(dev), None
    except RuntimeError as e:
        return None, f"optix_info failed: {str(e).splitlines()[0]}"


# ------------------------------------------------------------------------------------------ table and plots
def show(dim: str, v) -> str:
    if dim in ("keys", "lookups"):
        return f"2^{int(v).bit_length() - 1}"
    if dim == "hit_rate":
        return f"{v:.0%}"
    return f"{v}%" if dim == "uniformity" else str(v)


def num(x, width: int, spec: str) -> str:
    return f"{'-' if x is None else format(x, spec):>{width}s}"


def table(result: dict) -> str:
    head = (f"{'dimension':18s} {'value':>7s} {'method':17s} {'build ms':>9s} {'index MB':>9s} {'peak MB':>8s} "
            f"{'lookup ms':>10s} {'M/s':>9s} {'lookups/s/B':>11s}  check")
    lines = [head, "-" * len(head)]
    off = {name: m["skipped"] for name, m in result["methods"].items() if m["skipped"]}
    mb = lambda b: None if b is None else b / 2**20  # noqa: E731
    for r in result["runs"]:
        if r["method"] in off:
            continue  # not run on this device: said once below
        tput = None if r["throughput"] is None else r["throughput"] / 1e6
        lines.append(f"{r['dimension']:18s} {show(r['dimension'], r['value']):>7s} {r['method']:17s} "
                     f"{num(r['build_ms'], 9, '.2f')} {num(mb(r['memory_bytes']), 9, '.2f')} "
                     f"{num(mb(r['build_peak_bytes']), 8, '.1f')} {num(r['lookup_ms'], 10, '.3f')} "
                     f"{num(tput, 9, '.1f')} {num(r['throughput_per_byte'], 11, '.4g')}  "
                     f"{r['check'] if not r['skipped'] else 'skipped: ' + r['skipped']}")
    lines += [f"not run on this device: {name}: {why}" for name, why in off.items()]
    for u in result["updates"]:
        lines.append(f"\nupdate waves (update_bench.run_waves): 2^{u['log_keys'] - 1} keys, {u['waves']} insert waves of "
                     f"2^{u['log_keys'] - 1} keys in all, then {u['waves']} delete waves; check {u['check']}")
        for w in u.get("rows", []):
            lines.append(f"  {w['wave']:16s} {w['keys']:9d} keys  update {w['update_ms']:9.2f} ms  "
                         f"rebuild {w['rebuild_ms']:9.2f} ms  ({w['rebuild_ms'] / w['update_ms']:.1f}x)")
        if "lookup_after_ms" in u:
            lines.append(f"  lookups (2^{u['log_lookups']}) after the insert waves {u['lookup_after_ms']:.3f} ms, "
                         f"freshly built {u['lookup_fresh_ms']:.3f} ms")
        if "append" in u:
            a = u["append"]
            lines.append(f"  append workload (append_bench.run_append): 2^{u['log_keys']} keys + {a['days']} batches of "
                         f"2^{a['log_batch']} ever larger keys, 2^{u['log_lookups']} lookups over all:")
            for name in ("policy_on", "policy_off", "fresh"):
                r = a[name]
                lines.append(f"    {name:10s} lookups {r['lookup_ms']:9.3f} ms ({r['lookup_ms'] / a['fresh']['lookup_ms']:.2f}x "
                             f"fresh), mean node reads {r['mean_node_reads']:.2f}, longest chain {r['longest_chain']}, "
                             f"auto rebuilds {r['auto_rebuilds']}")
    return "\n".join(lines)


LINE_PLOTS = [  # (dimension, x label, log2 x axis)
    ("keys", "number of keys", True), ("lookups", "number of lookups", True), ("hit_rate", "hit rate", False),
    ("zipf", "Zipf skew of the lookups", False), ("multiplicity", "key multiplicity", True),
    ("range_selectivity", "hits per range lookup", True),
]
BAR_PLOTS = [("key_bits", "key bits"), ("uniformity", "uniformity (%)"), ("sorted", "sorted")]


MARKERS = "os^vDPX*p"  # 9 markers: with 20 colours, (colour, marker) differ for the first 180 methods


def method_styles(names: list[str], colors: list) -> dict[str, dict]:
    """One colour and marker per method, the same in every plot. Matplotlib's default cycle has 10 colours, so
    the 11th method (hash_table, after RX, 8 cgRX variants and SA) drew in RX's colour; `colors` is tab20."""
    order = list(colors[0::2]) + list(colors[1::2])  # tab20's strong shades first, then the light ones
    return {n: {"color": order[i % len(order)], "marker": MARKERS[i % len(MARKERS)]} for i, n in enumerate(names)}


def write_plots(result: dict, out: Path) -> list[str]:
    """PNG plots (matplotlib, imported here, Agg backend). Returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys([*result.get("methods", {}), *(r["method"] for r in result["runs"])]))
    style = method_styles(names, plt.get_cmap("tab20").colors)

    files = []
    base = result["base"]
    title = (f"{result['device']}, {result['mode']} suite, commit {result['commit']}; base: "
             f"2^{base['keyset']['log_keys']} keys, 2^{base['workload']['log_lookups']} lookups")
    measured = [r for r in result["runs"] if r["lookup_ms"] is not None]

    def series(dim: str, y: str) -> dict[str, tuple[list, list]]:
        by = {}
        for r in sorted((r for r in measured if r["dimension"] == dim), key=lambda r: r["value"]):
            xs, ys = by.setdefault(r["method"], ([], []))
            xs.append(r["value"])
            ys.append(r[y])
        return by

    def save(fig, ax, name: str) -> None:
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(name)

    def lines(dim: str, y: str, xlabel: str, ylabel: str, log2: bool, name: str) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for method, (xs, ys) in series(dim, y).items():
            ax.plot(xs, ys, markersize=3, label=method, **style[method])
        ax.set_yscale("log")
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        save(fig, ax, name)

    for dim, xlabel, log2 in LINE_PLOTS:
        lines(dim, "lookup_ms", xlabel, "lookup time (ms, median)", log2, f"lookup_ms_vs_{dim}.png")
    lines("keys", "throughput_per_byte", "number of keys", "lookups/s per byte of index memory", True,
          "throughput_per_byte_vs_keys.png")
    for dim, xlabel in BAR_PLOTS:
        by = series(dim, "lookup_ms")
        cats = list(dict.fromkeys(str(r["value"]) for r in measured if r["dimension"] == dim))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.8 / max(len(by), 1)
        for i, (method, (xs, ys)) in enumerate(by.items()):
            ax.bar([cats.index(str(x)) + i * width for x in xs], ys, width, label=method, color=style[method]["color"])
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cats))], cats)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("lookup time (ms, median)")
        save(fig, ax, f"lookup_ms_by_{dim}.png")
    waves = [w for u in result["updates"] for w in u.get("rows", [])]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.bar([i - 0.2 for i in range(len(waves))], [w["update_ms"] for w in waves], 0.4, label="update")
    ax.bar([i + 0.2 for i in range(len(waves))], [w["rebuild_ms"] for w in waves], 0.4, label="rebuild")
    ax.set_xticks(range(len(waves)), [w["wave"].replace(" wave ", "\n") for w in waves], fontsize=6)
    ax.set_ylabel("time (ms)")
    save(fig, ax, "update_waves.png")
    return files


# ---------------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    helps = {"tiny": "2^10 keys and lookups, one point per dimension: seconds on a CPU (the test's run)",
             "quick": "a small subset of every dimension", "full": "the whole grid"}
    for name in MODES:
        which.add_argument(f"--{name}", dest="mode", action="store_const", const=name, help=helps[name])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="folder for results.json, table.txt and the plots "
                    "(default benchmarks/results/<device>/suite_<mode>_<commit>/)")
    ap.add_argument("--dimensions", default=None, help="comma-separated subset of the dimensions (default: all)")
    ap.add_argument("--optix-max-log-lookups", type=int, default=24,
                    help="on a GPU without RT cores, run cgRX backend='optix' up to 2^this many lookups")
    ap.add_argument("--budget-s", type=float, default=5.0,
                    help="a lookup run whose warm-up takes longer than this is timed once more, not `repeats` times")
    args = ap.parse_args()
    mode = MODES[args.mode]
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dims = args.dimensions.split(",") if args.dimensions else list(mode.grid)
    unknown = set(dims) - set(mode.grid)
    if unknown:
        ap.error(f"unknown dimensions {sorted(unknown)}; known: {list(mode.grid)}")
    info, optix_note = optix(dev)
    rt_cores = None if info is None else info["has_rt_cores"]
    ms_ = methods(dev, info, optix_note, args.optix_max_log_lookups)
    result = {
        "suite": "benchmarks/suite.py", "mode": args.mode, "device": device_name(dev), "device_type": dev.type,
        "driver": driver_version(), "torch": torch.__version__, "python": platform.python_version(),
        "optix": info, "optix_abi": None if info is None else info["abi"], "rt_cores": rt_cores,
        "commit": git_commit(), "unix_time": int(time.time()), "argv": sys.argv[1:],
        "base": {"keyset": asdict(KeySet(mode.log_keys)), "workload": asdict(Workload("point", mode.log_lookups)),
                 "log_range_lookups": mode.log_range_lookups, "update_log_keys": mode.update_log_keys},
        "grid": {d: mode.grid[d] for d in dims},
        "timing": {"clock": "CUDA events" if dev.type == "cuda" else "time.perf_counter", "statistic": "median",
                   "warmup": 1, "repeats": mode.repeats, "build_warmup": 1, "build_repeats": mode.build_repeats,
                   "budget_s": args.budget_s},
        "methods": {m.name: {"family": m.family, "backend": m.backend, "bucket_size": m.bucket_size,
                             "skipped": m.skipped} for m in ms_},
        "notes": [n for n in [optix_note] if n] + [
            f"{m.name}: skipped: {m.skipped}" for m in ms_ if m.skipped] + [
            "SA: torch.sort (stable) + torch.searchsorted + a gather of the row IDs; a second searchsorted counts "
            "duplicates (only where the keys have any); range lookups: two searchsorted and the minimum row ID "
            "over the range's rows, which is what range_lookup answers",
            "checks: every method's (first row ID, count) per lookup against the sorted array's, where the first "
            "row ID of a duplicated key is its smallest; SA's own run is checked against a separately built one",
            "misses: half inside the key range (a random gap between consecutive distinct keys), half outside it; "
            "where one kind cannot exist the other takes its share (each run has the counts)",
            "keys: the value -1 is never drawn (the hash table reserves it); 32-bit keys are int32 tensors; the "
            "hash table takes int64 only: its build widens 32-bit keys (timed), its queries are widened untimed",
            "range lookups: on dense keys (uniformity 0%), each range spans `selectivity` consecutive keys",
            "hash_table: point lookups of unique keys only; skipped on range lookups and duplicated keys",
            "updates: the updatable cgRX (update_bench.run_waves): insert and delete waves, each against a rebuild "
            "of the index at the size reached; the other methods have no update path",
        ],
        "runs": [], "updates": [], "plots": [],
    }
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    points = grid_points(mode, dims)
    keysets = list(dict.fromkeys(ks for _, _, ks, _ in points))
    results = {}
    for i, ks in enumerate(keysets):
        workloads = list(dict.fromkeys(wl for _, _, k, wl in points if k == ks))
        log(f"[{i + 1}/{len(keysets)}] {ks}: {len(workloads)} workload(s)")
        for wl, recs in run_keyset(ks, workloads, ms_, dev, mode, args.budget_s).items():
            results[ks, wl] = recs
    result["runs"] = [{"dimension": dim, "value": v, **rec} for dim, v, ks, wl in points for rec in results[ks, wl]]
    if "updates" in dims:
        for waves in mode.grid["updates"]:
            log(f"update waves: 2^{mode.update_log_keys} keys, {waves} waves")
            result["updates"].append(run_updates(mode, waves, dev))
    failed = [r for r in result["runs"] + result["updates"] if r["check"].startswith("FAILED")]
    passed = [r for r in result["runs"] + result["updates"] if r["check"] == "passed"]
    result["checks"] = {"passed": len(passed), "failed": len(failed),
                        "skipped": sum(r["check"] == "skipped" for r in result["runs"])}

    out = Path(args.out) if args.out else results_dir(result["device"]) / f"suite_{args.mode}_{result['commit']}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        result["plots"] = write_plots(result, out)
    except ImportError as e:  # matplotlib is in the test extras; the numbers do not need it
        result["notes"].append(f"plots skipped: {e}")
        log(f"plots skipped: {e}")
    text = table(result)
    info_line = ("OptiX n/a" if info is None else f"OptiX ABI {info['abi']}, RT cores: {info['has_rt_cores']}")
    header = (f"{result['device']} (driver {result['driver']}), torch {result['torch']}, {info_line}, commit "
              f"{result['commit']}, {args.mode} suite: base 2^{mode.log_keys} keys, 2^{mode.log_lookups} lookups")
    print(f"\n{header}\n{text}")
    print(f"checks: {len(passed)} passed, {len(failed)} failed, {result['checks']['skipped']} skipped")
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "table.txt").write_text(f"{header}\n{text}\n")
    print(f"wrote {out}/results.json, table.txt and {len(result['plots'])} plots")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
