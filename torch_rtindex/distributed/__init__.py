"""The sharded index: one index over the keys of every rank of a ``torch.distributed`` process group.

    from torch_rtindex.distributed import ShardedIndex

Importing this module imports ``torch.distributed``; ``import torch_rtindex`` alone does not import it.
"""

import torch

from .launch import NO_MULTICAST_ENV, free_port, no_multicast_env, spawn
from .sharded import Fixed, PointRouting, ShardedIndex, ShardedIndexError

# torch.load(weights_only=True) of a saved ShardedIndex (this rank's state, rebuilt by __setstate__ after its
# checks), as torch_rtindex/_serialization.py allows the other index classes; a process loading one has
# imported this module.
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([ShardedIndex])

__all__ = [
    "ShardedIndex", "ShardedIndexError", "Fixed", "PointRouting", "spawn", "free_port", "no_multicast_env", "NO_MULTICAST_ENV",
]
