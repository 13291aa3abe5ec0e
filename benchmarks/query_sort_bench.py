"""What sorting the queries inside a lookup costs and gains (``index.sort_queries``), taken apart.

Times the parts of a sorted lookup on one GPU, in one run, on the same keys and queries: the query sort alone
(``torch.ops.rtindex.sort_queries`` over 16 and 24 key bits, and a full ``torch.sort`` for comparison), the
scatter of one answer column back to the caller's order, and whole lookups of RX, cgRX with OptiX rays and
cgRX with the radix table with the sort off and on (16 and 24 bits). Every answer is checked against the
unsorted lookup. Prints a table, writes JSON under benchmarks/results/<device>/.

    python benchmarks/query_sort_bench.py --log-keys 26 --log-lookups 27
"""

from __future__ import annotations

import argparse

import torch

from rx_bench import git_commit, make_keys, timed as timed_on, write_json  # noqa: E402  (same folder)

import torch_rtindex  # noqa: E402
from torch_rtindex import CgRXIndex, RXIndex  # noqa: E402
from torch_rtindex._base import query_sort_bits  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-keys", type=int, default=26)
    ap.add_argument("--log-lookups", type=int, default=27)
    ap.add_argument("--bits", default="16,24", help="key bits the query sort orders by")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (the tests run it)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    timed = lambda fn: timed_on(fn, device=dev)  # noqa: E731
    gen = torch.Generator(device=dev).manual_seed(42)
    n, q = 1 << args.log_keys, 1 << args.log_lookups
    keys = make_keys("uniform64", n, gen, dev)
    queries = keys[torch.randint(0, n, (q,), generator=gen, device=dev)]
    ordered = torch.ops.rtindex.map_keys(queries, 0)
    end = query_sort_bits(int(keys.min()), int(keys.max()))[1]
    widths = [int(b) for b in args.bits.split(",")]
    rows, result = [], {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "commit": git_commit(), "torch": torch.__version__,
                        "optix": torch_rtindex.optix_info() if dev.type == "cuda" else None, "params": vars(args), "parts_ms": {}, "lookups_ms": {}}

    for bits in widths:
        ms, _ = timed(lambda: torch.ops.rtindex.sort_queries(ordered, end - bits, end))
        rows.append((f"sort_queries, {bits} bits", ms))
        result["parts_ms"][f"sort_queries_{bits}_bits"] = ms
    ms, _ = timed(lambda: torch.sort(ordered))
    rows.append(("torch.sort (all 64 bits, with indices)", ms))
    result["parts_ms"]["torch_sort"] = ms
    _, order = torch.ops.rtindex.sort_queries(ordered, end - widths[-1], end)
    column = torch.arange(q, device=dev)
    ms, _ = timed(lambda: torch.empty_like(column).index_copy_(0, order, column))
    rows.append(("scatter one int64 answer column back", ms))
    result["parts_ms"]["scatter_column"] = ms

    for name, make in [("RX", lambda: RXIndex(keys)), ("cgRX optix B=16", lambda: CgRXIndex(keys, backend="optix")),
                       ("cgRX radix B=16", lambda: CgRXIndex(keys, backend="radix"))]:
        index = make()
        index.sort_queries = False
        base_ms, want = timed(lambda: index.lookup(queries))
        rows.append((f"{name}: queries as given", base_ms))
        result["lookups_ms"][f"{name} unsorted"] = base_ms
        index.sort_queries = True
        for bits in widths:
            index._query_bits = (end - bits, end)
            ms, got = timed(lambda: index.lookup(queries))
            assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count), f"{name}, {bits} bits"
            rows.append((f"{name}: sorted inside, {bits} bits", ms))
            result["lookups_ms"][f"{name} sorted {bits} bits"] = ms
        index = None  # the closures above hold the name: released, not deleted
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    print(f"\n{result['device']}  commit {result['commit']}  keys 2^{args.log_keys}, lookups 2^{args.log_lookups}")
    for name, ms in rows:
        print(f"{name:48s} {ms:9.2f} ms")
    if dev.type == "cuda":
        write_json(result, f"query_sort_k{args.log_keys}_q{args.log_lookups}_{result['commit']}")


if __name__ == "__main__":
    main()
