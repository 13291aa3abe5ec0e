"""How much of a Zipf batch a hot tier learned from a sample can answer: the tier holds the keys seen at least once
(or twice) in a sample of S queries, and answers the probability mass of those keys under the law the queries come
from (the continuous law `chunked_bench.zipf_positions` draws from, over 2^30 keys). No GPU, no index: it bounds
what a better learner (a larger sample per batch) would gain before one is built.

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
