"""How much of a Zipf batch a hot tier learned from a sample can answer: the tier holds the keys seen at least once
(or twice) in a sample of S queries, and answers the probability mass of those keys under the law the queries come
from (the continuous law `chunked_bench.zipf_positions` draws from, over 2^30 keys). No GPU, no index: it bounds
what a better learner would gain before one is built: a larger sample per batch, a cache of every key of the
last batches, or an oracle tier of the hottest keys that fills the budget.

    python benchmarks/hot_tier_hit_model.py
"""
import numpy as np, math
n=2**30
def cdf(r,s):  # P(rank < r) for ranks 0..n-1 continuous law on [1,n+1]
    a=1-s
    if abs(a)<1e-9: return np.log(r+1)/math.log(n+1)
    return ((r+1)**a-1)/((n+1)**a-1)
rng=np.random.default_rng(1)
for s in (0.99,1.2):
    for logS in (20,22,24):
        S=1<<logS
        u=rng.random(S)
        a=1-s
        if abs(a)<1e-9: r=np.exp(u*math.log(n+1))
        else: r=(((n+1)**a-1)*u+1)**(1/a)
        rank=np.clip(np.floor(r).astype(np.int64)-1,0,n-1)
        k,c=np.unique(rank,return_counts=True)
        p=cdf(k+1,s)-cdf(k,s)
        for th in (1,2):
            sel=c>=th
            print(f"s={s} S=2^{logS} seen>={th}: tier {sel.sum():9d} keys, hit {p[sel].sum()*100:6.2f}%")


def density_hit(s: float, queries_seen: float) -> float:
    """The share of a batch answered by a tier of every key drawn at least once in `queries_seen` earlier
    queries (a key cache with that much memory): the integral of f(r) (1 - exp(-queries_seen f(r))) over the
    ranks, f the law's density, on a log-spaced grid."""
    r = np.exp(np.linspace(0.0, math.log(n + 1), 200001))
    a = 1 - s
    f = (1 / r) / math.log(n + 1) if abs(a) < 1e-9 else a * r ** (-s) / ((n + 1) ** a - 1)
    g = f * -np.expm1(-queries_seen * f)
    return float(np.sum((g[1:] + g[:-1]) / 2 * np.diff(r)))


def distinct_keys(s: float, queries_seen: float) -> float:
    """How many distinct keys `queries_seen` queries draw (the size of that key cache)."""
    r = np.exp(np.linspace(0.0, math.log(n + 1), 200001))
    a = 1 - s
    f = (1 / r) / math.log(n + 1) if abs(a) < 1e-9 else a * r ** (-s) / ((n + 1) ** a - 1)
    g = -np.expm1(-queries_seen * f)
    return float(np.sum((g[1:] + g[:-1]) / 2 * np.diff(r)))


budget_keys = 185e6  # a 4.15 GiB budget at about 24 bytes per key (pairs and table of a cgRX tier)
for s in (0.99, 1.2):
    oracle = cdf(budget_keys, s)
    print(f"s={s} oracle tier of the {budget_keys:.3g} hottest keys (the whole budget): hit {oracle * 100:6.2f}%")
    for batches in (1, 8, 64):
        q = batches * 2**27
        print(f"s={s} every key of the last {batches:2d} batches of 2^27: {distinct_keys(s, q):.3g} keys, hit "
              f"{density_hit(s, q) * 100:6.2f}%")
