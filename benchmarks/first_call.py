"""First-call costs, each measured in a fresh process: ``import torch``, ``import torch_rtindex`` on top, then per
index class and device the first and second build over 2^20 keys and the first and second point lookup of
2^16 queries. CUDA's own start-up (context creation) is timed apart, before the first build, and for RXIndex
OptiX's (its device context, which every RX build needs). On CUDA, the first OptiX lookup's cost is also measured
with OptiX's disk cache cold (an empty cache folder) and warm (the same folder, next process).

    python3 benchmarks/first_call.py                      # the checkout this file lives in
    python3 benchmarks/first_call.py --package-path DIR   # e.g. a wheel installed with pip --target DIR

Prints one table (milliseconds) and, with --json, writes the raw numbers. Besides wall time, each build's process
CPU time (all threads) and minor page faults are recorded: on a shared, loaded machine the CPU time is the steadier
measure of the work a first build does beyond the second. The probes import with compiled bytecode, as an
installed package does (a private cache folder, filled by one untimed import first, so no tree is written to and
PYTHONDONTWRITEBYTECODE does not turn every import into a compile).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
t1 = time.perf_counter()
import torch_rtindex as ti
t_pkg = time.perf_counter() - t1
name, device, n, q = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = {"import_torch": t_torch, "import_torch_rtindex": t_pkg, "package": ti.__file__,
       "extension": ti._extension.load().get("kind", "jit")}  # older trees: no "kind"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
usage = lambda: resource.getrusage(resource.RUSAGE_SELF)
if device == "cuda":
    t = time.perf_counter(); torch.cuda.init(); torch.empty(1, device="cuda"); sync()
    out["cuda_init"] = time.perf_counter() - t
    if name == "RXIndex":  # OptiX's own start-up (its device context), which every RX build needs, apart too
        t = time.perf_counter(); ti.optix_info(torch.device("cuda")); out["optix_init"] = time.perf_counter() - t
gen = torch.Generator().manual_seed(0)
keys = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)
queries = keys[torch.randint(0, n, (q,), generator=gen)]
build = {
    "RXIndex": lambda k: ti.RXIndex(k),
    "CgRXIndex": lambda k: ti.CgRXIndex(k),
    "CgRXIndex(radix)": lambda k: ti.CgRXIndex(k, backend="radix"),
    "CgRXIndex(optix)": lambda k: ti.CgRXIndex(k, backend="optix"),
    "UpdatableCgRXIndex": lambda k: ti.UpdatableCgRXIndex(k),
    "ChunkedIndex": lambda k: ti.ChunkedIndex(k.cpu(), device=device),
}[name]
if name != "ChunkedIndex":
    keys, queries = keys.to(device), queries.to(device)
else:
    queries = queries.to(device)
profile = len(sys.argv) > 5 and sys.argv[5] == "profile"
for attempt in ("first", "second"):
    if profile and attempt == "first":
        import cProfile, io, pstats
        prof = cProfile.Profile(); prof.enable()
    sync(); u = usage(); t = time.perf_counter(); index = build(keys); sync()
    if profile and attempt == "first":
        prof.disable(); text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
        out["profile"] = text.getvalue()
    out[f"{attempt}_build"] = time.perf_counter() - t
    v = usage()
    out[f"{attempt}_build_cpu"] = v.ru_utime + v.ru_stime - u.ru_utime - u.ru_stime
    out[f"{attempt}_build_faults"] = v.ru_minflt - u.ru_minflt
    t = time.perf_counter(); found = index.lookup(queries); sync()
    out[f"{attempt}_lookup"] = time.perf_counter() - t
    assert int(found.count.min()) >= 1
out["backend"] = getattr(index, "backend", "optix" if device == "cuda" and name == "RXIndex" else "sorted")
out["dynamo_loaded"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def run_probe(name: str, device: str, n: int, q: int, env: dict, profile: bool = False) -> dict:
    argv = [sys.executable, "-c", PROBE, name, device, str(n), str(q)] + (["profile"] if profile else [])
    res = subprocess.run(argv, capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir(), timeout=900)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package-path", default=str(CHECKOUT), help="folder that holds torch_rtindex/")
    parser.add_argument("--keys", type=int, default=1 << 20)
    parser.add_argument("--queries", type=int, default=1 << 16)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per class and device")
    parser.add_argument("--classes", default="RXIndex,CgRXIndex,CgRXIndex(radix),UpdatableCgRXIndex,ChunkedIndex")
    parser.add_argument("--devices", default="cpu,cuda", help="of cpu,cuda (cuda where available)")
    parser.add_argument("--no-optix-cache-runs", action="store_true",
                        help="skip the OptiX lookups with the disk cache cold and warm (CUDA)")
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--profile", action="store_true",
                        help="one more process per class and device with the first build under cProfile: prints the "
                             "functions that took longest where the first build took 50 ms more than the second")
    args = parser.parse_args()

    import torch

    bytecode = tempfile.TemporaryDirectory(prefix="first_call_pycache_")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([args.package_path, os.environ.get("PYTHONPATH", "")]),
           "PYTHONPYCACHEPREFIX": bytecode.name}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # Untimed: compiles the bytecode of torch and the package into the private cache (and the extension, if the
    # build cache has none yet), so that no timed import pays either.
    subprocess.run([sys.executable, "-c", "import torch_rtindex"], env=env, cwd=tempfile.gettempdir(), check=True,
                   timeout=1800)
    wanted = args.devices.split(",")
    devices = [d for d in ("cpu", "cuda") if d in wanted and (d == "cpu" or torch.cuda.is_available())]
    rows, profiles = [], []
    for device in devices:
        for name in args.classes.split(","):
            for r in range(args.repeats):
                rows.append({"class": name, "device": device, "run": r, **run_probe(name, device, args.keys, args.queries, env)})
            if args.profile:
                profiles.append((name, device, run_probe(name, device, args.keys, args.queries, env, profile=True)))
    if "cuda" in devices and not args.no_optix_cache_runs:
        # The first OptiX lookup in a process with OptiX's disk cache cold, then warm (same folder, next process).
        with tempfile.TemporaryDirectory() as cache:
            for state in ("optix cache cold", "optix cache warm"):
                row = run_probe("CgRXIndex(optix)", "cuda", args.keys, args.queries, {**env, "OPTIX_CACHE_PATH": cache})
                rows.append({"class": "CgRXIndex(optix)", "device": f"cuda, {state}", "run": 0, **row})
                row = run_probe("RXIndex", "cuda", args.keys, args.queries, {**env, "OPTIX_CACHE_PATH": cache})
                rows.append({"class": "RXIndex", "device": f"cuda, {state}", "run": 0, **row})

    first = next((r for r in rows if "import_torch" in r), {})
    print(f"package: {first.get('package')} ({first.get('extension')} extension); "
          f"keys {args.keys}, queries {args.queries}; times in ms")
    cols = ["import_torch", "import_torch_rtindex", "cuda_init", "optix_init", "first_build", "second_build", "first_build_cpu",
            "second_build_cpu", "first_lookup", "second_lookup"]
    print(f"{'class':20} {'device':22} {'backend':14} " + " ".join(f"{c:>16}" for c in cols) + "  dynamo")
    for r in rows:
        if "error" in r:
            print(f"{r['class']:20} {r['device']:22} error: {r['error']}")
            continue
        vals = " ".join(f"{r[c] * 1e3:16.1f}" if c in r else f"{'-':>16}" for c in cols)
        print(f"{r['class']:20} {r['device']:22} {str(r['backend']):14} {vals}  {r['dynamo_loaded']}")
    for name, device, r in profiles:
        if "error" not in r and r["first_build"] - r["second_build"] > 0.05:
            print(f"\n{name} on {device}: first build {r['first_build'] * 1e3:.1f} ms, second "
                  f"{r['second_build'] * 1e3:.1f} ms; the first under cProfile:")
            print("\n".join(line for line in r["profile"].splitlines()[:40] if line.strip()))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
