"""ShardedIndex point lookups at embedding-batch sizes (issue 44): 2^10, 2^14 and 2^17 IDs per rank per call,
against two plain ``all_to_all_single`` of the same bytes (the IDs out, their answers back: the least an embedding
lookup's exchange costs), eager and replayed from a CUDA graph.

Forms, per size (every rank calls with its own IDs, drawn uniformly from every rank's keys: all hits):
  a2a                    the baseline: all_to_all_single of q int64 IDs, then of q * --answer-words int64 answers
                         (even splits; each rank's own 1/W stays home, as the lookups' own queries do on average)
  a2a_graph              the same two collectives captured in a CUDA graph, replayed
  lookup_rows            the default form (IdToRow's): header agreement and exact-size exchanges (host syncs)
  lookup_fixed           the fixed-capacity form with its collective input check (its eager default)
  lookup_fixed_nocheck   check=False: two all-to-alls of fixed blocks and a few kernels, no host sync
  lookup_fixed_graph     check=False captured once in a CUDA graph (static IDs in, static answer out), replayed
query_capacity = --slack * q / W + 64 slots per owner. Time per call: --warmup calls, then --iters back-to-back
calls, each between two CUDA events (host clock on the CPU); per call the slowest rank (all_reduce MAX); the
median over the calls ("mean" is the host clock around the whole loop over --iters, slowest rank). Ratios:
each form over the eager baseline and over the replayed one (issue 44's target: within 1.5x).

Answers: global row g's key is g times an odd constant (mod 2^64, a bijection: all keys distinct), so an ID's right
row is the g it was made from. Every form is checked on the timed IDs and on fresh ones (the graph: copied into its
static input and replayed) on every rank; any wrong answer fails the run after the table and JSON are written.

    torchrun --nproc-per-node=2 benchmarks/sharded_embedding_bench.py         # or: python ... --world 2
    python benchmarks/sharded_embedding_bench.py --device cpu --world 2 --log-keys 12 --log-ids 6,8   # gloo smoke
    torchrun --nproc-per-node=2 benchmarks/sharded_embedding_bench.py --log-ids 17 --kernels 50   # kernel times

Prints a table and writes JSON to benchmarks/results/<GPU name>/sharded_embedding_<commit>.json (or --out-dir).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _common import git_commit, launch_ranks, write_json  # noqa: E402
from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex.distributed import ShardedIndex, no_multicast_env  # noqa: E402

KEY_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # odd: g -> g * M (mod 2^64) is a bijection; as a signed int64
FORMS = ("a2a", "a2a_graph", "lookup_rows", "lookup_fixed", "lookup_fixed_nocheck", "lookup_fixed_graph")
TARGET = 1.5


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: gloo on CPU processes (smoke test)")
    ap.add_argument("--world", type=int, default=None, help="processes to start when not under torchrun "
                    "(default: the CUDA device count, 2 on the CPU)")
    ap.add_argument("--log-ids", default="10,14,17", help="IDs per rank per call (log2), comma-separated")
    ap.add_argument("--log-keys", type=int, default=24, help="keys per rank (log2): an embedding table's shard")
    ap.add_argument("--answer-words", type=int, default=2, choices=[1, 2],
                    help="int64 words per answer in the baseline: 2 = (first row, count) as a lookup answers, "
                         "1 = the row alone (the strict minimum)")
    ap.add_argument("--slack", type=float, default=1.1, help="query_capacity = slack * ids / world + 64")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200, help="timed calls per form and size")
    ap.add_argument("--kernels", type=int, default=0, metavar="CALLS",
                    help="also profile CALLS calls of the replayed fixed form and of the replayed baseline (the eager "
                         "fixed form on the CPU) and print each kernel's time per call: where a replayed call's time "
                         "goes, which its stages cannot be timed apart to show")
    ap.add_argument("--out-dir", default=None)
    return ap.parse_args(argv)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def keys_of(rows: torch.Tensor) -> torch.Tensor:
    return rows * KEY_MULTIPLIER  # wraps mod 2^64


def per_call(fn, dev, warmup: int, iters: int) -> tuple[float, float]:
    """(median over calls of the slowest rank's seconds per call, slowest rank's loop time / iters)."""
    for _ in range(warmup):
        fn()
    sync(dev)
    dist.barrier()
    sync(dev)
    times = []
    if dev.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        t0 = time.perf_counter()
        for start, end in events:
            start.record()
            fn()
            end.record()
        sync(dev)
        loop = time.perf_counter() - t0
        times = [s.elapsed_time(e) / 1e3 for s, e in events]
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        loop = time.perf_counter() - t0
    t = torch.tensor(times + [loop / iters], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t[:-1].tolist()), float(t[-1])


def capture(fn, dev):
    """A CUDA graph of one call of ``fn`` (warmed up on a side stream first, as capture wants) and its outputs."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    sync(dev)
    return graph, out


