"""Starting a group of processes on one machine for the sharded index: tests, the benchmark, small examples.

Production jobs use their own launcher (``torchrun``, SLURM, ...); :func:`spawn` is for a single machine. Any
launcher started from here keeps NVLink multicast off (see :data:`NO_MULTICAST_ENV`).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from datetime import timedelta
from typing import Any, Callable

import torch

#: Environment every process started here gets (setdefault: an explicit setting wins). NVLink multicast
#: (NVLS) stays off on the GPU machines these runs share: NCCL's NVLS algorithms, PyTorch symmetric memory's
#: multicast and NVSHMEM's NVLS all reserve multicast objects of the NVSwitch fabric.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def no_multicast_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Sets :data:`NO_MULTICAST_ENV` in ``env`` (default: ``os.environ``) where not set yet; returns ``env``."""
    env = os.environ if env is None else env
    for k, v in NO_MULTICAST_ENV.items():
        env.setdefault(k, v)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the group's rendezvous binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, port: int, backend: str, timeout_s: float, args: tuple) -> None:
    import torch.distributed as dist

    no_multicast_env()
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        fn(rank, world, *args)
        dist.barrier()  # every rank is done: no peer still sends into this rank's groups while they go
    finally:
        # Collective handles nobody waited on (an error path) go before the groups do: gloo's threads holding
        # them while the groups, or the interpreter, are torn down can abort the process.
        gc.collect()
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world: int, *args: Any, backend: str = "gloo", timeout_s: float = 60.0,
          join_timeout_s: float | None = None) -> None:
    """Runs ``fn(rank, world, *args)`` in ``world`` new processes, each in a process group (``backend``: gloo
    on CPU, nccl with one GPU per rank) whose collectives time out after ``timeout_s``; waits for all of them
    (at most ``join_timeout_s``, then terminates them and raises) and re-raises the first error of any rank.
    ``fn`` must be importable (a module-level function)."""
    import torch.multiprocessing as mp

    no_multicast_env()  # inherited by the children (and set again there for other start methods)
    port = free_port()
    ctx = mp.start_processes(
        _entry, args=(fn, world, port, backend, timeout_s, args), nprocs=world, join=False, start_method="spawn"
    )
    deadline = None if join_timeout_s is None else time.monotonic() + join_timeout_s
    while not ctx.join(timeout=1.0):
        if deadline is not None and time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"the {world} processes did not finish within {join_timeout_s} s")
