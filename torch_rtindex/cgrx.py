"""CgRXIndex: the coarse-granular RTIndeX — sorted key/rowID buckets, one representative per bucket.

A lookup finds the bucket of the first representative >= key, searches that bucket and scans on for
duplicates and ranges. Finding that bucket is pluggable:

- ``"optix"``: closest-hit rays through a scene of the representatives, the default on GPUs with RT cores.
  ``representation="optimized"`` (default) is the paper's optimized scene (§3.3): every populated row and
  plane ends with a triangle at its last slot (a representative moved there or an inserted one), triangles
  alone in their row are flipped (seen as back faces); one ray where the key's row holds a representative,
  about two on sparse 64-bit keys, never more rays than ``"naive"`` on average in our measurements, and a third
  to almost half fewer triangles on sparse keys; ``"naive"`` (§3.2) adds row and plane markers at x = -1 instead, up to three rays;
- ``"radix"``: a table small enough to stay in L2 finds the 64-byte line of the bucket where the key's first
  match lies, so the bucket search reads one line instead of two or three: a slice of the key range narrows
  the search to about 16 lines, compared as 8-bit words (their last keys' offsets inside the slice). About 1.25
  bytes per line of pairs (4 pairs ``aligned_row``, 8 keys ``column``, 16 pairs ``packed_row``; per bucket
  where buckets are smaller); the default where the GPU has no RT cores (A100, H100, H200, B200) and on the
  CPU. Where no two keys are equal, point lookups stop at their first match;
- ``"binary_search"``: plain binary search over the representatives (the reference).

Every backend gives identical answers. The ``"radix"`` and ``"binary_search"`` backends are plain CUDA kernels
and can be captured in a CUDA graph; the ``"optix"`` backend's OptiX launches cannot (refused with an error).
"""

from __future__ import annotations

from typing import Any, Callable, get_args

import torch

from ._base import (OPTIX_CAPTURE_REASON, IndexBase, _ops, _optix_ops, check_int, check_scene, format_bytes,
                    query_sort_bits)
from ._keys import KEY_TYPES, resolve_key_type
from ._config import LAYOUT_CODES, REPRESENTATION_CODES, cgrx_config, check_option
from .index import Backend, BucketSearch, KeyType, Layout, PairsLayout, Representation
from .results import Lookup
from .scene import SceneConfig

CGRX_SCENE = SceneConfig(23, 23, 18, 15, 25)  # the paper's scaled mapping: y * 2^15, z * 2^25
LAYOUTS = {name: LAYOUT_CODES[name] for name in get_args(PairsLayout)}  # the read-only index's layouts


# Compute capabilities whose GPUs have no RT cores (V100; A100, A30; H100, H200, GH200; B200, GB200): there the
# default needs no answer from OptiX, whose first device context costs tens of milliseconds of a first build.
NO_RT_CORES = frozenset({(7, 0), (8, 0), (9, 0), (10, 0)})


def optix_rt_cores(device: torch.device) -> bool:
    """Whether OptiX reports RT cores on ``device`` (False where OptiX is not usable)."""
    from . import optix_info

    try:
        return bool(optix_info(device)["has_rt_cores"])
    except RuntimeError:
        return False  # no usable OptiX: the radix table needs none


def gpu_backend(capability: tuple[int, int], rt_cores: Callable[[], bool]) -> str:
    """OptiX rays on a GPU with RT cores, else the radix table. ``rt_cores`` (asking OptiX, whose first device
    context costs tens of milliseconds) is called only where the capability does not tell (:data:`NO_RT_CORES`)."""
    return "optix" if tuple(capability) not in NO_RT_CORES and rt_cores() else "radix"


def default_backend(device: torch.device) -> str:
    """The backend of ``backend="auto"`` on ``device``: :func:`gpu_backend` on a GPU, the radix table elsewhere."""
    if device.type != "cuda":
        return "radix"
    return gpu_backend(torch.cuda.get_device_capability(device), lambda: optix_rt_cores(device))


def default_layout(backend: str) -> str:
    """aligned_row for the radix table, whose lookups then read one 64-byte line of pairs; the paper's
    packed_row (the smallest) for the backends that search whole buckets."""
    return "aligned_row" if backend == "radix" else "packed_row"


