"""The build: keys anywhere (a CPU tensor larger than GPU memory is the main case) sorted into key-range chunks.

With CUDA the sort runs on the GPU within ``gpu_budget``: splitters from a sample, the keys partitioned by splitter
range piece by piece (mapped and bucketed on the GPU, grouped in host memory), each range sorted on the GPU one at
a time. Chunk boundaries fall only between distinct keys, so every key's rows live in one chunk (a point lookup
touches one chunk); a run of equal keys longer than a chunk makes one larger chunk. Row IDs are int64 positions:
more than 2^32 keys are fine, as long as no chunk holds 2^32 keys or more. Each chunk is a cgRX structure over its
keys in global row order (its pairs holding row offsets from its smallest row where they span < 2^32), or with
``updatable=True`` the node chains of :class:`~torch_rtindex.UpdatableCgRXIndex`.
"""

from __future__ import annotations

import torch

from .._base import _ops
from .._keys import KEY_TYPES, MAX_KEYS
from ..cgrx import LAYOUTS
from .config import ChunkedConfig
from .store import TOP, Chunk, pack, place_rows


class Builder:
    """Makes chunks for an index of ``config`` over keys of ``key_type``: a whole build (:meth:`build`), a chunk
    over given pairs (:meth:`build_chunk`) and the cut of sorted pairs into chunks (:meth:`cut`)."""

    def __init__(self, config: ChunkedConfig, key_type: str, pin: bool) -> None:
        self.config, self.key_type, self.pin = config, key_type, pin

    def bytes_per_key(self, rows: int) -> float:
        """Bytes per key of a chunk in an index whose row IDs lie below ``rows``."""
        if self.config.updatable:  # a node per node_size / 2 pairs (half full), growth times that, reps, table
            N = self.config.node_size
            return (3 * N + 2) * 4 * 2 / N * self.config.growth + 16 / N + 1
        row_map = 4 if rows > 2**32 else 0  # rows spanning < 2^32: the pairs hold row offsets (build_chunk)
        return self.config.pair_bytes + row_map + 8 / self.config.bucket_size + 1

    def chunk_keys(self, rows: int) -> int:
        """Keys per chunk in an index whose row IDs lie below ``rows``."""
        return max(1, int(self.config.chunk_bytes // self.bytes_per_key(rows)))

    def work_device(self) -> torch.device:
        """Where the build sorts: the cache's GPU (within the budget) when there is one, else the CPU."""
        return self.config.device if self.config.device.type == "cuda" else torch.device("cpu")

    def map(self, keys: torch.Tensor) -> torch.Tensor:
        """Keys as ordered keys (int64 holding the key type's order as unsigned)."""
        return _ops().map_keys(keys.contiguous(), KEY_TYPES[self.key_type])

    def build(self, keys: torch.Tensor) -> list[Chunk]:
        """The chunks over ``keys`` (row ID = position), at least one (empty where there are no keys)."""
        n = keys.numel()
        W = self.work_device()
        T = self.chunk_keys(n)
        if self.config.build_sort_keys is not None:
            bucket_keys = self.config.build_sort_keys
        elif W.type == "cuda":
            # ~64 bytes per key while a range is sorted (keys, positions, the sort's output and scratch), plus a
            # chunk's own build (~64 bytes per key of the chunk).
            bucket_keys = max(T, (self.config.gpu_budget - 64 * T) // 64) if self.config.gpu_budget else 1 << 26
        else:
            bucket_keys = max(n, 1)
        bar = progress_bar(n, self.config.progress)
        chunks: list[Chunk] = []
        if n <= T:  # one chunk: its keys are in row order as given, so it needs neither the key sort nor a row sort
            chunks.append(self.build_chunk(self.map(keys.to(W)), None, None))
            bar.update(n)
        elif n <= bucket_keys:
            o = self.map(keys.to(W))
            sf, pos = torch.sort(o ^ TOP, stable=True)
            del o
            carry = self.cut(sf, pos, T, True, chunks)
            assert carry is None
            bar.update(n)
        else:
            carry = None
            for sf, pos, last in self.ranges(keys, W, bucket_keys, bar):
                if carry is not None:  # the previous range's tail: its keys are smaller than all of this range's
                    sf, pos = torch.cat([carry[0], sf]), torch.cat([carry[1], pos])
                carry = self.cut(sf, pos, T, last, chunks)
        if not chunks:
            chunks.append(self.build_chunk(torch.empty(0, dtype=torch.int64, device=W),
                                            torch.empty(0, dtype=torch.int64, device=W), 0))
        if W.type == "cuda":
            torch.cuda.current_stream(W).synchronize()  # the blobs were copied out asynchronously
        bar.close()
        return chunks

    def from_pairs(self, keys: torch.Tensor, rows: torch.Tensor) -> tuple[list[Chunk], int]:
        """The chunks over (ordered key, row ID) pairs on the CPU (a state's), and one past the largest row ID.
        Row IDs must be non-negative; several keys may share one (an insert may give a row in use)."""
        # (key, row ID) order: by row, then stably by key.
        by_row = torch.sort(rows, stable=True)
        if rows.numel() and int(by_row.values[0]) < 0:
            raise ValueError("the state's rows must be non-negative row IDs")
        end = int(by_row.values[-1]) + 1 if rows.numel() else 0
        sf, perm = torch.sort(keys.index_select(0, by_row.indices) ^ TOP, stable=True)
        pos = by_row.values.index_select(0, perm)
        chunks: list[Chunk] = []
        self.cut(sf, pos, self.chunk_keys(end), True, chunks)
        if not chunks:
            chunks.append(self.build_chunk(keys[:0], rows[:0], 0))
        return chunks, end

    def ranges(self, keys: torch.Tensor, W: torch.device, bucket_keys: int, bar):
        """The keys' (flipped ordered key, position) pairs sorted, one splitter range at a time; each range's keys
        are greater than every earlier range's (a key's copies all fall in one range). Yields (sf, pos, last)."""
        n = keys.numel()
        buckets = -(-n * 5 // (bucket_keys * 4))  # 1.25x as many as needed: sample noise stays under the limit
        gen = torch.Generator(device=keys.device).manual_seed(0x5EED)
        s = min(n, buckets * 1024)
        sample = self.map(keys[torch.randint(0, n, (s,), generator=gen, device=keys.device)]).to(W) ^ TOP
        sample = torch.sort(sample).values
        spl = torch.unique(sample[(torch.arange(1, buckets, device=W) * s) // buckets])  # sorted, distinct
        B = spl.numel() + 1
        piece = max(1, bucket_keys // 2)  # a piece and the next one's first tensors may be alive at once

        def pieces():
            for a in range(0, n, piece):
                b = min(n, a + piece)
                o = self.map(keys[a:b].to(W, non_blocking=True))
                yield a, o, torch.searchsorted(spl, o ^ TOP, right=True, out_int32=True)

        counts = torch.stack([torch.bincount(bid, minlength=B).cpu() for _, _, bid in pieces()])  # [pieces, B]
        counts = counts.to(torch.int64)
        per_bucket = counts.sum(0)
        bucket_start = torch.cumsum(per_bucket, 0) - per_bucket
        dest = bucket_start[None, :] + torch.cumsum(counts, 0) - counts  # [pieces, B]: where each piece's share goes
        hk = torch.empty(n, dtype=torch.int64)
        hp = torch.empty(n, dtype=torch.int32 if n <= 2**31 else torch.int64)  # positions: 4 bytes where they fit
        for p, (a, o, bid) in enumerate(pieces()):
            by_bucket = torch.sort(bid, stable=True).indices
            ok = o.index_select(0, by_bucket).cpu()
            op = (by_bucket + a).to(hp.dtype).cpu()
            src = 0
            for j, c in enumerate(counts[p].tolist()):
                d = int(dest[p, j])
                hk[d : d + c] = ok[src : src + c]
                hp[d : d + c] = op[src : src + c]
                src += c
        for j in range(B):
            a, c = int(bucket_start[j]), int(per_bucket[j])
            # Within a range the pairs are in position order (pieces in order, each grouped stably): a stable
            # sort by key gives (key, position) order.
            sf, perm = torch.sort(hk[a : a + c].to(W) ^ TOP, stable=True)
            pos = hp[a : a + c].to(W).index_select(0, perm).to(torch.int64)
            bar.update(c)
            yield sf, pos, j == B - 1

    def cut(self, sf: torch.Tensor, pos: torch.Tensor, T: int, last: bool, out: list) -> tuple | None:
        """Cuts sorted pairs into chunks of about T keys, only between distinct keys; returns the tail that should
        join the next range (None on the last one)."""
        m, start = sf.numel(), 0
        while start < m:
            if m - start < T and not last:
                return sf[start:].clone(), pos[start:].clone()
            end = min(start + T, m)
            if end < m:
                end = int(torch.searchsorted(sf, sf[end - 1 : end], right=True))
            out.append(self.build_chunk(sf[start:end] ^ TOP, pos[start:end], int(sf[start]) ^ TOP if start < m else 0))
            start = end
        return None

    def build_chunk(self, ordered: torch.Tensor, rows: torch.Tensor | None, lo: int | None) -> Chunk:
        """A chunk over (ordered key, global row) pairs (any order): its cgRX structure over the keys in row
        order, so that local row order is global row order, and the local -> global map. ``rows`` None: each key's
        row is its position (the whole index in one chunk); ``lo`` None: the chunk's smallest key."""
        if self.config.updatable:
            if rows is None:
                rows = torch.arange(ordered.numel(), device=ordered.device)
            return self.build_node_chunk(ordered, rows, lo)
        if rows is None:
            k, rows_sorted = ordered.contiguous(), None
        else:
            rows_sorted, perm = torch.sort(rows)
            k = ordered.index_select(0, perm).contiguous()
        n = k.numel()
        pairs, reps, table = _ops().cgrx_build(k, self.config.bucket_size, LAYOUTS[self.config.layout])
        if n:
            flipped = torch.aminmax(k ^ TOP)
            kmin, kmax = int(flipped.min) ^ TOP, int(flipped.max) ^ TOP
        else:
            kmin = kmax = None
        if n >= 2**32 - 1:
            raise ValueError(f"a chunk would hold {n} keys (one key repeated that often?); a chunk holds < 2^32 - 1")
        base, l2g = place_rows(pairs, self.config.layout, rows_sorted)
        blob, specs = pack({"pairs": pairs, "reps": reps, "table": table, "l2g": l2g}, self.pin)
        return Chunk(range_start(lo, kmin), n, base, kmin, kmax, specs, blob.numel(), blob)

    def build_node_chunk(self, ordered: torch.Tensor, rows: torch.Tensor, lo: int | None) -> Chunk:
        """An updatable chunk: the node chains of :class:`UpdatableCgRXIndex` (bulk-loaded half full, slack
        ``growth``) over the pairs. Rows spanning < 2^32 are stored as offsets from the smallest (no row map, so
        updates insert in place); wider spans get local rows in global row order and an int64 map, and every
        update of such a chunk rebuilds it."""
        n = ordered.numel()
        if n >= MAX_KEYS:
            raise ValueError(f"a chunk would hold {n} keys (one key repeated that often?); a chunk holds < 2^32 - 1")
        kmin = kmax = None
        base = last = 0
        if n:
            flipped = torch.aminmax(ordered ^ TOP)
            kmin, kmax = int(flipped.min) ^ TOP, int(flipped.max) ^ TOP
            span = torch.aminmax(rows)
            base, last = int(span.min), int(span.max)
        if last - base <= MAX_KEYS - 1:  # 2^32 - 1 is the node chains' "no row"
            local, l2g = rows - base, torch.empty(0, dtype=torch.int64, device=rows.device)
        else:
            rows_sorted, perm = torch.sort(rows, stable=True)
            ordered = ordered.index_select(0, perm)
            local, l2g = torch.arange(n, device=rows.device), rows_sorted - base
        nodes, reps, table, used = _ops().cgrx_nodes_load(ordered.contiguous(), local.to(torch.int32), self.config.node_size,
                                                          self.config.growth)
        blob, specs = pack({"nodes": nodes, "reps": reps, "table": table, "l2g": l2g}, self.pin)
        return Chunk(range_start(lo, kmin), n, base, kmin, kmax, specs, blob.numel(), blob, kind="nodes",
                     used=int(used))


def range_start(lo: int | None, kmin: int | None) -> int:
    """A chunk's range start: ``lo``, or where None (the whole index in one chunk) its smallest key (0: no key)."""
    if lo is not None:
        return lo
    return kmin if kmin is not None else 0


class _Silent:
    def update(self, n):
        pass

    def close(self):
        pass


def progress_bar(total: int, progress: bool | None):
    if progress is False:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    import sys

    if progress is None and not sys.stderr.isatty():
        return _Silent()
    return tqdm(total=total, unit="key", unit_scale=True, desc="ChunkedIndex build", delay=3.0)


