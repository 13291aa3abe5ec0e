"""What every benchmark shares: the library of the checkout the benchmark lives in, and where results go.

Importing this module puts the checkout's root first on ``sys.path``, so ``import torch_rtindex`` measures the tree
next to the script, not whichever checkout was last installed with ``pip install -e`` or named in PYTHONPATH. An A/B
of one script over two trees names the other tree in ``RTINDEX_TREE`` (a folder holding ``torch_rtindex/``); every
benchmark prints the tree it measures.

    import _common  # noqa: F401  (before torch_rtindex: this checkout first on sys.path)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
TREE = Path(os.environ.get("RTINDEX_TREE") or BENCHMARKS.parent).resolve()
if not (TREE / "torch_rtindex" / "__init__.py").is_file():
    raise SystemExit(f"RTINDEX_TREE={TREE} holds no torch_rtindex/ package")
sys.path.insert(0, str(TREE))
if "torch_rtindex" in sys.modules:  # imported before this module could choose the tree: say which one is measured
    TREE = Path(sys.modules["torch_rtindex"].__file__).resolve().parent.parent
print(f"torch_rtindex from {TREE}", file=sys.stderr, flush=True)


def results_dir(device_name: str) -> Path:
    """benchmarks/results/<device>: one folder per GPU, so timings are only ever compared on the same one."""
    return BENCHMARKS / "results" / re.sub(r"[^A-Za-z0-9_.-]+", "_", device_name).strip("_")


def write_json(result: dict, name: str, out: str | None = None) -> Path:
    """Writes one benchmark's result as <out or results_dir(device)>/<name>.json and says where."""
    folder = Path(out) if out else results_dir(result["device"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return path


def cpu_name() -> str:
    """The host processor's model name (benchmarks that run on the CPU name it in their results)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


def git_commit() -> str:
    """The measured tree's commit (``RTINDEX_COMMIT`` where the machine's copy has no .git or a stale one)."""
    if os.environ.get("RTINDEX_COMMIT"):
        return os.environ["RTINDEX_COMMIT"]
    try:  # "-dirty": the tree is not that commit
        return subprocess.check_output(["git", "describe", "--always", "--dirty", "--abbrev=7"], text=True,
                                       cwd=TREE, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def launch_ranks(bench, args, timeout_s: int, pg_options=None) -> None:
    """Runs ``bench(rank, world, sys.argv[1:])`` on every rank of a process group: under torchrun in this process
    (NCCL where ``args.device`` is CUDA, with ``pg_options``; gloo on the CPU), else in ``args.world`` processes
    started here (default: one per GPU, two on the CPU)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch_rtindex.distributed import spawn

    backend = "nccl" if args.device == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), pg_options=pg_options)
        try:
            bench(dist.get_rank(), dist.get_world_size(), sys.argv[1:])
        finally:
            dist.destroy_process_group()
        return
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if world < 1:
        raise SystemExit("no CUDA devices: pass --device cpu for a gloo smoke test")
    spawn(bench, world, sys.argv[1:], backend=backend, timeout_s=timeout_s)
