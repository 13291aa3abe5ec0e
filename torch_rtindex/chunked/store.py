"""The chunk store: each chunk's blob layout, its host copy (or the file it is read from on first use), and the
views of its structure that the lookups read (on the host, in a cache slot, or mapped for the GPU).

A chunk is one contiguous blob holding its cgRX structure (``pairs`` or ``nodes``, ``reps``, ``table``) and its
row map (``l2g``), every tensor at a 256-byte aligned offset. Rows spanning < 2^32 are stored as offsets from
the chunk's smallest row (``base``) in place of local rows, so the map is empty (:func:`place_rows`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._base import _ops
from .._keys import SIGN_BIT
from ..cgrx import LAYOUTS, CgRXIndex, CgRXSearch
from ..cgrx_updatable import UpdatableCgRXIndex
from .files import read_chunk_file

if TYPE_CHECKING:
    from .cache import ChunkCache
    from .config import ChunkedConfig
    from .stats import Stats

TOP = SIGN_BIT  # XOR with it (_keys.flip_sign) maps unsigned order (ordered keys) onto signed order (torch's sorts)
ALIGN = 256  # byte alignment of every tensor inside a chunk blob (and of cache slots)
DTYPES = {"int32": torch.int32, "int64": torch.int64}
# A chunk's search part, kept in GPU memory for its in-place reads: each lookup's first dependent reads (the
# representatives and the radix table) then stay off PCIe. Reserved for all chunks and a quarter more.
SEARCH_PARTS = ("reps", "table")
SEARCH_SLACK = 1.25


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def blob_specs(tensors: dict[str, torch.Tensor]) -> tuple[list[list], int]:
    """Where each tensor sits in a chunk's blob: [name, dtype, numel, byte offset], and the blob's size."""
    specs, off = [], 0
    for name, t in tensors.items():
        specs.append([name, str(t.dtype).removeprefix("torch."), int(t.numel()), off])
        off = align(off + t.numel() * t.element_size())
    return specs, max(off, ALIGN)


def views(buf: torch.Tensor, specs: list[list]) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, numel, off in specs:
        dt = DTYPES[dtype]
        size = numel * torch.empty(0, dtype=dt).element_size()
        out[name] = buf[off : off + size].view(dt)
    return out


def search_bytes(specs: list[list]) -> int:
    """Bytes of a chunk's search part (SEARCH_PARTS) kept on the GPU, each part in a slot of aligned size."""
    return sum(align(numel * torch.empty(0, dtype=DTYPES[dtype]).element_size())
               for name, dtype, numel, _ in specs if name in SEARCH_PARTS)


def pack(tensors: dict[str, torch.Tensor], pin: bool) -> tuple[torch.Tensor, list[list]]:
    """One host blob holding every tensor (copied asynchronously from CUDA: synchronize before reading it)."""
    specs, size = blob_specs(tensors)
    buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    for (name, *_), view in zip(specs, views(buf, specs).values()):
        view.copy_(tensors[name], non_blocking=True)
    # The alignment padding is zeroed, so that equal chunks are equal bytes (saved files, their checksums).
    ends = [off + numel * DTYPES[dtype].itemsize for _, dtype, numel, off in specs]
    for end, nxt in zip(ends, [spec[3] for spec in specs[1:]] + [size]):
        buf[end:nxt].zero_()
    return buf, specs


class Chunk:
    """One key-range chunk: its host blob (or the file it is lazily read from) and what describes it."""

    def __init__(self, lo: int, n: int, base: int, kmin: int | None, kmax: int | None, specs: list[list], size: int,
                 host: torch.Tensor | None, file: dict | None = None, *, kind: str = "pairs", used: int = 0) -> None:
        self.lo = lo  # the range's first ordered key (int64 bit pattern); chunk 0's is ignored (it starts at 0)
        self.n, self.base, self.kmin, self.kmax = n, base, kmin, kmax
        self.specs, self.nbytes = specs, size
        self.host = host  # uint8 blob (pinned when the index serves a GPU), None until loaded from `file`
        self.file = file  # {"path", "size", "crc32"} when the chunk is (also) in a saved directory
        self.heat = 0.0
        self.host_view: ChunkView | None = None
        self.mapped_view: ChunkView | None = None  # the host blob as the GPU addresses it (in-place reads)
        self.lock = threading.Lock()
        self.kind = kind  # "pairs" (a CgRXIndex) or "nodes" (node chains, updated in place)
        self.used = used  # nodes: the region's nodes in use (the rest is slack for updates)

    def row_map_entries(self) -> int:
        """Entries of the chunk's int64 row map: 0 where its rows span under 2^32 and the pairs (or node chains)
        hold each row's offset from ``base``."""
        return next(int(count) for name, _, count, _ in self.specs if name == "l2g")

    def rows_in_place(self) -> bool:
        """Whether the pairs (or node chains) hold each row's offset from base: no row map."""
        return self.row_map_entries() == 0


