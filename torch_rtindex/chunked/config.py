"""ChunkedConfig: every option of a :class:`~torch_rtindex.ChunkedIndex`, typed and checked where it is given.

The constructor, :meth:`ChunkedIndex.open` and :meth:`ChunkedIndex.from_state_dict` make one; options that may
change between batches (``processors``, ``critical_mass``, ``read_in_place``, ``hot_sample``,
``pipeline_depth``, ``in_place_window``) are set on the index, which checks them the same way
(:meth:`ChunkedConfig.replace`).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from .._base import resolve_device
from ..cgrx import LAYOUTS, default_layout
from ..cgrx_updatable import _check_growth

Processors = Literal["auto", "gpu", "cpu", "zero_copy"]
Eviction = Literal["demand", "lru"]
ChunkBackend = Literal["radix", "binary_search"]
ChunkLayout = Literal["packed_row", "aligned_row", "column"]

PROCESSORS: tuple[str, ...] = get_args(Processors)
EVICTIONS: tuple[str, ...] = get_args(Eviction)
BACKENDS: tuple[str, ...] = get_args(ChunkBackend)
assert set(get_args(ChunkLayout)) == set(LAYOUTS), "ChunkLayout must name every read-only cgRX layout"

# Bytes of GPU memory a cache slab may ask for: beyond any device, and a clear error before the allocator's.
MAX_GPU_BUDGET = 1 << 50


def _integer(value: Any, name: str, lo: int, hi: int | None = None, hint: str = "") -> int:
    """An integer option (int, numpy integer, 0-d integer tensor; never a bool) in [lo, hi]."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer (or a 0-d integer tensor), got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        value = int(value)
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    v = operator.index(value)
    if v < lo or (hi is not None and v > hi):
        bound = f"at least {lo}" if hi is None else f"in {lo} .. {hi}"
        raise ValueError(f"{name} must be {bound}, got {v}{hint}")
    return v


def _choice(value: Any, name: str, choices: tuple[str, ...], why: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}{why}")
    return value


