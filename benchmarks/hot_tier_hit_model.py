"""How much of a Zipf batch a hot tier can answer, by the law the queries come from (the continuous law
`chunked_bench.zipf_positions` draws ranks from, over 2^30 keys). No GPU, no index: it bounds what a better
learner would gain before one is built. Three kinds of tier:

- the keys seen at least once (or twice) in a sample of S queries (what `ChunkedIndex` learns from);
- a cache of every key of the last batches of 2^27 queries;
- an oracle tier of the hottest keys that fills the whole budget.

    python benchmarks/hot_tier_hit_model.py
"""

from __future__ import annotations

import math

import numpy as np

N = 2**30  # keys
BATCH = 2**27  # queries per batch
BUDGET_KEYS = 185e6  # a 4.15 GiB budget at about 24 bytes per key (a cgRX tier's pairs and table)


def cdf(r, s: float):
    """P(rank < r) for ranks 0 .. N - 1 (the continuous law on [1, N + 1])."""
    a = 1 - s
    if abs(a) < 1e-9:
        return np.log(r + 1) / math.log(N + 1)
    return ((r + 1) ** a - 1) / ((N + 1) ** a - 1)


def draw(m: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """m ranks, drawn as `chunked_bench.zipf_positions` draws them (inverse CDF)."""
    u = rng.random(m)
    a = 1 - s
    r = np.exp(u * math.log(N + 1)) if abs(a) < 1e-9 else (((N + 1) ** a - 1) * u + 1) ** (1 / a)
    return np.clip(np.floor(r).astype(np.int64) - 1, 0, N - 1)


def cache_of_seen(s: float, queries_seen: float) -> tuple[float, float]:
    """(distinct keys, share of a batch answered) of a tier holding every key drawn at least once in
    `queries_seen` earlier queries: integrals of (1 - exp(-q f(r))) and f(r) (1 - exp(-q f(r))) over the ranks,
    f the law's density, on a log-spaced grid."""
    r = np.exp(np.linspace(0.0, math.log(N + 1), 200001))
    a = 1 - s
    f = (1 / r) / math.log(N + 1) if abs(a) < 1e-9 else a * r ** (-s) / ((N + 1) ** a - 1)
    seen = -np.expm1(-queries_seen * f)
    integral = lambda g: float(np.sum((g[1:] + g[:-1]) / 2 * np.diff(r)))  # noqa: E731
    return integral(seen), integral(f * seen)


def main() -> None:
    rng = np.random.default_rng(1)
    for s in (0.99, 1.2):
        for log_s in (20, 22, 24):
            keys, counts = np.unique(draw(1 << log_s, s, rng), return_counts=True)
            p = cdf(keys + 1, s) - cdf(keys, s)
            for least in (1, 2):
                sel = counts >= least
                print(f"s={s} S=2^{log_s} seen>={least}: tier {sel.sum():9d} keys, hit {p[sel].sum() * 100:6.2f}%")
    for s in (0.99, 1.2):
        print(f"s={s} oracle tier of the {BUDGET_KEYS:.3g} hottest keys (the whole budget): hit "
              f"{cdf(BUDGET_KEYS, s) * 100:6.2f}%")
        for batches in (1, 8, 64):
            keys, hit = cache_of_seen(s, batches * BATCH)
            print(f"s={s} every key of the last {batches:2d} batches of 2^27: {keys:.3g} keys, hit {hit * 100:6.2f}%")


if __name__ == "__main__":
    main()