class Mapped:
    """A pinned host tensor presented through ``__cuda_array_interface__`` (its address is valid on the GPU), so
    that ``torch.as_tensor(Mapped(t), device="cuda")`` aliases it as a CUDA tensor; the tensor made keeps this
    object, and so ``t``, alive."""

    def __init__(self, t: torch.Tensor) -> None:
        if not t.is_pinned():
            raise ValueError("a zero-copy view needs pinned host memory")
        self.t = t
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "|u1", "data": (t.data_ptr(), False),
                                         "version": 3}


@dataclass
class ChunkView:
    """A chunk's structure on one device: the cgRX index and how its rows become global ones (a base plus the
    pairs' offsets, or a local -> global row map)."""

    index: CgRXSearch  # CgRXIndex (pairs) or UpdatableCgRXIndex (nodes)
    l2g: torch.Tensor  # offsets from base: int32 holding unsigned 32-bit values, or int64
    base: int
    resident: int = 0  # bytes of the search part this view keeps in GPU memory (an in-place view)
    # Node chunks whose rows span < 2^32 store each row's offset from base itself (no map): an update inserts
    # a row by its offset, and the chains' (key, offset) order stays the (key, global row) order.
    # (Read-only chunks whose rows span < 2^32 likewise hold each row's offset from base in their pairs.)
    direct: bool = False

    def global_rows(self, local: torch.Tensor) -> torch.Tensor:
        """Local row IDs (int64; -1, no row, stays -1) as global ones, in one operator pass: every queue's
        answer goes through here, and the same steps as separate tensor operations cost a queue several
        launches (a GPU) or small passes (the CPU)."""
        return torch.ops.rtindex_internal.global_rows(local, self.l2g, self.base)

    @staticmethod
    def _widen(offsets: torch.Tensor) -> torch.Tensor:
        wide = offsets.to(torch.int64)
        return wide & 0xFFFFFFFF if offsets.dtype == torch.int32 else wide

    def global_first(self, first: torch.Tensor) -> torch.Tensor:
        if self.l2g.numel() == 0 and not self.direct:
            return first
        return self.global_rows(first)

    def all_rows(self) -> torch.Tensor:
        return self._widen(self.l2g) + self.base

    def values_fit(self, values: torch.Tensor) -> bool:
        """Whether the aggregate kernel takes :meth:`local_values`: it wants one value per pair, which values from
        base on lack where updates gave several pairs one row ID (those views sum through their CSR rows)."""
        return not self.direct or isinstance(self.index, UpdatableCgRXIndex) or values.numel() - self.base >= len(self.index)

    def local_values(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (indexed by global row) indexed by the chunk's local rows."""
        if self.direct:
            return values[self.base :]  # a view: local row r is global row base + r
        return values.index_select(0, self.all_rows()) if self.l2g.numel() else values[:0]


def pair_rows(pairs: torch.Tensor, n: int, layout: str) -> torch.Tensor:
    """The row words of ``n`` pairs in ``layout`` (csrc/cgrx/cgrx_core.h), as a view of ``pairs``."""
    if layout == "packed_row":
        return pairs.view(-1, 3)[:n, 2]
    if layout == "aligned_row":
        return pairs.view(-1, 4)[:n, 2]
    return pairs[2 * n : 3 * n]


def place_rows(pairs: torch.Tensor, layout: str, rows_sorted: torch.Tensor | None) -> tuple[int, torch.Tensor]:
    """The row IDs of a cgRX structure built over keys in row order (local row r is ``rows_sorted[r]``, ascending):
    returns (base, row map), base the smallest row. Rows spanning < 2^32 (every chunk of an index under 2^32 keys):
    each pair holds its row's offset from base in place of its local row (rewritten here) and the map is empty, so
    a lookup needs no map (one dependent read fewer, over PCIe where the GPU reads a chunk in place) and the
    structure carries none; offsets ascend with local rows, so the pairs' order (key, then row) is unchanged.
    Wider spans keep local rows and the map holds each one's offset from base (int64). ``rows_sorted`` None: local
    row r is row r (the offsets are the local rows already)."""
    if rows_sorted is None:
        return 0, torch.empty(0, dtype=torch.int32, device=pairs.device)
    n = rows_sorted.numel()
    base = int(rows_sorted[0]) if n else 0
    offsets = rows_sorted - base
    if n == 0 or int(rows_sorted[-1]) - base < 2**32:
        if n:
            words = pair_rows(pairs, n, layout)
            words.copy_(offsets.to(torch.int32).index_select(0, words.to(torch.int64) & 0xFFFFFFFF))
        return base, torch.empty(0, dtype=torch.int32, device=pairs.device)
    return base, offsets


def chunks_of_manifest(directory: str, manifest: dict[str, Any]) -> list[Chunk]:
    """The chunks a saved directory's manifest lists, each read from its file on first use."""
    chunks = []
    for e in manifest["chunks"]:
        kind = e.get("kind", "pairs")
        file = {"path": os.path.join(directory, e["file"]), "size": e["size"], "crc32": e["crc32"], "kind": kind}
        chunks.append(Chunk(e["lo"], e["n"], e["base"], e["kmin"], e["kmax"], e["specs"], e["size"], None, file,
                            kind=kind, used=e.get("used", 0)))
    return chunks


class ChunkStore:
    """The chunks in key order, their boundaries on each device, their host blobs (read from their files on first
    use) and the views of their structures."""

    def __init__(self, config: "ChunkedConfig", key_type: str, key_dtype: torch.dtype, pin: bool,
                 stats: "Stats") -> None:
        self.config, self.key_type, self.key_dtype, self.pin, self.stats = config, key_type, key_dtype, pin, stats
        self.cache: ChunkCache | None = None  # set by the index once the chunk sizes are known
        self.n = 0  # pairs held
        self.next_row = 0  # the next fresh row ID (one past the largest ever held)
        self.rows_are_positions = True  # row IDs are 0 .. n - 1, the build's positions (no update changed them)
        self.set([])

    def set(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self._bounds_on: dict[torch.device, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self):
        return iter(self.chunks)

    def bounds(self, device: torch.device) -> torch.Tensor:
        """The chunks' first ordered keys (flipped to signed order) after the first, on ``device``."""
        if device not in self._bounds_on:
            self._bounds_on[device] = torch.tensor([c.lo for c in self.chunks[1:]], dtype=torch.int64).to(device) ^ TOP
        return self._bounds_on[device]

    def chunk_of(self, ordered: torch.Tensor) -> torch.Tensor:
        """The chunk of each ordered key."""
        return torch.searchsorted(self.bounds(ordered.device), ordered ^ TOP, right=True)

    def run_ends(self, ordered: torch.Tensor) -> list[int]:
        """Where each chunk's run of ``ordered`` ends, for keys in the chunks' order (ascending unsigned): chunk
        j's queries are ordered[ends[j - 1] : ends[j]] (the same chunks as :meth:`chunk_of`; a host sync)."""
        return torch.searchsorted(ordered ^ TOP, self.bounds(ordered.device)).tolist() + [ordered.numel()]

    def host(self, chunk: Chunk) -> torch.Tensor:
        """The chunk's host blob, read from its file on first use (checked: size, then CRC-32)."""
        if chunk.host is not None:
            return chunk.host
        with chunk.lock:
            if chunk.host is None:
                t0 = time.perf_counter()
                chunk.host = read_chunk_file(chunk.file, chunk.nbytes, self.pin)
                with self.stats.lock:
                    self.stats.data["disk_loads"] += 1
                    self.stats.data["bytes_loaded"] += chunk.nbytes
                    self.stats.data["time_s"]["load"] += time.perf_counter() - t0
        return chunk.host

    # ---------------------------------------------------------------------------------------------- views
    def host_view(self, chunk: Chunk) -> ChunkView:
        """The chunk's structure over its host blob (made once; an in-place update of a node chunk drops it)."""
        view = chunk.host_view
        if view is None:
            view = chunk.host_view = self.view(chunk, self.host(chunk))
        return view

    def mapped_view(self, chunk: Chunk) -> ChunkView:
        """The chunk's structure over its pinned host blob as the GPU addresses it: a CUDA tensor aliasing the
        host memory (pinned memory is mapped into the GPU's address space at the same address), so the lookup
        kernels read it over PCIe, its search part kept in the cache's shared slab where there is room. Made
        once, as the host view."""
        view = chunk.mapped_view
        if view is None:
            buf = torch.as_tensor(Mapped(self.host(chunk)), device=self.config.device)
            view = chunk.mapped_view = self.view(chunk, buf, resident=True)
        return view

    def in_place_view(self, chunk: Chunk) -> ChunkView:
        """The chunk's structure where it lies in host memory, as the cache's device reads it (on a CPU index,
        the host view: the stand-in for the GPU's reads over PCIe)."""
        return self.mapped_view(chunk) if self.config.device.type == "cuda" else self.host_view(chunk)

    def search_resident(self) -> int:
        """Bytes of search parts kept on the cache's device for in-place views."""
        return sum(c.mapped_view.resident for c in self.chunks if c.mapped_view is not None)

    def view(self, chunk: Chunk, buf: torch.Tensor, resident: bool = False) -> ChunkView:
        t = views(buf, chunk.specs)
        kept, slot = ({}, -1)
        if resident and self.cache is not None:
            kept, slot = self.cache.keep_search_part(t, search_bytes(chunk.specs), self.search_resident())
        t.update(kept)
        nbytes = sum(align(v.nbytes) for v in kept.values())
        view = self._chunk_view(chunk, t, nbytes)
        if slot >= 0:  # the slot goes back with the view (an update drops a changed chunk's views)
            weakref.finalize(view, self.cache.shared.dropped.append, (slot, nbytes)).atexit = False
        return view

    def _chunk_view(self, chunk: Chunk, t: dict[str, torch.Tensor], nbytes: int) -> ChunkView:
        cfg = self.config
        span = None if chunk.kmin is None else (chunk.kmin, chunk.kmax)
        if chunk.kind == "nodes":  # looked up as UpdatableCgRXIndex does: layout "nodes" over the node region
            index = UpdatableCgRXIndex._from_structure(
                t["nodes"], t["reps"], t["table"], chunk.n, chunk.used, node_size=cfg.node_size,
                key_type=self.key_type, key_dtype=self.key_dtype, key_span=span, num_values=0, backend=cfg.backend,
            )
            return ChunkView(index, t["l2g"], chunk.base, resident=nbytes, direct=chunk.rows_in_place())
        index = CgRXIndex._from_structure(
            t["pairs"], t["reps"], t["table"], chunk.n, key_type=self.key_type, key_dtype=self.key_dtype,
            key_span=span, bucket_size=cfg.bucket_size, layout=cfg.layout, backend=cfg.backend,
            cold=True,  # a chunk's queue comes once per batch: its lines are not in the CPU's caches
        )
        return ChunkView(index, t["l2g"], chunk.base, resident=nbytes, direct=chunk.rows_in_place())

    def decode(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's (ordered key, global row) pairs on the CPU, in key order."""
        view = self.host_view(chunk)
        p, n = view.index._pairs, chunk.n
        if chunk.kind == "nodes":  # chain order: (key, local row)
            keys, local = _ops().cgrx_nodes_export(p, self.config.node_size, view.index.num_buckets)
            local = local.to(torch.int64) & 0xFFFFFFFF
            return keys.clone(), view.global_rows(local) if n else local
        keys, local = _ops().cgrx_pairs_export(p, LAYOUTS[self.config.layout])  # row words: local rows or offsets
        return keys, view.global_rows(local) if n else local

    def export(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (ordered key, row ID) pair, on the CPU: chunk by chunk (key ranges in order), row IDs int64."""
        parts = [self.decode(c) for c in self.chunks]
        if not parts:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        return torch.cat([k.cpu() for k, _ in parts]), torch.cat([r.cpu() for _, r in parts])

    def info(self) -> list[dict[str, Any]]:
        """Per chunk: keys, bytes, first ordered key of its range, whether it is loaded and cached, its kind."""
        cache = self.cache
        return [{"n": c.n, "bytes": c.nbytes, "lo": c.lo, "loaded": c.host is not None,
                 "cached": cache is not None and c in cache, "kind": c.kind} for c in self.chunks]
