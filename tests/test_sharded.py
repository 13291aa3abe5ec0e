"""ShardedIndex across processes: every check of tests/sharded_worker.py and tests/sharded_sequences.py as a test
case of its own, run on a pool of processes with torch.distributed initialized once per world size
(tests/dist_harness.py): gloo on the CPU with 1, 2, 3 and 4 ranks, NCCL on the GPUs where there are enough. Every
answer is checked against the numpy reference over the concatenated keys."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from dist_harness import available, run_on_ranks, skip_unless_available
from sharded_worker import KEY_SET_NAMES

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# Where a case's worlds differ from the key sets': groups of two are the default, every case runs on three too
# (a middle rank sends its own pieces through the exchange), the 1- and 4-rank groups on some.
KEY_SET_CASES = ([(2, n) for n in KEY_SET_NAMES] + [(3, n) for n in KEY_SET_NAMES]
                 + [(1, n) for n in ("uniform", "duplicates", "float64")]
                 + [(4, n) for n in ("uniform", "duplicates", "last_rank_empty", "int32")])


def _world(world: int):
    return pytest.param(world, marks=skip_unless_available(world), id=f"{world}ranks")


@pytest.mark.parametrize("world,name", [pytest.param(w, n, marks=skip_unless_available(w), id=f"{w}ranks-{n}")
                                        for w, n in KEY_SET_CASES])
def test_key_set(world, name):
    run_on_ranks(world, "sharded_worker:key_set", name, timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (1, 2, 3, 4)])
def test_updates(world):
    run_on_ranks(world, "sharded_worker:updates", timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (2, 3, 4)])
def test_errors(world):
    """Bad input or a failing local lookup on one rank: every rank raises, naming it; the index still answers."""
    run_on_ranks(world, "sharded_worker:errors", timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (2, 3)])
def test_fixed_forms_have_no_host_sync(world):
    run_on_ranks(world, "sharded_worker:fixed_has_no_host_sync", timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (2, 3)])
def test_local_index_kinds(world):
    """RX, cgRX variants, updatable and out-of-core (ChunkedIndex) shards answer the same."""
    run_on_ranks(world, "sharded_worker:local_factories", timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (2, 3, 4)])
def test_uint64_keys(world):
    run_on_ranks(world, "sharded_worker:uint64_dtype", timeout=300)


@skip_unless_available(2)
def test_stats():
    run_on_ranks(2, "sharded_worker:profile")


@skip_unless_available(2)
def test_id_to_row():
    run_on_ranks(2, "sharded_worker:id_to_row")


@pytest.mark.parametrize("world", [_world(w) for w in (1, 2)])
def test_lookup_fixed_compiles_fullgraph(world):
    run_on_ranks(world, "sharded_worker:compiles", timeout=300)


@skip_unless_available(4)
def test_groups_side_by_side():
    """Two 2-rank groups, then a 3-rank and a 1-rank group, working at the same time."""
    run_on_ranks(4, "sharded_worker:subgroups", timeout=300)


@pytest.mark.parametrize("world", [_world(w) for w in (2, 4)])
def test_collective_sequences_under_faults(world):
    """Bad input or a fault on each rank in turn at every stage between two collectives, with every rank's
    collectives recorded and compared (gloo is synchronous; the recorder shows the sequences as NCCL would have
    to match them)."""
    run_on_ranks(world, "sharded_sequences:sequences", uuid.uuid4().hex, timeout=600)


# -------------------------------------------------------------------------------------------- NCCL, GPUs
NCCL_WORLDS = [w for w in (1, 2, GPUS) if w >= 1 and available(w, "nccl")[0]]


@pytest.mark.skipif(not NCCL_WORLDS, reason="needs CUDA GPUs and NCCL")
@pytest.mark.parametrize("world", sorted(set(NCCL_WORLDS)) or [1])
@pytest.mark.parametrize("name", KEY_SET_NAMES)
def test_nccl_key_set(world, name):
    if world == 1 and name == "last_rank_empty":
        pytest.skip("one rank has no other rank to leave empty")
    run_on_ranks(world, "sharded_worker:key_set", name, backend="nccl", timeout=300)


@pytest.mark.skipif(not NCCL_WORLDS, reason="needs CUDA GPUs and NCCL")
@pytest.mark.parametrize("world", sorted(set(NCCL_WORLDS)) or [1])
@pytest.mark.parametrize("case", ["updates", "compiles", "uint64_dtype", "local_factories"])
def test_nccl_case(world, case):
    run_on_ranks(world, f"sharded_worker:{case}", backend="nccl", timeout=300)


@pytest.mark.skipif(not available(2, "nccl")[0], reason="needs two CUDA GPUs")
@pytest.mark.parametrize("case", ["errors", "fixed_has_no_host_sync", "profile", "id_to_row"])
def test_nccl_two_gpus(case):
    run_on_ranks(2, f"sharded_worker:{case}", backend="nccl", timeout=300)


@pytest.mark.skipif(not available(2, "nccl")[0], reason="needs two CUDA GPUs")
def test_nccl_collective_sequences():
    run_on_ranks(2, "sharded_sequences:sequences", uuid.uuid4().hex, backend="nccl", timeout=600)


@pytest.mark.skipif(not available(2, "nccl")[0], reason="needs two CUDA GPUs")
def test_nccl_cuda_graph():
    run_on_ranks(2, "sharded_worker:cuda_graph", backend="nccl", timeout=300)


# ------------------------------------------------------------------------------------ single process
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
