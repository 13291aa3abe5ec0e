"""RXIndex: the RTIndeX of Henneberg and Schuhknecht — one triangle per key, lookups as rays.

On CUDA tensors the keys become triangles of an OptiX BVH and every lookup is a ray traced by OptiX; on CPU
tensors the same operators answer from a sorted copy of the keys (the reference implementation).
"""

from __future__ import annotations

import torch

from . import _extension
from ._keys import MAX_KEYS, KEY_TYPES, check_key_tensor, resolve_key_type
from .results import Aggregate, Lookup, Matches
from .scene import RX_DEFAULT, SceneConfig

DEFAULT_MAX_RANGE_RAYS = 1024


def _ops():
    _extension.load()
    return torch.ops.rtindex


class RXIndex:
    """A read-only index over a 1-D tensor of keys; row ID = position of the key in that tensor.

    Args:
        keys: 1-D contiguous tensor of int64, int32, float32, float64 or uint64 keys (CPU or CUDA).
            Duplicates are allowed; NaN is not. At most 2^32 - 1 keys.
        key_type: how to read the keys; inferred from the dtype, or ``"uint64"`` for unsigned values
            stored in an int64 tensor. Range lookups follow this type's order.
        scene: the key-bit split over the scene axes (default: the paper's 3D mode, 23/23/18 bits).
        allow_update: build an updatable (uncompacted) BVH so that :meth:`refit` can move keys in place.
        max_range_rays: a range lookup fires one ray per row of the scene it touches; a range spanning more
            rows than this is answered by scanning the keys instead (same answer, cost O(n)).
    """

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        scene: SceneConfig | None = None,
        allow_update: bool = False,
        max_range_rays: int = DEFAULT_MAX_RANGE_RAYS,
    ) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        self.key_type = resolve_key_type(keys, key_type)
        self.key_dtype = keys.dtype
        self.device = keys.device
        self.scene = scene or RX_DEFAULT
        self.allow_update = bool(allow_update)
        if int(max_range_rays) < 1:
            raise ValueError(f"max_range_rays must be at least 1, got {max_range_rays}")
        self.max_range_rays = int(max_range_rays)
        self._build(keys)

    # ----------------------------------------------------------------------------------------------- build
    def _map_keys(self, keys: torch.Tensor) -> torch.Tensor:
        check_key_tensor(keys, "keys", dtype=self.key_dtype, device=self.device)
        if keys.numel() > MAX_KEYS:
            raise ValueError(f"an index holds at most 2^32 - 1 keys, got {keys.numel()}")
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError("keys contain NaN, which has no place in a key order; drop or replace those rows")
        return _ops().map_keys(keys, KEY_TYPES[self.key_type])

    def _build(self, keys: torch.Tensor) -> None:
        ordered = self._map_keys(keys)
        if ordered.numel() > 1:
            s = torch.sort(ordered).values
            self.unique_keys = not bool((s[1:] == s[:-1]).any())
        else:
            self.unique_keys = True
        self._keys = ordered
        self._structure = _ops().rx_build(ordered, self.scene.as_list(), self.allow_update)

    def rebuild(self, keys: torch.Tensor) -> None:
        """Replaces the indexed keys (the paper's update path). All-or-nothing: on error the index is unchanged."""
        old = (self._keys, self._structure, self.unique_keys)
        try:
            self._build(keys)
        except BaseException:
            self._keys, self._structure, self.unique_keys = old
            raise

    def refit(self, keys: torch.Tensor) -> None:
        """Moves every key to a new value in place (OptiX refit); needs ``allow_update=True`` and the same count.

        Cheaper than :meth:`rebuild`, but the BVH keeps its old topology: lookups slow down when keys move far.
        """
        if not self.allow_update:
            raise RuntimeError("refit needs an index built with allow_update=True; use rebuild() otherwise")
        if keys.numel() != self._keys.numel():
            raise ValueError(f"refit keeps the number of keys ({self._keys.numel()}), got {keys.numel()}")
        ordered = self._map_keys(keys)
        _ops().rx_refit(self._structure, ordered, self.scene.as_list())
        self._keys = ordered
        if ordered.numel() > 1:
            s = torch.sort(ordered).values
            self.unique_keys = not bool((s[1:] == s[:-1]).any())

    # --------------------------------------------------------------------------------------------- lookups
    def _queries(self, lo: torch.Tensor, hi: torch.Tensor | None):
        if hi is None:
            check_key_tensor(lo, "queries", dtype=self.key_dtype, device=self.device)
            return _ops().map_keys(lo, KEY_TYPES[self.key_type]), None
        check_key_tensor(lo, "lo", dtype=self.key_dtype, device=self.device)
        check_key_tensor(hi, "hi", dtype=self.key_dtype, device=self.device)
        if lo.numel() != hi.numel():
            raise ValueError(f"lo and hi must have the same length, got {lo.numel()} and {hi.numel()}")
        return _ops().map_ranges(lo, hi, KEY_TYPES[self.key_type])

    def _args(self, lo, hi):
        qlo, qhi = self._queries(lo, hi)
        return (self._structure, self._keys, qlo, qhi, self.scene.as_list(), self.unique_keys, self.max_range_rays)

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups: per query the smallest matching row ID (-1 on a miss) and the match count."""
        return Lookup(*_ops().rx_lookup(*self._args(queries, None)))

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Point lookups returning every matching row ID (duplicates), as CSR in ascending row order."""
        return Matches(*_ops().rx_lookup_csr(*self._args(queries, None)))

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Range lookups [lo[i], hi[i]] (inclusive; empty when lo > hi), every row ID, CSR in ascending row order."""
        return Matches(*_ops().rx_lookup_csr(*self._args(lo, hi)))

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups answered as (smallest matching row ID or -1, match count)."""
        return Lookup(*_ops().rx_lookup(*self._args(lo, hi)))

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Point lookups answered as (match count, sum of ``values[row]`` over the matches)."""
        return Aggregate(*_ops().rx_aggregate(*self._args(queries, None), self._values(values)))

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Range lookups answered as (match count, sum of ``values[row]`` over the matches)."""
        return Aggregate(*_ops().rx_aggregate(*self._args(lo, hi), self._values(values)))

    def _values(self, values: torch.Tensor) -> torch.Tensor:
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or values.numel() != self._keys.numel():
            raise ValueError(f"values must be a 1-D tensor with one value per key ({self._keys.numel()})")
        if values.device != self.device:
            raise ValueError(f"values are on {values.device} but the index is on {self.device}")
        if values.dtype not in (torch.int32, torch.int64, torch.float32, torch.float64):
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")
        return values.contiguous()

    # ----------------------------------------------------------------------------------------- reporting
    def __len__(self) -> int:
        return self._keys.numel()

    def memory(self) -> dict[str, int]:
        """Bytes held on the index's device, per part."""
        part = "bvh" if self.device.type == "cuda" else "sorted_keys"
        return {part: self._structure.nbytes, "keys": self._keys.nbytes}

    def __repr__(self) -> str:
        mem = sum(self.memory().values())
        s = self.scene
        return (
            f"RXIndex(keys={len(self)}, key_type={self.key_type}, device={self.device}, "
            f"scene={s.bits_x}/{s.bits_y}/{s.bits_z}, unique={self.unique_keys}, "
            f"updatable={self.allow_update}, memory={mem / 2**20:.1f} MiB)"
        )
