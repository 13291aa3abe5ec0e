"""Batch updates of the updatable cgRX against full rebuilds (the cgRX paper's §6.5 experiment, scaled).

Start from 2^(k-1) uniform 64-bit keys, apply 8 insert waves that add another 2^(k-1) keys in total, then 8
delete waves that remove them again. Each wave is timed against rebuilding the index from scratch at the size
it reaches, and lookups after the waves are timed against a freshly built index of the same contents. Every
answer is checked against a sorted array first.

    python benchmarks/update_bench.py --log-keys 26 --log-lookups 27
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rx_bench import git_commit, timed  # noqa: E402  (same folder)

import torch_rtindex  # noqa: E402
from torch_rtindex import UpdatableCgRXIndex  # noqa: E402


def wall_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--waves", type=int, default=8)
    ap.add_argument("--node-size", type=int, default=32)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    n = 1 << args.log_keys
    base = torch.randint(-(2**63), 2**63 - 1, (n // 2,), generator=gen, device=dev)
    extra = torch.randint(-(2**63), 2**63 - 1, (n // 2,), generator=gen, device=dev)
    waves = extra.chunk(args.waves)
    index = UpdatableCgRXIndex(base, node_size=args.node_size)
    rows = []
    current = base
    for i, w in enumerate(waves):
        ms, res = wall_ms(lambda: index.insert(w))
        current = torch.cat([current, w])
        rebuild_ms, _ = wall_ms(lambda: UpdatableCgRXIndex(current, node_size=args.node_size))
        rows.append((f"insert wave {i + 1}", w.numel(), ms, rebuild_ms))
    q = current[torch.randint(0, current.numel(), (1 << args.log_lookups,), generator=gen, device=dev)]
    after_ms, after = timed(lambda: index.lookup(q))
    fresh = UpdatableCgRXIndex(current, node_size=args.node_size)
    fresh_ms, fresh_res = timed(lambda: fresh.lookup(q))
    assert torch.equal(after.count, fresh_res.count) and bool((after.count == 1).all()), "lookups after inserts wrong"
    del fresh
    for i, w in enumerate(waves):
        ms, res = wall_ms(lambda: index.delete(w))
        assert res.deleted == w.numel() and res.absent == 0
        remaining = torch.cat([base, *waves[i + 1 :]])
        rebuild_ms, _ = wall_ms(lambda: UpdatableCgRXIndex(remaining, node_size=args.node_size))
        rows.append((f"delete wave {i + 1}", w.numel(), ms, rebuild_ms))
    gone = index.lookup(extra[: 1 << 20])
    assert int(gone.count.sum()) == 0, "deleted keys still found"
    still = index.lookup(base[: 1 << 20])
    assert bool((still.count == 1).all()), "kept keys lost"
    mem = index.memory()
    info = torch_rtindex.optix_info()
    print(f"\n{torch.cuda.get_device_name()}  commit {git_commit()}  RT cores: {info['has_rt_cores']}  "
          f"start 2^{args.log_keys - 1} keys, {args.waves} waves of {waves[0].numel()} keys, node size {args.node_size}")
    print(f"{'wave':18s} {'keys':>9s} {'update ms':>10s} {'rebuild ms':>11s} {'speed-up':>9s}")
    for name, k, ms, rb in rows:
        print(f"{name:18s} {k:9d} {ms:10.2f} {rb:11.2f} {rb / ms:8.1f}x")
    print(f"lookups (2^{args.log_lookups}) after the insert waves {after_ms:.2f} ms vs freshly built {fresh_ms:.2f} ms "
          f"({after_ms / fresh_ms:.2f}x); memory after all waves {mem}")
    out = Path(__file__).parent / "results" / torch.cuda.get_device_name().replace(" ", "_")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"updates_k{args.log_keys}_{git_commit()}.json"
    path.write_text(json.dumps({"rows": rows, "lookup_after_ms": after_ms, "lookup_fresh_ms": fresh_ms, "memory": mem,
                                "params": vars(args), "device": torch.cuda.get_device_name(), "commit": git_commit()},
                               indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
