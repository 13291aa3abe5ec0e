"""Whether a given tier's misses are served faster from the chunks when sorted by key: within a chunk's queue the
lookups then walk its host memory in address order (the GPU's in-place reads stay within a few pages of
each other, the CPU's searches follow the prefetcher) instead of jumping over the whole chunk. Issue 12's
Zipf 1.2 target: a probe, not a feature.

On the same index and Zipf batches: the library's batches with its switch (``chunked.SORT_TIER_MISSES``) off and
on, rounds alternating (on: with the sorted misses' window, ``IN_PLACE_WINDOW``, at its value of the time); with
``--windows``, rounds of the sorted misses per window; with ``--runs``, rounds of the sorted misses partitioned
and cut into runs (``SORTED_RUNS``); each batch's misses answered by each way alone over all chunks in one call,
the first time and again (cold and cached); the tier's misses of one batch served by the library with
the tier off, as they come and sorted; one chunk's queue answered in place by the GPU and on the CPU, as it comes
and sorted (the tier off, so no window: a launch per queue; sorted as int64 keys, the chunks' order for the int64
keys the probe builds); the sort's own time. Every answer is checked against the one with the misses as they
come.

    python benchmarks/sorted_misses_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 1.2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import (GcTimer, add_tier_probe_args, run_tasks, stages_ms, switched,  # noqa: E402
                          tier_probe_on_device)

from torch_rtindex import chunked  # noqa: E402
from torch_rtindex.chunked import _Batch, _key_sorted, _Task  # noqa: E402


def tier_missed(index, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as ordered keys, which of them the tier misses)."""
    qlo, _ = index._check_queries(q, None)
    D = qlo.device
    _, _, count = index._answer(index._tier_view(D), _Batch("lookup", qlo, None, None, D, None), qlo, None, D)
    return qlo, count == 0


def ways_alone(index, q: torch.Tensor, dev: torch.device, sync, i: int) -> None:
    """A batch's tier misses, sorted, answered over all chunks by each way alone in one call (the GPU's one
    in-place launch, the CPU's one call over all cores), three times: the first reads host memory the way a batch
    does (these misses are not in any cache), the repeats find them in the caches (the GPU's L2, the CPU's)."""
    qlo, missed = tier_missed(index, q)
    lo, _ = _key_sorted(qlo[missed])
    dev = lo.device  # with its index, as the library's batches have it
    tasks = run_tasks(index, lo)
    with switched(SORTED_RUNS=False):  # the reference: the library's queues partitioned, not cut into runs
        want = index._serve("lookup", lo, None, None, dev, True)
    ways = [("cpu", torch.device("cpu"), index._host_view)]
    if dev.type == "cuda":
        ways.insert(0, ("in place", dev, index._in_place_view))
    for name, S, view_of in ways:
        x = lo.to(S)
        batch = _Batch("lookup", x, None, None, S, None, key_order=True)
        times = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            index._answer_group([view_of(t.chunk) for t in tasks], tasks, batch, S)
            sync()
            times.append(time.perf_counter() - t0)
        got = [torch.cat([t.result[k] for t in tasks]).to(dev) for k in (1, 2)]
        same = all(torch.equal(g, w) for g, w in zip(got, want))
        print(f"batch {i} misses alone ({lo.numel()} in {len(tasks)} chunks), {name:8s} one call: "
              + "  ".join(f"{t * 1e3:6.2f} ms ({lo.numel() / t / 1e6:6.1f} M/s)" for t in times)
              + f"  same {same}", flush=True)
    if dev.type != "cuda":
        return
    # Contention: every third chunk's queue on the CPU, alone and while the GPU reads all queues in place.
    cpu = torch.device("cpu")
    mine = tasks[::3]
    sub = [_Task(t.chunk, t.start, t.size, False, True) for t in mine]
    host_batch = _Batch("lookup", lo.to(cpu), None, None, cpu, None, key_order=True)
    gpu_batch = _Batch("lookup", lo, None, None, dev, None, key_order=True)
    n = sum(t.size for t in sub)
    for beside in (False, True, False, True):
        sync()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if beside:
            a.record()
            index._answer_group([index._in_place_view(t.chunk) for t in tasks], tasks, gpu_batch, dev)
            b.record()
        t0 = time.perf_counter()
        index._answer_group([index._host_view(t.chunk) for t in sub], sub, host_batch, cpu)
        t_cpu = time.perf_counter() - t0
        sync()
        gpu = f", the GPU's launch {a.elapsed_time(b):6.2f} ms" if beside else ""
        print(f"batch {i} cpu on {n} misses of {len(sub)} chunks, {'beside in place' if beside else 'alone':15s}: "
              f"{t_cpu * 1e3:6.2f} ms ({n / t_cpu / 1e6:6.1f} M/s){gpu}", flush=True)


