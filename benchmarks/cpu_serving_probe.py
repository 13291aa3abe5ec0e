"""Where the out-of-core index's CPU side loses against one in-core CgRXIndex on the CPU: the same keys and
queries, CPU only, with ChunkedIndex's time per stage, and CgRXIndex lookups called from the main thread and from
a second Python thread (the out-of-core CPU worker is one), each at the batch size of a whole batch and of one
chunk's queue; with CUDA also the chunks in pinned host memory (where the GPU can read them), which the CPU
serves from as well.

    python benchmarks/cpu_serving_probe.py [--log-keys 28] [--log-lookups 24]
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from torch_rtindex import CgRXIndex, ChunkedIndex


def best(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def in_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log-keys", type=int, default=28)
    ap.add_argument("--log-lookups", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    print(f"threads {torch.get_num_threads()}, parallel info: {torch.__config__.parallel_info().splitlines()[:6]}")
    gen = torch.Generator().manual_seed(5)
    keys = torch.randint(-(2**63), 2**63 - 1, (1 << a.log_keys,), generator=gen)
    q = keys.index_select(0, torch.randint(0, keys.numel(), (1 << a.log_lookups,), generator=gen))
    t0 = time.perf_counter()
    full = CgRXIndex(keys, layout="packed_row")  # the chunks' layout
    print(f"CgRXIndex over 2^{a.log_keys} keys on the CPU built in {time.perf_counter() - t0:.1f} s")
    m = q.numel()
    for name, fn in (("main thread", lambda: best(lambda: full.lookup(q), a.repeats)),
                     ("second thread", lambda: in_thread(lambda: best(lambda: full.lookup(q), a.repeats)))):
        s = fn()
        print(f"CgRXIndex.lookup 2^{a.log_lookups} queries, {name:13s}: {s * 1e3:8.1f} ms  {m / s / 1e6:6.1f} M/s")
    places = [("pageable", "cpu")] + ([("pinned", "cuda")] if torch.cuda.is_available() else [])
    for place, device in places:
        index = ChunkedIndex(keys, device=device, processors="cpu", progress=False)
        chunks = len(index.chunk_info())
        per = max(1, m // chunks)
        if place == "pageable":
            qs = q[:per]
            for name, fn in (("main thread", lambda: best(lambda: full.lookup(qs), 10)),
                             ("second thread", lambda: in_thread(lambda: best(lambda: full.lookup(qs), 10)))):
                s = fn()
                print(f"CgRXIndex.lookup {per} queries (one queue's size), {name:13s}: {s * 1e6:8.0f} us  "
                      f"{per / s / 1e6:6.1f} M/s")
        for name, fn in (("main thread", lambda: best(lambda: index.lookup(q), a.repeats)),
                         ("second thread", lambda: in_thread(lambda: best(lambda: index.lookup(q), a.repeats)))):
            index.reset_stats()
            s = fn()
            st = index.stats()["time_s"]
            calls = a.repeats + 1
            parts = "  ".join(f"{k} {v / calls * 1e3:.1f}" for k, v in st.items() if v and k != "build")
            print(f"ChunkedIndex ({chunks} chunks, {place}) CPU only, 2^{a.log_lookups} queries, {name:13s}: "
                  f"{s * 1e3:8.1f} ms {m / s / 1e6:6.1f} M/s; ms per call: {parts}")
        del index

if __name__ == "__main__":
    main()