class CgRXSearch(IndexBase):
    """What every cgRX index is made of besides its storage: the representative search that finds a key's bucket
    (``backend``: radix table, OptiX rays or binary search; representatives fixed at build), its OptiX scene
    where it traces rays, and the cgRX lookup operators. How the (key, row ID) pairs are stored is the other
    half, chosen by the class: sorted pairs in buckets (:class:`CgRXIndex`) or node chains that take updates
    (:class:`~torch_rtindex.UpdatableCgRXIndex`). Each class carries only the settings it honours."""

    _OPS = "cgrx"
    _RANGE_COUNT_OP = "cgrx_range_count"  # every backend: the count is found through the radix table, no rays
    range_rows_ascending = False
    _SETTINGS = IndexBase._SETTINGS | {"scene", "backend", "requested_backend", "bucket_size", "layout",
                                       "representation"}

    def _init_search(self, keys: torch.Tensor, key_type: KeyType | None, backend: Backend,
                     scene: SceneConfig | None) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        check_option(backend, "backend", Backend)
        self.key_type = resolve_key_type(keys, key_type)
        self.key_dtype = keys.dtype
        self.device = keys.device
        self.requested_backend = backend  # what state_dict() keeps: "auto" is resolved again where it is loaded
        self.backend = default_backend(self.device) if backend == "auto" else backend
        # On the CPU, "optix" means the rays' answer (the first representative >= key), by binary search.
        self.scene = check_scene(scene, CGRX_SCENE)

    def _index_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self._pairs, self._reps, self._table, self._scene)

    def _op_family(self) -> str:
        # The ray-tracing backend's operators carry the cudagraph_unsafe tag (csrc/ops.cpp says why).
        return "cgrx_optix" if self.backend == "optix" and self.device.type == "cuda" else "cgrx"

    def _traces_rays(self) -> bool:
        return self.backend == "optix"

    def _capture_refusal(self) -> str | None:
        if self.backend != "optix":
            return None  # plain CUDA kernels: capturable (verified with torch.cuda.graph replays)
        return (
            f"backend='optix' traces rays with OptiX, and {OPTIX_CAPTURE_REASON}; build the index with "
            "backend='radix' or 'binary_search' (same answers, plain CUDA kernels) to capture its lookups"
        )

    def _no_scene(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8, device=self.device)

    def __len__(self) -> int:
        return self._n

    def memory(self) -> dict[str, int]:
        """Bytes held on the index's device, per part (the caller's key tensor, only referenced, not counted)."""
        return {
            **self._storage_memory(),
            "representatives": self._reps.nbytes,
            "radix_table": self._table.nbytes,
            "bvh": self._scene.nbytes,
        }

    def _storage_memory(self) -> dict[str, int]:
        raise NotImplementedError


