"""Keeping the radix search table in a GPU's L2 cache.

A large batch of random point lookups reads one line of pairs per query, and every line passes through L2. Above
a few MiB the radix table then loses part of itself to those lines, and each of its misses costs a device-memory
transaction like the line itself (``benchmarks/results/README.md``). CUDA can set part of L2 aside for
"persisting" accesses; :func:`reserve_l2` does that for one GPU, and from then on cgRX radix lookups there mark
their table persisting (a launch attribute of their kernel: the caller's streams keep their own settings).

The set-aside is a device-wide CUDA setting (``cudaLimitPersistingL2CacheSize``): it lasts until changed, and
other code's persisting accesses share it. Normal accesses may use set-aside lines no persisting access holds,
yet other kernels can run markedly slower while it is set (the sharded index's streaming passes did:
``benchmarks/results/README.md``): use it where radix lookups dominate the GPU's time.
"""

from __future__ import annotations

import operator

import torch


def reserve_l2(nbytes: int | None = None, device: int | torch.device | None = None) -> int:
    """Sets aside ``nbytes`` of the L2 cache of a CUDA device (default: the most the device allows) for the
    search tables of cgRX radix lookups on it, and returns the bytes granted (CUDA rounds to its granularity and
    caps at the device's maximum). ``reserve_l2(0)`` gives the set-aside back.

    Size it to the tables in use (``index.memory()["radix_table"]``, summed): a set-aside smaller than a
    table marks only that share of the table's lines persisting.
    """
    if nbytes is not None:
        if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__"):
            raise TypeError(f"nbytes must be an integer or None, got {type(nbytes).__name__}")
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("reserve_l2 needs a CUDA device; none is available")
        device = torch.cuda.current_device()
    elif isinstance(device, (str, torch.device)):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"reserve_l2 reserves a CUDA device's L2 cache, got device {device}")
        device = torch.cuda.current_device() if device.index is None else device.index
    elif isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int, a torch.device or None, got {type(device).__name__}")
    if not torch.cuda.is_available() or not 0 <= device < torch.cuda.device_count():
        raise ValueError(f"no CUDA device {device} here ({torch.cuda.device_count()} visible)")
    if nbytes is None:
        nbytes = torch.cuda.get_device_properties(device).L2_cache_size  # capped to the device's maximum
    return int(torch.ops.rtindex_internal.reserve_l2(device, nbytes))
