"""The benchmarks' own CUDA baselines (hash table, random-read floor), compiled just in time on first use."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import ModuleType

import _common  # noqa: F401  (this checkout first on sys.path, for the scripts that import baselines first)
from torch.utils import cpp_extension


def build_root() -> Path:
    """Where the baselines build: beside the package's own builds (``TORCH_RTINDEX_BUILD_DIR``, so a warm GPU
    machine reuses them), else the user's cache."""
    root = os.environ.get("TORCH_RTINDEX_BUILD_DIR")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_rtindex"
    return (Path(root) if root else cache) / "baselines"


@contextlib.contextmanager
def build_lock(build_dir: Path):
    """Builds in ``build_dir`` one at a time across processes. The kernel releases an flock when its holder dies,
    so an interrupted build never blocks the next; cpp_extension's own baton file, which such a build leaves
    behind and on which every later build would wait, is removed under the lock."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "rtindex.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        yield


def load_baseline(name: str, source: Path) -> ModuleType:
    """Builds (if needed) and imports the extension `name` from one .cu file."""
    build_dir = build_root() / name
    with build_lock(build_dir):
        return cpp_extension.load(name=name, sources=[str(source)], extra_cuda_cflags=["-O3"],
                                  build_directory=str(build_dir), verbose=False)
