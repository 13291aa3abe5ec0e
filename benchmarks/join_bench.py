"""Joins: torch_rtindex against DuckDB (and Polars where installed) on the same tables, on the CPU and the GPU.

The build side is a table of (key, row) with ``2^--log-build`` rows (``--build-mult`` rows per distinct key);
the probe side has ``2^--log-probe`` rows, a ``--hit-rate`` share of them keys of the build side (drawn with
replacement, so probe keys repeat too) and the rest random values (misses). Two joins, each inner and left:

- equi: ``SELECT p.pos, b.row FROM p [LEFT] JOIN b ON p.key = b.key``
- band: ``... ON b.key BETWEEN p.lo AND p.hi``, bands ``--band-keys`` distinct-key spacings wide starting at
  the probe keys.

What is timed (wall clock, median of ``--repeats`` after a warm-up, CUDA synchronized before and after):

- ``duckdb query``: the query over tables loaded into DuckDB (loading timed apart), pairs fetched as numpy
  arrays (unordered); ``duckdb count``: ``SELECT count(*)`` of the same join (no pairs leave DuckDB).
- ``polars join``: the eager join of two DataFrames wrapping the numpy columns (band: ``join_where``, inner only).
- ``torch_rtindex <index> cpu``: ``join`` with the index already built, and build + join.
- ``torch_rtindex <index> cuda``: ``join`` on resident tensors with the index built; build + join on resident
  tensors; and end to end: the key columns copied from host memory, the index built, the join, the pairs copied
  back to the host.

torch_rtindex's pairs come ordered by (probe position, build row); DuckDB's and Polars' in no particular order.
Every engine's pair count, and an order-free fingerprint of its pairs (sums of positions, rows and their
products), must equal DuckDB's; a disagreement is reported and the exit status is 1. ``cores`` is process CPU
time over wall time: how many cores an engine kept busy (left out where the runs are too short to tell).

    python benchmarks/join_bench.py --log-build 24 --log-probe 24            # CPU and, if present, the GPU
    python benchmarks/join_bench.py --device cpu --log-build 12 --log-probe 12 --out /tmp/join.json

Writes JSON to benchmarks/results/<GPU name, or cpu>/join_<commit>.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
from rx_bench import cpu_name, git_commit, results_dir  # noqa: E402  (same folder; puts the repository on sys.path)

import torch_rtindex  # noqa: E402
from torch_rtindex import CgRXIndex, RXIndex, join, range_join  # noqa: E402

INDEXES = {"cgrx": CgRXIndex, "rx": RXIndex}
DTYPES = {"int64": np.int64, "int32": np.int32, "float64": np.float64}
FLOAT_SPAN = 2.0**40  # float64 keys are uniform in [-2^40, 2^40)
SQL_ON = {"equi": "p.key = b.key", "band": "b.key BETWEEN p.lo AND p.hi"}


# ------------------------------------------------------------------------------------------------------ data
def key_span(dtype: str) -> float:
    if dtype == "float64":
        return 2 * FLOAT_SPAN
    info = np.iinfo(DTYPES[dtype])
    return float(int(info.max) - int(info.min) + 1)


def random_keys(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if dtype == "float64":
        return rng.uniform(-FLOAT_SPAN, FLOAT_SPAN, n)
    info = np.iinfo(DTYPES[dtype])
    return rng.integers(info.min, info.max, n, dtype=DTYPES[dtype], endpoint=True)


def make_tables(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The build table (key, row), the probe table (pos, key) and the bands (lo, hi), as numpy columns."""
    rng = np.random.default_rng(args.seed)
    n_build, n_probe = 1 << args.log_build, 1 << args.log_probe
    distinct = random_keys(args.dtype, max(1, n_build // args.build_mult), rng)
    build = np.resize(np.repeat(distinct, args.build_mult), n_build)  # n_build rows even if mult does not divide
    build = build[rng.permutation(n_build)]
    n_hits = int(round(args.hit_rate * n_probe))
    probe = np.concatenate([distinct[rng.integers(0, distinct.size, n_hits)], random_keys(args.dtype, n_probe - n_hits, rng)])
    probe = probe[rng.permutation(n_probe)]
    # Bands --band-keys distinct-key spacings wide, starting at the probe keys (saturating at the maximum).
    width = args.band_keys * key_span(args.dtype) / distinct.size
    if args.dtype == "float64":
        hi = probe + width
    else:
        dt = DTYPES[args.dtype]
        w = np.array(min(int(width), int(np.iinfo(dt).max)), dtype=dt)
        hi = np.where(probe > np.iinfo(dt).max - w, np.iinfo(dt).max, probe + w).astype(dt)
    return {"b_key": build, "b_row": np.arange(n_build, dtype=np.int64), "p_pos": np.arange(n_probe, dtype=np.int64),
            "p_key": probe, "p_lo": probe, "p_hi": hi}


def ordered(a: np.ndarray) -> np.ndarray:
    """The index's order-preserving uint64 image of the keys (csrc/core/keys.h)."""
    if a.dtype == np.int32:
        return (a.view(np.uint32) ^ np.uint32(0x80000000)).astype(np.uint64)
    bits = a.view(np.uint64)
    if a.dtype == np.float64:
        return np.where(bits >> np.uint64(63) == 1, ~bits, bits | np.uint64(1 << 63))
    return bits ^ np.uint64(1 << 63)


RX_SEGMENT_LOG2 = 21  # RX fires one ray per aligned block of 2^21 ordered keys a range touches (csrc/core/scene.h)
RX_MAX_RANGE_RAYS = 1024  # RXIndex's default; a range touching more blocks scans every key on the GPU


def rx_band_cost(t: dict[str, np.ndarray]) -> tuple[int, int]:
    """(rays, keys compared by scanning) of RX's band join on the GPU."""
    lo, hi = ordered(t["p_lo"]), ordered(t["p_hi"])
    segments = np.where(lo <= hi, (hi >> np.uint64(RX_SEGMENT_LOG2)) - (lo >> np.uint64(RX_SEGMENT_LOG2)) + 1, 0)
    scans = segments > RX_MAX_RANGE_RAYS
    return int(segments[~scans].sum()), int(scans.sum()) * t["b_key"].size


def fingerprint(pos: np.ndarray, row: np.ndarray) -> list[int]:
    """An order-free summary of a pair multiset: count, sum of positions, of rows, of position * row (wrapping
    int64 arithmetic, the same for every engine)."""
    pos, row = pos.astype(np.int64, copy=False), row.astype(np.int64, copy=False)
    with np.errstate(over="ignore"):
        return [int(pos.size), int(pos.sum()), int(row.sum()), int((pos * (row + 1)).sum())]


# -------------------------------------------------------------------------------------------------- timing
def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, repeats: int, device: str = "cpu"):
    """(median wall ms, cores busy = process CPU time / wall time, last output) over `repeats` runs after one warm-up."""
    out = fn()
    times, cpu = [], []
    for _ in range(repeats):
        del out
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    # Process CPU time is accounted in ticks: below ~50 ms in all the ratio is noise, so it is left out.
    cores = sum(cpu) / sum(times) if sum(times) >= 0.05 else None
    return statistics.median(times) * 1e3, cores, out


# ------------------------------------------------------------------------------------------------- engines
def duckdb_engine(t: dict[str, np.ndarray], threads: int | None):
    try:
        import duckdb
    except ImportError as e:
        raise SystemExit(f"join_bench needs DuckDB, the reference engine: pip install duckdb (or install a wheel) ({e})")

    con = duckdb.connect(config={"threads": threads} if threads else {})
    t0 = time.perf_counter()
    con.register("b_np", {"key": t["b_key"], "row": t["b_row"]})
    con.register("p_np", {"pos": t["p_pos"], "key": t["p_key"], "lo": t["p_lo"], "hi": t["p_hi"]})
    con.execute("CREATE TABLE b AS SELECT * FROM b_np")
    con.execute("CREATE TABLE p AS SELECT * FROM p_np")
    load_ms = (time.perf_counter() - t0) * 1e3
    info = {"version": duckdb.__version__, "threads": int(con.execute("SELECT current_setting('threads')").fetchone()[0]),
            "load_ms": load_ms}
    return con, info


def duckdb_pairs(con, join_kind: str, how: str):
    out = con.execute(f"SELECT p.pos, b.row FROM p {'LEFT ' if how == 'left' else ''}JOIN b ON {SQL_ON[join_kind]}").fetchnumpy()
    return out["pos"], np.ma.filled(out["row"], -1)


def duckdb_count(con, join_kind: str, how: str) -> int:
    return con.execute(f"SELECT count(*) FROM p {'LEFT ' if how == 'left' else ''}JOIN b ON {SQL_ON[join_kind]}").fetchone()[0]


def polars_frames(t: dict[str, np.ndarray]):
    import polars as pl

    b = pl.DataFrame({"key": t["b_key"], "row": t["b_row"]})
    p = pl.DataFrame({"pos": t["p_pos"], "key": t["p_key"]})
    bands = pl.DataFrame({"pos": t["p_pos"], "lo": t["p_lo"], "hi": t["p_hi"]})
    return pl, b, p, bands


def polars_join(frames, join_kind: str, how: str):
    pl, b, p, bands = frames
    if join_kind == "equi":
        return p.join(b, on="key", how=how).select("pos", "row")
    return bands.join_where(b, pl.col("key") >= pl.col("lo"), pl.col("key") <= pl.col("hi")).select("pos", "row")


def torch_join(index, q: dict[str, torch.Tensor], join_kind: str, how: str):
    if join_kind == "equi":
        return join(index, q["key"], how=how)
    return range_join(index, q["lo"], q["hi"], how=how)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-build", type=int, default=24, help="log2 of the build side's rows (default 24)")
    ap.add_argument("--log-probe", type=int, default=24, help="log2 of the probe side's rows (default 24)")
    ap.add_argument("--build-mult", type=int, default=1, help="build rows per distinct key (default 1: unique keys)")
    ap.add_argument("--hit-rate", type=float, default=0.5, help="share of probe keys drawn from the build keys")
    ap.add_argument("--band-keys", type=float, default=4.0, help="band width, in distinct-key spacings (default 4)")
    ap.add_argument("--dtype", choices=list(DTYPES), default="int64")
    ap.add_argument("--joins", default="equi,band", help="comma-separated: equi, band")
    ap.add_argument("--how", default="inner,left", help="comma-separated: inner, left")
    ap.add_argument("--indexes", default="cgrx,rx", help=f"comma-separated build-side indexes: {', '.join(INDEXES)}")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: the CPU, and the GPU where there is one; cpu: the CPU only; cuda: both, GPU required")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for DuckDB, Polars and torch (default: each engine's own default, reported)")
    ap.add_argument("--no-polars", action="store_true", help="leave Polars out even where installed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON file to write (default benchmarks/results/<device>/join_<commit>.json)")
    args = ap.parse_args(argv)
    args.joins, args.how, args.indexes = (s.split(",") for s in (args.joins, args.how, args.indexes))
    for name, got, allowed in (("--joins", args.joins, SQL_ON), ("--how", args.how, ("inner", "left")),
                               ("--indexes", args.indexes, INDEXES)):
        if not got or any(x not in allowed for x in got):
            ap.error(f"{name} takes a comma-separated list of {', '.join(allowed)}, got {','.join(got)}")
    if not 0.0 <= args.hit_rate <= 1.0 or args.build_mult < 1 or args.repeats < 1 or args.band_keys < 0:
        ap.error("--hit-rate is in [0, 1]; --build-mult and --repeats are at least 1; --band-keys at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA device")
    return args


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["POLARS_MAX_THREADS"] = str(args.threads)  # read when polars is first imported
    devices = ["cpu"] + (["cuda"] if args.device != "cpu" and torch.cuda.is_available() else [])
    t = make_tables(args)
    con, duck = duckdb_engine(t, args.threads)
    result = {
        "benchmark": "join", "commit": git_commit(), "unix_time": int(time.time()), "argv": sys.argv[1:],
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "device": torch.cuda.get_device_name() if "cuda" in devices else "cpu",
        "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "torch_rtindex": torch_rtindex.__version__,
        "duckdb": duck, "polars": None, "rows": [], "failures": [],
    }
    def note(text: str) -> None:
        if text not in result.setdefault("notes", []):
            result["notes"].append(text)

    polars = None
    if not args.no_polars:
        try:
            polars = polars_frames(t)
            result["polars"] = {"version": polars[0].__version__, "threads": polars[0].thread_pool_size()}
        except ImportError as e:
            result["polars"] = {"skipped": f"not installed ({e})"}

    def record(join_kind, how, engine, stage, threads, ms, cores, fp=None, want=None):
        """One row; `fp` (the pairs' fingerprint) is checked against DuckDB's `want` where both are given."""
        row = {"join": join_kind, "how": how, "engine": engine, "stage": stage, "threads": threads, "ms": ms,
               "cores": cores, "pairs": fp[0] if fp else None, "check": "-"}
        if fp is not None and want is not None:
            row["check"] = "ok" if fp == want else f"MISMATCH: {fp} vs DuckDB {want}"
            if fp != want:
                result["failures"].append(f"{engine} {stage} {join_kind} {how}: {row['check']}")
        result["rows"].append(row)

    cases = [(j, h) for j in args.joins for h in args.how]
    want = {}
    for join_kind, how in cases:
        ms, cores, pairs = measure(lambda: duckdb_pairs(con, join_kind, how), args.repeats)
        want[join_kind, how] = fingerprint(*pairs)
        del pairs
        record(join_kind, how, "duckdb", "query", duck["threads"], ms, cores, want[join_kind, how])
        result["rows"][-1]["check"] = "reference"
        ms, cores, count = measure(lambda: duckdb_count(con, join_kind, how), args.repeats)
        record(join_kind, how, "duckdb", "count", duck["threads"], ms, cores, [count], want[join_kind, how][:1])
        if polars is None:
            continue
        if join_kind == "band" and how == "left":
            note("polars: band joins (join_where) are inner only")
            continue
        ms, cores, df = measure(lambda: polars_join(polars, join_kind, how), args.repeats)
        fp = fingerprint(df.get_column("pos").to_numpy(), df.get_column("row").fill_null(-1).to_numpy())
        del df
        record(join_kind, how, "polars", "join", result["polars"]["threads"], ms, cores, fp, want[join_kind, how])

    host = {"key": torch.from_numpy(t["p_key"]), "lo": torch.from_numpy(t["p_lo"]), "hi": torch.from_numpy(t["p_hi"])}
    build_host = torch.from_numpy(t["b_key"])
    for device in devices:
        threads = torch.get_num_threads() if device == "cpu" else None
        keys = build_host.to(device)
        q = {k: v.to(device) for k, v in host.items()}
        for name in args.indexes:
            make = INDEXES[name]
            try:
                ms, cores, index = measure(lambda: make(keys), args.repeats, device)
            except RuntimeError as e:  # e.g. RX on a GPU without a usable OptiX
                note(f"{name} on {device} skipped: {str(e).splitlines()[0]}")
                continue
            engine = f"torch_rtindex {name}{'-' + index.backend if hasattr(index, 'backend') else ''} {device}"
            record("-", "-", engine, "build", threads, ms, cores)
            for join_kind, how in cases:
                if name == "rx" and device == "cuda" and join_kind == "band":
                    rays, scanned = rx_band_cost(t)
                    if rays > 2**32 or scanned > 2**36:  # hours of GPU time, not a measurement
                        note(
                            f"rx band join on cuda skipped: its bands would fire {rays} rays and scan {scanned} keys "
                            f"(a band touching more than {RX_MAX_RANGE_RAYS} blocks of 2^{RX_SEGMENT_LOG2} ordered keys "
                            "scans all keys); RX ranges suit dense keys")
                        continue
                ms, cores, pairs = measure(lambda: torch_join(index, q, join_kind, how), args.repeats, device)
                record(join_kind, how, engine, "join", threads, ms, cores, fingerprint(*(x.cpu().numpy() for x in pairs)),
                       want[join_kind, how])
                del pairs
                if device == "cpu":
                    continue  # on the CPU, build + join is the sum of the build row and the join row
                ms, cores, pairs = measure(lambda: torch_join(make(keys), q, join_kind, how), args.repeats, device)
                record(join_kind, how, engine, "build+join", threads, ms, cores,
                       fingerprint(*(x.cpu().numpy() for x in pairs)), want[join_kind, how])
                del pairs

                def end_to_end():  # host columns in (those this join reads), host pairs out
                    qd = {k: host[k].to(device) for k in (("key",) if join_kind == "equi" else ("lo", "hi"))}
                    pairs = torch_join(make(build_host.to(device)), qd, join_kind, how)
                    return tuple(x.cpu() for x in pairs)

                ms, cores, pairs = measure(end_to_end, args.repeats, device)
                record(join_kind, how, engine, "copies+build+join", threads, ms, cores,
                       fingerprint(*(x.numpy() for x in pairs)), want[join_kind, how])
                del pairs
            index = None  # the closures above hold the name: released, not deleted
        keys = q = None  # the closures above hold the name: released, not deleted
        if device == "cuda":
            torch.cuda.empty_cache()
    con.close()
    return result


