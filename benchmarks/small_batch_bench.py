"""Per-call cost at embedding-batch sizes: one lookup call over 2^4 .. 2^24 queries, eager, under torch.compile
and replayed from a CUDA graph, for RX, cgRX (each backend), IdToRow, the sorted array and the hash table, side by
side. Answers are checked against the sorted array first. Writes
benchmarks/results/<device>/small_batch_<commit>.json: one entry per method and batch size,
{"method", "log_queries", "eager_us", "compiled_us", "graph_us"} (null where a form does not apply).

    python benchmarks/small_batch_bench.py --log-keys 24 --log-queries 4 10 14 17 20 24
    python benchmarks/small_batch_bench.py --device cpu --log-keys 16 --log-queries 4 10      # CPU per-call cost
    python benchmarks/small_batch_bench.py --breakdown --log-queries 4 14   # where one eager call's time goes
    python benchmarks/small_batch_bench.py --embedding --log-keys 20 --log-queries 10 14   # the example's step
    python benchmarks/small_batch_bench.py --methods cgRX-radix,IdToRow,one_kernel --log-queries 10 14

``one_kernel`` (``q + 1``) is the floor of the framework itself: a compiled call of it costs what torch.compile adds
to any call, so a compiled lookup cannot cost less.

``--embedding`` times examples/embedding_bag.py's training step (forward, loss, backward; bags of 8 IDs, 2^q
IDs per step) eager and compiled, with IdToRow inside and with the rows precomputed, so the index's share of a
compiled step can be read against its share of an eager one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
import torch_rtindex  # noqa: E402
from rx_bench import git_commit, write_json  # noqa: E402


def timed_loop_us(fn, dev: torch.device, iters: int) -> float:
    """Mean microseconds per call of `iters` back-to-back calls, timed on the host around the whole loop with a
    synchronize at each end (an eager user's view: launch and Python costs included)."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def per_call_us(fn, dev: torch.device, iters: int) -> float:
    """The median of three timed loops after warm-up."""
    for _ in range(3):
        fn()
    return statistics.median(timed_loop_us(fn, dev, iters) for _ in range(3))


def interleaved_eager_us(fns: dict, dev: torch.device, iters: int, rounds: int) -> dict:
    """Per method the median over `rounds` rounds, each timing one loop of every method in turn: the host's time
    per call drifts by tens of percent over seconds, and interleaving makes every method see the same drift."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed_loop_us(fn, dev, iters))
    return {name: statistics.median(t) for name, t in times.items()}


def graph_us(fn, iters: int) -> float | None:
    """Mean microseconds per replay of a CUDA graph that captured one call (None where capture is refused)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except RuntimeError:
        return None
    return per_call_us(g.replay, torch.device("cuda"), iters)


def compiled_us(fn, arg, dev: torch.device, iters: int, mode: str, *rest) -> float | None:
    """per_call_us of torch.compile(fn, mode=mode); None (and why, printed) where it does not compile."""
    torch._dynamo.reset()
    cfn = torch.compile(fn, dynamic=False, mode=mode)
    try:
        return per_call_us(lambda: cfn(arg, *rest), dev, iters)
    except Exception as e:  # noqa: BLE001  (a method that does not compile gets null, and why)
        print(f"  torch.compile(mode={mode!r}) failed: {type(e).__name__}: {str(e)[:160]}")
        return None


def breakdown(dev: torch.device, keys: torch.Tensor, log_queries: list[int]) -> None:
    """Prints the per-call cost of the pieces an eager lookup is made of (host view, as per_call_us), then the
    Python functions an eager and a compiled lookup spend their time in (cProfile)."""
    import cProfile
    import pstats

    cuda = dev.type == "cuda"
    ix = torch_rtindex.CgRXIndex(keys)
    sorted_keys = torch.sort(keys)[0]
    for lq in log_queries:
        q = keys[: 1 << lq].clone()
        scratch = torch.empty(1 << lq, dtype=torch.int64, device=dev)
        parts = {
            "python call of nothing": lambda: None,
            "torch.empty (one result)": lambda: torch.empty(q.numel(), dtype=torch.int64, device=dev),
            "one tiny kernel (zero_)": lambda: scratch.zero_(),
            "torch.searchsorted (one side)": lambda: torch.searchsorted(sorted_keys, q),
            "torch.searchsorted (left + right)": lambda: (torch.searchsorted(sorted_keys, q),
                                                          torch.searchsorted(sorted_keys, q, right=True)),
            "torch.ops overload of searchsorted": lambda: torch.ops.aten.searchsorted.Tensor(sorted_keys, q),
            "CgRXIndex.lookup": lambda: ix.lookup(q),
            "CgRXIndex.lookup_rows": lambda: ix.lookup_rows(q),
        }
        if cuda:
            stream = torch.cuda.current_stream(dev)
            parts["torch.cuda.current_stream(dev)"] = lambda: torch.cuda.current_stream(dev)
            parts["Tensor.record_stream"] = lambda: q.record_stream(stream)
        parts["torch.compiler.is_compiling()"] = torch.compiler.is_compiling
        for name, fn in parts.items():
            print(f"2^{lq:<3} {name:>36} {per_call_us(fn, dev, 5000):8.2f} us", flush=True)
        if cuda:  # the device's side: how long the lookup's kernels run, next to the host's time per call
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(200):
                    ix.lookup(q)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=6), flush=True)
            # The host's side: what one call spends in the operator, its allocations and the launch.
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10), flush=True)
    q = keys[:1 << log_queries[0]].clone()
    compiled = torch.compile(lambda x: ix.lookup(x), dynamic=False)
    for title, fn in (("eager", lambda: ix.lookup(q)), ("compiled", lambda: compiled(q))):
        for _ in range(20):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        if cuda:
            torch.cuda.synchronize()
        prof.disable()
        print(f"--- cProfile, 2000 {title} lookups of 2^{log_queries[0]} queries (tottime, top 14)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def embedding_steps(dev: torch.device, log_keys: int, log_queries: list[int], iters: int) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from embedding_bag import ClickModel

    gen = torch.Generator().manual_seed(7)
    table_ids = torch.randint(-(2**63), 2**63 - 1, (1 << log_keys,), generator=gen)
    model = ClickModel(table_ids, 16).to(dev)
    rows_of = model.id_to_row

    def step_ids(raw, labels):  # the example's step: IDs -> rows inside
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(raw), labels)
        loss.backward()
        return loss

    def step_rows(rows, labels):  # the same step on rows found beforehand
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model.head(model.bag(rows)).squeeze(-1), labels)
        loss.backward()
        return loss

    out = []
    for lq in log_queries:
        bags = max(1, (1 << lq) // 8)
        raw = table_ids[torch.randint(0, table_ids.numel(), (bags, 8), generator=gen)].to(dev)
        labels = torch.rand(bags, generator=gen).to(dev)
        rows = rows_of(raw)
        entry = {"log_queries": lq}
        forms = ["eager", "compiled"] + (["compiled_reduce_overhead"] if dev.type == "cuda" else [])
        for name, fn, arg in (("with_index", step_ids, raw), ("rows_given", step_rows, rows)):
            entry[f"{name}_eager_us"] = per_call_us(lambda: fn(arg, labels), dev, iters)
            entry[f"{name}_compiled_us"] = compiled_us(fn, arg, dev, iters, "default", labels)
            if "compiled_reduce_overhead" in forms:
                entry[f"{name}_compiled_reduce_overhead_us"] = compiled_us(fn, arg, dev, iters, "reduce-overhead", labels)
        for form in forms:
            a, b = entry[f"with_index_{form}_us"], entry[f"rows_given_{form}_us"]
            entry[f"index_share_{form}_us"] = None if a is None or b is None else a - b
        print(f"2^{lq:<3} embedding step: " + ", ".join(f"{k} {v}" if v is None else f"{k} {v:.1f}"
                                                       for k, v in entry.items() if k != "log_queries"),
              flush=True)
        out.append(entry)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--log-keys", type=int, default=24)
    ap.add_argument("--log-queries", type=int, nargs="+", default=[4, 10, 14, 17, 20, 24])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--breakdown", action="store_true", help="print where one eager call's time goes, then stop")
    ap.add_argument("--embedding", action="store_true", help="time the embedding example's step, then stop")
    ap.add_argument("--methods", default=None,
                    help="comma-separated subset of the methods to time (e.g. cgRX-radix,IdToRow,one_kernel)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the eager column (median)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    gen = torch.Generator(device=dev).manual_seed(5)
    n = 1 << args.log_keys
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), device=dev, generator=gen)
    if args.breakdown:
        breakdown(dev, keys, args.log_queries)
        return 0
    if args.embedding:
        steps = embedding_steps(dev, args.log_keys, args.log_queries, 200)
        name = torch.cuda.get_device_name(dev) if cuda else "cpu"
        write_json({"device": name, "torch": torch.__version__, "commit": git_commit(), "log_keys": args.log_keys,
                    "argv": sys.argv[1:], "embedding_steps": steps}, f"embedding_step_{git_commit()}", args.out)
        return 0
    sorted_keys, order = torch.sort(keys)

    def sa_lookup(q):
        a = torch.searchsorted(sorted_keys, q)
        z = torch.searchsorted(sorted_keys, q, right=True)
        return torch.where(z > a, order[a.clamp(max=n - 1)], -1), z - a

    methods = {"SA": sa_lookup}
    backends = ["radix", "binary_search"] + (["optix"] if cuda else [])
    for b in backends:
        ix = torch_rtindex.CgRXIndex(keys, backend=b)
        methods[f"cgRX-{b}"] = lambda q, ix=ix: ix.lookup(q)
    if cuda:
        rx = torch_rtindex.RXIndex(keys)
        methods["RX"] = lambda q: rx.lookup(q)
        from baselines.hash_table import HashTable

        ht = HashTable(keys)
        methods["hash_table"] = lambda q: ht.lookup(q)
    id_to_row = torch_rtindex.IdToRow(keys, miss="minus_one")
    methods["IdToRow"] = id_to_row
    # The framework's floor: one elementwise kernel over the batch. What torch.compile adds to it (guards, the
    # compiled graph's call, cudagraph-tree bookkeeping) is the least any compiled call pays.
    methods["one_kernel"] = lambda q: (q + 1,)
    if args.methods:
        wanted = args.methods.split(",")
        unknown = sorted(set(wanted) - set(methods))
        if unknown:
            raise SystemExit(f"unknown methods {unknown}; choose from {sorted(methods)}")
        methods = {k: v for k, v in methods.items() if k in wanted}

    entries = []
    for lq in args.log_queries:
        m = 1 << lq
        q = keys[torch.randint(0, n, (m,), device=dev, generator=gen)]
        want_first, want_count = sa_lookup(q)
        iters = max(5, min(2000, (1 << 24) // m))  # a loop of at least a few ms, also at 2^17
        for name, fn in methods.items():
            out = fn(q)
            first = out if name == "IdToRow" else out[0]
            if name not in ("hash_table", "one_kernel") and not torch.equal(first, want_first):
                raise SystemExit(f"{name} disagrees with the sorted array at 2^{lq} queries")
        eagers = interleaved_eager_us({name: (lambda fn=fn: fn(q)) for name, fn in methods.items()}, dev, iters,
                                      args.rounds)
        for name, fn in methods.items():
            eager = eagers[name]
            compiled = None
            if not args.no_compile and name != "hash_table":
                compiled = compiled_us(fn, q, dev, iters, "default")
            graph = graph_us(lambda: fn(q), iters) if cuda else None
            # mode="reduce-overhead": torch.compile's own CUDA graphs, where the lookup is capturable
            reduced = compiled_us(fn, q, dev, iters, "reduce-overhead") if cuda and not args.no_compile and graph else None
            entries.append({"method": name, "log_queries": lq, "eager_us": eager, "compiled_us": compiled,
                            "graph_us": graph, "compiled_reduce_overhead_us": reduced})
            fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            print(f"2^{lq:<3} {name:>18} eager {fmt(eager):>9} us  compiled {fmt(compiled):>9} us  graph {fmt(graph):>9} us"
                  f"  reduce-overhead {fmt(reduced):>9} us", flush=True)
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    result = {"device": name, "torch": torch.__version__, "commit": git_commit(), "log_keys": args.log_keys,
              "argv": sys.argv[1:], "entries": entries}
    write_json(result, f"small_batch_{git_commit()}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
