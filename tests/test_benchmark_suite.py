"""benchmarks/suite.py --tiny on the CPU, as a subprocess: every method and dimension is reported, every answer
check passed, and the plots are written (the GPU-only methods are reported as skipped, with the reason)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "suite.py"
METHODS = {"RX", "SA", "hash_table"} | {f"cgRX-{b}-B{n}" for b in ("radix", "optix") for n in (4, 16, 64, 256)}
DIMENSIONS = {"keys", "lookups", "hit_rate", "zipf", "multiplicity", "range_selectivity", "key_bits", "uniformity",
              "sorted", "updates"}
PLOTS = {f"lookup_ms_vs_{d}.png" for d in ("keys", "lookups", "hit_rate", "zipf", "multiplicity", "range_selectivity")}
PLOTS |= {"throughput_per_byte_vs_keys.png"}


def test_tiny_suite_on_cpu(tmp_path):
    pytest.importorskip("matplotlib")  # in the test extras; the suite itself writes its JSON without it
    out = tmp_path / "suite"
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--tiny", "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "RTINDEX_COMMIT": "testcommit"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((out / "results.json").read_text())

    assert result["mode"] == "tiny" and result["device_type"] == "cpu" and result["commit"] == "testcommit"
    assert result["optix"] is None and result["optix_abi"] is None and result["rt_cores"] is None
    assert result["driver"] and result["torch"] and result["device"]
    assert result["timing"]["clock"] == "time.perf_counter"

    # Every method is there; what cannot run on the CPU says why.
    assert set(result["methods"]) == METHODS
    skipped = {name for name, m in result["methods"].items() if m["skipped"]}
    assert skipped == {"hash_table"} | {f"cgRX-optix-B{n}" for n in (4, 16, 64, 256)}
    assert any("hash_table" in n and "CUDA only" in n for n in result["notes"])
    ran = METHODS - skipped

    # Every dimension has runs of every method that ran, each checked against the sorted array.
    assert set(result["grid"]) == DIMENSIONS
    runs = result["runs"]
    for dim in DIMENSIONS - {"updates"}:
        for name in ran:
            mine = [r for r in runs if r["dimension"] == dim and r["method"] == name]
            assert mine, (dim, name)
            for r in mine:
                assert r["check"] == "passed" and not r["skipped"], r
                assert r["lookup_ms"] > 0 and r["throughput"] > 0 and r["throughput_per_byte"] > 0
                assert r["memory_bytes"] > 0 and r["build_ms"] > 0 and r["build_peak_bytes"] is None
                assert r["repeats"] >= 1 and r["keys"] == 2 ** r["log_keys"] and r["lookups"] == 2 ** r["log_lookups"]
    assert all(r["check"] in ("passed", "skipped") for r in runs)
    assert result["checks"]["failed"] == 0 and result["checks"]["passed"] > 0
    (hit,) = {(r["inside_misses"], r["outside_misses"]) for r in runs if r["dimension"] == "hit_rate"}
    assert min(hit) > 0  # misses both inside and outside the key range
    assert {r["key_dtype"] for r in runs if r["dimension"] == "key_bits"} == {"int32"}
    assert all(r["check"] == "skipped" and r["skipped"] for r in runs if r["method"] in skipped)

    (updates,) = result["updates"]
    assert updates["check"] == "passed" and updates["rows"] and updates["lookup_after_ms"] > 0
    append = updates["append"]  # the append workload: the policy keeps chains short, without it they stretch
    assert append["policy_on"]["mean_node_reads"] <= append["policy_on"]["max_node_reads"]
    assert append["policy_off"]["auto_rebuilds"] == 0 and append["fresh"]["lookup_ms"] > 0

    assert PLOTS <= set(result["plots"])
    for name in result["plots"]:
        assert (out / name).stat().st_size > 1000, name
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "check" in proc.stdout and "RX" in proc.stdout and (out / "table.txt").exists()


def test_plot_styles_distinct(monkeypatch):
    """Every method of a GPU run (11, one more than matplotlib's default colour cycle) has its own colour; a
    longer list still gets distinct (colour, marker) pairs."""
    matplotlib = pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import suite

    colors = matplotlib.colormaps["tab20"].colors
    styles = suite.method_styles(sorted(METHODS), colors)
    assert len({s["color"] for s in styles.values()}) == len(METHODS)
    many = suite.method_styles([f"m{i}" for i in range(60)], colors)
    assert len({(s["color"], s["marker"]) for s in many.values()}) == 60


BENCH_MODULES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))


def test_benchmarks_import_the_checkout_they_live_in(tmp_path):
    """Every benchmark imports torch_rtindex from the checkout it lives in, whatever PYTHONPATH and the working
    folder say (an editable install of another checkout included)."""
    decoy = tmp_path / "torch_rtindex"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy on PYTHONPATH was imported')\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            f"for name in {BENCH_MODULES!r}: __import__(name)\n"
            "import torch_rtindex; print(torch_rtindex.__file__)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("RTINDEX_TREE", None)
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert Path(proc.stdout.strip().splitlines()[-1]).resolve() == ROOT / "torch_rtindex" / "__init__.py"
    assert f"torch_rtindex from {ROOT}" in proc.stderr


def test_benchmarks_use_the_public_api():
    """The user-facing benchmarks import no private module of the library, read no private attribute of an index
    and assign no module-level setting; one-off probes live in benchmarks/lab/ (or are deleted once answered)."""
    import re

    top = sorted((ROOT / "benchmarks").glob("*.py"))
    assert not [p.name for p in top if p.stem.endswith("_probe")]
    for path in top:
        if path.name in ("cgrx_bench.py", "gather_floor.py"):  # the cgRX engineer's own A/B benchmarks
            continue
        text = path.read_text()
        assert not re.search(r"torch_rtindex\._[a-z]|from torch_rtindex\.\S* import _", text), path.name
        assert not re.search(r"\b(index|ix|idx)\._[a-z]", text), path.name
        assert not re.search(r"^\s*(chunked|sharded|torch_rtindex\.\w+)\.[A-Z_]{3,}\s*=", text, flags=re.M), path.name
    assert (ROOT / "benchmarks" / "lab" / "README.md").exists()
    for path in (ROOT / "benchmarks" / "lab").glob("*.py"):
        assert path.name in (ROOT / "benchmarks" / "lab" / "README.md").read_text(), path.name


def test_sharded_embedding_bench_on_cpu(tmp_path):
    """benchmarks/sharded_embedding_bench.py on two gloo processes at tiny sizes: every form timed at every size,
    every answer checked right, the CUDA-graph forms skipped with the reason."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sharded_embedding_bench.py"), "--device", "cpu", "--world", "2",
         "--log-keys", "10", "--log-ids", "4,8", "--warmup", "1", "--iters", "3", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "RTINDEX_COMMIT": "testcommit"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "sharded_embedding_testcommit.json").read_text())
    assert result["world"] == 2 and result["backend"] == "gloo" and result["keys_per_rank"] == 1 << 10
    runs = {(r["log_ids"], r["form"]): r for r in result["runs"]}
    graphs = {"a2a_graph", "lookup_fixed_graph"}
    eager = {"a2a", "lookup_rows", "lookup_fixed", "lookup_fixed_nocheck"}
    assert set(runs) == {(s, f) for s in (4, 8) for f in eager | graphs}
    for (_, form), r in runs.items():
        if form in graphs:
            assert r["median_s"] is None and r["check"].startswith("skipped"), r
        else:
            assert r["median_s"] > 0 and r["mean_s"] > 0 and r["vs_a2a"] > 0, r
            assert r["check"] == ("n/a" if form == "a2a" else "passed"), r
    assert "answers checked: all right" in proc.stdout
