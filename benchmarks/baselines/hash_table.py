"""The project's own GPU hash-table baseline for the benchmarks (see hash_table.cu): open addressing, load
factor 0.8, cooperative probing in groups of 8, 64-bit keys. Compiled just in time on first use."""

from __future__ import annotations

from pathlib import Path

import torch

from . import load_baseline

_module = None


def _load():
    global _module
    if _module is None:
        _module = load_baseline("rtindex_hash_table_baseline", Path(__file__).with_name("hash_table.cu"))
    return _module


class HashTable:
    """Unique int64 keys -> row IDs (positions). The key -1 (2^64 - 1 as unsigned) is reserved as 'empty'."""

    def __init__(self, keys: torch.Tensor, load_factor: float = 0.8) -> None:
        if bool((keys == -1).any()):
            raise ValueError("the baseline hash table reserves the key -1 as its empty marker")
        self.table = _load().build(keys.contiguous(), load_factor)

    def lookup(self, queries: torch.Tensor) -> torch.Tensor:
        return _load().lookup(self.table, queries.contiguous())

    def nbytes(self) -> int:
        return self.table.nbytes
