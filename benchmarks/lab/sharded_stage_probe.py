"""The sharded point lookup's device stages on one GPU, each alone, at one rank's weak-scaling sizes (2^26 keys
held, 2^27 queries sent and answered): where a two-GPU call's time goes apart from NVLink, and what each stage
costs against its memory floor. No NCCL: what the stages do between the exchanges.

    python benchmarks/lab/sharded_stage_probe.py [--log-keys 26] [--log-lookups 27]

Rows: the local CgRXIndex lookup; the same with the local row IDs made global (pack_answers over a monotone
int64 map, as ShardedIndex keeps one); partition_queries for 2 owners (1 and 4 chunks); scatter_answers_into of
16-byte answers back to the callers' order; a one-GPU lookup of twice the keys and queries (the weak-scaling
baseline). Prints a table and writes JSON (sharded_probe_<commit>.json) to --out-dir or
benchmarks/results/<GPU>/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rx_bench, _common
import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402

from rx_bench import git_commit, timed, write_json  # noqa: E402

from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex._keys import KEY_TYPES  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    internal = torch.ops.rtindex_internal
    gen = torch.Generator(device=dev).manual_seed(7)
    nk, nq = 2**args.log_keys, 2**args.log_lookups
    rows = []

    def row(name, ms, nbytes=None, **extra):
        gbs = nbytes / ms / 1e6 if nbytes else None
        rows.append({"stage": name, "ms": ms, "bytes": nbytes, "GB_per_s": gbs, **extra})
        print(f"{name:44s} {ms:8.3f} ms" + (f"  {nbytes / 2**30:6.2f} GiB  {gbs:7.0f} GB/s" if nbytes else ""), flush=True)

    keys = torch.randint(-(2**63), 2**63 - 1, (nk,), generator=gen, device=dev)
    idx = CgRXIndex(keys)
    q = keys[torch.randint(0, nk, (nq,), generator=gen, device=dev)]
    ms, res = timed(lambda: idx.lookup(q), args.repeats, device=dev)
    row("local lookup (CgRXIndex, radix)", ms)
    count = res.count.to(torch.int64)
    # A shard's local-to-global map: ascending, as the build makes it (rank order, each rank's order).
    l2g = torch.sort(torch.randint(0, 2**40, (nk,), generator=gen, device=dev)).values
    ms, _ = timed(lambda: internal.pack_answers(res.first_row, count, l2g), args.repeats, device=dev)
    row("pack_answers with the int64 map", ms, nq * (8 + 8 + 16))
    ms, _ = timed(lambda: internal.pack_answers(res.first_row, count, l2g[:0]), args.repeats, device=dev)
    row("pack_answers, no map", ms, nq * (8 + 8 + 16))
    ms, _ = timed(lambda: l2g[res.first_row], args.repeats, device=dev)
    row("map gather alone (l2g[first_row])", ms)
    l2g32 = l2g.to(torch.int32)
    ms, _ = timed(lambda: internal.global_rows(res.first_row, l2g32, 0), args.repeats, device=dev)
    row("global_rows with an int32 map", ms)

    splitters = torch.sort(keys ^ (-(2**63))).values[nk // 2:nk // 2 + 1]  # the median ordered key: 2 owners
    for chunks in (1, 4):
        ms, part = timed(lambda: internal.partition_queries(q, KEY_TYPES["int64"], splitters, chunks), args.repeats, device=dev)
        row(f"partition_queries, 2 owners, {chunks} chunk(s)", ms, nq * (8 + 8 + 8 + 8))
    _, positions, _ = part
    back = torch.stack([res.first_row, count], dim=1)
    cols = [torch.empty(nq, dtype=torch.int64, device=dev) for _ in range(2)]
    ms, _ = timed(lambda: internal.scatter_answers_into(back, positions, *cols), args.repeats, device=dev)
    row("scatter_answers_into (partition order -> callers')", ms, nq * (16 + 8 + 16))
    perm = torch.randperm(nq, device=dev, generator=gen)
    ms, _ = timed(lambda: internal.scatter_answers_into(back, perm, *cols), args.repeats, device=dev)
    row("scatter_answers_into, random permutation", ms, nq * (16 + 8 + 16))
    inv = torch.empty_like(positions).index_copy_(0, positions, torch.arange(nq, device=dev))
    ms, _ = timed(lambda: back.index_select(0, inv), args.repeats, device=dev)
    row("gather instead (back.index_select(inv))", ms, nq * (16 + 8 + 16))
    ms, _ = timed(lambda: back.clone(), args.repeats, device=dev)
    row("copy of the answers (memory floor)", ms, nq * 32)
    idx = res = back = part = positions = inv = perm = None  # free them before the baseline's build

    keys2 = torch.randint(-(2**63), 2**63 - 1, (2 * nk,), generator=gen, device=dev)
    idx2 = CgRXIndex(keys2)
    q2 = keys2[torch.randint(0, 2 * nk, (2 * nq,), generator=gen, device=dev)]
    ms, _ = timed(lambda: idx2.lookup(q2), args.repeats, device=dev)
    row("one GPU: 2x keys, 2x lookups (baseline)", ms)
    write_json({"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "commit": git_commit(), "log_keys": args.log_keys,
                "log_lookups": args.log_lookups, "rows": rows}, f"sharded_probe_{git_commit()}", args.out_dir)


if __name__ == "__main__":
    main()
