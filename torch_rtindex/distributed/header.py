"""The call header every collective call starts with, and the wire codes it carries.

One ``all_gather`` of a fixed-size int64 header per rank: the status of the rank's local input checks, the
operation, a call counter, key type and dtype, value dtype, data device type, then ``2 * world + 4`` integers of
the call's own (sizes, settings). Any failed check or disagreement raises :class:`ShardedIndexError` on every
rank before data moves. The header goes on the device the group's object collectives use, never on a device
taken from a rank's input, so that a rank with bad input still posts it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _extension
from .._keys import KEY_TYPES, resolve_key_type

I64_MAX = 2**63 - 1

DTYPE_CODES = {torch.int64: 0, torch.int32: 1, torch.float32: 2, torch.float64: 3}
if hasattr(torch, "uint64"):
    DTYPE_CODES[torch.uint64] = 4
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
KEY_TYPE_NAMES = {v: k for k, v in KEY_TYPES.items()}
VALUE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)

# Operation codes in the call header: a rank calling another operation than the others is a collective error.
# New operations go at the end (the codes of the others stay).
OPS = [
    "build", "build_done", "lookup", "range_lookup", "aggregate", "range_aggregate", "lookup_all", "range",
    "lookup_all_capped", "range_capped", "update", "update_apply", "update_done", "load_state_dict",
    "gathered_state_dict", "lookup_fixed", "range_lookup_fixed", "aggregate_fixed", "range_aggregate_fixed",
    "range_count", "lookup_rows", "lookup_all_capped_fixed", "range_capped_fixed",
]
OP_CODES = {name: i for i, name in enumerate(OPS)}
# Header columns: status, op, key type, key dtype, call number, values dtype, data device type; then
# 2 * world + 4 extra integers.
HEAD = 7
DEVICE_CODES = {"cpu": 0, "cuda": 1, "xpu": 2, "mps": 3, "hpu": 4, "meta": 5}


class ShardedIndexError(RuntimeError):
    """Raised on every rank of a collective call when some rank's input was bad or the ranks disagreed
    (other operation, other sizes). ``errors`` maps each failing rank to its message. The index is unchanged."""

    def __init__(self, message: str, errors: dict[int, str] | None = None):
        super().__init__(message)
        self.errors = errors or {}


def ops():
    _extension.load()
    return torch.ops.rtindex


def internal():
    _extension.load()
    return torch.ops.rtindex_internal


def check_served(ix, device: torch.device, what: str) -> None:
    """Raises unless the group's backend serves ``device``'s type (NCCL: CUDA only)."""
    types = group_device_types(ix.group)
    if types and device.type not in types:
        raise ValueError(f"{what} are on {device}, a device type that the process group's backend does not "
                         f"serve (it serves {', '.join(sorted(types))}); with NCCL, put them on this rank's GPU")


def agree(ix, op: str, validate: Callable[[], Any] | None, extra: Callable[[Any], list[int]] | None = None,
           *, key_type: str | None = None, key_dtype: torch.dtype | None = None, values_code: int = -1,
           device: torch.device | None = None) -> tuple[Any, list[list[int]]]:
    """Runs the local checks, then shares every rank's header; raises :class:`ShardedIndexError` on every
    rank if any rank's checks failed or the ranks called different operations. Returns the local checks'
    result and the gathered headers ([world][HEAD + 2 * world + 4] ints): one host synchronization.

    Whatever fails here on one rank (its checks, ``extra``, a header value that does not fit int64) becomes
    its status: every rank posts the same header ``all_gather`` on the group's device (``device``, the
    device of the call's data, only goes into the header), so no rank can leave the others' header
    unmatched."""
    t0 = time.perf_counter()
    result, err = None, None
    n_extra = 2 * ix.world + 4
    op_code = OP_CODES[op]
    try:
        if validate is not None:
            result = validate()
        vals = [0] * n_extra
        if extra is not None:
            got = extra(result)
            if len(got) > n_extra:
                raise ValueError(f"{len(got)} header values for {n_extra} places")
            vals[: len(got)] = got
        kt = key_type if key_type is not None else getattr(ix, "key_type", None)
        kd = key_dtype if key_dtype is not None else getattr(ix, "key_dtype", None)
        dev = device if device is not None else getattr(ix, "device", None)
        dev_code = DEVICE_CODES.get(dev.type, len(DEVICE_CODES)) if isinstance(dev, torch.device) else -1
        head = [0, op_code, KEY_TYPES.get(kt, -1), DTYPE_CODES.get(kd, -1), ix._calls, values_code,
                dev_code, *vals]
        mine = torch.tensor(head, dtype=torch.int64, device=ix._head_device)
    except Exception as e:  # noqa: BLE001  (any local failure becomes a collective error)
        err = e
        head = [1, op_code, -1, -1, ix._calls, -1, -1] + [0] * n_extra
        mine = torch.tensor(head, dtype=torch.int64, device=ix._head_device)
    gathered = [torch.empty_like(mine) for _ in range(ix.world)]
    dist.all_gather(gathered, mine, group=ix.group)
    heads = torch.stack(gathered).tolist()
    ix._calls += 1
    ix._check_s = time.perf_counter() - t0  # the header round trip (one host synchronization)
    failed = [r for r, h in enumerate(heads) if h[0]]
    if failed:
        msg = "" if err is None else f"{type(err).__name__}: {err}"
        msgs: list[Any] = [None] * ix.world
        dist.all_gather_object(msgs, msg, group=ix.group)
        errors = {r: msgs[r] for r in failed}
        text = "; ".join(f"rank {r}: {m}" for r, m in errors.items())
        raise ShardedIndexError(f"ShardedIndex.{op} failed on {len(failed)} of {ix.world} ranks: {text}", errors) from err
    op_codes = {h[1] for h in heads}
    calls = {h[4] for h in heads}
    if len(op_codes) > 1 or len(calls) > 1:
        desc = ", ".join(f"rank {r}: {OPS[h[1]]} (call {h[4]})" for r, h in enumerate(heads))
        raise ShardedIndexError(
            f"ShardedIndex: the ranks made different collective calls ({desc}); every rank must call the same "
            "methods in the same order"
        )
    return result, heads


def disagree(heads: list[list[int]], col: int, what: str, show: Callable[[int], str]) -> None:
    values = [h[col] for h in heads]
    if len(set(values)) > 1:
        desc = ", ".join(f"rank {r}: {show(v)}" for r, v in enumerate(values))
        raise ShardedIndexError(f"ShardedIndex: the ranks disagree on {what} ({desc}); pass the same on every rank")


def group_device_types(group: dist.ProcessGroup) -> frozenset[str]:
    """The device types the group's backend(s) serve (NCCL: cuda; gloo: cpu and cuda); empty if unknown."""
    try:
        return frozenset(d.type for d in group._device_types)
    except Exception:  # noqa: BLE001  (a ProcessGroup without the property: no check)
        return frozenset()


def group_device(group: dist.ProcessGroup) -> torch.device:
    """The device of the call headers, from the group alone (the rule of ``all_gather_object``): the one device
    type its backend serves, else the CPU where served, else the first type; an accelerator's current device."""
    try:
        types = [d.type for d in group._device_types]
    except Exception:  # noqa: BLE001
        types = []
    kind = types[0] if len(types) == 1 else ("cpu" if not types or "cpu" in types else types[0])
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind, None)
    current = getattr(module, "current_device", None)
    return torch.device(kind, current()) if callable(current) else torch.device(kind)


def device_name(code: int) -> str:
    return {v: k for k, v in DEVICE_CODES.items()}.get(code, "?")


def key_type_or_none(keys: Any, key_type: str | None) -> str | None:
    """The key type for the call header; None where the keys are unusable (the validation reports why)."""
    try:
        return resolve_key_type(keys, key_type)
    except Exception:  # noqa: BLE001
        return None
