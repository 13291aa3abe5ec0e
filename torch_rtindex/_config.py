"""The typed configuration every index hands its lookup operators: the operators' codes of the option names
(torch_rtindex/index.py spells them), the packed ``int config`` layouts (csrc/ops.cpp ``config_schema``,
csrc/cgrx/cgrx_args.h, csrc/rx/rx_args.h) and the fixed-capacity exchange's block header, checked against the C++
side when the package is imported, so an integer never silently changes its meaning."""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch

from .index import BucketSearch, KeyType, PairsLayout, Representation, SearchBackend


def codes(names: Any) -> dict[str, int]:
    """The codes of a C++ enum whose names a Literal alias lists in the enum's numbering: name -> position."""
    return {name: code for code, name in enumerate(get_args(names))}


def check_option(value: Any, name: str, options: Any) -> str:
    """``value`` where it is one of a Literal alias's names, else a ValueError that lists them."""
    allowed = get_args(options)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


#: The storage layouts of every cgRX index: the read-only index's pairs, then the updatable index's node chains.
StorageLayout = Literal[PairsLayout, "nodes"]

KEY_TYPE_CODES = codes(KeyType)
LAYOUT_CODES = codes(StorageLayout)
BACKEND_CODES = codes(SearchBackend)
BUCKET_SEARCH_CODES = codes(BucketSearch)
REPRESENTATION_CODES = codes(Representation)
_ENUMS = (("key_type", KEY_TYPE_CODES), ("layout", LAYOUT_CODES), ("backend", BACKEND_CODES),
          ("bucket_search", BUCKET_SEARCH_CODES), ("representation", REPRESENTATION_CODES))


# Each configuration's fields and bit widths, packed from the lowest bit up into the lookup operators' one
# ``int config`` argument (csrc/core/config.h: a scalar, not an ``int[]``, because a list costs every lookup
# call a conversion). The scene's bits_z is implied: the three axes' bits add up to 64.
SCENE_FIELDS = (("scene_bits_x", 5), ("scene_bits_y", 5), ("scene_scale_y_log2", 6), ("scene_scale_z_log2", 6))
CGRX_CONFIG_FIELDS = (("key_type", 3), ("layout", 2), ("bucket_search", 1), ("backend", 2), *SCENE_FIELDS,
                      ("bucket_size", 31), ("spare_rows", 1), ("cold", 1))
RX_CONFIG_FIELDS = (("key_type", 3), ("unique_keys", 1), *SCENE_FIELDS, ("max_range_rays", 31))

# The header in front of each owner's keys in the sharded index's fixed-capacity exchange block, which
# partition_padded writes: its columns (the owner's query count, the sender's overflow flag, the sender's routing
# status) and their number (kPadded* in csrc/distributed/partition_checks.h).
PADDED_COUNT, PADDED_OVERFLOW, PADDED_STATUS = 0, 1, 2
PADDED_HEADER = 3


def pack(fields: tuple[tuple[str, int], ...], **values: int) -> int:
    """``values`` (one per field) packed by ``fields``; a value that does not fit its field raises."""
    packed, at = 0, 0
    for name, bits in fields:
        v = int(values.pop(name))
        if not 0 <= v < 1 << bits:
            raise ValueError(f"configuration field {name}={v} does not fit its {bits} bits")
        packed |= v << at
        at += bits
    if values:
        raise TypeError(f"unknown configuration fields {sorted(values)}")
    if at > 63:  # the operators take a non-negative int64
        raise ValueError(f"a configuration of {at} bits does not fit a non-negative int64")
    return packed


def _scene_fields(scene: list[int]) -> dict[str, int]:
    bits_x, bits_y, bits_z, scale_y_log2, scale_z_log2 = scene
    if bits_x + bits_y + bits_z != 64:
        raise ValueError(f"a scene's axis bits must add up to 64, got {scene[:3]}")
    return {"scene_bits_x": bits_x, "scene_bits_y": bits_y, "scene_scale_y_log2": scale_y_log2,
            "scene_scale_z_log2": scale_z_log2}


def cgrx_config(key_type: str, layout: str, bucket_size: int, bucket_search: str, backend: str,
                scene: list[int], spare_rows: bool = False, cold: bool = False) -> int:
    """The packed ``int config`` of the cgRX lookup operators (CGRX_CONFIG_FIELDS). ``spare_rows``: answer with
    the aligned pairs' spare words (written by ``cgrx_set_spare_rows``) instead of their row IDs. ``cold``: the
    structure is not in the CPU's caches when a call starts (an out-of-core chunk), so the CPU kernels prefetch
    ahead whatever its size."""
    # A plain int: what the operator takes (and what torch.compile guards on by value).
    return pack(CGRX_CONFIG_FIELDS, key_type=KEY_TYPE_CODES[key_type], layout=LAYOUT_CODES[layout],
                bucket_size=bucket_size, bucket_search=BUCKET_SEARCH_CODES[bucket_search],
                backend=BACKEND_CODES[backend], spare_rows=int(spare_rows), cold=int(cold), **_scene_fields(scene))


def rx_config(key_type: str, unique_keys: bool, max_range_rays: int, scene: list[int]) -> int:
    """The packed ``int config`` of the RX lookup operators (RX_CONFIG_FIELDS)."""
    return pack(RX_CONFIG_FIELDS, key_type=KEY_TYPE_CODES[key_type], unique_keys=unique_keys, max_range_rays=max_range_rays,
                **_scene_fields(scene))


def _schema() -> str:
    """config_schema()'s format: each enum's "name=code" pairs, then each configuration's "field:bits", then the
    exchange block's header width and columns."""
    parts = [f"{name}:" + ",".join(f"{n}={c}" for n, c in table.items()) for name, table in _ENUMS]
    parts += [f"{name}:" + ",".join(f"{f}:{bits}" for f, bits in fields)
              for name, fields in (("cgrx_config", CGRX_CONFIG_FIELDS), ("rx_config", RX_CONFIG_FIELDS))]
    parts.append(f"padded_header:{PADDED_HEADER}")
    parts.append(f"padded_columns:count={PADDED_COUNT},overflow={PADDED_OVERFLOW},status={PADDED_STATUS}")
    return ";".join(parts)


def check_against_extension(python: str | None = None) -> None:
    """Raises if the compiled extension's enums or config layouts differ from the Python side's (``python``: that
    side's schema, by default the package's own), naming the part."""
    native, python = torch.ops.rtindex_internal.config_schema(), _schema() if python is None else python
    if native != python:
        differ = [f"C++ {c!r} vs Python {p!r}" for c, p in zip(native.split(";"), python.split(";")) if c != p]
        raise RuntimeError(
            "torch_rtindex: the compiled extension's enums or configuration layouts differ from the Python "
            f"package's: {'; '.join(differ) or (native, python)}. A stale build: delete the build cache and import "
            "again; a changed C++ enum: list its names in that order in torch_rtindex/index.py; a changed layout: "
            "mirror it in torch_rtindex/_config.py"
        )