def _optional_bool(value: Any, name: str, what: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be None ({what}), True or False, got {value!r}")
    return value


def check_device(device: Any) -> torch.device:
    """The cache's device: given, or CUDA where available, else the CPU; an unavailable CUDA is a clear error."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        wanted = torch.device("cuda", device) if isinstance(device, int) and not isinstance(device, bool) \
            else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu' or 'cuda' (or a torch.device), got {device!r}") from e
    if wanted.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {wanted}")
    if wanted.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but CUDA is not available here; pass device='cpu'")
        if wanted.index is not None and not 0 <= wanted.index < torch.cuda.device_count():
            raise ValueError(f"device={wanted} does not exist: this machine has {torch.cuda.device_count()} "
                             "CUDA devices")
    return resolve_device(wanted)


@dataclass(frozen=True)
class ChunkedConfig:
    """The options of a ChunkedIndex (see :class:`~torch_rtindex.ChunkedIndex` for what each does).

    Checked at construction; ``None`` fields that depend on the machine (``device``, ``gpu_budget``,
    ``backend``, ``layout``) are chosen by :meth:`resolved`.

    Attributes:
        chunk_bytes: target bytes per chunk (at least 1024).
        gpu_budget: bytes on ``device`` for the cache, the hot tier and kept search parts; None: half the free
            GPU memory on CUDA, 0 on the CPU.
        device: the cache's device, ``"cuda"`` (default where available) or ``"cpu"``.
        bucket_size: each chunk's cgRX bucket size (1 .. 65536).
        layout: each chunk's pair layout; None: by backend, as :class:`~torch_rtindex.CgRXIndex` chooses.
        backend: ``"radix"`` or ``"binary_search"``; None: by device, as CgRXIndex chooses (never OptiX).
        processors: who serves the queues: ``"auto"``, ``"gpu"``, ``"cpu"`` or ``"zero_copy"``.
        critical_mass: None (planned by measured rates) or a queue size from which the GPU takes a queue.
        eviction: the cache's policy, ``"demand"`` or ``"lru"``.
        pipeline_depth: queues the GPU has in flight at once (1 ..).
        hot_keys: the hot tier's capacity in keys; None: automatic; 0: off.
        hot_sample: queries per batch the hot tier learns from; None: by the queries' device.
        updatable: chunks of node chains updated in place (True) or sorted pairs rebuilt by updates (False).
        node_size, growth: the node chunks' pairs per node (even, 2 .. 4096) and spare node space (1 .. 16).
        read_in_place: whether the planner may have the GPU read a small queue's chunk in pinned host memory;
            None: where the chunks are pinned and the cache is on CUDA.
        in_place_window: lookups in flight at once when the GPU reads a key-sorted batch's queues in place in
            one launch (0: no limit).
        cpu_group_queries: the CPU worker answers small point queues in groups of about this many queries, one
            call over all cores (a queue alone would pay its call and a parallel region).
        build_sort_keys: keys the build sorts at once (its splitter ranges); None: from ``gpu_budget`` on CUDA,
            every key on the CPU. Bounds the build's memory for key sets larger than it; keys that fit one chunk
            are not sorted at all.
        progress: a progress bar for long builds (None: when stderr is a terminal).
    """

    chunk_bytes: int = 256 << 20
    gpu_budget: int | None = None
    device: torch.device | str | None = None
    bucket_size: int = 16
    layout: ChunkLayout | None = None
    backend: ChunkBackend | None = None
    processors: Processors = "auto"
    critical_mass: int | None = None
    eviction: Eviction = "demand"
    pipeline_depth: int = 2
    hot_keys: int | None = None
    hot_sample: int | None = None
    updatable: bool = False
    node_size: int = 32
    growth: float = 1.25
    read_in_place: bool | None = None
    in_place_window: int = 1 << 14
    cpu_group_queries: int = 1 << 16
    build_sort_keys: int | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        fix = object.__setattr__  # normalized values (a 0-d tensor or numpy integer as an int) on a frozen class
        fix(self, "chunk_bytes", _integer(self.chunk_bytes, "chunk_bytes", 1024))
        if self.gpu_budget is not None:
            fix(self, "gpu_budget", _integer(self.gpu_budget, "gpu_budget", 0, MAX_GPU_BUDGET,
                                             " bytes; pass the bytes of device memory the cache may use"))
        if self.device is not None and not isinstance(self.device, (torch.device, str, int)):
            raise TypeError(f"device must be 'cpu', 'cuda' or a torch.device, got {type(self.device).__name__}")
        fix(self, "bucket_size", _integer(self.bucket_size, "bucket_size", 1, 2**16))
        if self.layout is not None:
            _choice(self.layout, "layout", get_args(ChunkLayout))
        if self.backend is not None:
            _choice(self.backend, "backend", BACKENDS, " (chunks move between host and GPU, and an OptiX scene is "
                    "bound to its device address)")
        _choice(self.processors, "processors", PROCESSORS)
        if self.critical_mass is not None:
            fix(self, "critical_mass", _integer(self.critical_mass, "critical_mass", 0, None,
                                                " (queries per queue; None plans by measured rates)"))
        _choice(self.eviction, "eviction", EVICTIONS)
        fix(self, "pipeline_depth", _integer(self.pipeline_depth, "pipeline_depth", 1, 1 << 10))
        if self.hot_keys is not None:
            fix(self, "hot_keys", _integer(self.hot_keys, "hot_keys", 0, None, " (None: automatic; 0: no hot tier)"))
        if self.hot_sample is not None:
            fix(self, "hot_sample", _integer(self.hot_sample, "hot_sample", 1, None, " (None: by device)"))
        if not isinstance(self.updatable, bool):
            raise TypeError(f"updatable must be True or False, got {self.updatable!r}")
        node_size = _integer(self.node_size, "node_size", 2, 4096)
        if node_size % 2:
            raise ValueError(f"node_size must be an even integer in 2 .. 4096, got {node_size}")
        fix(self, "node_size", node_size)
        fix(self, "growth", _check_growth(self.growth))
        _optional_bool(self.read_in_place, "read_in_place", "automatic")
        fix(self, "in_place_window", _integer(self.in_place_window, "in_place_window", 0, None, " (0: no limit)"))
        fix(self, "cpu_group_queries", _integer(self.cpu_group_queries, "cpu_group_queries", 1))
        if self.build_sort_keys is not None:
            fix(self, "build_sort_keys", _integer(self.build_sort_keys, "build_sort_keys", 1))
        _optional_bool(self.progress, "progress", "when stderr is a terminal")

    def replace(self, **changes: Any) -> "ChunkedConfig":
        """A copy with ``changes``, checked as at construction."""
        return dataclasses.replace(self, **changes)

    def resolved(self) -> "ChunkedConfig":
        """The machine-dependent defaults chosen: the device, the budget, the backend and the layout by device
        (as :class:`~torch_rtindex.CgRXIndex` chooses them)."""
        device = check_device(self.device)
        budget = self.gpu_budget
        if budget is None:
            budget = int(torch.cuda.mem_get_info(device)[0] * 0.5) if device.type == "cuda" else 0
        backend = self.backend or "radix"  # never OptiX, whose scene is bound to one device address
        layout = self.layout or default_layout(backend)
        return dataclasses.replace(self, device=device, gpu_budget=budget, backend=backend, layout=layout)

    @property
    def pair_bytes(self) -> int:
        """Bytes of one sorted (key, row) pair in the layout (csrc/cgrx/cgrx_core.h)."""
        return 16 if self.layout == "aligned_row" else 12
