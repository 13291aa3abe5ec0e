"""The sharded index: one index over the keys of every rank of a ``torch.distributed`` process group.

    from torch_rtindex.distributed import ShardedIndex

Importing this module imports ``torch.distributed``; ``import torch_rtindex`` alone does not import it.
"""

from .launch import NO_MULTICAST_ENV, free_port, no_multicast_env, spawn
from .sharded import Fixed, PointRouting, ShardedIndex, ShardedIndexError

__all__ = [
    "ShardedIndex", "ShardedIndexError", "Fixed", "PointRouting", "spawn", "free_port", "no_multicast_env", "NO_MULTICAST_ENV",
]