def kernel_table(title: str, fn, dev, calls: int, top: int = 12) -> str:
    """Each kernel's time per call of ``fn`` (GPU time; operators' own CPU time on the CPU) from torch.profiler,
    the largest ``top``, and their sum against the call's time per call (the rest: gaps between kernels)."""
    from torch.profiler import ProfilerActivity, profile  # only with --kernels

    cuda = dev.type == "cuda"
    fn()
    sync(dev)
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        sync(dev)
    wall = (time.perf_counter() - t) / calls
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted((e for e in prof.key_averages() if getattr(e, attr) > 0), key=lambda e: -getattr(e, attr))
    total = sum(getattr(e, attr) for e in events) / calls
    lines = [f"{title}: {total:.1f} us of {'kernels' if cuda else 'operators'} per call, "
             f"{wall * 1e6:.1f} us per call on the host clock (profiled)"]
    lines += [f"  {getattr(e, attr) / calls:8.2f} us  x{e.count / calls:4.1f}  {e.key[:110]}" for e in events[:top]]
    return "\n".join(lines)


def wrong(rows: torch.Tensor, want: torch.Tensor) -> int:
    return int((rows != want).sum()) if rows.shape == want.shape else want.numel()


def run_size(a, log_ids: int, idx: ShardedIndex, n_total: int, rank: int, world: int, dev) -> list[dict]:
    q = 1 << log_ids
    qcap = int(a.slack * q / world) + 64
    gen = torch.Generator(device=dev).manual_seed(1000 * log_ids + rank)
    draw = lambda: torch.randint(0, n_total, (q,), generator=gen, device=dev)  # noqa: E731  (global rows)
    rows = draw()
    ids = keys_of(rows)
    timed = functools.partial(per_call, dev=dev, warmup=a.warmup, iters=a.iters)
    graphs = dev.type == "cuda"
    out: dict[str, dict] = {}

    def record(form, seconds=None, bad=None, note=None, **extra):
        if seconds is None:
            out[form] = {"form": form, "median_s": None, "mean_s": None, "check": note, **extra}
            return
        n = torch.tensor([bad or 0], dtype=torch.int64, device=dev)
        dist.all_reduce(n)  # wrong answers over every rank
        check = "n/a" if bad is None else ("passed" if int(n) == 0 else f"failed: {int(n)} wrong")
        out[form] = {"form": form, "median_s": seconds[0], "mean_s": seconds[1], "check": check, **extra}

    # Baseline: the IDs out and the answers back, as plain collectives over static buffers.
    send_q = ids.clone()
    recv_q = torch.empty_like(send_q)
    send_a = torch.zeros(q * a.answer_words, dtype=torch.int64, device=dev)
    recv_a = torch.empty_like(send_a)

    def a2a():
        dist.all_to_all_single(recv_q, send_q)
        dist.all_to_all_single(recv_a, send_a)

    remote = (q + q * a.answer_words) * 8 * (world - 1) // world
    record("a2a", timed(a2a), bytes_remote=remote)
    base_graph = None
    if graphs:
        try:
            base_graph, _ = capture(a2a, dev)
            record("a2a_graph", timed(base_graph.replay), bytes_remote=remote)
        except RuntimeError as e:  # say why, and keep going with the other forms
            record("a2a_graph", note=f"capture failed: {type(e).__name__}: {str(e)[:200]}")
    else:
        record("a2a_graph", note="skipped: no CUDA graphs on the CPU")

    # Eager forms: checked on the timed IDs and on fresh ones, then timed.
    def check_eager(fn) -> int:
        bad = 0
        for r in (rows, draw()):
            got = fn(keys_of(r))
            bad += wrong(got, r)
        return bad

    def check_lookup(x):
        res = idx.lookup(x)
        return torch.where(res.count == 1, res.first_row, -3)  # exactly one match, and the right row

    def check_fixed(x, check):
        res = idx.lookup_fixed(x, qcap, check=check)
        return torch.where(res.overflowed, -4, res.answer.first_row)

    bad = check_eager(lambda x: idx.lookup_rows(x)) + check_eager(check_lookup)
    record("lookup_rows", timed(lambda: idx.lookup_rows(ids)), bad)
    bad = check_eager(lambda x: check_fixed(x, None))
    record("lookup_fixed", timed(lambda: idx.lookup_fixed(ids, qcap)), bad, query_capacity=qcap)
    bad = check_eager(lambda x: check_fixed(x, False))
    record("lookup_fixed_nocheck", timed(lambda: idx.lookup_fixed(ids, qcap, check=False)), bad, query_capacity=qcap)

    if not graphs:
        record("lookup_fixed_graph", note="skipped: no CUDA graphs on the CPU")
    elif not idx.capturable:
        record("lookup_fixed_graph", note="skipped: ShardedIndex.capturable is False for this local index")
    else:
        static = ids.clone()
        g, res = capture(lambda: idx.lookup_fixed(static, qcap, check=False), dev)
        bad = 0
        for r in (rows, draw()):  # the timed IDs, then fresh IDs copied into the captured input
            static.copy_(keys_of(r))
            g.replay()
            sync(dev)
            bad += wrong(torch.where(res.overflowed, -4, res.answer.first_row), r)
        static.copy_(ids)
        record("lookup_fixed_graph", timed(g.replay), bad, query_capacity=qcap)
        if a.kernels:  # every rank replays (the graphs hold collectives); rank 0 prints
            tables = [kernel_table(f"2^{log_ids} lookup_fixed_graph", g.replay, dev, a.kernels)]
            if base_graph is not None:
                tables.append(kernel_table(f"2^{log_ids} a2a_graph", base_graph.replay, dev, a.kernels))
            if rank == 0:
                print("\n".join(tables), flush=True)
    if a.kernels and not graphs:
        t = kernel_table(f"2^{log_ids} lookup_fixed_nocheck", lambda: idx.lookup_fixed(ids, qcap, check=False), dev,
                         a.kernels)
        if rank == 0:
            print(t, flush=True)

    base, base_g = out["a2a"]["median_s"], out["a2a_graph"]["median_s"]
    result = []
    for form in FORMS:
        r = {"log_ids": log_ids, "ids_per_rank": q, "world": world, **out[form]}
        s = r["median_s"]
        r["vs_a2a"] = s / base if s and base else None
        r["vs_a2a_graph"] = s / base_g if s and base_g else None
        result.append(r)
    return result


