"""The benchmarks' own CUDA baselines (hash table, random-read floor), compiled just in time on first use."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from torch.utils import cpp_extension

from torch_rtindex._extension import _build_root, build_lock


def load_baseline(name: str, source: Path) -> ModuleType:
    """Builds (if needed) and imports the extension `name` from one .cu file, in the package's build folder
    (``TORCH_RTINDEX_BUILD_DIR``, so a warm GPU machine reuses it) under the package's build lock (a build that
    was killed leaves nothing that blocks the next)."""
    build_dir = _build_root() / "baselines" / name
    with build_lock(build_dir):
        return cpp_extension.load(name=name, sources=[str(source)], extra_cuda_cflags=["-O3"],
                                  build_directory=str(build_dir), verbose=False)
