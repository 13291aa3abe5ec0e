"""RXIndex: the RTIndeX of Henneberg and Schuhknecht — one triangle per key, lookups as rays.

On CUDA tensors the keys become triangles of an OptiX BVH and every lookup is a ray traced by OptiX; on CPU
tensors the same operators answer from a sorted copy of the keys (the reference implementation).

State and devices: :meth:`RXIndex.state_dict` holds the keys as the caller gave them plus the configuration,
never the BVH (an OptiX structure is tied to its device address); :meth:`RXIndex.from_state_dict`,
:meth:`RXIndex.load_state_dict` and :meth:`RXIndex.to` build a new BVH from those keys (torch_rtindex/_base.py
holds what every index shares).
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import OPTIX_CAPTURE_REASON, IndexBase, _ops, _optix_ops, check_bool, check_int, check_scene, format_bytes
from ._keys import resolve_key_type
from ._config import rx_config
from .index import KeyType
from .scene import RX_DEFAULT, SceneConfig

DEFAULT_MAX_RANGE_RAYS = 1024


class RXIndex(IndexBase):
    """A read-only index over a 1-D tensor of keys; row ID = position of the key in that tensor.

    Args:
        keys: 1-D contiguous tensor of int64, int32, float32, float64 or uint64 keys (CPU or CUDA).
            Duplicates are allowed; NaN is not. At most 2^32 - 1 keys.
        key_type: how to read the keys; inferred from the dtype, or ``"uint64"`` for unsigned values
            stored in an int64 tensor. Range lookups follow this type's order.
        scene: the key-bit split over the scene axes (default: the paper's 3D mode, 23/23/18 bits).
        allow_update: build an updatable (uncompacted) BVH so that :meth:`refit` can move keys in place.
        max_range_rays: a range lookup fires one ray per segment of the scene it touches (a row, or a
            quarter row: segments are at most 2^21 slots, see csrc/core/scene.h); a range needing more rays
            than this is answered by scanning the keys instead (same answer, cost O(n)).

    The index holds its own ordered copy of the keys: modifying ``keys`` in place afterwards changes neither the
    index nor its :meth:`state_dict` (call :meth:`rebuild` to index new values).
    Lookups work inside ``torch.compile(fullgraph=True)``; see the README for the CSR-returning ones. On CUDA
    every lookup is an OptiX launch, which cannot be captured in a CUDA graph (refused with an error).

    Lookups (shared by every index): :meth:`lookup`, :meth:`lookup_all`, :meth:`lookup_all_capped`,
    :meth:`range`, :meth:`range_capped`, :meth:`range_lookup`, :meth:`aggregate`, :meth:`range_aggregate`.
    """

    _OPS = "rx"
    range_rows_ascending = True
    # What state_dict() holds: plain tensors, strings, ints, bools and lists, so that
    # torch.load(..., weights_only=True) (the default) reads it back.
    _STATE_FORMAT = "torch_rtindex.RXIndex"
    _STATE_KEYS = ("keys", "key_type", "scene", "allow_update", "max_range_rays")
    _SETTINGS = IndexBase._SETTINGS | {"scene", "allow_update", "max_range_rays"}

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: KeyType | None = None,
        scene: SceneConfig | None = None,
        allow_update: bool = False,
        max_range_rays: int = DEFAULT_MAX_RANGE_RAYS,
    ) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        self.key_type = resolve_key_type(keys, key_type)
        self.key_dtype = keys.dtype
        self.device = keys.device
        self.scene = check_scene(scene, RX_DEFAULT)
        self.allow_update = check_bool(allow_update, "allow_update")
        self.max_range_rays = check_int(max_range_rays, "max_range_rays", 1, 2**31 - 1)
        self._build(keys)

    # ----------------------------------------------------------------------------------------------- build
    def _build(self, keys: torch.Tensor) -> None:
        ordered = self._map_keys(keys)
        self._keys = ordered
        self._structure = _optix_ops(self.device).rx_build(ordered, self.scene.as_list(), self.allow_update)
        self._note_keys(ordered)

    def _note_keys(self, ordered: torch.Tensor) -> None:
        """What the lookups need to know of the keys, from one sort: whether they are unique (a point lookup
        may then stop at its first hit) and their span (the query sort's bits)."""
        # On the CPU the structure is the sorted keys already (unsigned order; either order serves, see
        # query_sort_bits); on CUDA it is a BVH, so sort once here.
        s = self._structure[0] if self.device.type == "cpu" else torch.sort(ordered).values
        self.unique_keys = not bool((s[1:] == s[:-1]).any())
        self._note_key_span(s, already_sorted=True)
        self._prepare_lookups()

    def rebuild(self, keys: torch.Tensor) -> None:
        """Replaces the indexed keys (the paper's update path). All-or-nothing: on error the index is unchanged."""
        self._all_or_nothing(self._build, keys)

    def refit(self, keys: torch.Tensor) -> None:
        """Moves every key to a new value in place (OptiX refit); needs ``allow_update=True`` and the same count.

        Cheaper than :meth:`rebuild`, but the BVH keeps its old topology: lookups slow down when keys move far.
        """
        if not self.allow_update:
            raise RuntimeError("refit needs an index built with allow_update=True; use rebuild() otherwise")
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        if keys.numel() != self._keys.numel():
            raise ValueError(f"refit keeps the number of keys ({self._keys.numel()}), got {keys.numel()}")
        ordered = self._map_keys(keys)
        _ops().rx_refit(self._structure, ordered, self.scene.as_list())
        self._keys = ordered
        self._note_keys(ordered)

    # --------------------------------------------------------------------------------------------- lookups
    def _index_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self._structure, self._keys)

    def _config(self, key_type: str) -> int:
        return rx_config(key_type, self.unique_keys, self.max_range_rays, self.scene.as_list())

    def _traces_rays(self) -> bool:
        return True

    def _capture_refusal(self) -> str | None:
        return (
            f"every RX lookup is an OptiX launch, and {OPTIX_CAPTURE_REASON}; run the lookups outside the capture "
            "(torch.compile's default mode is fine), or use a CgRXIndex with backend='radix'"
        )

    # ---------------------------------------------------------------------------------- state and devices
    def state_dict(self) -> dict[str, Any]:
        """The indexed keys (as of the constructor, or the last :meth:`rebuild` / :meth:`refit`) plus the configuration.

        Holds no BVH: loading builds a new one. The ``"keys"`` entry is a new tensor exported from the index
        itself, in the key dtype, on the index's device, so the state equals the index even when the caller's
        key tensor was changed afterwards; everything else is a plain str/int/bool/list, so
        ``torch.save(index.state_dict(), f)`` and ``torch.load(f)`` (``weights_only=True``) round-trip it.
        """
        return super().state_dict()

    def _state_entries(self) -> dict[str, Any]:
        return {
            "keys": self._keys_from_ordered(self._keys),
            "key_type": self.key_type,
            "scene": self.scene.as_list(),
            "allow_update": self.allow_update,
            "max_range_rays": self.max_range_rays,
        }

    @classmethod
    def _from_valid_state(cls, state: dict[str, Any]) -> "RXIndex":
        return cls(
            state["keys"],
            key_type=state["key_type"],
            scene=SceneConfig(*state["scene"]),
            allow_update=state["allow_update"],
            max_range_rays=state["max_range_rays"],
        )

    # ----------------------------------------------------------------------------------------- reporting
    def __len__(self) -> int:
        return self._keys.numel()

    def memory(self) -> dict[str, int]:
        """Bytes held on the index's device, per part (the caller's key tensor, only referenced, not counted)."""
        part = "bvh" if self.device.type == "cuda" else "sorted_keys"
        return {part: self._structure.nbytes, "keys": self._keys.nbytes}

    def __repr__(self) -> str:
        mem = sum(self.memory().values())
        s = self.scene
        return (
            f"RXIndex(keys={len(self)}, key_type={self.key_type}, device={self.device}, "
            f"scene={s.bits_x}/{s.bits_y}/{s.bits_z}, unique={self.unique_keys}, "
            f"updatable={self.allow_update}, memory={format_bytes(mem)})"
        )
