"""A lower bound for the sharded point lookup's weak scaling: every piece of device work a rank must do, with
no dependencies between them, all at once. Run under torchrun, one rank per GPU:

    torchrun --nproc-per-node=2 benchmarks/lab/sharded_bound_probe.py [--log-keys 26] [--log-lookups 27]

Per rank (weak sizes: 2^26 keys held, 2^27 queries asked and 2^27 answered, uniform over all ranks' keys):
  lookup     the rank's share of lookups, 2^27 queries all in its shard (CgRXIndex, radix), the same number a
             rank answers in any design when queries are uniform;
  exchange   the fewest bytes NCCL must move: the (W-1)/W remote queries out (8 bytes each) and their answers
             back (first row 8 + count 4 bytes), two all_to_all_single calls;
  route      partition_queries over the caller's 2^27 queries (W owners) and scatter_answers_into of the
             remote answers back to the caller's order.
A real call has dependencies (the exchange waits for the route, the return for the lookups), so it cannot be
faster than these pieces run together with none: the "together" rows. The one-GPU baseline is one GPU holding W
times the keys and answering W times the lookups; 1.7x weak scaling at two GPUs (0.85x per GPU) means a rank's
call within baseline / (0.85 W). Prints a table (the maximum over ranks per row) and writes
JSON (sharded_bound_<commit>.json) to --out-dir or benchmarks/results/<GPU>/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rx_bench, _common
import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rx_bench import git_commit, write_json  # noqa: E402

from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex._keys import KEY_TYPES  # noqa: E402
from torch_rtindex.distributed import no_multicast_env  # noqa: E402


def wall_ms(fn, repeats: int) -> float:
    """Median over repeats of the slowest rank's wall time for fn (all ranks start together, every stream
    drained at the end): the time a collective call would take."""
    times = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t = torch.tensor([time.perf_counter() - t0], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i:  # the first is a warm-up
            times.append(float(t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    no_multicast_env()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    dist.init_process_group("nccl", timeout=timedelta(seconds=600), pg_options=opts)
    rank, W = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda")
    internal = torch.ops.rtindex_internal
    nk, nq = 2**a.log_keys, 2**a.log_lookups
    gen = torch.Generator(device=dev).manual_seed(11 + rank)
    rows: list[dict] = []

    def row(name: str, ms: float) -> None:
        rows.append({"row": name, "ms": ms})
        if rank == 0:
            print(f"{name:60s} {ms:8.3f} ms", flush=True)

    base = None
    if not a.skip_baseline:  # rank 0's GPU alone; the others wait at the next barrier
        if rank == 0:
            keys = torch.randint(-(2**63), 2**63 - 1, (W * nk,), generator=gen, device=dev)
            idx = CgRXIndex(keys)
            q = keys[torch.randint(0, W * nk, (W * nq,), generator=gen, device=dev)]
            idx.lookup(q)
            ts = []
            for _ in range(a.repeats):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                idx.lookup(q)
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e))
            base = statistics.median(ts)
            row(f"one GPU: {W}x keys, {W}x lookups (baseline)", base)
            del keys, idx, q
            torch.cuda.empty_cache()
        dist.barrier()

    keys = torch.randint(-(2**63), 2**63 - 1, (nk,), generator=gen, device=dev)
    idx = CgRXIndex(keys)
    q_local = keys[torch.randint(0, nk, (nq,), generator=gen, device=dev)]
    # The caller's batch: uniform over W owners (splitters at this shard's quantiles stand in for the global ones).
    q_call = torch.randint(-(2**63), 2**63 - 1, (nq,), generator=gen, device=dev)
    ordered = torch.sort(q_call ^ (-(2**63))).values
    splitters = ordered[[nq * i // W for i in range(1, W)]].contiguous()
    n_remote = nq * (W - 1) // W // W * W  # divisible by W for equal splits
    qsend = torch.randint(-(2**63), 2**63 - 1, (n_remote,), generator=gen, device=dev)
    qrecv = torch.empty_like(qsend)
    asend = torch.zeros(n_remote * 3, dtype=torch.int32, device=dev)  # 12 bytes per answer
    arecv = torch.empty_like(asend)
    back = torch.zeros(n_remote, 2, dtype=torch.int64, device=dev)
    # One owner's segment of a partition: ascending caller positions (the partition is stable).
    positions = torch.sort(torch.randperm(nq, generator=gen, device=dev)[:n_remote]).values
    cols = [torch.empty(nq, dtype=torch.int64, device=dev) for _ in range(2)]
    side = torch.cuda.Stream(priority=-1)
    int64 = KEY_TYPES["int64"]

    def lookup():
        idx.lookup(q_local)

    def exchange():
        w1 = dist.all_to_all_single(qrecv, qsend, async_op=True)
        w2 = dist.all_to_all_single(arecv, asend, async_op=True)
        w1.wait()
        w2.wait()

    def route():
        internal.partition_queries(q_call, int64, splitters, 1)
        internal.scatter_answers_into(back, positions, *cols)

    def together(parts):
        works = []
        if "exchange" in parts:  # posted first: NCCL's stream waits only for work already on this stream
            works = [dist.all_to_all_single(qrecv, qsend, async_op=True),
                     dist.all_to_all_single(arecv, asend, async_op=True)]
        if "route" in parts:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                route()
        if "lookup" in parts:
            lookup()
        for w in works:
            w.wait()
        torch.cuda.current_stream().wait_stream(side)

    alone = {}
    for name, fn in (("lookup", lookup), ("exchange", exchange), ("route", route)):
        alone[name] = wall_ms(fn, a.repeats)
        row(f"{name} alone", alone[name])
    row("sum of the three alone", sum(alone.values()))
    for parts in (("lookup", "exchange"), ("lookup", "route"), ("lookup", "exchange", "route")):
        row(" + ".join(parts) + ", together", wall_ms(lambda: together(parts), a.repeats))
    if base is not None and rank == 0:
        budget = base / (1.7 * W / 2)
        row(f"budget for {1.7 * W / 2:.2f}x at {W} GPUs (1.7x at two)", budget)
    if rank == 0:
        write_json({"device": torch.cuda.get_device_name(), "world": W, "commit": git_commit(),
                    "log_keys": a.log_keys, "log_lookups": a.log_lookups, "rows": rows},
                   f"sharded_bound_{git_commit()}", a.out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
