"""benchmarks/join_bench.py at a tiny size: every engine runs, every pair count and fingerprint agrees with
DuckDB's, the JSON is written; and a wrong join answer is reported as a failure (exit status 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("duckdb", reason="the join benchmark's reference engine: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "join_bench.py"
TINY = ["--log-build", "9", "--log-probe", "10", "--build-mult", "3", "--repeats", "1"]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_join_bench_tiny(tmp_path, device):
    out = tmp_path / "join.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--device", device, *TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "RTINDEX_COMMIT": "testcommit"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["commit"] == "testcommit" and result["failures"] == []
    assert result["duckdb"]["threads"] >= 1 and result["torch_threads"] == torch.get_num_threads()
    rows = result["rows"]
    cases = {(j, h) for j in ("equi", "band") for h in ("inner", "left")}
    engines = {"torch_rtindex cgrx-radix cpu", "torch_rtindex rx cpu"}
    if device == "cuda":  # the CPU rows, and the GPU's cgRX with the backend chosen for the GPU
        assert any(r["engine"].startswith("torch_rtindex cgrx-") and r["engine"].endswith(" cuda") for r in rows)
    for join_kind, how in cases:
        mine = [r for r in rows if (r["join"], r["how"]) == (join_kind, how)]
        duck = [r for r in mine if r["engine"] == "duckdb" and r["stage"] == "query"]
        assert len(duck) == 1 and duck[0]["pairs"] > 0
        checked = [r for r in mine if r["engine"].startswith("torch_rtindex")]
        assert {r["engine"] for r in checked if r["stage"] == "join"} >= engines
        assert all(r["check"] == "ok" and r["pairs"] == duck[0]["pairs"] for r in checked)
        if device == "cuda":
            assert {r["stage"] for r in checked if r["engine"].endswith("cuda")} == {"join", "build+join", "copies+build+join"}
    builds = [r for r in rows if r["stage"] == "build"]
    assert {r["engine"] for r in builds} >= engines and all(r["ms"] >= 0 for r in builds)
    assert "DuckDB" in proc.stdout and "wrote" in proc.stdout


def test_join_bench_reports_a_wrong_answer(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import join_bench

    right = join_bench.torch_join
    monkeypatch.setattr(join_bench, "torch_join", lambda *a: tuple(t[1:] for t in right(*a)))  # one pair lost
    out = tmp_path / "join.json"
    status = join_bench.main(["--device", "cpu", *TINY, "--joins", "equi", "--how", "inner", "--indexes", "cgrx",
                              "--no-polars", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 1 and len(result["failures"]) == 1 and "MISMATCH" in result["failures"][0]
