"""Pinned host buffers an index keeps for the CPU's answers on their way to the GPU.

A batch's CPU answers (tens of millions of int64 at 2^27 lookups) are joined in pinned memory and copied to the
GPU in one asynchronous copy. Taken from torch's caching host allocator, a buffer of that size is sometimes not
found free (its blocks wait on events in order) and is pinned afresh, which costs tens of milliseconds in the
middle of a batch. The index keeps its own instead: one buffer per slot, grown (by a quarter more than asked) as batches need, reused
once the GPU has read the last copy out of it."""

from __future__ import annotations

import torch


class PinnedStaging:
    """Buffers by slot (the merge's answer columns). ``pin``: page-locked memory with CUDA events guarding reuse
    (an index that serves a GPU); else ordinary host memory (the same logic, for the CPU)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.cuda.Event] = {}  # slot -> the event after the last copy out of it

    def take(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``numel``-element view of ``slot``'s buffer, grown as needed, once the last copy out of it is done."""
        ev = self.pending.pop(slot, None)
        if ev is not None:
            ev.synchronize()  # normally long done: the copy was issued a batch ago
        nbytes = numel * dtype.itemsize
        buf = self.buffers.get(slot)
        if buf is None or buf.numel() < nbytes:
            self.buffers.pop(slot, None)
            buf = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, pin_memory=self.pin)  # room for the next
            self.buffers[slot] = buf
        return buf[:nbytes].view(dtype)

    def copied(self, slot: int, stream: torch.cuda.Stream | None) -> None:
        """Marks ``slot``'s buffer as read by copies issued on ``stream`` (None: copies that were waited for)."""
        if self.pin and stream is not None:
            ev = torch.cuda.Event()
            ev.record(stream)
            self.pending[slot] = ev

    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())
