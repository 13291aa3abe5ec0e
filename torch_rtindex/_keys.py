"""Key types: which dtypes an index accepts and how their values are ordered.

The numbering matches ``rtindex::KeyType`` in csrc/core/keys.h. The mapping itself runs in C++
(``torch.ops.rtindex.map_keys``), once for every backend.
"""

from __future__ import annotations

import torch

KEY_TYPES = {"int64": 0, "int32": 1, "uint64": 2, "float32": 3, "float64": 4}

_DTYPE_TO_KEY_TYPE = {
    torch.int64: "int64",
    torch.int32: "int32",
    torch.float32: "float32",
    torch.float64: "float64",
}
if hasattr(torch, "uint64"):
    _DTYPE_TO_KEY_TYPE[torch.uint64] = "uint64"

MAX_KEYS = 2**32 - 1  # row IDs are 32-bit inside the indexes


def resolve_key_type(keys: torch.Tensor, key_type: str | None) -> str:
    if key_type is None:
        if keys.dtype not in _DTYPE_TO_KEY_TYPE:
            raise TypeError(
                f"keys have dtype {keys.dtype}; supported are int64, int32, float32, float64 and uint64 "
                "(torch.uint64, or int64 storage with key_type='uint64')"
            )
        return _DTYPE_TO_KEY_TYPE[keys.dtype]
    if key_type not in KEY_TYPES:
        raise ValueError(f"key_type must be one of {sorted(KEY_TYPES)}, got {key_type!r}")
    allowed = {"uint64": (torch.int64, getattr(torch, "uint64", torch.int64))}.get(
        key_type, tuple(d for d, t in _DTYPE_TO_KEY_TYPE.items() if t == key_type)
    )
    if keys.dtype not in allowed:
        raise TypeError(f"key_type={key_type!r} needs keys of dtype {allowed[0]}, got {keys.dtype}")
    return key_type


def check_key_tensor(t: torch.Tensor, name: str, *, dtype: torch.dtype, device: torch.device) -> None:
    """The checks every key or query argument passes before it reaches an operator."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}; flatten it with .reshape(-1)")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but the index holds {dtype} keys; convert with .to({dtype})")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the index is on {device}; move it with .to('{device}')")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass {name}.contiguous()")


def check_queries(lo: torch.Tensor, hi: torch.Tensor | None, *, dtype: torch.dtype, device: torch.device) -> None:
    """The checks every query batch passes, point (``hi`` None) or range, for every index class."""
    check_key_tensor(lo, "queries" if hi is None else "lo", dtype=dtype, device=device)
    if hi is not None:
        check_key_tensor(hi, "hi", dtype=dtype, device=device)
        if lo.numel() != hi.numel():
            raise ValueError(f"lo and hi must have the same length, got {lo.numel()} and {hi.numel()}")
