"""A pool of processes with torch.distributed initialized once per (world size, backend) for the whole pytest
session, so that each distributed check is its own test case and one failure does not hide the others.

    from dist_harness import run_on_ranks
    results = run_on_ranks(world, "module_name:function_name", *args, backend="gloo", timeout=120)

Every rank imports ``module_name`` (tests/ is on its ``sys.path``) and calls
``function_name(group_info, *args)``; ``group_info`` has ``.rank``, ``.world``, ``.group`` (the process group)
and ``.device``. Arguments and results travel pickled (tensors on the CPU). The per-rank results come back as a
list; a rank that raised makes the call raise AssertionError with every failing rank's traceback, and the next
call runs in a new process group (the ranks may have made different collectives). Ranks that stay silent past
``timeout`` (a hang), or for a short grace after another rank raised (left waiting in a collective it never
entered), get the pool killed; the next call starts a fresh one. Pools are torn down at interpreter exit.

Start-up (a fresh interpreter importing torch and the package per rank) is the cost the pool saves: a pool
is reused by every later call of the same world size and backend.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# NVLink multicast stays off in every spawned process (the GPU machines are shared; see
# torch_rtindex.distributed.launch.NO_MULTICAST_ENV, repeated here so that the workers need nothing to set it).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Process start-up: a fresh interpreter importing torch and the package, on a busy machine.
START_TIMEOUT_S = 240.0
# After one rank raised, the others get this long to answer before the pool is taken for wedged (they may be
# waiting in a collective the failed rank never entered).
GRACE_AFTER_FAILURE_S = 10.0


@dataclass(frozen=True)
class GroupInfo:
    """What the called function learns about its process."""

    rank: int
    world: int
    group: Any  # torch.distributed.ProcessGroup
    device: torch.device
    backend: str


def available(world: int, backend: str = "gloo") -> tuple[bool, str]:
    """Whether a ``world``-process group with ``backend`` can run here, and why not."""
    import torch.distributed as dist

    if not dist.is_available():
        return False, "torch.distributed is not available"
    if backend == "gloo":
        return (True, "") if dist.is_gloo_available() else (False, "gloo is not available")
    if backend == "nccl":
        if not dist.is_nccl_available():
            return False, "NCCL is not available"
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return (True, "") if n >= world else (False, f"NCCL with {world} ranks needs {world} GPUs, found {n}")
    return False, f"unknown backend {backend!r}"


def skip_unless_available(world: int, backend: str = "gloo"):
    """A pytest mark that skips a test where the group cannot run."""
    import pytest

    ok, why = available(world, backend)
    return pytest.mark.skipif(not ok, reason=why)


# --------------------------------------------------------------------------------------------- worker side


def _resolve(target: str):
    import importlib

    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def _worker(rank: int, world: int, backend: str, init_file: str, sys_path: list[str], conn) -> None:
    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)
    sys.path[:0] = [p for p in [TESTS_DIR, *sys_path] if p not in sys.path]
    import gc

    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
        import torch_rtindex  # noqa: F401  (loads the extension once, before the first call)
    except BaseException:  # noqa: BLE001
        conn.send_bytes(pickle.dumps(("start_failed", traceback.format_exc())))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    group = None
    try:
        while True:
            try:
                msg = conn.recv_bytes()
            except (EOFError, OSError):
                break  # the parent went away
            target, args, device, fresh = pickle.loads(msg)
            if target is None:
                break
            try:
                if group is None or fresh:
                    # The calls run in a group of their own, not WORLD: after a failed call (ranks that made
                    # different collectives) a new one starts clean, made through the store, not the old group.
                    if group is not None:
                        dist.destroy_process_group(group)
                        group = None
                    group = dist.new_group(list(range(world)), backend=backend)
                dev = torch.device(device) if device is not None else None
                if dev is None:
                    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
                elif dev.type == "cuda" and dev.index is None:
                    dev = torch.device("cuda", rank % torch.cuda.device_count())
                if dev.type == "cuda":
                    torch.cuda.set_device(dev)
                info = GroupInfo(rank=rank, world=world, group=group, device=dev, backend=backend)
                value = _resolve(target)(info, *args)
                reply = pickle.dumps(("ok", value))
            except BaseException:  # noqa: BLE001
                reply = pickle.dumps(("error", traceback.format_exc()))
            gc.collect()
            conn.send_bytes(reply)
    finally:
        # Collective handles nobody waited on (an error path) go before the groups do.
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------------------------- parent side


class _Pool:
    def __init__(self, world: int, backend: str):
        import multiprocessing as mp

        self.world, self.backend = world, backend
        self._fresh_group = False
        ctx = mp.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="dist_harness_")
        init_file = os.path.join(self._dir, "init")
        env_saved = {k: os.environ.get(k) for k in NO_MULTICAST_ENV}
        for k, v in NO_MULTICAST_ENV.items():
            os.environ.setdefault(k, v)  # inherited by the spawned interpreters from their start on
        self.conns, self.procs = [], []
        try:
            for rank in range(world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(rank, world, backend, init_file, list(sys.path), child),
                                daemon=True, name=f"dist_harness-{world}-{backend}-{rank}")
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
        finally:
            for k, v in env_saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        replies = self._collect(START_TIMEOUT_S)
        bad = {r: v for r, v in replies.items() if v[0] != "ready"}
        missing = [r for r in range(world) if r not in replies]
        if bad or missing:
            self.kill()
            text = "".join(f"\n--- rank {r} ---\n{v[1]}" for r, v in sorted(bad.items()))
            raise AssertionError(f"dist_harness: the {world}-rank {backend} pool did not start"
                                 + (f" (ranks {missing} silent after {START_TIMEOUT_S:.0f} s)" if missing else "")
                                 + text)

    def _collect(self, timeout: float, grace: float | None = None) -> dict[int, tuple[str, Any]]:
        """Replies by rank, until all came, ``timeout`` passed, or ``grace`` passed since the first error."""
        from multiprocessing.connection import wait

        replies: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        pending = {c: r for r, c in enumerate(self.conns)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for c in wait(list(pending), timeout=left):
                r = pending.pop(c)
                try:
                    replies[r] = pickle.loads(c.recv_bytes())
                except (EOFError, OSError):
                    code = self.procs[r].exitcode
                    replies[r] = ("error", f"rank {r} died (exit code {code}) without answering")
                except Exception:  # noqa: BLE001  (a result that does not unpickle here)
                    replies[r] = ("error", traceback.format_exc())
                if replies[r][0] not in ("ok", "ready") and grace is not None:
                    deadline = min(deadline, time.monotonic() + grace)
        return replies

    def call(self, target: str, args: tuple, device, timeout: float) -> list[Any]:
        msg = pickle.dumps((target, args, None if device is None else str(device), self._fresh_group))
        self._fresh_group = False
        for c in self.conns:
            c.send_bytes(msg)
        replies = self._collect(timeout, GRACE_AFTER_FAILURE_S)
        silent = [r for r in range(self.world) if r not in replies]
        failed = {r: v[1] for r, v in sorted(replies.items()) if v[0] != "ok"}
        if not silent and not failed:
            return [replies[r][1] for r in range(self.world)]
        if silent:
            # Ranks stuck (in a collective, or a loop) cannot be reached: the pool goes, the next call starts one.
            self.kill()
        else:
            # Every rank answered, but maybe after different collectives: the next call gets a new group.
            self._fresh_group = True
        head = f"dist_harness: {target} on {self.world} ranks ({self.backend})"
        parts = []
        if failed:
            parts.append(f"{head}: ranks {sorted(failed)} raised")
        if silent:
            why = "hung" if not failed else "did not answer after the failure"
            parts.append(f"ranks {silent} {why} (timeout {timeout:.0f} s); the pool was killed and is rebuilt "
                         "for the next call")
        if failed and not silent:
            parts.append("the next call runs in a new process group")
        text = "; ".join(parts) if failed else f"{head}: " + parts[0]
        text += "".join(f"\n--- rank {r} ---\n{tb}" for r, tb in failed.items())
        raise AssertionError(text)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self, timeout: float = 20.0) -> None:
        """Orderly: each rank leaves its loop and destroys its group; whatever is left after ``timeout`` is killed."""
        for c in self.conns:
            try:
                c.send_bytes(pickle.dumps((None, (), None, False)))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)


_POOLS: dict[tuple[int, str], _Pool] = {}


def run_on_ranks(world: int, target: str, *args: Any, backend: str = "gloo", timeout: float = 120.0,
                 device: str | torch.device | None = None) -> list[Any]:
    """Calls ``target`` ("module:function") as ``fn(group_info, *args)`` on each of ``world`` ranks and returns
    their results in rank order. ``device`` picks ``group_info.device``: default the CPU under gloo and each
    rank's GPU under NCCL; "cuda" gives each rank its own GPU (rank modulo the GPU count)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    ok, why = available(world, backend)
    if not ok:
        raise RuntimeError(f"dist_harness: cannot run {world} ranks over {backend}: {why}")
    key = (world, backend)
    pool = _POOLS.get(key)
    if pool is not None and not pool.alive():
        pool.kill()
        pool = None
    if pool is None:
        _POOLS.pop(key, None)
        pool = _Pool(world, backend)
        _POOLS[key] = pool
    try:
        return pool.call(target, args, device, timeout)
    except AssertionError:
        if not pool.procs:
            _POOLS.pop(key, None)  # killed in call(); the next call starts a fresh pool
        raise


def shutdown() -> None:
    """Tears every pool down (registered to run at exit)."""
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.close()


atexit.register(shutdown)
