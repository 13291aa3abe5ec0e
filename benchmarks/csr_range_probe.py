"""CPU probe: index.range (CSR) over 2^16 ranges of 4 / 64 / 1024 hits, 2^20 keys; median of 5. Run with each tree on
PYTHONPATH to compare two commits: python3 benchmarks/csr_range_probe.py <label>."""
import time, torch, statistics, torch_rtindex as tr, sys
torch.manual_seed(0)
n = 1 << 20
keys = torch.arange(n) * 3  # dense-ish: a range of width w*3 holds w keys
perm = keys[torch.randperm(n)]
idx = tr.CgRXIndex(perm)
out = {}
for hits in (4, 64, 1024):
    lo = keys[torch.randint(0, n - hits, (1 << 16,))]
    hi = lo + 3 * (hits - 1)
    f = lambda: idx.range(lo, hi)
    f()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); r = f(); ts.append((time.perf_counter() - t0) * 1e3)
    assert int(r.offsets[-1]) == hits * (1 << 16)
    out[hits] = statistics.median(ts)
print(sys.argv[1], " ".join(f"range {h} hits: {v:.1f} ms" for h, v in out.items()))
