"""Batch updates of the updatable cgRX against full rebuilds (the cgRX paper's §6.5 experiment, scaled).

Start from 2^(k-1) uniform 64-bit keys, apply 8 insert waves that add another 2^(k-1) keys in total, then 8
delete waves that remove them again. Each wave is timed against rebuilding the index from scratch at the size
it reaches, and lookups after the waves are timed against a freshly built index of the same contents. Every
answer is checked against a sorted array first (``run_waves``, which benchmarks/suite.py runs too).

    python benchmarks/update_bench.py --log-keys 26 --log-lookups 27
"""

from __future__ import annotations

import argparse

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
from rx_bench import git_commit, sa_lookup, sorted_array, timed, write_json  # noqa: E402  (same folder)

import torch_rtindex  # noqa: E402
from torch_rtindex import UpdatableCgRXIndex  # noqa: E402


def wall_ms(fn, device="cuda"):
    """One run from an idle device: (milliseconds, result)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return timed(fn, repeats=1, warmup=0, device=device)


def check_against_sorted_array(got, keys: torch.Tensor, queries: torch.Tensor, what: str) -> None:
    """Asserts that a Lookup equals the sorted array's answer when key i has row ID i."""
    first, count = sa_lookup(sorted_array(keys), queries)
    assert torch.equal(got.count, count) and torch.equal(got.first_row, first), f"{what}: lookups disagree with the sorted array"


def run_waves(log_keys: int, log_lookups: int, waves: int, node_size: int, device="cuda", seed: int = 7) -> dict:
    """The experiment: returns the waves' rows (name, keys, update ms, rebuild ms), the lookup times after the
    insert waves and on a fresh index, and the memory after all waves. Raises AssertionError on a wrong answer."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    n = 1 << log_keys
    base = torch.randint(-(2**63), 2**63 - 1, (n // 2,), generator=gen, device=dev)
    extra = torch.randint(-(2**63), 2**63 - 1, (n // 2,), generator=gen, device=dev)
    chunks = extra.chunk(waves)
    # CUDA loads a module's kernels at their first launch, and the caching allocator starts empty: a process's
    # first update pays both once. Warm them up on a small index first, as every lookup timing here warms up,
    # and report that cold first wave apart.
    small = UpdatableCgRXIndex(base[: 1 << 16].clone(), node_size=node_size)
    cold_insert_ms, _ = wall_ms(lambda: small.insert(extra[: 1 << 12]), dev)
    cold_delete_ms, _ = wall_ms(lambda: small.delete(extra[: 1 << 12]), dev)
    small = None  # the closures above hold the name: released, not deleted
    index = UpdatableCgRXIndex(base, node_size=node_size)
    rows = []
    current = base
    for i, w in enumerate(chunks):
        ms = wall_ms(lambda: index.insert(w), dev)[0]
        current = torch.cat([current, w])
        rebuild_ms = wall_ms(lambda: UpdatableCgRXIndex(current, node_size=node_size), dev)[0]  # freed at once
        rows.append((f"insert wave {i + 1}", w.numel(), ms, rebuild_ms))
    q = current[torch.randint(0, current.numel(), (1 << log_lookups,), generator=gen, device=dev)]
    after_ms, after = timed(lambda: index.lookup(q), device=dev)
    check_against_sorted_array(after, current, q, "after the insert waves")  # inserts take the next row IDs
    fresh = UpdatableCgRXIndex(current, node_size=node_size)
    fresh_ms, fresh_res = timed(lambda: fresh.lookup(q), device=dev)
    assert torch.equal(after.count, fresh_res.count) and bool((after.count == 1).all()), "lookups after inserts wrong"
    fresh = None  # the closures above hold the name: released, not deleted
    for i, w in enumerate(chunks):
        ms, res = wall_ms(lambda: index.delete(w), dev)
        assert res.deleted == w.numel() and res.absent == 0
        remaining = torch.cat([base, *chunks[i + 1 :]])
        rebuild_ms = wall_ms(lambda: UpdatableCgRXIndex(remaining, node_size=node_size), dev)[0]
        rows.append((f"delete wave {i + 1}", w.numel(), ms, rebuild_ms))
    gone = index.lookup(extra[: 1 << 20])
    assert int(gone.count.sum()) == 0, "deleted keys still found"
    still = index.lookup(base[: 1 << 20])
    assert bool((still.count == 1).all()), "kept keys lost"
    check_against_sorted_array(index.lookup(q), base, q, "after the delete waves")
    return {"rows": rows, "lookup_after_ms": after_ms, "lookup_fresh_ms": fresh_ms, "memory": index.memory(),
            "wave_keys": chunks[0].numel(), "cold_small_insert_ms": cold_insert_ms, "cold_small_delete_ms": cold_delete_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--waves", type=int, default=8)
    ap.add_argument("--node-size", type=int, default=32)
    args = ap.parse_args()
    res = run_waves(args.log_keys, args.log_lookups, args.waves, args.node_size)
    rows, after_ms, fresh_ms, mem = res["rows"], res["lookup_after_ms"], res["lookup_fresh_ms"], res["memory"]
    info = torch_rtindex.optix_info()
    print(f"\n{torch.cuda.get_device_name()}  commit {git_commit()}  RT cores: {info['has_rt_cores']}  "
          f"start 2^{args.log_keys - 1} keys, {args.waves} waves of {res['wave_keys']} keys, node size {args.node_size}")
    print(f"warm-up (process's first update, 2^12 keys into 2^16): insert {res['cold_small_insert_ms']:.2f} ms, "
          f"delete {res['cold_small_delete_ms']:.2f} ms")
    print(f"{'wave':18s} {'keys':>9s} {'update ms':>10s} {'rebuild ms':>11s} {'speed-up':>9s}")
    for name, k, ms, rb in rows:
        print(f"{name:18s} {k:9d} {ms:10.2f} {rb:11.2f} {rb / ms:8.1f}x")
    print(f"lookups (2^{args.log_lookups}) after the insert waves {after_ms:.2f} ms vs freshly built {fresh_ms:.2f} ms "
          f"({after_ms / fresh_ms:.2f}x); memory after all waves {mem}")
    write_json({"rows": rows, "lookup_after_ms": after_ms, "lookup_fresh_ms": fresh_ms, "memory": mem,
                "cold_small_insert_ms": res["cold_small_insert_ms"], "cold_small_delete_ms": res["cold_small_delete_ms"],
                "params": vars(args), "device": torch.cuda.get_device_name(), "commit": git_commit()},
               f"updates_k{args.log_keys}_{git_commit()}")


if __name__ == "__main__":
    main()
