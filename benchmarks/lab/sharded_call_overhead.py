"""The host work of one ShardedIndex point call at embedding-batch sizes (issue 44): per form, the torch
operators one call dispatches (counted by a TorchDispatchMode: top-level operators, the collectives included,
not the ones a custom operator's kernel calls inside) and the microseconds per call, wall and the calling thread's
CPU time (medians over calls, slowest rank), at world 1 and 2 (gloo on CPU processes, or NCCL under --device cuda), a cgRX radix local index
as sharded_embedding_bench.py builds it.

On the CPU the wall time is the call's whole time (host work, the gloo exchanges and the small kernels: on a
loaded machine mostly noise); the thread's CPU time is the host work (Python, dispatch, the CPU kernels); the
operator count is what a GPU call pays in launches and dispatch.

    python3 benchmarks/lab/sharded_call_overhead.py                 # worlds 1 and 2, 2^10 IDs per rank
    python3 benchmarks/lab/sharded_call_overhead.py --worlds 2 --log-ids 10,14
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from _common import git_commit, launch_ranks  # noqa: E402
from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex.distributed import ShardedIndex  # noqa: E402

KEY_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # as sharded_embedding_bench.py: all keys distinct, all hits
FORMS = ("lookup_fixed_nocheck", "lookup_fixed", "lookup_rows")


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--worlds", default="1,2", help="process counts, comma-separated")
    ap.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)  # set per run for launch_ranks
    ap.add_argument("--log-ids", default="10", help="IDs per rank per call (log2), comma-separated")
    ap.add_argument("--log-keys", type=int, default=14, help="keys per rank (log2)")
    ap.add_argument("--slack", type=float, default=1.1, help="query_capacity = slack * ids / world + 64")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (1: a loaded machine's "
                    "descheduled pool threads stay out of the timings)")
    ap.add_argument("--list-ops", action="store_true", help="print each form's operators (rank 0)")
    return ap.parse_args(argv)


def per_call_us(fn, dev, iters: int) -> tuple[float, float]:
    """(wall, CPU time of the calling thread) per call in microseconds, medians over calls, slowest rank. The
    thread's CPU time is the host work alone: it leaves out waiting (for the peer, for a core on a loaded
    machine) and the backend's own threads."""
    for _ in range(20):
        fn()
    dist.barrier()
    wall, cpu = [], []
    for _ in range(iters):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    t = torch.tensor([statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0]), float(t[1])


def probe(rank: int, world: int, argv: list[str]) -> None:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    dev = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    n = 1 << a.log_keys
    idx = ShardedIndex(torch.arange(rank * n, (rank + 1) * n, dtype=torch.int64, device=dev) * KEY_MULTIPLIER,
                       index_factory=functools.partial(CgRXIndex, backend="radix"))
    for log_ids in [int(s) for s in a.log_ids.split(",") if s]:
        q = 1 << log_ids
        qcap = int(a.slack * q / world) + 64
        gen = torch.Generator(device=dev).manual_seed(log_ids + 17 * rank)
        rows = torch.randint(0, n * world, (q,), generator=gen, device=dev)
        ids = rows * KEY_MULTIPLIER
        calls = {"lookup_fixed_nocheck": lambda: idx.lookup_fixed(ids, qcap, check=False).answer.first_row,
                 "lookup_fixed": lambda: idx.lookup_fixed(ids, qcap).answer.first_row,
                 "lookup_rows": lambda: idx.lookup_rows(ids)}
        for form in FORMS:
            got = calls[form]()
            wrong = torch.tensor([int((got != rows).sum())], device=dev)
            dist.all_reduce(wrong)
            counter = OpCounter()
            with counter:
                calls[form]()
            us, cpu_us = per_call_us(calls[form], dev, a.iters)
            if rank == 0:
                ops = sum(counter.ops.values())
                a2a = counter.ops.get("c10d.alltoall_base_", 0)
                print(f"{world:>5} {log_ids:>8} {form:22} {ops:>6} {a2a:>5} {us:>10.1f} {cpu_us:>10.1f}  "
                      f"{'right' if int(wrong) == 0 else f'{int(wrong)} WRONG'}", flush=True)
                if a.list_ops:
                    print("      " + ", ".join(f"{k} x{v}" for k, v in sorted(counter.ops.items())), flush=True)
    dist.barrier()


def main() -> None:
    a = parse()
    print(f"sharded call overhead, commit {git_commit()}, torch {torch.__version__}, {a.device}, "
          f"2^{a.log_keys} keys per rank, cgRX radix shards, {a.threads} thread(s) per rank, median of {a.iters} calls "
          "(slowest rank)")
    print(f"{'world':>5} {'log2 ids':>8} {'form':22} {'ops':>6} {'a2a':>5} {'wall us':>10} {'thread us':>10}  answers", flush=True)
    for w in [int(s) for s in a.worlds.split(",") if s]:
        launch_ranks(probe, argparse.Namespace(device=a.device, world=w), timeout_s=300)


if __name__ == "__main__":
    main()
