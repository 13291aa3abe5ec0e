"""CgRXIndex: the coarse-granular RTIndeX — sorted key/rowID buckets, one representative per bucket.

A lookup finds the bucket of the first representative >= key, searches that bucket and scans on for
duplicates and ranges. Finding that bucket is pluggable:

- ``"optix"``: closest-hit rays through a scene of the representatives, the default on GPUs with RT cores.
  ``representation="optimized"`` (default) is the paper's optimized scene (§3.3): every populated row and
  plane ends with a triangle at its last slot (a representative moved there or an inserted one), triangles
  alone in their row are flipped (seen as back faces), usually one or two rays; ``"naive"`` (§3.2) adds row
  and plane markers at x = -1 instead, up to three rays;
- ``"radix"``: a radix table over the representatives' key range narrows the search to about one
  representative, read from L2 with the table (a few bytes per representative); the default where the GPU has
  no RT cores (A100, H100, H200, B200) and on the CPU;
- ``"binary_search"``: plain binary search over the representatives (the reference).

Every backend gives identical answers.
"""

from __future__ import annotations

import torch

from . import _extension
from ._keys import KEY_TYPES, MAX_KEYS, check_key_tensor, resolve_key_type
from .results import Aggregate, Lookup, Matches
from .scene import SceneConfig

CGRX_SCENE = SceneConfig(23, 23, 18, 15, 25)  # the paper's scaled mapping: y * 2^15, z * 2^25
LAYOUTS = {"packed_row": 0, "aligned_row": 1, "column": 2}
BACKENDS = {"radix": 0, "optix": 1, "binary_search": 2}
BUCKET_SEARCHES = ("binary", "linear")
REPRESENTATIONS = {"naive": 0, "optimized": 1}


def _ops():
    _extension.load()
    return torch.ops.rtindex


def default_backend(device: torch.device) -> str:
    """OptiX rays where the GPU has RT cores, the radix table everywhere else."""
    if device.type == "cuda":
        from . import optix_info

        try:
            if optix_info(device)["has_rt_cores"]:
                return "optix"
        except RuntimeError:
            pass  # no usable OptiX: the radix table needs none
    return "radix"