def traced_rounds(index, batches, sync, threads: list[int], rounds: int) -> None:
    """The library's batches with a timeline of the host's side: when the chunks' serving starts, each CPU call
    (its queries' copy to the host, its lookups), the plan, the GPU's launch, the merge; per thread count."""
    events = []

    def wrap(owner, name, label):
        plain = getattr(owner, name)

        def timed(*args, **kw):
            t0 = time.perf_counter()
            out = plain(*args, **kw)
            events.append((label(*args), t0, time.perf_counter()))
            return out
        setattr(owner, name, timed)
        return plain

    saved = [(chunked.ChunkedIndex, "_answer_group", wrap(
                 chunked.ChunkedIndex, "_answer_group", lambda self, v, tasks, b, S: f"{S.type} call "
                 f"{sum(t.size for t in tasks):7d} queries")),
             (chunked._Batch, "joined_queues", wrap(chunked._Batch, "joined_queues",
                                                    lambda self, tasks, S, ix: "  its queries to the host")),
             (chunked.ChunkedIndex, "_merge", wrap(chunked.ChunkedIndex, "_merge", lambda *a: "merge")),
             (chunked._Scheduler, "__init__", wrap(chunked._Scheduler, "__init__", lambda *a: "plan")),
             (chunked.ChunkedIndex, "_serve", wrap(chunked.ChunkedIndex, "_serve", lambda *a: "serve"))]
    default = torch.get_num_threads()
    try:
        for r in range(rounds):
            for n in threads:
                torch.set_num_threads(n)
                for i, b in enumerate(batches):
                    events.clear()
                    sync()
                    t0 = time.perf_counter()
                    index.lookup(b)
                    sync()
                    ms = (time.perf_counter() - t0) * 1e3
                    st = index.stats()["last_batch"]
                    print(f"traced batch {i} round {r}, {n} threads: {ms:7.2f} ms  cpu {st['queries_cpu']:8d}  in place "
                          f"{st['queries_in_place']:8d}  stages {stages_ms(st['time_s'])}", flush=True)
                    for label, a, e in sorted(events, key=lambda x: x[1]):
                        print(f"    {(a - t0) * 1e3:7.2f} -> {(e - t0) * 1e3:7.2f} ms  {label}", flush=True)
    finally:
        torch.set_num_threads(default)
        for owner, name, plain in saved:
            setattr(owner, name, plain)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=2, device=True)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (as they come, sorted) library batches")
    ap.add_argument("--windows", default="", help="IN_PLACE_WINDOW values to try with the misses sorted, comma "
                    "separated ('none': a launch per queue; N: one launch, at most about N lookups in flight)")
    ap.add_argument("--runs", action="store_true", help="rounds of the sorted misses partitioned and cut into "
                    "runs (SORTED_RUNS off and on)")
    ap.add_argument("--trace", default="", help="thread counts, comma separated: rounds of the library's batches "
                    "with the host's timeline, per thread count")
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    timer = GcTimer()
    if a.trace:
        traced_rounds(index, batches, sync, [int(x) for x in a.trace.split(",")], max(a.rounds, 1))
    q = batches[-1]
    with switched(SORT_TIER_MISSES=False):
        want = [index.lookup(b) for b in batches]  # the reference, and a warm-up

    def library_round(label: str, r: int) -> None:
        for i, b in enumerate(batches):
            out, ms = timer.timed(lambda: index.lookup(b), sync)
            st = index.stats()["last_batch"]
            same = all(torch.equal(o, w) for o, w in zip(out, want[i]))
            print(f"library batch {i} (tier on, misses {label}) round {r}: {ms:7.2f} ms  cpu {st['queries_cpu']:8d}"
                  f"  gpu {st['queries_gpu']:8d} (in place {st['queries_in_place']:8d}, fitted "
                  f"{index.rates().in_place / 1e6:.1f} M/s)  stages {stages_ms(st['time_s'])}  same {same}", flush=True)

    for r in range(a.rounds):  # the library's own switch, rounds alternating on the same index and batches
        for on in (False, True):
            with switched(SORT_TIER_MISSES=on):
                library_round("sorted" if on else "as they come", r)
    windows = [None if w == "none" else int(w) for w in a.windows.split(",") if w]
    for r in range(a.rounds if windows else 0):  # the sorted misses' in-place queues in one launch
        for w in windows:
            with switched(IN_PLACE_WINDOW=w):
                library_round(f"sorted, window {w}", r)
    for r in range(a.rounds if a.runs else 0):  # the sorted misses' queues: partitioned, or runs of the batch
        for on in (False, True):
            with switched(SORTED_RUNS=on):
                library_round(f"sorted, {'runs' if on else 'partitioned'}", r)
    for i, b in enumerate(batches):
        ways_alone(index, b, dev, sync, i)
    miss = q[tier_missed(index, q)[1]]
    for _ in range(3):
        srt, ms = timer.timed(lambda: torch.sort(miss).values, sync)
        print(f"sort of the {miss.numel()} misses: {ms:6.3f} ms", flush=True)
    index.hot_tier = False
    want = index.lookup(miss)
    perm = torch.sort(miss).indices
    for r in range(a.rounds):
        for name, x in (("as they come", miss), ("sorted", srt)):
            for _ in range(3):
                out, ms = timer.timed(lambda: index.lookup(x), sync)
                st = index.stats()["last_batch"]
                same = all(torch.equal(o, w.index_select(0, perm) if x is srt else w) for o, w in zip(out, want))
                print(f"misses {name:12s} round {r}: {ms:7.2f} ms  cpu {st['queries_cpu']:8d}  gpu "
                      f"{st['queries_gpu']:8d} (in place {st['queries_in_place']:8d})  stages "
                      f"{stages_ms(st['time_s'])}  same {same}", flush=True)
    # One chunk's queue, the fullest, answered by each way alone.
    mlo, _ = index._check_queries(miss.cpu(), None)
    cid = index._chunk_of(mlo)
    j = int(torch.bincount(cid).argmax())
    chunk = index._chunks[j]
    mine = mlo[cid == j]
    ways = [("cpu", index._host_view(chunk), torch.device("cpu"))]
    if dev.type == "cuda":
        ways.insert(0, ("in place", index._in_place_view(chunk), dev))
    for name, view, S in ways:
        ref = None
        for order, x in (("as they come", mine), ("sorted", mine)) * 2:
            x = (x if order == "as they come" else _key_sorted(x)[0]).to(S)
            bt = _Batch("lookup", x, None, None, S, None)
            times = []
            for _ in range(5):
                sync()
                t0 = time.perf_counter()
                out = index._answer(view, bt, x, None, S)
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
            got = sorted(zip(x.tolist(), out[1].tolist(), out[2].tolist()))
            ref = ref or got
            best = min(times)
            print(f"chunk {j} queue of {x.numel()} misses, {name:8s} {order:12s}: best {best:7.3f} ms "
                  f"({x.numel() / best / 1e3:7.1f} M/s), all {' '.join(f'{t:.3f}' for t in times)}  same "
                  f"{got == ref}", flush=True)


if __name__ == "__main__":
    main()
