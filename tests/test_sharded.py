"""ShardedIndex across processes: 2, 3 and 4 ranks with gloo on the CPU (and NCCL on two GPUs, and on every GPU
of a machine with more), every answer checked against the numpy reference over the concatenated keys (tests/sharded_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sharded_worker
from torch_rtindex.distributed import spawn

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def test_sharded_gloo_two_three_four_ranks():
    """Process start-up dominates the cost, so one group of four processes runs every check on 2-rank groups
    (two side by side), a 3-rank group and all 4 ranks (sharded_worker.run, layout "2+3+4"), then, on all 4
    ranks, bad input or a fault on each rank in turn at every stage between two collectives, with every rank's
    sequence of collectives recorded and compared (sharded_worker.collective_sequences: gloo is synchronous,
    the recorder shows the sequences as NCCL would have to match them)."""
    spawn(sharded_worker.run, 4, 0, "2+3+4", timeout_s=120, join_timeout_s=400)


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_sharded_nccl_two_gpus():
    spawn(sharded_worker.run, 2, 0, "world", backend="nccl", timeout_s=120, join_timeout_s=600)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 3, reason="needs 3+ CUDA GPUs")
def test_sharded_nccl_every_gpu():
    """Every check through NCCL with one rank per GPU of the machine: middle ranks (neither first nor last)
    send their own pieces through the exchange."""
    spawn(sharded_worker.run, torch.cuda.device_count(), 0, "world", backend="nccl", timeout_s=120,
          join_timeout_s=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sharded_nccl_one_gpu():
    """Every answer through NCCL's code paths with one rank: what the one-GPU machine can run (and run under
    compute-sanitizer: benchmarks/gpu_check.sh memcheck)."""
    spawn(sharded_worker.run, 1, 0, "one", backend="nccl", timeout_s=120, join_timeout_s=400)


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_sharded_nccl_cuda_graph():
    spawn(sharded_worker.cuda_graph, 2, backend="nccl", timeout_s=120, join_timeout_s=300)


def test_import_does_not_load_torch_distributed_eagerly():
    code = "import sys, torch_rtindex; print('torch_rtindex.distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bench_cpu_smoke(tmp_path):
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "sharded_bench.py"), "--device", "cpu", "--world", "2",
         "--log-keys", "10", "--log-lookups", "10", "--repeats", "1", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list(tmp_path.rglob("sharded_*.json")), out.stdout


def test_readme_sharded_example(tmp_path):
    """The README's two-process example, saved as a file and run as the README says."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    section = re.search(r"^## Sharded index\n(.*?)(?=^## )", text, flags=re.M | re.S).group(1)
    code = re.findall(r"^```python\n(.*?)^```", section, flags=re.M | re.S)[0]
    script = tmp_path / "sharded_example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