class CgRXIndex:
    """A read-only cgRX index over a 1-D tensor of keys; row ID = position of the key in that tensor.

    Args:
        keys: 1-D contiguous tensor of int64, int32, float32, float64 or uint64 keys (CPU or CUDA);
            duplicates allowed, NaN not, at most 2^32 - 1 keys.
        key_type: as for :class:`RXIndex` (``"uint64"`` reads int64 storage as unsigned).
        bucket_size: key/rowID pairs per bucket (default 16, the paper's recommendation).
        layout: ``"packed_row"`` (12 bytes per pair, default), ``"aligned_row"`` (16) or ``"column"``.
        bucket_search: ``"binary"`` (default) or ``"linear"``.
        backend: ``"auto"`` (default), ``"radix"``, ``"optix"`` or ``"binary_search"`` (see the module doc).
        scene: key-bit split and axis scales of the OptiX scene (default: 23/23/18 bits, y * 2^15, z * 2^25).
        representation: the OptiX scene's representation, ``"optimized"`` (default) or ``"naive"``; only the
            ``"optix"`` backend builds a scene, and every representation gives the same answers.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        bucket_size: int = 16,
        layout: str = "packed_row",
        bucket_search: str = "binary",
        backend: str = "auto",
        scene: SceneConfig | None = None,
        representation: str = "optimized",
    ) -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"keys must be a torch.Tensor, got {type(keys).__name__}")
        if not isinstance(bucket_size, int) or not 1 <= bucket_size <= 2**30:
            raise ValueError(f"bucket_size must be an integer in 1 .. 2^30, got {bucket_size!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        if bucket_search not in BUCKET_SEARCHES:
            raise ValueError(f"bucket_search must be one of {BUCKET_SEARCHES}, got {bucket_search!r}")
        if backend != "auto" and backend not in BACKENDS:
            raise ValueError(f"backend must be 'auto' or one of {sorted(BACKENDS)}, got {backend!r}")
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation must be one of {sorted(REPRESENTATIONS)}, got {representation!r}")
        self.key_type = resolve_key_type(keys, key_type)
        self.key_dtype = keys.dtype
        self.device = keys.device
        self.bucket_size = bucket_size
        self.layout = layout
        self.bucket_search = bucket_search
        self.backend = default_backend(self.device) if backend == "auto" else backend
        # On the CPU, "optix" means the rays' answer (the first representative >= key), by binary search.
        self.scene = scene or CGRX_SCENE
        self.representation = representation
        self._build(keys)

    def _build(self, keys: torch.Tensor) -> None:
        check_key_tensor(keys, "keys", dtype=self.key_dtype, device=self.device)
        if keys.numel() > MAX_KEYS:
            raise ValueError(f"an index holds at most 2^32 - 1 keys, got {keys.numel()}")
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError("keys contain NaN, which has no place in a key order; drop or replace those rows")
        ops = _ops()
        ordered = ops.map_keys(keys, KEY_TYPES[self.key_type])
        self._n = ordered.numel()
        self._pairs, self._reps, self._table = ops.cgrx_build(ordered, self.bucket_size, LAYOUTS[self.layout])
        self.num_buckets = -(-self._n // self.bucket_size)
        if self.backend == "optix" and self.device.type == "cuda":
            self._scene = ops.cgrx_build_scene(
                self._reps, self.num_buckets, self.scene.as_list(), REPRESENTATIONS[self.representation],
                self._pairs, self.bucket_size, LAYOUTS[self.layout],
            )
        else:
            self._scene = torch.empty(0, dtype=torch.uint8, device=self.device)

    def rebuild(self, keys: torch.Tensor) -> None:
        """Replaces the indexed keys. All-or-nothing: on error the index is unchanged."""
        old = (self._n, self._pairs, self._reps, self._table, self._scene, self.num_buckets)
        try:
            self._build(keys)
        except BaseException:
            self._n, self._pairs, self._reps, self._table, self._scene, self.num_buckets = old
            raise

    # --------------------------------------------------------------------------------------------- lookups
    def _args(self, lo: torch.Tensor, hi: torch.Tensor | None):
        ops = _ops()
        if hi is None:
            check_key_tensor(lo, "queries", dtype=self.key_dtype, device=self.device)
            qlo, qhi = ops.map_keys(lo, KEY_TYPES[self.key_type]), None
        else:
            check_key_tensor(lo, "lo", dtype=self.key_dtype, device=self.device)
            check_key_tensor(hi, "hi", dtype=self.key_dtype, device=self.device)
            if lo.numel() != hi.numel():
                raise ValueError(f"lo and hi must have the same length, got {lo.numel()} and {hi.numel()}")
            qlo, qhi = ops.map_ranges(lo, hi, KEY_TYPES[self.key_type])
        return (
            self._pairs, self._reps, self._table, self._scene, qlo, qhi, self.bucket_size, LAYOUTS[self.layout],
            self.bucket_search == "linear", self.scene.as_list(), BACKENDS[self.backend],
        )

    def _values(self, values: torch.Tensor) -> torch.Tensor:
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or values.numel() != self._n:
            raise ValueError(f"values must be a 1-D tensor with one value per key ({self._n})")
        if values.device != self.device:
            raise ValueError(f"values are on {values.device} but the index is on {self.device}")
        if values.dtype not in (torch.int32, torch.int64, torch.float32, torch.float64):
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")
        return values.contiguous()

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups: per query the smallest matching row ID (-1 on a miss) and the match count."""
        return Lookup(*_ops().cgrx_lookup(*self._args(queries, None)))

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Point lookups returning every matching row ID (duplicates) as CSR, ascending row IDs."""
        return Matches(*_ops().cgrx_lookup_csr(*self._args(queries, None)))

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Range lookups [lo[i], hi[i]] (inclusive), every row ID as CSR in (key, row ID) order."""
        return Matches(*_ops().cgrx_lookup_csr(*self._args(lo, hi)))

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups answered as (smallest matching row ID or -1, match count)."""
        return Lookup(*_ops().cgrx_lookup(*self._args(lo, hi)))

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Point lookups answered as (match count, sum of ``values[row]`` over the matches)."""
        return Aggregate(*_ops().cgrx_aggregate(*self._args(queries, None), self._values(values)))

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Range lookups answered as (match count, sum of ``values[row]`` over the matches)."""
        return Aggregate(*_ops().cgrx_aggregate(*self._args(lo, hi), self._values(values)))

    # ----------------------------------------------------------------------------------------- reporting
    def __len__(self) -> int:
        return self._n

    def memory(self) -> dict[str, int]:
        """Bytes held on the index's device, per part."""
        return {
            "pairs": self._pairs.nbytes,
            "representatives": self._reps.nbytes,
            "radix_table": self._table.nbytes,
            "bvh": self._scene.nbytes,
        }

    def __repr__(self) -> str:
        mem = sum(self.memory().values())
        return (
            f"CgRXIndex(keys={self._n}, key_type={self.key_type}, device={self.device}, "
            f"bucket_size={self.bucket_size}, buckets={self.num_buckets}, layout={self.layout}, "
            f"bucket_search={self.bucket_search}, backend={self.backend}, memory={mem / 2**20:.1f} MiB)"
        )
