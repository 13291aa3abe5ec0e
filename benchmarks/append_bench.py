"""The append workload: new, ever larger IDs every day. Start from 2^k uniform keys below 2^62, then insert
`--days` batches of increasing keys above every earlier one (they all land in the last bucket), and time point
lookups over everything afterwards: with the rebuild policy on (the default `max_node_reads`), off, and on a
fresh index of the same contents. Every answer is checked against the sorted array first.

    python benchmarks/append_bench.py --log-keys 24 --log-lookups 24 --days 100 --log-batch 14
    python benchmarks/append_bench.py --device cpu --log-keys 14 --log-lookups 14 --days 20 --log-batch 8
"""

from __future__ import annotations

import argparse
import sys

import torch

import _common  # noqa: F401,E402  (this checkout first on sys.path)
from rx_bench import git_commit, sa_lookup, sorted_array, timed, write_json  # noqa: E402

from torch_rtindex import UpdatableCgRXIndex  # noqa: E402


def run_append(log_keys: int, log_lookups: int, days: int, log_batch: int, device="cuda", seed: int = 3) -> dict:
    """The experiment: {"policy_on" | "policy_off" | "fresh": lookup ms, update ms, chain stats}. Raises
    AssertionError on a wrong answer (benchmarks/suite.py runs it next to the update waves)."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    base = torch.randint(0, 2**62, (1 << log_keys,), device=dev, generator=gen)
    batch = 1 << log_batch
    day_keys = [2**62 + d * batch + torch.arange(batch, device=dev) for d in range(days)]
    everything = torch.cat([base, *day_keys])
    q = everything[torch.randint(0, everything.numel(), (1 << log_lookups,), device=dev, generator=gen)]
    want = sa_lookup(sorted_array(everything), q)
    rows = {}
    for name, policy in (("policy_on", "default"), ("policy_off", None)):
        kw = {} if policy == "default" else {"max_node_reads": None}
        index = UpdatableCgRXIndex(base, **kw)
        update_ms = 0.0
        for d in day_keys:
            ms, _ = timed(lambda d=d: index.insert(d), repeats=1, warmup=0, device=dev)
            update_ms += ms
        got = index.lookup(q)
        assert torch.equal(got.first_row, want[0]) and torch.equal(got.count, want[1]), name
        ms, _ = timed(lambda: index.lookup(q), device=dev)
        rows[name] = {"lookup_ms": ms, "updates_ms": update_ms, **index.stats()}
        index = None  # the closures above hold the name: released, not deleted
    fresh = UpdatableCgRXIndex(everything)
    ms, got = timed(lambda: fresh.lookup(q), device=dev)
    assert torch.equal(got.first_row, want[0]), "fresh"
    rows["fresh"] = {"lookup_ms": ms, **fresh.stats()}
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--log-keys", type=int, default=24)
    ap.add_argument("--log-lookups", type=int, default=24)
    ap.add_argument("--days", type=int, default=100)
    ap.add_argument("--log-batch", type=int, default=14)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    rows = run_append(args.log_keys, args.log_lookups, args.days, args.log_batch, dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{name}, commit {git_commit()}: 2^{args.log_keys} keys + {args.days} days x 2^{args.log_batch} "
          f"increasing keys, 2^{args.log_lookups} point lookups over all")
    for k, r in rows.items():
        ratio = r["lookup_ms"] / rows["fresh"]["lookup_ms"]
        print(f"{k:>10}: lookups {r['lookup_ms']:8.2f} ms ({ratio:5.2f}x fresh), mean node reads "
              f"{r['mean_node_reads']:6.2f}, longest chain {r['longest_chain']:6d}, auto rebuilds {r['auto_rebuilds']}, "
              f"updates {r.get('updates_ms', 0):8.1f} ms in all")
    write_json({"device": name, "commit": git_commit(), "argv": sys.argv[1:], "runs": rows},
               f"append_{git_commit()}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
