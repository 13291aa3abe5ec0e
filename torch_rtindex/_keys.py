"""Key types: which dtypes an index accepts and how their values are ordered.

``KEY_TYPES`` maps each key type (torch_rtindex.index.KeyType) to the code of ``rtindex::KeyType`` in
csrc/core/keys.h (torch_rtindex/_config.py derives and checks it). The mapping itself runs in C++
(``torch.ops.rtindex.map_keys``), once for every backend.
"""

from __future__ import annotations

import torch

from ._config import KEY_TYPE_CODES as KEY_TYPES

_DTYPE_TO_KEY_TYPE = {
    torch.int64: "int64",
    torch.int32: "int32",
    torch.float32: "float32",
    torch.float64: "float64",
}
if hasattr(torch, "uint64"):
    _DTYPE_TO_KEY_TYPE[torch.uint64] = "uint64"

MAX_KEYS = 2**32 - 1  # row IDs are 32-bit inside the indexes

SIGN_BIT = -(2**63)


def flip_sign(x):
    """XOR with the sign bit (a tensor of ordered keys or an int): maps the unsigned order of ordered keys onto
    torch's signed int64 order (its sorts and searches) and back; its own inverse."""
    return x ^ SIGN_BIT


_UNSIGNED = tuple(getattr(torch, n) for n in ("uint8", "uint16", "uint32") if hasattr(torch, n))
# The dtypes a key or query argument may arrive in for each key type: every value converts exactly and keeps its
# order. Anything else (narrowing, int <-> float, signed <-> unsigned) is refused rather than silently rounded.
_LOSSLESS_FROM = {
    "int64": (torch.int32, torch.int16, torch.int8) + _UNSIGNED,
    "int32": (torch.int16, torch.int8, torch.uint8) + tuple(d for d in _UNSIGNED if d.itemsize < 4),
    "uint64": _UNSIGNED,
    "float64": (torch.float32, torch.float16, torch.bfloat16),
    "float32": (torch.float16, torch.bfloat16),
}


def key_type_of(dtype: torch.dtype) -> str | None:
    return _DTYPE_TO_KEY_TYPE.get(dtype)


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


def as_key_dtype(t: torch.Tensor, name: str, *, dtype: torch.dtype, key_type: str | None = None,
                 holder: str = "the index", noun: str = "keys") -> torch.Tensor:
    """The dtype policy for keys, queries and IDs: ``t`` as ``dtype`` when every value converts exactly (int32
    queries on an int64 index, float32 on float64), else a TypeError naming both dtypes. ``key_type``: the
    index's key type where its dtype alone does not say it (uint64 keys held in int64 storage). ``holder`` and
    ``noun`` name what the error speaks of ("the table" and "IDs" for IdToRow)."""
    if t.dtype == dtype:
        return t
    kt = key_type or _DTYPE_TO_KEY_TYPE.get(dtype)
    if t.dtype in _LOSSLESS_FROM.get(kt, ()):
        return t.to(dtype)
    if t.dtype.is_floating_point != dtype.is_floating_point:
        why = f"converting between integer and floating-point {noun} can round or truncate"
    elif t.dtype.is_signed != (kt != "uint64"):
        why = f"converting between signed and unsigned {noun} changes negative values"
    else:
        why = f"{t.dtype} values may not fit {dtype}"
    raise TypeError(
        f"{name} has dtype {t.dtype} but {holder} holds {kt or dtype} {noun} ({dtype}): {why}. "
        f"Convert explicitly with .to({dtype}) if every value is exact in it"
    )


def check_key_tensor(t: torch.Tensor, name: str, *, dtype: torch.dtype, device: torch.device,
                     key_type: str | None = None) -> torch.Tensor:
    """The checks every key or query argument passes before it reaches an operator; returns it in ``dtype``
    (lossless conversions only, see :func:`as_key_dtype`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}; flatten it with .reshape(-1)")
    t = as_key_dtype(t, name, dtype=dtype, key_type=key_type)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the index is on {device}; move it with .to('{device}')")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass {name}.contiguous()")
    return t


def check_queries(lo: torch.Tensor, hi: torch.Tensor | None, *, dtype: torch.dtype, device: torch.device,
                  key_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The checks every query batch passes, point (``hi`` None) or range, for every index class; returns the
    batch in the index's key dtype (lossless conversions only)."""
    lo = check_key_tensor(lo, "queries" if hi is None else "lo", dtype=dtype, device=device, key_type=key_type)
    if hi is not None:
        hi = check_key_tensor(hi, "hi", dtype=dtype, device=device, key_type=key_type)
        if lo.numel() != hi.numel():
            raise ValueError(f"lo and hi must have the same length, got {lo.numel()} and {hi.numel()}")
    return lo, hi