def table(result: dict) -> str:
    p, duck = result["params"], result["duckdb"]
    lines = [
        f"joins: 2^{p['log_build']} build rows ({p['build_mult']} per key), 2^{p['log_probe']} probe rows "
        f"({p['hit_rate']:.0%} hits), {p['dtype']} keys, bands {p['band_keys']:g} keys wide; device {result['device']}; "
        f"commit {result['commit']}",
        f"threads: DuckDB {duck['version']} {duck['threads']}, torch {result['torch']} {result['torch_threads']}"
        + (f", Polars {result['polars']['version']} {result['polars']['threads']}" if result["polars"] and "threads" in result["polars"] else "")
        + f"; {result['cpu_count']} CPUs ({result['cpu_affinity']} usable); DuckDB table load {duck['load_ms']:.1f} ms",
        f"{'join':5s} {'how':5s} {'engine':34s} {'stage':17s} {'threads':>7s} {'ms':>10s} {'cores':>6s} {'pairs':>11s} "
        f"{'vs duckdb':>9s}  check",
    ]
    base = {(r["join"], r["how"]): r["ms"] for r in result["rows"] if r["engine"] == "duckdb" and r["stage"] == "query"}
    for r in result["rows"]:
        b = base.get((r["join"], r["how"]))
        speed = "" if b is None else f"{b / r['ms']:8.2f}x" if r["ms"] > 0 else "inf"
        pairs = "" if r["pairs"] is None else str(r["pairs"])
        lines.append(f"{r['join']:5s} {r['how']:5s} {r['engine']:34s} {r['stage']:17s} {str(r['threads'] or '-'):>7s} "
                     f"{r['ms']:10.2f} {'-' if r['cores'] is None else format(r['cores'], '6.2f'):>6s} {pairs:>11s} {speed:>9s}  {r['check']}")
    lines.append("vs duckdb: DuckDB query time / this time (above 1: faster than DuckDB's query with its pairs fetched)")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    for f in result["failures"]:
        lines.append(f"FAILED: {f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    path = Path(args.out) if args.out else results_dir(result["device"]) / f"join_{result['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
