"""Can an OptiX launch be captured in a CUDA graph? Each variant runs in a fresh process (a failed capture can
poison the CUDA context for the rest of its process): build an index whose lookups are OptiX launches, capture
its lookup operator with torch.cuda.graph, replay it over new queries and compare with eager answers, then check
that the context still works. Prints one JSON line per variant and a summary.

Variants: whether a lookup ran before the capture (lazy OptiX pipeline creation outside the capture), and the
capture's error mode ("global", "thread_local", "relaxed").

    python benchmarks/optix_capture_probe.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

VARIANTS = [(index, warm, mode) for index in ("rx", "cgrx_optix") for warm in (True, False)
            for mode in ("global", "thread_local", "relaxed")]


def child(index_kind: str, warm: bool, mode: str) -> dict:
    import torch

    sys.path.append(str(Path(__file__).resolve().parent.parent))
    import torch_rtindex

    out = {"index": index_kind, "warm": warm, "mode": mode}
    gen = torch.Generator(device="cuda").manual_seed(1)
    keys = torch.randint(-(2**63), 2**63 - 1, (1 << 20,), device="cuda", generator=gen)
    if index_kind == "rx":
        index = torch_rtindex.RXIndex(keys)
    else:
        index = torch_rtindex.CgRXIndex(keys, backend="optix")
    q = keys[torch.randperm(keys.numel(), device="cuda", generator=gen)[: 1 << 16]].clone()
    mapped = q
    op = index._forms["lookup"]  # the operator itself: the Python API refuses the capture before launching
    args = lambda qq: (*index._lead, index._cfg, qq, None)  # noqa: E731
    if warm:
        op(*args(mapped))
        torch.cuda.synchronize()
    static_q = mapped.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, capture_error_mode=mode):
                static_out = op(*args(static_q))
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        out["captured"] = True
    except Exception as e:  # noqa: BLE001  (the point is to see what fails)
        out["captured"] = False
        out["capture_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if out["captured"]:
        ok = True
        try:
            for rep in range(3):
                fresh = keys[torch.randint(0, keys.numel(), (static_q.numel(),), device="cuda", generator=gen)]
                static_q.copy_(fresh)
                g.replay()
                torch.cuda.synchronize()
                want = op(*args(static_q.clone()))
                ok &= all(torch.equal(a, b) for a, b in zip(static_out, want))
            out["replays_correct"] = bool(ok)
        except Exception as e:  # noqa: BLE001
            out["replays_correct"] = False
            out["replay_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    try:
        x = torch.arange(10, device="cuda").sum().item()
        out["context_ok"] = x == 45
    except Exception as e:  # noqa: BLE001
        out["context_ok"] = False
        out["context_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3] == "1", sys.argv[4])), flush=True)
        return 0
    results = []
    for index_kind, warm, mode in VARIANTS:
        cmd = [sys.executable, __file__, "--child", index_kind, "1" if warm else "0", mode]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(line[-1]) if line else {"index": index_kind, "warm": warm, "mode": mode,
                                                   "crashed": p.returncode, "stderr": p.stderr[-400:]}
        except subprocess.TimeoutExpired:
            r = {"index": index_kind, "warm": warm, "mode": mode, "hung": True}
        print(json.dumps(r), flush=True)
        results.append(r)
    good = [r for r in results if r.get("replays_correct") and r.get("context_ok")]
    print(f"{len(good)} of {len(results)} variants captured, replayed correctly and left the context working")
    return 0


if __name__ == "__main__":
    sys.exit(main())
