"""Whether the tier pass and the misses can overlap without slicing the batch (issue 12's Zipf 1.2 target): the
whole batch partitioned by chunk first, then the tier's lookups queued segment by segment (one chunk's queries each)
on a side stream, and each chunk's misses read in place by the GPU as soon as its segment's tier pass is done, while
the side stream goes on with the next segments. A chunk's misses form its one queue, as in the library's batch, so
the overlap adds no queue; it costs a partition of every query (not only the misses) and a scatter of every answer
back to the caller's order. GPU only (the CPU serves none of the misses here). Variants per batch, interleaved:
the library's batch; "serial" (every segment's tier pass, then the misses), with its stages timed apart; and
"pipelined". Built on the index's internals: a probe of the design, not a feature.

    python benchmarks/chunk_pipeline_probe.py [--log-keys 30] [--log-lookups 27] [--zipf 1.2]
    python benchmarks/chunk_pipeline_probe.py --device cpu --log-keys 16 --log-lookups 14 --hot-keys 4096 --chunk-mib 0.0625
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, tier_probe_on_device  # noqa: E402

from torch_rtindex import ChunkedIndex  # noqa: E402
from torch_rtindex._keys import KEY_TYPES  # noqa: E402
from torch_rtindex.chunked import TOP, _Batch, partition_points  # noqa: E402


def chunk_pipeline(index: ChunkedIndex, q: torch.Tensor, overlap: bool, stages: dict | None = None):
    """(first row, count) of point lookups ``q``: partition by chunk, the tier pass per segment on a side stream,
    each chunk's misses read in place (or from the cache) on the current stream; ``overlap`` False waits for the
    whole tier pass first. ``stages``: seconds per stage, the device synchronized between them (serial only)."""
    qlo, _ = index._check_queries(q, None)
    D, n = qlo.device, qlo.numel()
    cuda = D.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = [time.perf_counter()]

    def stage(name):
        if stages is not None:
            sync()
            now = time.perf_counter()
            stages[name] = stages.get(name, 0.0) + now - clock[0]
            clock[0] = now

    grouped = partition_points(qlo, KEY_TYPES["uint64"], index._bounds(D) ^ TOP)
    if grouped is None:
        raise SystemExit("this index has more chunks than the one-pass partition takes")
    s_lo, order, counts = grouped
    counts = counts[0].tolist()
    stage("partition")
    tier = index._tier_view(D)
    cur = torch.cuda.current_stream(D) if cuda else None
    side = torch.cuda.Stream(D) if cuda else None
    first_s = torch.empty(n, dtype=torch.int64, device=D)
    count_s = torch.empty(n, dtype=torch.int64, device=D)
    misses = torch.empty(len(counts), dtype=torch.int64, pin_memory=cuda)
    segs, start = [], 0
    if cuda:
        side.wait_stream(cur)
    with torch.cuda.stream(side) if cuda else nullcontext():
        for c, size in enumerate(counts):
            if size:
                seg = s_lo[start : start + size]
                _, f, k = index._answer(tier, _Batch("lookup", seg, None, None, D, None), seg, None, D)
                first_s[start : start + size] = f
                count_s[start : start + size] = k
                misses[c : c + 1].copy_((k == 0).sum().reshape(1), non_blocking=True)
                ev = None
                if cuda:
                    ev = torch.cuda.Event()
                    ev.record(side)
                segs.append((c, start, size, ev))
            start += size
    if not overlap and cuda:
        side.synchronize()
    stage("tier")
    chunks, cache = index._chunks, index._cache
    for c, start, size, ev in segs:
        if cuda:
            ev.synchronize()  # this segment's miss count is on the host; the side stream goes on
            cur.wait_event(ev)
        m = int(misses[c])
        if not m:
            continue
        seg_k = count_s[start : start + size]
        idx = torch.nonzero_static(seg_k == 0, size=m).reshape(-1)
        queries = s_lo[start : start + size].index_select(0, idx)
        entry = None if cache is None else cache.entries.get(chunks[c])
        if entry is not None and cuda and entry.ready is not None:
            cur.wait_event(entry.ready)
        view = entry.view if entry is not None else index._in_place_view(chunks[c])
        _, rf, rk = index._answer(view, _Batch("lookup", queries, None, None, D, None), queries, None, D)
        first_s[start : start + size].index_copy_(0, idx, rf)
        seg_k.index_copy_(0, idx, rk)
    if cuda:
        cur.wait_stream(side)
    stage("misses")
    first = torch.empty_like(first_s).index_copy_(0, order, first_s)
    count = torch.empty_like(count_s).index_copy_(0, order, count_s)
    stage("scatter")
    return first, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3, device=True)
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    gc_timer = GcTimer()
    for i, q in enumerate(batches):
        ref = index.lookup(q)
        for variant in ("library", "serial", "pipelined", "serial timed"):
            stages = {} if variant == "serial timed" else None
            if variant == "library":
                got, ms = gc_timer.timed(lambda: index.lookup(q), sync)
                first, count = got.first_row, got.count
            else:
                (first, count), ms = gc_timer.timed(
                    lambda: chunk_pipeline(index, q, overlap=variant == "pipelined", stages=stages), sync)
            same = bool(torch.equal(first, ref.first_row) and torch.equal(count, ref.count))
            extra = "" if stages is None else "  " + "  ".join(f"{k} {v * 1e3:.2f}" for k, v in stages.items())
            if variant == "library":
                extra = f"  tier pass {index.stats()['last_batch']['time_s']['hot'] * 1e3:.2f}"
            print(f"batch {i} {variant:>12}: {ms:8.2f} ms  same {same}{extra}  gc {gc_timer.take()}", flush=True)


if __name__ == "__main__":
    main()
