"""Per-stage timing of a collective call (``profile=True``) and the bytes it moved, for ``ShardedIndex.stats``."""

from __future__ import annotations

import time
from typing import Any

import torch


class Stages:
    """Per-stage wall time (device synchronized at each mark when profiling) and bytes moved."""

    NAMES = ("partition", "exchange", "local", "return", "scatter")

    def __init__(self, op: str, on: bool, device: torch.device, rank: int, check_s: float = 0.0):
        self.on, self.device, self.rank = on, device, rank
        self.stats: dict[str, Any] = {"op": op, "check_s": check_s if on else 0.0,
                                      **{f"{n}_s": 0.0 for n in self.NAMES}, "bytes_sent": 0,
                                      "bytes_sent_remote": 0, "bytes_received": 0}
        self._t = self._now() if on else 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, stage: str) -> None:
        if self.on:
            t = self._now()
            self.stats[f"{stage}_s"] += t - self._t
            self._t = t

    def moved(self, send: torch.Tensor, recv: torch.Tensor, send_splits: list[int] | None) -> None:
        # A row's size from the shape alone (send[0] would dispatch an operator on every exchange).
        width = send.element_size() * (send.numel() // send.shape[0] if send.dim() > 1 and send.shape[0] else 1)
        self.stats["bytes_sent"] += send.numel() * send.element_size()
        self.stats["bytes_received"] += recv.numel() * recv.element_size()
        if send_splits is None:  # equal splits over the world
            world = max(1, send.shape[0])
            own = send.numel() * send.element_size() // world if send.shape[0] else 0
        else:
            own = send_splits[self.rank] * width
        self.stats["bytes_sent_remote"] += send.numel() * send.element_size() - own
