"""The counters behind :meth:`ChunkedIndex.stats`: one lock, per-batch deltas, copies handed out."""

from __future__ import annotations

import threading
from typing import Any

CALIBRATIONS_KEPT = 16  # lookup ways' calibrations stats() shows, the latest

# Counters whose growth over one call is its share (stats()["last_batch"]).
PER_BATCH = ("queries", "pieces", "hot_hits", "hot_rebuilds", "queries_gpu", "queries_cpu", "queries_in_place",
             "chunk_hits", "chunk_misses", "evictions", "bytes_copied", "bytes_calibration", "disk_loads",
             "bytes_loaded")


def _fresh() -> dict[str, Any]:
    return {
        "batches": 0, "queries": 0, "pieces": 0, "hot_hits": 0, "hot_rebuilds": 0, "queries_gpu": 0,
        "queries_cpu": 0, "queries_in_place": 0, "chunk_hits": 0, "chunk_misses": 0, "evictions": 0,
        "bytes_copied": 0, "bytes_calibration": 0, "disk_loads": 0, "bytes_loaded": 0, "chunks_updated_in_place": 0,
        "chunks_rebuilt": 0,
        "critical_mass": None, "break_even_queue": None, "cpu_rate": None, "copy_rate": None, "gpu_rate": None,
        "in_place_rate": None, "fixed_s": None,
        "plan": None, "calibrations": [],
        "time_s": {"partition": 0.0, "gpu_issue": 0.0, "gpu_wait": 0.0, "cpu": 0.0, "copy": 0.0, "merge": 0.0,
                   "load": 0.0, "hot": 0.0, "hot_rebuild": 0.0, "calibrate": 0.0, "total": 0.0},
    }


class Stats:
    """Counters and seconds per stage, shared by the index's units (the CPU worker thread among them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data = _fresh()
        self.last_batch: dict[str, Any] | None = None

    def reset(self) -> None:
        """Zeroes every counter; the build's seconds stay."""
        build = self.data["time_s"].get("build")
        self.data = _fresh()
        self.last_batch = None
        if build is not None:
            self.data["time_s"]["build"] = build

    def count(self, name: str, amount: int) -> None:
        with self.lock:
            self.data[name] += amount

    def time(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.data["time_s"][stage] += seconds

    def set(self, **values: Any) -> None:
        with self.lock:
            self.data.update(values)

    def calibration(self, record: dict[str, Any]) -> None:
        """Keeps what a calibration timed (the last CALIBRATIONS_KEPT): a rate that came out wrong says why."""
        with self.lock:
            kept = self.data["calibrations"]
            kept.append(record)
            del kept[:-CALIBRATIONS_KEPT]

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {**{k: self.data[k] for k in PER_BATCH}, "time_s": dict(self.data["time_s"])}

    def since(self, before: dict[str, Any]) -> dict[str, Any]:
        """The counters' growth since ``before``: one call's share (the copies, CPU/GPU split, seconds)."""
        now = self.snapshot()
        out = {k: now[k] - before[k] for k in PER_BATCH}
        out["time_s"] = {k: v - before["time_s"].get(k, 0.0) for k, v in now["time_s"].items() if k != "build"}
        out["plan"] = self.data["plan"]
        return out

    def copy(self) -> dict[str, Any]:
        """A deep enough copy for a caller to keep: nested dicts and the calibrations' slices copied."""
        with self.lock:
            s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.data.items()}
            s["calibrations"] = [dict(c, slices=[list(x) for x in c["slices"]]) for c in s["calibrations"]]
        s["last_batch"] = None if self.last_batch is None else {
            k: (dict(v) if isinstance(v, dict) else v) for k, v in self.last_batch.items()}
        return s
