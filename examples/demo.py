"""The main job: an RX index over ~1M random 64-bit keys, point and range lookups checked against a sorted
array, throughput printed. Runs on the GPU when there is one, otherwise on the CPU."""

import time

import torch

import torch_rtindex


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(0)
    n, q = 1 << 20, 1 << 22
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, device=device)
    queries = torch.cat([keys[torch.randint(0, n, (q // 2,), generator=gen, device=device)],
                         torch.randint(-(2**63), 2**63 - 1, (q // 2,), generator=gen, device=device)])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    index = torch_rtindex.RXIndex(keys)
    sync()
    build = time.perf_counter() - t0
    print(index)
    index.lookup(queries[:1024])  # warm-up (pipeline compilation on first use)
    sync()
    t0 = time.perf_counter()
    res = index.lookup(queries)
    sync()
    t_point = time.perf_counter() - t0

    sk, perm = torch.sort(keys)
    pos = torch.searchsorted(sk, queries).clamp(max=n - 1)
    expected = torch.where(sk[pos] == queries, perm[pos], -1)
    assert torch.equal(res.first_row, expected), "point lookups disagree with the sorted-array reference"

    lo = keys[torch.randint(0, n, (q // 4,), generator=gen, device=device)]
    hi = lo + (1 << 25)  # up to 5 scene rows per range: 5 rays each
    t0 = time.perf_counter()
    rng = index.range_lookup(lo, hi)
    sync()
    t_range = time.perf_counter() - t0
    exp_count = torch.searchsorted(sk, hi, right=True) - torch.searchsorted(sk, lo)
    exp_count = torch.where(hi >= lo, exp_count, 0)
    assert torch.equal(rng.count, exp_count), "range counts disagree with the sorted-array reference"

    print(f"device {device}: build {build * 1e3:.1f} ms for {n} keys")
    print(f"point lookups: {q} in {t_point * 1e3:.1f} ms = {q / t_point / 1e6:.1f} M/s, "
          f"{int((res.count > 0).sum())} hits, all equal to the sorted-array answer")
    print(f"range lookups: {lo.numel()} in {t_range * 1e3:.1f} ms = {lo.numel() / t_range / 1e6:.1f} M/s, "
          f"{int(rng.count.sum())} rows, all counts equal to the sorted-array answer")


if __name__ == "__main__":
    main()
