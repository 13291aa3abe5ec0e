"""Whether overlapping a batch's tier pass with the serving of its misses pays (issue 12's Zipf 1.2 target): the
batch in slices, every slice's tier lookups queued at once on a side stream, each slice's misses served through the
chunks (CPU and GPU, the library's planner) while the side stream goes on with the next slices. The library's own
batch (tier pass, then all misses) alongside; the same fresh batches for every variant, answers compared. Built on
the index's internals: a probe of the design, not a feature.

    python benchmarks/tier_overlap_probe.py [--log-keys 30] [--log-lookups 27] [--slices 1,2,4,8] [--priority 0,1]
    python benchmarks/tier_overlap_probe.py --device cpu --log-keys 16 --log-lookups 14 --hot-keys 4096 --chunk-mib 0.0625
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from chunked_bench import GcTimer, add_tier_probe_args, tier_passes, tier_probe_on_device  # noqa: E402

from torch_rtindex import ChunkedIndex  # noqa: E402
from torch_rtindex.chunked import _key_sorted  # noqa: E402


def sliced_lookup(index: ChunkedIndex, q: torch.Tensor, k: int, priority: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(first row, count, seconds until the first slice's misses are known: every slice's tier pass queued, the
    first one done) with the batch in k slices. Each slice's misses go to the chunks sorted by key, as the
    library's do. ``priority``: the tier passes on a low-priority stream and the rest on a high-priority one, so
    that a slice's selection and misses take SMs as the next pass's blocks retire instead of after that pass."""
    qlo, _ = index._check_queries(q, None)
    D = qlo.device
    cuda = D.type == "cuda"
    if cuda and priority:
        low, high = torch.cuda.Stream.priority_range()
        caller, cur = torch.cuda.current_stream(D), torch.cuda.Stream(D, priority=high)
        cur.wait_stream(caller)
        with torch.cuda.stream(cur):
            out = _sliced(index, qlo, k, cur, torch.cuda.Stream(D, priority=low))
        caller.wait_stream(cur)
        return out
    return _sliced(index, qlo, k, torch.cuda.current_stream(D) if cuda else None,
                   torch.cuda.Stream(D) if cuda else None)


def _sliced(index: ChunkedIndex, qlo: torch.Tensor, k: int, cur, side) -> tuple[torch.Tensor, torch.Tensor, float]:
    D, n = qlo.device, qlo.numel()
    cuda = D.type == "cuda"
    t0 = time.perf_counter()
    parts = tier_passes(index, qlo, k, side)
    first = torch.empty(n, dtype=torch.int64, device=D)
    count = torch.empty(n, dtype=torch.int64, device=D)
    tier_first_s = None
    for a, b, f, c, ev in parts:
        if cuda:
            cur.wait_event(ev)
            f.record_stream(cur)
            c.record_stream(cur)
        miss = torch.nonzero(c == 0).reshape(-1)  # waits for this slice's pass and the current stream's work
        if tier_first_s is None:
            tier_first_s = time.perf_counter() - t0
        if miss.numel():
            lo, order = _key_sorted(qlo[a:b].index_select(0, miss))
            miss = miss.index_select(0, order)
            rf, rc = index._serve("lookup", lo, None, None, D, True)
            f.index_copy_(0, miss, rf)
            c.index_copy_(0, miss, rc)
        first[a:b] = f
        count[a:b] = c
    return first, count, tier_first_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_tier_probe_args(ap, zipf=1.2, batches=3, device=True)
    ap.add_argument("--slices", default="1,2,4,8", help="slice counts, comma separated (1: one tier pass, then serve)")
    ap.add_argument("--priority", default="0,1", help="stream priorities to try, comma separated (0: the tier "
                    "passes on a side stream of the default priority; 1: on a low-priority one, the misses high)")
    a = ap.parse_args()
    index, batches, dev, sync = tier_probe_on_device(a)
    gc_timer = GcTimer()
    # Variants interleaved batch by batch: each serve refits the planner's rates and the chunks' heat, so a
    # variant run after another would inherit its state.
    for i, q in enumerate(batches):
        ref = index.lookup(q)
        variants = [("library", 0)] + [(int(k), int(p)) for p in a.priority.split(",") for k in a.slices.split(",")]
        for variant, prio in variants:
            if variant == "library":
                got, ms = gc_timer.timed(lambda: index.lookup(q), sync)
                first, count = got.first_row, got.count
                tier = f"  tier pass {index.stats()['last_batch']['time_s']['hot'] * 1e3:6.2f} ms"
            else:
                (first, count, tier_s), ms = gc_timer.timed(lambda: sliced_lookup(index, q, variant, bool(prio)), sync)
                tier = f"  first slice's misses known after {tier_s * 1e3:6.2f} ms"
            same = bool(torch.equal(first, ref.first_row) and torch.equal(count, ref.count))
            label = f"{variant}" + (" prio" if prio else "")
            print(f"batch {i} {label:>8}: {ms:8.2f} ms  same {same}{tier}  gc {gc_timer.take()}", flush=True)


if __name__ == "__main__":
    main()
