"""RXIndex: the RTIndeX of Henneberg and Schuhknecht — one triangle per key, lookups as rays.

On CUDA tensors the keys become triangles of an OptiX BVH and every lookup is a ray traced by OptiX; on CPU
tensors the same operators answer from a sorted copy of the keys (the reference implementation).

State and devices: :meth:`RXIndex.state_dict` holds the keys as the caller gave them plus the configuration,
never the BVH (an OptiX structure is tied to its device address); :meth:`RXIndex.from_state_dict`,
:meth:`RXIndex.load_state_dict` and :meth:`RXIndex.to` build a new BVH from those keys.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _extension
from ._keys import MAX_KEYS, KEY_TYPES, check_key_tensor, resolve_key_type
from .results import Aggregate, Lookup, Matches
from .scene import RX_DEFAULT, SceneConfig

DEFAULT_MAX_RANGE_RAYS = 1024

# What state_dict() holds: plain tensors, strings, ints, bools and lists, so that
# torch.load(..., weights_only=True) (the default) reads it back.
_STATE_FORMAT = "torch_rtindex.RXIndex"
_STATE_VERSION = 1
_STATE_KEYS = ("format", "version", "keys", "key_type", "scene", "allow_update", "max_range_rays")


def _version_counter(t: torch.Tensor) -> int | None:
    """A tensor's in-place modification counter (None for inference tensors, which have none)."""
    try:
        return t._version
    except RuntimeError:
        return None


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

    The index keeps a reference to ``keys`` (no copy) for :meth:`state_dict`; modifying that tensor in place
    afterwards does not change the index (call :meth:`rebuild`), and :meth:`state_dict` then refuses to save it.
    Lookups work inside ``torch.compile(fullgraph=True)``; see the README for the CSR-returning ones.
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
        self._set_source(keys)

    def _set_source(self, keys: torch.Tensor) -> None:
        self._source = keys  # the caller's tensor, as given, for state_dict()
        self._source_version = _version_counter(keys)

    def rebuild(self, keys: torch.Tensor) -> None:
        """Replaces the indexed keys (the paper's update path). All-or-nothing: on error the index is unchanged."""
        old = (self._keys, self._structure, self.unique_keys, self._source, self._source_version)
        try:
            self._build(keys)
        except BaseException:
            self._keys, self._structure, self.unique_keys, self._source, self._source_version = old
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
        self._set_source(keys)
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
        eager_cuda = self.device.type == "cuda" and not torch.compiler.is_compiling()
        if eager_cuda and torch.cuda.is_current_stream_capturing():
            # Capturing an OptiX launch fails inside OptiX with an illegal memory access that poisons the CUDA
            # context for the rest of the process (seen on an H100): refuse before that happens.
            raise RuntimeError(
                "RX lookups on CUDA cannot be captured in a CUDA graph (torch.cuda.graph, or torch.compile with "
                "mode='reduce-overhead'); run them outside the capture, e.g. with torch.compile's default mode"
            )
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

    # ---------------------------------------------------------------------------------- state and devices
    def state_dict(self) -> dict[str, Any]:
        """The keys as given to the constructor (or the last :meth:`rebuild` / :meth:`refit`) plus the configuration.

        Holds no BVH: loading builds a new one. The ``"keys"`` entry is the caller's tensor itself (not a copy),
        with its dtype and device; everything else is a plain str/int/bool/list, so
        ``torch.save(index.state_dict(), f)`` and ``torch.load(f)`` (``weights_only=True``) round-trip it.

        Raises:
            RuntimeError: the key tensor was modified in place after the index was built from it, so it no
                longer holds the keys this index answers for.
        """
        if self._source_version is not None and _version_counter(self._source) != self._source_version:
            raise RuntimeError(
                "the key tensor this index was built from was modified in place afterwards, so it no longer holds "
                "the indexed keys; call index.rebuild(keys) to index the new values, or save before modifying"
            )
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "keys": self._source,
            "key_type": self.key_type,
            "scene": self.scene.as_list(),
            "allow_update": self.allow_update,
            "max_range_rays": self.max_range_rays,
        }

    @staticmethod
    def _options_from_state(state: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(state, dict):
            raise TypeError(f"an RXIndex state is a dict (from RXIndex.state_dict()), got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        unexpected = sorted(str(k) for k in state if k not in _STATE_KEYS)
        if missing or unexpected:
            raise KeyError(f"not an RXIndex state: missing entries {missing}, unexpected entries {unexpected}")
        if state["format"] != _STATE_FORMAT or state["version"] != _STATE_VERSION:
            raise ValueError(
                f"not an RXIndex state of version {_STATE_VERSION}: format {state['format']!r}, "
                f"version {state['version']!r}"
            )
        if not isinstance(state["keys"], torch.Tensor):
            raise TypeError(f"the state's keys must be a tensor, got {type(state['keys']).__name__}")
        return {
            "key_type": state["key_type"],
            "scene": SceneConfig(*state["scene"]),
            "allow_update": state["allow_update"],
            "max_range_rays": state["max_range_rays"],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], device: torch.device | str | None = None) -> "RXIndex":
        """A new index built from :meth:`state_dict`'s output, on ``device`` (default: where the state's keys are)."""
        options = cls._options_from_state(state)
        keys = state["keys"] if device is None else state["keys"].to(device)
        return cls(keys, **options)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces this index by the one ``state`` describes, built on this index's device.

        All-or-nothing: if the state is malformed or its keys are rejected, the index is unchanged.
        """
        options = self._options_from_state(state)
        fresh = type(self)(state["keys"].to(self.device), **options)
        self.__dict__.update(fresh.__dict__)

    def to(self, device: torch.device | str | int) -> "RXIndex":
        """The index on ``device``: a new index built there from the keys, or ``self`` if it is there already.

        The BVH is rebuilt rather than copied (an OptiX structure is bound to its device address).
        """
        keys = self._source.to(device)
        if keys.device == self.device:
            return self
        return type(self).from_state_dict({**self.state_dict(), "keys": keys})

    def cpu(self) -> "RXIndex":
        """The index on the CPU (see :meth:`to`)."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None) -> "RXIndex":
        """The index on a CUDA device, the current one by default (see :meth:`to`)."""
        if device is None:
            return self.to("cuda")
        return self.to(device if isinstance(device, (torch.device, str)) else torch.device("cuda", device))

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (torch.save(index), copy.deepcopy) goes through state_dict: the BVH is rebuilt, never copied.
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(type(self).from_state_dict(state).__dict__)

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
            f"updatable={self.allow_update}, memory={mem / 2**20:.1f} MiB)"
        )