class CgRXIndex(CgRXSearch):
    """A read-only cgRX index over a 1-D tensor of keys; row ID = position of the key in that tensor.

    Args:
        keys: 1-D contiguous tensor of int64, int32, float32, float64 or uint64 keys (CPU or CUDA);
            duplicates allowed, NaN not, at most 2^32 - 1 keys.
        key_type: as for :class:`RXIndex` (``"uint64"`` reads int64 storage as unsigned).
        bucket_size: key/rowID pairs per bucket (default 16, the paper's recommendation).
        layout: ``"auto"`` (default), ``"packed_row"`` (12 bytes per pair), ``"aligned_row"`` (16: one lookup
            reads one 64-byte line, the fastest with the ``"radix"`` backend) or ``"column"``. ``"auto"`` is
            ``"aligned_row"`` with the ``"radix"`` backend (faster point lookups than packed_row for 4/3
            of its memory) and ``"packed_row"`` otherwise.
        bucket_search: ``"binary"`` (default) or ``"linear"``.
        backend: ``"auto"`` (default), ``"radix"``, ``"optix"`` or ``"binary_search"`` (see the module doc).
        scene: key-bit split and axis scales of the OptiX scene (default: 23/23/18 bits, y * 2^15, z * 2^25).
        representation: the OptiX scene's representation, ``"optimized"`` (default) or ``"naive"``; only the
            ``"optix"`` backend builds a scene, and every representation gives the same answers.

    Lookups (shared by every index): :meth:`lookup`, :meth:`lookup_all`, :meth:`lookup_all_capped`,
    :meth:`range`, :meth:`range_capped`, :meth:`range_lookup`, :meth:`aggregate`, :meth:`range_aggregate`.
    Range results come in (key, row ID) order. The index keeps no reference to ``keys``: :meth:`state_dict`
    exports the keys from the index itself.
    """

    _STATE_FORMAT = "torch_rtindex.CgRXIndex"
    _STATE_KEYS = ("keys", "key_type", "bucket_size", "layout", "bucket_search", "backend", "scene", "representation")
    _SETTINGS = CgRXSearch._SETTINGS | {"bucket_search", "requested_layout"}

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: KeyType | None = None,
        bucket_size: int = 16,
        layout: Layout = "auto",
        bucket_search: BucketSearch = "binary",
        backend: Backend = "auto",
        scene: SceneConfig | None = None,
        representation: Representation = "optimized",
    ) -> None:
        bucket_size = check_int(bucket_size, "bucket_size", 1, 2**30)
        check_option(layout, "layout", Layout)
        check_option(bucket_search, "bucket_search", BucketSearch)
        check_option(representation, "representation", Representation)
        self._init_search(keys, key_type, backend, scene)
        self.bucket_size = bucket_size
        self.bucket_search = bucket_search
        self.requested_layout = layout  # like the backend: "auto" is resolved again where a state is loaded
        self.layout = default_layout(self.backend) if layout == "auto" else layout
        self.representation = representation
        self._build(keys)

    def _build(self, keys: torch.Tensor) -> None:
        # The build maps the keys where its sort reads them: no ordered copy of them all (build memory).
        keys = self._check_build_keys(keys)
        ops = _ops()
        self._n = keys.numel()
        self._pairs, self._reps, self._table = ops.cgrx_build(keys, self.bucket_size, LAYOUTS[self.layout],
                                                              KEY_TYPES[self.key_type])
        self._record_input_uses((keys,))
        self.num_buckets = -(-self._n // self.bucket_size)
        if self.backend == "optix" and self.device.type == "cuda":
            self._scene = _optix_ops(self.device).cgrx_build_scene(
                self._reps, self.num_buckets, self.scene.as_list(), REPRESENTATION_CODES[self.representation],
                self._pairs, self.bucket_size, LAYOUTS[self.layout],
            )
        else:
            self._scene = self._no_scene()
        self._note_raw_key_span(keys)
        self._prepare_lookups()

    def rebuild(self, keys: torch.Tensor) -> None:
        """Replaces the indexed keys. All-or-nothing: on error the index is unchanged."""
        self._all_or_nothing(self._build, keys)

    # --------------------------------------------------------------------------------------------- lookups
    _cold = False  # see _from_structure

    def _config(self, key_type: str, spare_rows: bool = False) -> int:
        return cgrx_config(key_type, self.layout, self.bucket_size, self.bucket_search, self.backend, self.scene.as_list(),
                           spare_rows=spare_rows, cold=self._cold)

    # A second row per pair, for a sharded index's shard: its global rows, answered without a map.
    _spare: tuple[torch.Tensor, int, int] | None = None

    def _set_spare_rows(self, rows: torch.Tensor) -> bool:
        """Writes ``rows[row ID]`` (int64 below 2^32: the caller's promise) into every pair's spare word, so that
        :meth:`_spare_lookup` answers with those instead of row IDs. False (and nothing written) where the
        pairs have no spare word (a layout other than aligned_row) or ``rows`` is not one value per key here.
        A rebuild clears them (new pairs)."""
        self._spare = None
        if (self.layout != "aligned_row" or not isinstance(rows, torch.Tensor) or rows.dim() != 1
                or rows.numel() != self._n or rows.device != self.device):
            return False
        _ops().cgrx_set_spare_rows(self._pairs, LAYOUTS[self.layout], rows.to(torch.int64).contiguous())
        self._spare = (self._pairs, self._config(self.key_type, True), self._config("uint64", True))
        return True

    def _spare_lookup(self, lo: torch.Tensor, hi: torch.Tensor | None = None, key_type: str | None = None) -> Lookup | None:
        """``lookup(lo)`` / ``range_lookup(lo, hi)`` answered with the rows :meth:`_set_spare_rows` wrote (the
        smallest one per query: they must rise with the row IDs); None where those are gone (a rebuild).
        ``key_type``: point queries of another key type (:meth:`_point_call_as`)."""
        spare = self._spare
        if spare is None or spare[0] is not self._pairs:
            return None
        if key_type is not None:
            return Lookup(*self._point_call_as("lookup", lo, key_type, cfg=self._config(key_type, True)))
        return Lookup(*self._call("lookup", lo, hi, "range_lookup" if hi is not None else "lookup", configs=spare[1:]))

    # ---------------------------------------------------------------------------------- state and devices
    def _held_keys(self) -> torch.Tensor:
        """The keys in row order, read back from the sorted pairs (row IDs are the positions 0 .. n - 1)."""
        sorted_keys, rows = _ops().cgrx_pairs_export(self._pairs, LAYOUTS[self.layout])
        ordered = torch.empty_like(sorted_keys).index_copy_(0, rows, sorted_keys)
        return self._keys_from_ordered(ordered)

    def _state_entries(self) -> dict[str, Any]:
        """The indexed keys, exported from the pairs (as :meth:`RXIndex.state_dict`), and the configuration."""
        return {
            "keys": self._held_keys(),
            "key_type": self.key_type,
            "bucket_size": self.bucket_size,
            "layout": self.requested_layout,
            "bucket_search": self.bucket_search,
            "backend": self.requested_backend,
            "scene": self.scene.as_list(),
            "representation": self.representation,
        }

    @classmethod
    def _from_valid_state(cls, state: dict[str, Any]) -> "CgRXIndex":
        return cls(
            state["keys"],
            key_type=state["key_type"],
            bucket_size=state["bucket_size"],
            layout=state["layout"],
            bucket_search=state["bucket_search"],
            backend=state["backend"],
            scene=SceneConfig(*state["scene"]),
            representation=state["representation"],
        )

    # -------------------------------------------------------------------- structure tensors (ChunkedIndex)
    @classmethod
    def _from_structure(cls, pairs: torch.Tensor, reps: torch.Tensor, table: torch.Tensor, n: int, *,
                        key_type: str, key_dtype: torch.dtype, key_span: tuple[int, int] | None,
                        bucket_size: int = 16, layout: str = "packed_row", bucket_search: str = "binary",
                        backend: str = "radix", cold: bool = False) -> "CgRXIndex":
        """An index over structure tensors that ``cgrx_build`` made (on any device: the format is the same on
        the CPU and on CUDA), without rebuilding them: how :class:`~torch_rtindex.ChunkedIndex` serves a chunk
        from its pinned host copy or from its copy in the GPU cache. Only the backends that need no OptiX scene
        (bound to a device address); ``key_span`` is (smallest, largest) ordered key, for the query sort;
        ``cold``: the structure is not in the CPU's caches when a lookup starts (the CPU kernels prefetch)."""
        if backend not in ("radix", "binary_search"):
            raise ValueError(f"an index over prebuilt structure needs backend 'radix' or 'binary_search', got {backend!r}")
        self = cls.__new__(cls)
        self.key_type, self.key_dtype, self.device = key_type, key_dtype, pairs.device
        self.bucket_size, self.bucket_search = bucket_size, bucket_search
        self.requested_backend = self.backend = backend
        self.requested_layout = self.layout = layout
        self.scene, self.representation = CGRX_SCENE, "optimized"
        self._n = int(n)
        self._pairs, self._reps, self._table = pairs, reps, table
        self._scene = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.num_buckets = -(-self._n // bucket_size)
        self._query_bits = (0, 0) if key_span is None else query_sort_bits(*key_span)
        self._cold = cold
        self._prepare_lookups()
        return self

    # ----------------------------------------------------------------------------------------- reporting
    def _storage_memory(self) -> dict[str, int]:
        """Bytes of the sorted (key, row ID) pairs."""
        return {"pairs": self._pairs.nbytes}

    def __repr__(self) -> str:
        mem = sum(self.memory().values())
        return (
            f"CgRXIndex(keys={self._n}, key_type={self.key_type}, device={self.device}, "
            f"bucket_size={self.bucket_size}, buckets={self.num_buckets}, layout={self.layout}, "
            f"bucket_search={self.bucket_search}, backend={self.backend}, memory={format_bytes(mem)})"
        )
