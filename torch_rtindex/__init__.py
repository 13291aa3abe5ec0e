"""torch_rtindex: GPU database indexes that turn lookups into ray tracing, as PyTorch operators.

    >>> import torch, torch_rtindex
    >>> index = torch_rtindex.RXIndex(torch.tensor([10, 20, 20, 30]))
    >>> index.lookup(torch.tensor([20, 25]))
    Lookup(first_row=tensor([ 1, -1]), count=tensor([2, 0]))

The operators are ``torch.ops.rtindex.*``; the extension is compiled on first use (see _extension.py).
"""

from __future__ import annotations

import torch

from . import _extension
from .cgrx import CgRXIndex
from .cgrx_updatable import UpdatableCgRXIndex
from .chunked import ChunkedIndex
from .index import Index, UpdatableIndex
from .results import Aggregate, CappedMatches, CappedPairs, Lookup, Matches, UpdateResult
from .rx import RXIndex
from .scene import SceneConfig
from .embedding import IdToRow, MissingIdError
from .join import join, join_capped, range_join, range_join_capped
from .l2 import reserve_l2
from . import _serialization  # noqa: F401,E402  (torch.load(f) of a saved index with weights_only=True)

__version__ = "0.1.0"

_extension.load()
from . import _config  # noqa: E402

_config.check_against_extension()
from . import _fake  # noqa: E402,F401  (fake kernels need the schemas registered first)


def optix_info(device: int | torch.device | None = None) -> dict:
    """What the OptiX layer sees on a CUDA device: ABI, RT cores, limits."""
    if isinstance(device, torch.device):
        device = device.index
    device = torch.cuda.current_device() if device is None else int(device)
    abi, rtcore, max_prims, max_sbt, max_depth = torch.ops.rtindex.optix_info(device)
    return {
        "abi": abi,
        "rtcore_version": rtcore,
        "has_rt_cores": rtcore > 0,
        "max_primitives_per_gas": max_prims,
        "max_sbt_records_per_gas": max_sbt,
        "max_trace_depth": max_depth,
    }


__all__ = ["RXIndex", "CgRXIndex", "UpdatableCgRXIndex", "SceneConfig", "Lookup", "Matches", "Aggregate", "optix_info", "__version__"]
__all__ += ["IdToRow", "join", "range_join", "join_capped", "range_join_capped", "CappedMatches", "CappedPairs"]
__all__ += ["UpdateResult", "MissingIdError", "ChunkedIndex", "reserve_l2", "Index", "UpdatableIndex"]