def fmt(x, scale=1.0, spec=".1f"):
    return "-" if x is None else format(x * scale, spec)


def table(rows: list[dict]) -> str:
    head = f"{'log2 ids':>8} {'form':22} {'median us':>10} {'mean us':>9} {'x a2a':>7} {'x a2a graph':>11}  check"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['log_ids']:>8} {r['form']:22} {fmt(r['median_s'], 1e6):>10} {fmt(r['mean_s'], 1e6):>9} "
                     f"{fmt(r['vs_a2a'], spec='.2f'):>7} {fmt(r['vs_a2a_graph'], spec='.2f'):>11}  {r['check']}")
    return "\n".join(lines)


def bench(rank: int, world: int, argv: list[str]) -> None:
    a = parse(argv)
    dev = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    n = 1 << a.log_keys
    mine = keys_of(torch.arange(rank * n, (rank + 1) * n, dtype=torch.int64, device=dev))
    t = time.perf_counter()
    idx = ShardedIndex(mine, index_factory=functools.partial(CgRXIndex, backend="radix"))  # radix: capturable
    sync(dev)
    build_s = time.perf_counter() - t
    del mine
    rows = []
    for log_ids in [int(s) for s in a.log_ids.split(",") if s]:
        rows += run_size(a, log_ids, idx, n * world, rank, world, dev)
    failed = [r for r in rows if str(r["check"]).startswith("failed")]
    if rank == 0:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        result = {"device": name, "world": world, "backend": dist.get_backend(), "commit": git_commit(),
                  "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()) if
                  dev.type == "cuda" else None, "params": vars(a), "keys_per_rank": n, "build_s": build_s,
                  "timing": "CUDA events per call (host clock on the CPU), slowest rank, median over calls",
                  "target_ratio": TARGET, "env": {k: os.environ.get(k) for k in
                  ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}, "runs": rows}
        print(f"{name} x{world} ({dist.get_backend()}), commit {result['commit']}, torch {torch.__version__}, "
              f"2^{a.log_keys} keys per rank, answers {'checked: ' + ('FAILED' if failed else 'all right')}")
        print(table(rows))
        for r in rows:
            if r["form"] in ("lookup_rows", "lookup_fixed_nocheck", "lookup_fixed_graph"):
                ratio = r["vs_a2a_graph"] if r["form"].endswith("graph") else r["vs_a2a"]
                if ratio is not None:
                    print(f"2^{r['log_ids']} {r['form']}: {ratio:.2f}x its baseline "
                          f"({'within' if ratio <= TARGET else 'OVER'} the {TARGET}x target)")
        write_json(result, f"sharded_embedding_{result['commit']}", a.out_dir)
    dist.barrier()
    if failed:  # on every rank alike (the counts were summed over ranks)
        raise AssertionError(f"wrong answers: {[(r['log_ids'], r['form'], r['check']) for r in failed]}")


def main() -> None:
    no_multicast_env()  # before any NCCL communicator exists, here and in every process started below
    launch_ranks(bench, parse(), timeout_s=300)


if __name__ == "__main__":
    main()
