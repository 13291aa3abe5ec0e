"""The floor of an embedding-sized sharded point call (issue 44: within 1.5x of two plain all-to-alls): each device
stage that ``ShardedIndex.lookup_fixed(check=False)`` cannot skip, timed alone at the call's own sizes, next to the
two all-to-alls of the same bytes and the whole call, eager and replayed from a CUDA graph.

Stages, per size (2^10 / 2^14 / 2^17 IDs per rank; query_capacity as sharded_embedding_bench.py sets it):
  a2a_ids, a2a_answers   all_to_all_single of the fixed blocks the call sends ([W, header + capacity] int64 out,
                         twice that back), alone
  partition              partition_padded: the IDs into per-owner blocks behind their header
  local                  the shard's lookup of a received block, made global (points.local_per_query)
  gather                 gather_answers: the returned answers back to the caller's order
  call                   lookup_fixed(check=False), whole
The floor is a2a_ids + a2a_answers + partition + local + gather run back to back (no stage can start before the
one it reads is done); "floor / baseline" is that over the bench's baseline (the two all-to-alls of the IDs and
their answers alone, without the header and spare slots). A floor above 1.5x bounds the target from below.

Reaches below the public API (named here): the routing operators of ``torch.ops.rtindex_internal``, the shard's
splitters and ``distributed.points.local_per_query``, as the call uses them.

    torchrun --nproc-per-node=2 benchmarks/lab/sharded_embedding_floor.py
    python3 benchmarks/lab/sharded_embedding_floor.py --device cpu --log-keys 12 --log-ids 6,8   # gloo smoke
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common  # noqa: F401,E402  (this checkout first on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _common import git_commit, launch_ranks  # noqa: E402
from torch_rtindex import CgRXIndex  # noqa: E402
from torch_rtindex._config import PADDED_HEADER  # noqa: E402
from torch_rtindex._keys import KEY_TYPES, flip_sign  # noqa: E402
from torch_rtindex.distributed import ShardedIndex, no_multicast_env  # noqa: E402
from torch_rtindex.distributed import points  # noqa: E402
from sharded_embedding_bench import KEY_MULTIPLIER, capture, per_call  # noqa: E402  (the bench's keys, capture, timing)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world", type=int, default=None, help="processes to start when not under torchrun")
    ap.add_argument("--log-ids", default="10,14,17")
    ap.add_argument("--log-keys", type=int, default=24)
    ap.add_argument("--slack", type=float, default=1.1, help="query_capacity = slack * ids / world + 64")
    ap.add_argument("--iters", type=int, default=200)
    return ap.parse_args(argv)


def probe(rank: int, world: int, argv: list[str]) -> None:
    a = parse(argv)
    dev = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    internal = torch.ops.rtindex_internal
    n = 1 << a.log_keys
    ix = ShardedIndex(torch.arange(rank * n, (rank + 1) * n, dtype=torch.int64, device=dev) * KEY_MULTIPLIER,
                      index_factory=functools.partial(CgRXIndex, backend="radix"))
    splitters = flip_sign(ix._splitters)
    rows = []
    for log_ids in [int(s) for s in a.log_ids.split(",") if s]:
        q = 1 << log_ids
        qcap = int(a.slack * q / world) + 64
        width = PADDED_HEADER + qcap
        gen = torch.Generator(device=dev).manual_seed(log_ids + 17 * rank)
        want = torch.randint(0, n * world, (q,), generator=gen, device=dev)
        ids = want * KEY_MULTIPLIER
        # The stages' static inputs and outputs, as one call makes them.
        block, slots = internal.partition_padded(ids, KEY_TYPES[ix.key_type], splitters, qcap)
        got = torch.empty_like(block)
        dist.all_to_all_single(got, block)
        back = points.local_per_query(ix, "lookup", got.view(-1), None, None).view(world, width * 2)
        ret = torch.empty_like(back)
        dist.all_to_all_single(ret, back)
        first, _ = internal.gather_answers(ret.view(world * width, 2), slots, -1, -1)
        call = ix.lookup_fixed(ids, qcap, check=False).answer.first_row
        bad = torch.tensor([int((first != want).sum()) + int((call != want).sum())], device=dev)
        dist.all_reduce(bad)
        ids_b, ans_b = ids.clone(), torch.zeros(2 * q, dtype=torch.int64, device=dev)
        ids_r, ans_r = torch.empty_like(ids_b), torch.empty_like(ans_b)
        stages = {
            "baseline": lambda: (dist.all_to_all_single(ids_r, ids_b), dist.all_to_all_single(ans_r, ans_b)),
            "a2a_ids": lambda: dist.all_to_all_single(got, block),
            "a2a_answers": lambda: dist.all_to_all_single(ret, back),
            "partition": lambda: internal.partition_padded(ids, KEY_TYPES[ix.key_type], splitters, qcap),
            "local": lambda: points.local_per_query(ix, "lookup", got.view(-1), None, None),
            "gather": lambda: internal.gather_answers(ret.view(world * width, 2), slots, -1, -1),
            "call": lambda: ix.lookup_fixed(ids, qcap, check=False),
        }
        for name, fn in stages.items():
            eager = per_call(fn, dev, 10, a.iters)[0] * 1e6
            graph = per_call(capture(fn, dev)[0].replay, dev, 10, a.iters)[0] * 1e6 if dev.type == "cuda" else None
            rows.append((log_ids, name, eager, graph))
        if rank == 0:
            mine = {r[1]: r for r in rows if r[0] == log_ids}
            for col, label in ((2, "eager"), (3, "graph")):
                if mine["call"][col] is None:
                    continue
                floor = sum(mine[s][col] for s in ("a2a_ids", "a2a_answers", "partition", "local", "gather"))
                base = mine["baseline"][col]
                print(f"2^{log_ids} {label}: floor {floor:.1f} us = {floor / base:.2f}x the baseline's {base:.1f} us; "
                      f"the call {mine['call'][col]:.1f} us = {mine['call'][col] / base:.2f}x; answers "
                      f"{'right' if int(bad) == 0 else f'{int(bad)} WRONG'}", flush=True)
    if rank == 0:
        print(f"{'log2 ids':>8} {'stage':12} {'eager us':>9} {'graph us':>9}")
        for log_ids, name, eager, graph in rows:
            print(f"{log_ids:>8} {name:12} {eager:>9.1f} {'-' if graph is None else format(graph, '9.1f'):>9}")
    dist.barrier()


def main() -> None:
    no_multicast_env()
    a = parse()
    print(f"sharded embedding-size floor, commit {git_commit()}, torch {torch.__version__}, {a.device}, 2^{a.log_keys} "
          "keys per rank, cgRX radix shards, median us per call (slowest rank)", flush=True)
    launch_ranks(probe, a, timeout_s=300)


if __name__ == "__main__":
    main()
