"""A CPU wheel built from this checkout installs into a folder of its own and works there with nothing compiled:
the prebuilt extension loads (the build cache is never touched), every in-memory index answers, and
``python -m torch_rtindex`` reports the prebuilt build. Builds the wheel once (a few minutes on two cores)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SMOKE = """
import os, torch, torch_rtindex
info = torch_rtindex._extension.load()
assert info["kind"] == "prebuilt" and info["path"].startswith(os.environ["PYTHONPATH"]), info
assert not os.path.exists(os.environ["TORCH_RTINDEX_BUILD_DIR"]), "the wheel's import used the build cache"
keys = torch.tensor([7, -2**63, 2**63 - 1, 7])
for cls in (torch_rtindex.RXIndex, torch_rtindex.CgRXIndex, torch_rtindex.UpdatableCgRXIndex):
    found = cls(keys).lookup(torch.tensor([7, 0, 2**63 - 1]))
    assert found.count.tolist() == [2, 0, 1], (cls, found)
print("prebuilt", info["path"])
"""


def test_cpu_wheel_installs_and_runs_without_compiling(tmp_path):
    staging = tmp_path / "src"
    # A copy of the checkout: setuptools stages into build/ beside setup.py, which must not be the user's tree.
    shutil.copytree(ROOT, staging, ignore=shutil.ignore_patterns(".git", ".build", "build", "*.egg-info", "results",
                                                                   "__pycache__", ".ab", ".whl", ".gl"))
    env = {**os.environ, "TORCH_RTINDEX_CPU_ONLY": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w",
                    str(tmp_path / "wheel"), str(staging)], check=True, env=env, timeout=1800)
    (wheel,) = (tmp_path / "wheel").glob("torch_rtindex-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, timeout=600)
    run_env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "TORCH_RTINDEX_BUILD_DIR": str(tmp_path / "none")}
    smoke = subprocess.run([sys.executable, "-c", SMOKE], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                           timeout=600)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    report = subprocess.run([sys.executable, "-m", "torch_rtindex"], cwd=tmp_path, env=run_env, capture_output=True,
                            text=True, timeout=600)
    assert report.returncode == 0 and "prebuilt" in report.stdout, report.stdout + report.stderr
